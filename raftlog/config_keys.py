"""The dynamic config keys: topic and broker configs as AlterConfigs and CreateTopics carry them.

One table per resource type, keyed by Kafka's spelling. Each key names how its text value is
parsed and bounded (the controller refuses a bad value with INVALID_CONFIG, the image parses
stored values with the same function), the node default DescribeConfigs shows when the key is
unset, and for topic keys the LogConfig field storage reads, so a key the controller accepts is
a key storage knows. Values stay strings everywhere they are stored, exactly as clients send them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from raftlog.codec import I32_MAX, I64_MAX
from raftlog.config import CLEANUP_POLICIES, FLUSH_POLICIES, NodeConfig
from raftlog.constants import MIB
from raftlog.errors import RemoteError
from raftlog.records import HEADER_SIZE_BYTES

__all__ = [
    "BROKER_CONFIGS",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MESSAGE_TIMESTAMP_TYPE",
    "LIST_KEYS",
    "LOG_CONFIG_KEYS",
    "MESSAGE_TIMESTAMP_TYPES",
    "TOPIC_CONFIGS",
    "ConfigKey",
    "ConfigValueError",
    "log_overrides",
    "parse_topic_config",
    "validate_configs",
]

# Kafka's default max.message.bytes (1 MiB + record batch overhead).
DEFAULT_MAX_MESSAGE_BYTES = 1 * MIB + 12
# message.timestamp.type values (KIP-32): LogAppendTime makes the leader stamp each batch.
MESSAGE_TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
DEFAULT_MESSAGE_TIMESTAMP_TYPE = "CreateTime"


class ConfigValueError(RemoteError, ValueError):
    """A config value a client sent does not parse or is out of bounds."""


@dataclass(frozen=True, slots=True)
class ConfigKey:
    # Parses the stored text to its type; raises ConfigValueError with Kafka's bounds.
    parse: Callable[[str], Any]
    # The value DescribeConfigs shows when the key is unset (every listed key has one).
    default: Callable[[NodeConfig], str] | None = None
    # The LogConfig field this topic key sets; "" for a key storage accepts and ignores (our
    # indexes grow as needed, so segment.index.bytes has nothing to size); None when storage
    # never sees the key (it is read elsewhere, like min.insync.replicas, or not at all).
    log_field: str | None = None


def _int(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ConfigValueError(f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise ConfigValueError(f"{value} is outside {lo}..{hi}")
        return value

    return parse


def _double(lo: float, hi: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise ConfigValueError(f"{text!r} is not a number") from None
        if not (math.isfinite(value) and lo <= value <= hi):
            raise ConfigValueError(f"{value} is outside {lo}..{hi}")
        return value

    return parse


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ConfigValueError(f"{text!r} is not true or false")
    return lowered == "true"


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.strip() not in choices:
            raise ConfigValueError(f"{text!r} is not one of {list(choices)}")
        return text.strip()

    return parse


def _choice_list(*choices: str) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        bad = [item for item in items if item not in choices]
        if bad or not items:
            raise ConfigValueError(f"{text!r} must be a list of {list(choices)}")
        return items

    return parse


def _show_bool(value: bool) -> str:
    return "true" if value else "false"


_COMPRESSION = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
_MESSAGE_FORMAT_VERSION = re.compile(r"\d{1,2}(\.\d{1,2}){1,3}(-IV\d{1,2})?")


def _message_format_version(text: str) -> str:
    """A Kafka version as message.format.version takes it: 0.10.0, 2.8-IV1, 3.0-IV1."""
    value = text.strip()
    if not _MESSAGE_FORMAT_VERSION.fullmatch(value):
        raise ConfigValueError(f"{text!r} is not a Kafka version")
    return value


# Kafka's ThrottledReplicaListValidator accepts "partition:broker" entries of digits.
_THROTTLED_ENTRY = re.compile(r"\d{1,10}:\d{1,10}")
# A list longer than this is refused. Every broker parses each topic's lists on the event
# loop when any config changes: 10,000 pairs take a few milliseconds, the 3.2 million a
# topic of 100,000 partitions of 32 replicas could name would take seconds. A throttle of
# every replica of a bigger topic is "*".
MAX_THROTTLED_REPLICAS = 10_000


@dataclass(frozen=True, slots=True)
class ThrottledReplicas:
    """One topic's throttled replica list: every replica ("*"), or (partition, broker) pairs."""

    every: bool = False
    replicas: frozenset[tuple[int, int]] = field(default_factory=frozenset)

    def covers(self, partition: int, broker_id: int) -> bool:
        return self.every or (partition, broker_id) in self.replicas

    def partitions_of(self, broker_id: int) -> frozenset[int] | None:
        """The partitions throttled on `broker_id` (None: all of them)."""
        if self.every:
            return None
        return frozenset(p for p, b in self.replicas if b == broker_id)


