"""raftlog: a Kafka-compatible, Raft-replicated partitioned log on trio.

Rules that hold in every package (DESIGN.md; docs/architecture.md draws the layers):
- Imports point down the layers: vocabulary (errors, constants, codec) < config and records
  < storage, framing, declared messages < state machines < services < the Kafka server and
  broker < node.py. No cycles (tests/test_import_graph.py).
- Sans-IO cores decide, drivers do the I/O: no trio, socket, disk or clock in a core.
- Persist before you promise; bounded everything, with the unit in the name.
- Every byte from outside the process is checked at decode before it is stored or acted on.
- Kafka's names for configs, APIs, errors and metrics.
"""

__version__ = "0.1.0"
