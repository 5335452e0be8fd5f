"""The sans-IO replication state of one partition: leader, follower, ISR, HW, purgatory.

Rules of this package:
- No trio, sockets, disk or clock: time, fetches and "flushed up to X" come in as keyword
  arguments, decisions and steps go out (tests/replication/test_core_is_sans_io.py).
- The log is seen through `types.ReplicaLogView`, which has no writing method.
- Each rule is Kafka's (Partition.scala, KIP-320, KIP-497) and docs/replication.md says
  where it deviates.
"""
