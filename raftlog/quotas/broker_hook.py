"""The Kafka server's QuotaHook on a broker: the QuotaManager fed from the metadata image.

Quotas live in the metadata log as ClientQuota records; every broker rebuilds its QuotaConfig
from its committed image whenever the quotas in it change, so all brokers enforce the same
quotas within one metadata fetch of a change, and they survive restarts with the log.

The node also serves `QuotaManager.usage()` over its internal RPC ("quotas.usage"), as rows
of plain values so msgpack carries them; `usage_rows` is that method, UsageRowWire its row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

from raftlog.codec import Array, Codec, Size
from raftlog.metadata.image import MetadataDelta, MetadataImage
from raftlog.quotas.entity import (
    CONSUMER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaConfig,
    QuotaEntity,
    QuotaValidationError,
    validate_quota_value,
)
from raftlog.quotas.manager import QuotaLimits, QuotaManager, QuotaUsage
from raftlog.quotas.task_time import TaskTimeMeter, no_measure

log = logging.getLogger("raftlog.quotas")

# Smallest fetch response a consumer quota may cap a request to: below this the
# per-request overhead dominates and a consumer would crawl far under its quota.
MIN_FETCH_QUOTA_MAX_BYTES = 1024

# What a stored quota of 0 is enforced as (1 byte/s, 1 %, 1 mutation/s).
SMALLEST_QUOTA = 1.0


@dataclass(frozen=True, slots=True)
class UsageRowWire:
    """One row of the "quotas.usage" answer (a list of its fields, in this order)."""

    __wire__: ClassVar[Array] = Array()
    quota_key: str
    user: str
    client_id: str
    entity: tuple[tuple[str, str | None], ...]
    quota: float
    rate: float
    throttle_time_total_ms: Size


UsageWire = tuple[UsageRowWire, ...]
USAGE_CODEC = Codec()


class BrokerQuotas:
    """Implements raftlog.net.kafka.context.QuotaHook."""

    def __init__(self, limits: QuotaLimits, clock_ms: Callable[[], int]) -> None:
        self.config = QuotaConfig()
        self.manager = QuotaManager(self.config, limits)
        self._clock_ms = clock_ms
        self._seen: object = None
        self.task_time = TaskTimeMeter()
        self._measure_requests = False

    def on_metadata(self, image: MetadataImage, delta: MetadataDelta) -> None:
        quotas = image.client_quotas
        if quotas is self._seen:
            return  # copy-on-write image: the same mapping object means no quota changed
        self._seen = quotas
        table = _usable_table(quotas)
        self.config.replace(table)
        self._measure_requests = any(REQUEST_PERCENTAGE in values for values in table.values())

    # ------------------------------------------------------------------ QuotaHook
    def record_produce(self, client_id: str, user: str, produced_bytes: int) -> int:
        return self.manager.record_produce(self._clock_ms(), user, client_id, produced_bytes)

    def record_fetch(self, client_id: str, user: str, fetched_bytes: int) -> int:
        return self.manager.record_fetch(self._clock_ms(), user, client_id, fetched_bytes)

    def request_timer(self) -> AbstractContextManager[Callable[[], float]]:
        """Measures a request's run time on the event loop (see quotas.task_time); the meter
        is installed (inside trio, on first use) only while a request_percentage quota exists."""
        if self._measure_requests:
            self.task_time.install()
            return self.task_time.measure()
        self.task_time.uninstall()
        return no_measure()

    def record_request(self, client_id: str, user: str, handler_time_ms: float) -> int:
        return self.manager.record_request_time(self._clock_ms(), user, client_id, handler_time_ms)

    def record_mutations(
        self, client_id: str, user: str, count: int, strict: bool
    ) -> tuple[bool, int]:
        outcome = self.manager.record_mutations(
            self._clock_ms(), user, client_id, count, strict=strict
        )
        return outcome.accepted, outcome.throttle_time_ms

    def fetch_max_bytes(self, client_id: str, user: str) -> int | None:
        """Kafka's cap on one fetch response under a consumer quota: one window's worth.

        Without it a single fetch could return many seconds of quota at once and the client
        would then sit muted for up to a whole span; with it the bytes arrive evenly.
        """
        quota, _ = self.config.quota_for(user, client_id, CONSUMER_BYTE_RATE)
        if quota is None:
            return None
        window_bytes = int(quota * self.manager.limits.quota_window_size_s)
        return max(MIN_FETCH_QUOTA_MAX_BYTES, window_bytes)

    # ------------------------------------------------------------------ usage
    async def usage_rows(self, _body: Any = None) -> list[list[Any]]:
        """The "quotas.usage" RPC: one UsageRowWire per tracked sensor."""
        return usage_to_wire(self.manager.usage(self._clock_ms()))


def usage_to_wire(rows: Sequence[QuotaUsage]) -> list[list[Any]]:
    wire: list[list[Any]] = USAGE_CODEC.to_wire(
        tuple(
            UsageRowWire(
                row.quota_key,
                row.user,
                row.client_id,
                row.entity.components,
                row.quota,
                row.rate,
                row.throttle_time_total_ms,
            )
            for row in rows
        ),
        UsageWire,
    )
    return wire


def _usable_table(quotas: Any) -> dict[QuotaEntity, dict[str, float]]:
    """The image's quotas as QuotaConfig takes them; anything it would refuse is skipped.

    The controller validates alterations with its own rules (it accepts 0, for one); a value
    the broker cannot enforce must cost a log line, never the metadata listener.
    """
    table: dict[QuotaEntity, dict[str, float]] = {}
    for components, values in quotas.items():
        try:
            entity = QuotaEntity.of(components)
        except QuotaValidationError as exc:
            log.warning("ignoring quotas of entity %r: %s", components, exc)
            continue
        usable: dict[str, float] = {}
        for key, value in values.items():
            if value == 0:
                # Stored by a controller that accepts 0: the intent is "block", so enforce
                # the tightest quota QuotaConfig can hold rather than none at all.
                log.warning("quota %s of %s is 0; enforcing %s", key, entity, SMALLEST_QUOTA)
                value = SMALLEST_QUOTA
            try:
                usable[key] = validate_quota_value(key, value)
            except QuotaValidationError as exc:
                log.warning("ignoring quota %s of %s: %s", key, entity, exc)
        if usable:
            table[entity] = usable
    return table
