"""Per-broker quota accounting: record usage, answer how long to throttle (sans-IO).

The Kafka handlers call one `record_*` method per request with the request's principal, its
client id and `now_ms`, and put the returned throttle time into the response's
`throttle_time_ms`; the connection layer then mutes that connection for as long (KIP-219).
Nothing is dropped or failed, except controller mutations in strict mode (KIP-599), which
fail with THROTTLING_QUOTA_EXCEEDED while the entity's credits are overdrawn.

Sensors — the per-entity rate state — exist only for entities a quota applies to, so an
unquoted cluster keeps no per-client state at all. Idle sensors expire, and the number of
sensors is capped (least recently used goes first), so a flood of client ids cannot grow
memory without bound.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode
from raftlog.quotas.entity import (
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaConfig,
    QuotaEntity,
    sensor_tags,
)
from raftlog.quotas.rate import SampledRate, TokenBucket, pacing_throttle_ms

# Kafka records request time as a percentage of one thread: 1000 ms of thread time per
# second of wall time is 100 %.
PERCENT_PER_THREAD_MS = 100.0 / 1000.0


@dataclass(frozen=True)
class QuotaLimits:
    """Window shape and the bounds on throttling and on tracked state."""

    quota_window_num: int = 11
    quota_window_size_s: int = 1
    # Longest delay one response asks for; None means one full span
    # (quota_window_num * quota_window_size_s), beyond which the rate has forgotten the burst.
    max_throttle_time_ms: int | None = None
    # Sensors kept at once; the least recently used is dropped to make room.
    max_tracked_entities: int = 10_000
    # A sensor unused this long is dropped (Kafka's inactive-sensor expiry is one hour).
    sensor_idle_expiry_ms: int = 3_600_000
    # KIP-599: refuse mutations with THROTTLING_QUOTA_EXCEEDED instead of only delaying.
    controller_mutation_strict: bool = True

    def __post_init__(self) -> None:
        if self.quota_window_num < 2:
            raise ValueError(f"quota_window_num must be >= 2, got {self.quota_window_num}")
        if self.quota_window_size_s < 1:
            raise ValueError(f"quota_window_size_s must be >= 1, got {self.quota_window_size_s}")
        if self.max_tracked_entities < 1:
            raise ValueError(f"max_tracked_entities must be >= 1, got {self.max_tracked_entities}")
        if self.sensor_idle_expiry_ms < 1:
            raise ValueError(
                f"sensor_idle_expiry_ms must be >= 1, got {self.sensor_idle_expiry_ms}"
            )

    @property
    def window_size_ms(self) -> int:
        return self.quota_window_size_s * 1000

    @property
    def span_ms(self) -> int:
        return self.quota_window_num * self.window_size_ms

    @property
    def throttle_cap_ms(self) -> int:
        return self.span_ms if self.max_throttle_time_ms is None else self.max_throttle_time_ms

    @classmethod
    def from_node_config(cls, config: NodeConfig, **overrides: object) -> QuotaLimits:
        return cls(
            quota_window_num=config.quota_window_num,
            quota_window_size_s=config.quota_window_size_s,
            **overrides,  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class MutationOutcome:
    """What to answer a CreateTopics/CreatePartitions/DeleteTopics for its mutations."""

    accepted: bool
    throttle_time_ms: int
    error: ErrorCode = ErrorCode.none


@dataclass(frozen=True)
class QuotaUsage:
    """One tracked sensor, for `raftlog quotas describe --usage`."""

    quota_key: str
    user: str  # "" when the quota is not per user
    client_id: str  # "" when the quota is not per client id
    entity: QuotaEntity  # where the quota value came from
    quota: float
    rate: float  # bytes/s, percent, or mutations/s depending on quota_key
    throttle_time_total_ms: int


class _Sensor:
    __slots__ = ("bucket", "entity", "last_record_ms", "quota", "rate", "throttle_time_total_ms")

    def __init__(self, rate: SampledRate, quota: float, entity: QuotaEntity) -> None:
        self.rate = rate
        self.bucket: TokenBucket | None = None
        self.quota = quota
        self.entity = entity
        self.last_record_ms = 0
        self.throttle_time_total_ms = 0


_SensorKey = tuple[str, str, str]  # (quota key, user tag, client-id tag)


class QuotaManager:
    """Quota accounting for one broker; see the module docstring for the contract."""

    def __init__(self, config: QuotaConfig, limits: QuotaLimits | None = None) -> None:
        self.config = config
        self.limits = limits or QuotaLimits()
        # Kept in least-recently-recorded order: expiry and eviction pop from the front.
        self._sensors: OrderedDict[_SensorKey, _Sensor] = OrderedDict()
        self.evicted_sensors = 0
        self.expired_sensors = 0

    @property
    def tracked_entities(self) -> int:
        return len(self._sensors)

    # ------------------------------------------------------------------ recording
    def record_produce(self, now_ms: int, user: str, client_id: str, size_bytes: int) -> int:
        """Count produced bytes; return the throttle time in ms (0: no quota or within it)."""
        return self._record_rate(PRODUCER_BYTE_RATE, now_ms, user, client_id, float(size_bytes))

    def record_fetch(self, now_ms: int, user: str, client_id: str, size_bytes: int) -> int:
        """Count fetched bytes (the response size); return the throttle time in ms."""
        return self._record_rate(CONSUMER_BYTE_RATE, now_ms, user, client_id, float(size_bytes))

    def record_request_time(
        self, now_ms: int, user: str, client_id: str, thread_time_ms: float
    ) -> int:
        """Count request-handling thread time against request_percentage; return throttle ms."""
        value = thread_time_ms * PERCENT_PER_THREAD_MS
        return self._record_rate(REQUEST_PERCENTAGE, now_ms, user, client_id, value)

    def record_mutations(
        self,
        now_ms: int,
        user: str,
        client_id: str,
        count: int,
        *,
        strict: bool | None = None,
    ) -> MutationOutcome:
        """Count partition mutations against controller_mutation_rate (KIP-599 credits).

        Strict (CreateTopics v6+, CreatePartitions v3+, DeleteTopics v5+): while the credits
        are overdrawn the request is refused with THROTTLING_QUOTA_EXCEEDED and nothing is
        counted. Permissive (older versions): always accepted, only delayed.
        """
        strict = self.limits.controller_mutation_strict if strict is None else strict
        sensor = self._sensor(CONTROLLER_MUTATION_RATE, now_ms, user, client_id)
        if sensor is None:
            return MutationOutcome(True, 0)
        bucket = sensor.bucket
        assert bucket is not None, "mutation sensors always carry a token bucket"
        cap_ms = self.limits.throttle_cap_ms
        if strict and bucket.exhausted(now_ms):
            wait_ms = bucket.throttle_time_ms(now_ms, cap_ms)
            sensor.throttle_time_total_ms += wait_ms
            return MutationOutcome(False, wait_ms, ErrorCode.throttling_quota_exceeded)
        bucket.record(float(count), now_ms)
        sensor.rate.record(float(count), now_ms)
        wait_ms = bucket.throttle_time_ms(now_ms, cap_ms)
        sensor.throttle_time_total_ms += wait_ms
        return MutationOutcome(True, wait_ms)

    def _record_rate(self, key: str, now_ms: int, user: str, client_id: str, value: float) -> int:
        sensor = self._sensor(key, now_ms, user, client_id)
        if sensor is None:
            return 0
        # Like Kafka, the usage is counted even when it is over quota: the client is delayed,
        # never refused, so the bytes were really served.
        sensor.rate.record(value, now_ms)
        wait_ms = pacing_throttle_ms(
            sensor.rate.total(now_ms),
            sensor.quota,
            sensor.rate.elapsed_ms(now_ms),
            self.limits.throttle_cap_ms,
        )
        sensor.throttle_time_total_ms += wait_ms
        return wait_ms

    # ------------------------------------------------------------------ sensors
    def _sensor(self, key: str, now_ms: int, user: str, client_id: str) -> _Sensor | None:
        self.expire_idle(now_ms)
        quota, entity = self.config.quota_for(user, client_id, key)
        if quota is None or entity is None:
            return None
        user_tag, client_tag = sensor_tags(entity, user, client_id)
        sensor_key = (key, user_tag, client_tag)
        sensor = self._sensors.get(sensor_key)
        if sensor is None:
            while len(self._sensors) >= self.limits.max_tracked_entities:
                self._sensors.popitem(last=False)
                self.evicted_sensors += 1
            rate = SampledRate(self.limits.quota_window_num, self.limits.window_size_ms)
            sensor = _Sensor(rate, quota, entity)
            if key == CONTROLLER_MUTATION_RATE:
                sensor.bucket = TokenBucket(quota, self._burst(quota), now_ms)
            self._sensors[sensor_key] = sensor
        else:
            self._sensors.move_to_end(sensor_key)
            if sensor.quota != quota and sensor.bucket is not None:
                sensor.bucket.set_rate(quota, self._burst(quota), now_ms)
            # The rate history stays: a quota change must not hand out a fresh allowance.
            sensor.quota = quota
            sensor.entity = entity
        sensor.last_record_ms = now_ms
        return sensor

    def _burst(self, quota: float) -> float:
        # KIP-599: the bucket holds one full span of credits.
        return quota * self.limits.quota_window_num * self.limits.quota_window_size_s

    def expire_idle(self, now_ms: int) -> int:
        """Drop sensors idle for sensor_idle_expiry_ms; return how many went."""
        expired = 0
        expiry_ms = self.limits.sensor_idle_expiry_ms
        while self._sensors:
            oldest = next(iter(self._sensors.values()))
            if now_ms - oldest.last_record_ms < expiry_ms:
                break
            self._sensors.popitem(last=False)
            expired += 1
        self.expired_sensors += expired
        return expired

    # ------------------------------------------------------------------ reporting
    def usage(self, now_ms: int) -> list[QuotaUsage]:
        """Current rate and total throttle time of every tracked sensor, sorted."""
        self.expire_idle(now_ms)
        rows = [
            QuotaUsage(
                quota_key=key,
                user=user_tag,
                client_id=client_tag,
                entity=sensor.entity,
                quota=sensor.quota,
                rate=sensor.rate.measure(now_ms),
                throttle_time_total_ms=sensor.throttle_time_total_ms,
            )
            for (key, user_tag, client_tag), sensor in self._sensors.items()
        ]
        rows.sort(key=lambda row: (row.user, row.client_id, row.quota_key))
        return rows
