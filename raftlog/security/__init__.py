"""Security: who a connection is, and what it may do.

Rules of this package:
- No I/O and no trio here: TLS contexts are built from file paths handed in, SASL mechanisms
  are state machines that take the client's bytes and return the server's, the authorizer
  answers from the ACL bindings it was given. The listeners (raftlog.net) drive them.
- Kafka's names and numeric codes for every enum (resource types, operations, pattern and
  permission types, SCRAM mechanisms), so they map one to one onto the wire.
- Nothing secret is stored or logged in clear text: SCRAM keeps salted, iterated keys; a
  failed authentication says only that it failed.
"""
