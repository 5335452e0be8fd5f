"""Partition replication: leader/follower logs, the ISR and the high watermark.

Rules of this package (docs/replication.md):
- `core/` is the sans-IO state of each partition; everything else here is its trio driver.
  The core reads its log through a read-only view and returns every write (append,
  truncation, reset) as a step the driver performs off the event loop.
- A follower's next fetch offset is its durable acknowledgement: it fetches again only after
  what it appended is fsynced (flush.policy=always).
- A produce with acks=all is answered once every ISR member holds it durably and the high
  watermark covers it; consumers never read past the high watermark.
- ReplicaManager is the composition root: `Replicas` holds the shared state, and each
  collaborator (assignment, produce path, read paths, fetchers) names what it uses.
"""
