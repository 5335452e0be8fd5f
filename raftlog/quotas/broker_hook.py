"""The Kafka server's QuotaHook on a broker: the QuotaManager fed from the metadata image.

Quotas live in the metadata log as ClientQuota records; every broker rebuilds its QuotaConfig
from its committed image whenever the quotas in it change, so all brokers enforce the same
quotas within one metadata fetch of a change, and they survive restarts with the log.
"""

from __future__ import annotations

from collections.abc import Callable

from raftlog.metadata.image import MetadataDelta, MetadataImage
from raftlog.quotas.entity import QuotaConfig, QuotaEntity
from raftlog.quotas.manager import QuotaLimits, QuotaManager


class BrokerQuotas:
    """Implements raftlog.net.kafka.context.QuotaHook."""

    def __init__(self, limits: QuotaLimits, clock_ms: Callable[[], int]) -> None:
        self.config = QuotaConfig()
        self.manager = QuotaManager(self.config, limits)
        self._clock_ms = clock_ms
        self._seen: object = None

    def on_metadata(self, image: MetadataImage, delta: MetadataDelta) -> None:
        quotas = image.client_quotas
        if quotas is self._seen:
            return  # copy-on-write image: the same mapping object means no quota changed
        self._seen = quotas
        self.config.replace(
            {QuotaEntity.of(entity): dict(values) for entity, values in quotas.items() if values}
        )

    def record_produce(self, client_id: str, user: str, produced_bytes: int) -> int:
        return self.manager.record_produce(self._clock_ms(), user, client_id, produced_bytes)

    def record_fetch(self, client_id: str, user: str, fetched_bytes: int) -> int:
        return self.manager.record_fetch(self._clock_ms(), user, client_id, fetched_bytes)

    def record_request(self, client_id: str, user: str, handler_time_ms: float) -> int:
        return self.manager.record_request_time(self._clock_ms(), user, client_id, handler_time_ms)
