"""Kafka wire-protocol server (see docs/protocol.md).

Rules of this package: kio encodes and decodes every Kafka byte (its private API only
through raftlog.kio_private); a request's sizes and counts are bounded before it is acted
on; handlers reach the node only through the `KafkaBackend` seam in backend.py.
"""

from raftlog.net.kafka.apis import VERSION_TABLE, ApiRegistry, default_registry
from raftlog.net.kafka.backend import KafkaBackend
from raftlog.net.kafka.context import NoQuotas, QuotaHook, RequestContext
from raftlog.net.kafka.server import serve

__all__ = [
    "VERSION_TABLE",
    "ApiRegistry",
    "KafkaBackend",
    "NoQuotas",
    "QuotaHook",
    "RequestContext",
    "default_registry",
    "serve",
]
