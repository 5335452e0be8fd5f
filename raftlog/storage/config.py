"""Per-partition log configuration: node defaults plus Kafka-spelled topic overrides."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from raftlog.config import CLEANUP_POLICIES, FLUSH_POLICIES, NodeConfig
from raftlog.config_keys import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MESSAGE_TIMESTAMP_TYPE,
    MESSAGE_TIMESTAMP_TYPES,
    TOPIC_CONFIGS,
)
from raftlog.constants import MIB
from raftlog.errors import ConfigError

# LogConfig fields taken as text (the rest are integers); __post_init__ checks them.
_TEXT_FIELDS = frozenset({"cleanup_policy", "flush_policy", "message_timestamp_type"})


@dataclass(frozen=True)
class LogConfig:
    segment_bytes: int = 1024 * MIB
    segment_ms: int = 7 * 24 * 3_600_000
    index_interval_bytes: int = 4096
    retention_ms: int = 7 * 24 * 3_600_000
    retention_bytes: int = -1
    cleanup_policy: str = "delete"
    delete_retention_ms: int = 24 * 3_600_000
    flush_policy: str = "always"
    flush_interval_ms: int = 1000
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    message_timestamp_type: str = DEFAULT_MESSAGE_TIMESTAMP_TYPE

    def __post_init__(self) -> None:
        if self.segment_bytes < 61:
            raise ConfigError(f"segment.bytes = {self.segment_bytes} is below one batch header")
        if self.segment_bytes > 2**31 - 1:
            # index positions are u32 relative to the segment; keep well inside that.
            raise ConfigError(f"segment.bytes = {self.segment_bytes} is above 2 GiB - 1")
        if self.segment_ms < 1 or self.flush_interval_ms < 1:
            raise ConfigError("segment.ms and flush.ms must be at least 1")
        if self.index_interval_bytes < 0 or self.delete_retention_ms < 0:
            raise ConfigError("index.interval.bytes and delete.retention.ms must be >= 0")
        if self.retention_ms < -1 or self.retention_bytes < -1:
            raise ConfigError("retention.ms and retention.bytes must be >= -1")
        if self.max_message_bytes < 61:
            raise ConfigError(f"max.message.bytes = {self.max_message_bytes} is too small")
        if self.cleanup_policy not in CLEANUP_POLICIES:
            raise ConfigError(
                f"cleanup.policy must be one of {list(CLEANUP_POLICIES)}, "
                f"got {self.cleanup_policy!r}"
            )
        if self.flush_policy not in FLUSH_POLICIES:
            raise ConfigError(
                f"flush.policy must be one of {list(FLUSH_POLICIES)}, got {self.flush_policy!r}"
            )
        if self.message_timestamp_type not in MESSAGE_TIMESTAMP_TYPES:
            raise ConfigError(
                f"message.timestamp.type must be one of {list(MESSAGE_TIMESTAMP_TYPES)}, "
                f"got {self.message_timestamp_type!r}"
            )

    @property
    def compact(self) -> bool:
        return self.cleanup_policy == "compact"

    @classmethod
    def from_node_config(
        cls, node: NodeConfig, overrides: dict[str, str] | None = None
    ) -> LogConfig:
        values: dict[str, object] = {
            f.name: getattr(node, f.name) for f in dataclasses.fields(cls) if hasattr(node, f.name)
        }
        for key, text in (overrides or {}).items():
            spec = TOPIC_CONFIGS.get(key)
            if spec is None or spec.log_field is None:
                raise ConfigError(f"unknown topic config {key!r}")
            name = spec.log_field
            if not name:
                continue
            if name in _TEXT_FIELDS:
                values[name] = text.strip()
                continue
            try:
                values[name] = int(text)
            except ValueError:
                raise ConfigError(f"topic config {key} must be an integer, got {text!r}") from None
        return cls(**values)  # type: ignore[arg-type]