def parse_throttled_replicas(text: str) -> ThrottledReplicas:
    """Kafka's format: "*", or comma-separated "partition:broker" entries (may be empty).
    Raises ValueError naming what is wrong."""
    value = text.strip()
    if value == "*":
        return ThrottledReplicas(every=True)
    pairs: set[tuple[int, int]] = set()
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            continue
        if not _THROTTLED_ENTRY.fullmatch(entry):
            raise ValueError(
                f"{entry!r} is not partition:broker (a list of them, or * for every replica)"
            )
        partition, broker = (int(part) for part in entry.split(":"))
        if partition > I32_MAX or broker > I32_MAX:
            raise ValueError(f"{entry!r}: partition and broker ids are at most {I32_MAX}")
        pairs.add((partition, broker))
        if len(pairs) > MAX_THROTTLED_REPLICAS:
            raise ValueError(f"more than {MAX_THROTTLED_REPLICAS} throttled replicas")
    return ThrottledReplicas(replicas=frozenset(pairs))


def _throttled_replicas(text: str) -> str:
    try:
        parse_throttled_replicas(text)
    except ValueError as exc:
        raise ConfigValueError(str(exc)) from None
    return text.strip()


_CLEANUP = _choice_list(*CLEANUP_POLICIES)
# Keys whose value is a comma-separated list (IncrementalAlterConfigs APPEND/SUBTRACT apply).
LIST_KEYS = frozenset(
    {
        "cleanup.policy",
        "log.cleanup.policy",
        "follower.replication.throttled.replicas",
        "leader.replication.throttled.replicas",
    }
)

# Topic-level configs (Kafka's names and bounds).
TOPIC_CONFIGS: Mapping[str, ConfigKey] = {
    "cleanup.policy": ConfigKey(_CLEANUP, lambda c: c.cleanup_policy, "cleanup_policy"),
    "compression.type": ConfigKey(_choice(*_COMPRESSION), lambda c: "producer"),
    "delete.retention.ms": ConfigKey(
        _int(0, I64_MAX), lambda c: str(c.delete_retention_ms), "delete_retention_ms"
    ),
    # Keys below with a fixed default: accepted and stored, the behaviour being Kafka's
    # default (DescribeConfigs must show every key it lists with a value).
    "file.delete.delay.ms": ConfigKey(_int(0, I64_MAX), lambda c: "60000"),
    # flush.policy=always fsyncs every produce before it counts: a flush per message batch.
    "flush.messages": ConfigKey(
        _int(1, I64_MAX), lambda c: "1" if c.flush_policy == "always" else str(I64_MAX)
    ),
    # At least 1: an interval flusher wakes every flush.ms.
    "flush.ms": ConfigKey(
        _int(1, I64_MAX), lambda c: str(c.flush_interval_ms), "flush_interval_ms"
    ),
    "flush.policy": ConfigKey(_choice(*FLUSH_POLICIES), lambda c: c.flush_policy, "flush_policy"),
    # Replicas whose replication the brokers' throttled rates limit (KIP-455 reassignments).
    "follower.replication.throttled.replicas": ConfigKey(_throttled_replicas, lambda c: ""),
    "index.interval.bytes": ConfigKey(
        _int(0, I32_MAX), lambda c: str(c.index_interval_bytes), "index_interval_bytes"
    ),
    "leader.replication.throttled.replicas": ConfigKey(_throttled_replicas, lambda c: ""),
    "max.compaction.lag.ms": ConfigKey(_int(1, I64_MAX), lambda c: str(I64_MAX)),
    # Nothing smaller than a batch header can be appended (nor fill a segment).
    "max.message.bytes": ConfigKey(
        _int(HEADER_SIZE_BYTES, I32_MAX),
        lambda c: str(DEFAULT_MAX_MESSAGE_BYTES),
        "max_message_bytes",
    ),
    # No node-level log.message.timestamp.type: every topic defaults to what LogConfig does.
    "message.timestamp.type": ConfigKey(
        _choice(*MESSAGE_TIMESTAMP_TYPES),
        lambda c: DEFAULT_MESSAGE_TIMESTAMP_TYPE,
        "message_timestamp_type",
    ),
    # Deprecated in Kafka 3 and ignored there since 3.0 (every batch is RecordBatch v2, as
    # here); accepted so that tools written for Kafka 3 can still set it.
    "message.format.version": ConfigKey(_message_format_version, lambda c: "3.0-IV1"),
    "message.timestamp.difference.max.ms": ConfigKey(_int(0, I64_MAX), lambda c: str(I64_MAX)),
    "min.cleanable.dirty.ratio": ConfigKey(_double(0.0, 1.0), lambda c: "0.5"),
    "min.compaction.lag.ms": ConfigKey(_int(0, I64_MAX), lambda c: "0"),
    "min.insync.replicas": ConfigKey(_int(1, I32_MAX), lambda c: str(c.min_insync_replicas)),
    "preallocate": ConfigKey(_bool, lambda c: "false"),
    "retention.bytes": ConfigKey(
        _int(-1, I64_MAX), lambda c: str(c.retention_bytes), "retention_bytes"
    ),
    "retention.ms": ConfigKey(_int(-1, I64_MAX), lambda c: str(c.retention_ms), "retention_ms"),
    "segment.bytes": ConfigKey(
        _int(HEADER_SIZE_BYTES, I32_MAX), lambda c: str(c.segment_bytes), "segment_bytes"
    ),
    "segment.index.bytes": ConfigKey(_int(4, I32_MAX), lambda c: "10485760", log_field=""),
    "segment.jitter.ms": ConfigKey(_int(0, I64_MAX), lambda c: "0"),
    "segment.ms": ConfigKey(_int(1, I64_MAX), lambda c: str(c.segment_ms), "segment_ms"),
    "unclean.leader.election.enable": ConfigKey(
        _bool, lambda c: _show_bool(c.unclean_leader_election)
    ),
}

