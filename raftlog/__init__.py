"""raftlog: a Kafka-compatible, Raft-replicated partitioned log on trio."""

__version__ = "0.1.0"
