"""Per-partition log configuration: node defaults plus Kafka-spelled topic overrides."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from raftlog.config import NodeConfig
from raftlog.config_keys import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MESSAGE_TIMESTAMP_TYPE,
    TOPIC_CONFIGS,
    ConfigValueError,
)
from raftlog.constants import MIB
from raftlog.errors import ConfigError

# LogConfig field -> the topic key that sets it: every field is checked with the key's own
# parser, so a value the controller accepts is a value storage accepts, and the reverse.
_FIELD_KEYS = {spec.log_field: key for key, spec in TOPIC_CONFIGS.items() if spec.log_field}


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
        for field in dataclasses.fields(self):
            key = _FIELD_KEYS[field.name]
            try:
                parsed = TOPIC_CONFIGS[key].parse(str(getattr(self, field.name)))
            except ConfigValueError as exc:
                raise ConfigError(f"{key}: {exc}") from None
            if isinstance(parsed, list):  # cleanup.policy: keep one spelling of the set
                object.__setattr__(self, field.name, ",".join(sorted(set(parsed))))

    @property
    def cleanup_policies(self) -> frozenset[str]:
        return frozenset(self.cleanup_policy.split(","))

    @property
    def compact(self) -> bool:
        """cleanup.policy includes compact: the cleaner keeps the newest record per key."""
        return "compact" in self.cleanup_policies

    @property
    def delete(self) -> bool:
        """cleanup.policy includes delete: retention removes old segments."""
        return "delete" in self.cleanup_policies

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
            try:
                parsed = spec.parse(text)
            except ConfigValueError as exc:
                raise ConfigError(f"topic config {key}: {exc}") from None
            if not spec.log_field:
                continue
            values[spec.log_field] = ",".join(parsed) if isinstance(parsed, list) else parsed
        return cls(**values)  # type: ignore[arg-type]
