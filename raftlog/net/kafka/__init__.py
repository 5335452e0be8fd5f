"""Kafka wire-protocol server (see docs/protocol.md)."""

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
