"""The network edges of a node: framing, the internal RPC, the Kafka protocol server.

Rules of this package (docs/protocol.md):
- Every frame is length-prefixed and bounded before it is read; a bad frame closes the
  connection with a log line, never the node.
- Internal RPC bodies are declared through raftlog.codec and never pickled; Kafka bytes are
  encoded and decoded by kio only.
- Errors sent to a peer or client carry an error code, not internal state.
"""
