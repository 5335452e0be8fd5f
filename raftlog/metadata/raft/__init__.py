"""The metadata quorum's Raft: a sans-IO core, the executor of its effects, and the trio
driver with its log store.

Rules of this package (docs/raft.md, DESIGN.md):
- The core (core, elections, replication, roles, types, messages, majority) and executor.py
  import no trio and do no I/O: time, messages and "flushed up to X" come in as arguments,
  effects go out in a `Ready`. That is what lets the simulator and the transcripts run it.
- Every Ready is carried out by `executor.execute_ready`, in the contract's order: quorum
  state durable before any message that reflects it, entries durable before a follower's
  next fetch acknowledges them.
- Quorum arithmetic is counted in majority.py only.
- Only driver.py and log_store.py touch the disk, the clock or the network.
"""