# The topic keys that reach storage (a log's overrides file holds exactly these).
LOG_CONFIG_KEYS = frozenset(
    key for key, spec in TOPIC_CONFIGS.items() if spec.log_field is not None
)

# Dynamic broker configs, settable per broker or as cluster defaults.
BROKER_CONFIGS: Mapping[str, ConfigKey] = {
    "auto.create.topics.enable": ConfigKey(
        _bool, lambda c: _show_bool(c.auto_create_topics_enable)
    ),
    "compression.type": ConfigKey(_choice(*_COMPRESSION), lambda c: "producer"),
    "follower.replication.throttled.rate": ConfigKey(_int(0, I64_MAX), lambda c: str(I64_MAX)),
    "leader.replication.throttled.rate": ConfigKey(_int(0, I64_MAX), lambda c: str(I64_MAX)),
    "log.cleanup.policy": ConfigKey(_CLEANUP, lambda c: c.cleanup_policy),
    "log.retention.bytes": ConfigKey(_int(-1, I64_MAX), lambda c: str(c.retention_bytes)),
    "log.retention.ms": ConfigKey(_int(-1, I64_MAX), lambda c: str(c.retention_ms)),
    "log.segment.bytes": ConfigKey(
        _int(HEADER_SIZE_BYTES, I32_MAX), lambda c: str(c.segment_bytes)
    ),
    "message.max.bytes": ConfigKey(
        _int(HEADER_SIZE_BYTES, I32_MAX), lambda c: str(DEFAULT_MAX_MESSAGE_BYTES)
    ),
    "min.insync.replicas": ConfigKey(_int(1, I32_MAX), lambda c: str(c.min_insync_replicas)),
    "num.partitions": ConfigKey(_int(1, 100_000), lambda c: str(c.num_partitions)),
    # raftlog has no Kerberos (GSSAPI): stored and shown, no effect, so tools that set
    # Kafka's dynamic SASL keys on a broker get the answer Kafka gives (librdkafka's 0081).
    "sasl.kerberos.min.time.before.relogin": ConfigKey(_int(0, I64_MAX), lambda c: "60000"),
    "unclean.leader.election.enable": ConfigKey(
        _bool, lambda c: _show_bool(c.unclean_leader_election)
    ),
}


def parse_topic_config(key: str, value: str) -> Any:
    """Parse a stored topic config value to its type; unknown keys come back as strings."""
    spec = TOPIC_CONFIGS.get(key)
    return value if spec is None else spec.parse(value)


def log_overrides(configs: Mapping[str, str]) -> dict[str, str]:
    """The part of a topic's configs that storage reads (LogConfig.from_node_config's input)."""
    return {key: value for key, value in configs.items() if key in LOG_CONFIG_KEYS}


def validate_configs(schema: Mapping[str, ConfigKey], configs: Mapping[str, Any]) -> str | None:
    """None when every key is known and every value parses, else the message for INVALID_CONFIG."""
    for key, value in configs.items():
        spec = schema.get(key)
        if spec is None:
            return f"unknown config key {key!r}"
        if not isinstance(value, str):
            return f"config {key} must be a string, got {value!r}"
        try:
            spec.parse(value)
        except ConfigValueError as exc:
            return f"invalid value for {key}: {exc}"
    return None
