"""The active controller and the broker's side of it.

Rules of this package (docs/metadata.md):
- controller.py, topics.py, configs.py and elections.py are sans-IO: a request and the
  image in, metadata records and a reply out. Nothing is applied until it commits.
- Every request, reply and record is declared in messages.py through raftlog.codec; values
  are range-checked at decode, and topic and broker configs through raftlog.config_keys.
- Elections pick only from the ISR (unclean election is off unless configured) and bump the
  leader epoch.
- broker_lifecycle.py is the trio driver on every broker: registration, heartbeats,
  controlled shutdown.
"""
