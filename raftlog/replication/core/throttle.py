"""Replication throttles: Kafka's replication quotas (KIP-73), as reassignments use them.

Four configs decide them, spelled as Kafka spells them:
- broker configs `leader.replication.throttled.rate` and `follower.replication.throttled.rate`
  (bytes/s; per broker, else the cluster default, else unthrottled);
- topic configs `leader.replication.throttled.replicas` and
  `follower.replication.throttled.replicas`: "partition:broker" pairs, or "*" for every replica.

A leader throttles what it sends to a follower of a partition listed with the leader's own
broker id; a follower throttles what it fetches of a partition listed with its own id. In both
cases only a replica outside the ISR is throttled (Kafka's rule): a lagging or joining replica
may be slowed, an in-sync one never, so acks=all produces do not wait for a throttle.

The quota of each side is one byte budget per broker shared by all its throttled partitions: a
token bucket (raftlog.quotas.rate.TokenBucket) refilling at the rate and holding at most
THROTTLE_BURST_S of it. A throttled read may return at most what the bucket holds, and one
batch more than that (the read must make progress); the overdraft is paid back before the
next throttled byte moves, so over any longer span the bytes moved keep to the rate.

Nothing here reads a clock or the image object itself: callers pass `now_ms` and the image's
configs mapping.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from raftlog.codec import I64_MAX
from raftlog.config_keys import (
    MAX_THROTTLED_REPLICAS,
    ThrottledReplicas,
    parse_throttled_replicas,
)
from raftlog.constants import MS_PER_S
from raftlog.quotas.rate import TokenBucket

__all__ = [
    "FOLLOWER_THROTTLED_RATE",
    "FOLLOWER_THROTTLED_REPLICAS",
    "LEADER_THROTTLED_RATE",
    "LEADER_THROTTLED_REPLICAS",
    "THROTTLE_BURST_S",
    "ByteRateLimit",
    "ThrottlePolicy",
    "ThrottledReplicas",
    "format_throttled_replicas",
    "parse_throttled_replicas",
]

LEADER_THROTTLED_RATE = "leader.replication.throttled.rate"
FOLLOWER_THROTTLED_RATE = "follower.replication.throttled.rate"
LEADER_THROTTLED_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_THROTTLED_REPLICAS = "follower.replication.throttled.replicas"
# Kafka's default rate (Long.MAX_VALUE): no throttle.
UNTHROTTLED_RATE = I64_MAX
# The bucket holds one second of the rate: a move starts at once, then keeps to the rate.
THROTTLE_BURST_S = 1.0
# With a rate of 0 nothing throttled moves; the wait before looking again (a config change
# lifts it).
BLOCKED_RECHECK_MS = 1000

ConfigsView = Mapping[tuple[str, str], Mapping[str, str]]


def format_throttled_replicas(pairs: Iterable[tuple[int, int]]) -> str:
    """The config value naming `pairs`, sorted ("0:1,0:2,1:3"); "*" (every replica of the
    topic) when they are more than a list may hold."""
    unique = sorted(set(pairs))
    if len(unique) > MAX_THROTTLED_REPLICAS:
        return "*"
    return ",".join(f"{p}:{b}" for p, b in unique)


def _rate(configs: ConfigsView, broker_id: int, key: str) -> int | None:
    """The broker's own value, else the cluster default; None: unthrottled."""
    for resource in (("broker", str(broker_id)), ("cluster", "")):
        raw = configs.get(resource, {}).get(key)
        if raw is None:
            continue
        try:
            rate = int(raw.strip())
        except ValueError:
            return None  # the controller validates values; an unreadable one throttles nothing
        return None if rate < 0 or rate >= UNTHROTTLED_RATE else rate
    return None


def _throttled(configs: ConfigsView, key: str, broker_id: int) -> dict[str, frozenset[int] | None]:
    out: dict[str, frozenset[int] | None] = {}
    for (kind, name), values in configs.items():
        raw = values.get(key) if kind == "topic" else None
        if raw is None:
            continue
        try:
            partitions = parse_throttled_replicas(raw).partitions_of(broker_id)
        except ValueError:
            continue
        if partitions is None or partitions:
            out[name] = partitions
    return out


