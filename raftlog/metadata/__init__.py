"""The self-managed metadata: records, the image built from them, snapshots, the service.

Rules of this package (docs/metadata.md):
- The metadata log is a partition log (`__cluster_metadata-0`) replicated by `raft/`.
- records.py declares every record through raftlog.codec; a record that does not decode
  stops the node with its offset rather than being skipped.
- The image is immutable: applying committed records yields a new image and a delta, and
  listeners (replicas, groups, quotas) act on both.
- `controller/` writes records only on the Raft leader, one Raft entry per request, and
  answers once that entry commits.
"""