@dataclass(frozen=True)
class ThrottlePolicy:
    """What one broker throttles, read from the image's configs: the two rates and, per
    topic, the partitions throttled on this broker (None: every partition of the topic)."""

    leader_rate_bytes_per_s: int | None = None
    follower_rate_bytes_per_s: int | None = None
    leader_partitions: Mapping[str, frozenset[int] | None] = field(default_factory=dict)
    follower_partitions: Mapping[str, frozenset[int] | None] = field(default_factory=dict)

    @classmethod
    def from_configs(cls, configs: ConfigsView, broker_id: int) -> ThrottlePolicy:
        return cls(
            leader_rate_bytes_per_s=_rate(configs, broker_id, LEADER_THROTTLED_RATE),
            follower_rate_bytes_per_s=_rate(configs, broker_id, FOLLOWER_THROTTLED_RATE),
            leader_partitions=_throttled(configs, LEADER_THROTTLED_REPLICAS, broker_id),
            follower_partitions=_throttled(configs, FOLLOWER_THROTTLED_REPLICAS, broker_id),
        )

    @staticmethod
    def _listed(table: Mapping[str, frozenset[int] | None], topic: str, partition: int) -> bool:
        if topic not in table:
            return False
        partitions = table[topic]
        return partitions is None or partition in partitions

    def leader_throttles(
        self, topic: str, partition: int, follower_id: int, isr: frozenset[int]
    ) -> bool:
        """Whether this broker, leading the partition, throttles what it sends `follower_id`."""
        return (
            self.leader_rate_bytes_per_s is not None
            and follower_id not in isr
            and self._listed(self.leader_partitions, topic, partition)
        )

    def follower_throttles(
        self, topic: str, partition: int, replica_id: int, isr: frozenset[int]
    ) -> bool:
        """Whether this broker, following the partition, throttles what it fetches of it."""
        return (
            self.follower_rate_bytes_per_s is not None
            and replica_id not in isr
            and self._listed(self.follower_partitions, topic, partition)
        )


class ByteRateLimit:
    """One side's byte budget on one broker: how many bytes a throttled read may move now."""

    __slots__ = ("_bucket", "rate_bytes_per_s")

    def __init__(self, rate_bytes_per_s: int, now_ms: int) -> None:
        self.rate_bytes_per_s = -1
        self._bucket: TokenBucket | None = None
        self.set_rate(rate_bytes_per_s, now_ms)

    def set_rate(self, rate_bytes_per_s: int, now_ms: int) -> None:
        """A changed rate applies from now; credit earned at the old rate is kept (up to the
        new burst), debt too."""
        if rate_bytes_per_s < 0:
            raise ValueError(f"rate_bytes_per_s must be 0 or more, got {rate_bytes_per_s}")
        if rate_bytes_per_s == self.rate_bytes_per_s:
            return
        self.rate_bytes_per_s = rate_bytes_per_s
        if rate_bytes_per_s == 0:
            self._bucket = None
            return
        burst = rate_bytes_per_s * THROTTLE_BURST_S
        if self._bucket is None:
            self._bucket = TokenBucket(rate_bytes_per_s, burst, now_ms)
        else:
            self._bucket.set_rate(rate_bytes_per_s, burst, now_ms)

    def allowance_bytes(self, now_ms: int) -> int:
        """Bytes a throttled read may return now (0: none; wait wait_ms). A read given a
        positive allowance may still return one whole batch beyond it."""
        bucket = self._bucket
        if bucket is None:
            return 0
        bucket.exhausted(now_ms)  # refills up to now
        return max(0, math.ceil(bucket.tokens))

    def record(self, size_bytes: int, now_ms: int) -> None:
        """Bytes a throttled read returned."""
        if size_bytes < 0:
            raise ValueError(f"size_bytes must be 0 or more, got {size_bytes}")
        if self._bucket is not None and size_bytes:
            self._bucket.record(size_bytes, now_ms)

    def wait_ms(self, now_ms: int) -> int:
        """How long until allowance_bytes is positive again (0: it is now)."""
        bucket = self._bucket
        if bucket is None:
            return BLOCKED_RECHECK_MS
        bucket.exhausted(now_ms)
        if bucket.tokens > 0:
            return 0
        # One byte of credit past zero, rounded up: never an answer of 0 while blocked.
        return max(1, math.ceil((1 - bucket.tokens) / bucket.rate_per_s * MS_PER_S))


class ThrottleState:
    """A broker's policy and its two budgets, kept in step with the image's configs."""

    __slots__ = ("_configs", "broker_id", "follower", "leader", "policy")

    def __init__(self, broker_id: int) -> None:
        self.broker_id = broker_id
        self.policy = ThrottlePolicy()
        self._configs: object = None
        self.leader: ByteRateLimit | None = None
        self.follower: ByteRateLimit | None = None

    def update(self, configs: ConfigsView, now_ms: int) -> ThrottlePolicy:
        """Re-read the policy when the configs mapping changed (the image is copy-on-write:
        the same mapping object means no config changed), and return it."""
        if configs is self._configs:
            return self.policy
        self._configs = configs
        self.policy = ThrottlePolicy.from_configs(configs, self.broker_id)
        self.leader = _limit(self.leader, self.policy.leader_rate_bytes_per_s, now_ms)
        self.follower = _limit(self.follower, self.policy.follower_rate_bytes_per_s, now_ms)
        return self.policy


def _limit(current: ByteRateLimit | None, rate: int | None, now_ms: int) -> ByteRateLimit | None:
    if rate is None:
        return None
    if current is None:
        return ByteRateLimit(rate, now_ms)
    current.set_rate(rate, now_ms)
    return current
