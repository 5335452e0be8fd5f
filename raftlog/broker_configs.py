"""What DescribeConfigs shows: every known topic/broker key with its value and source.

A topic's effective value is its dynamic config if set, else the node default (from
NodeConfig, spelled the Kafka way); the same lookup feeds the replica manager through
MetadataImage.topic_config, so what a client is shown is what the broker enforces.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from raftlog.config import NodeConfig
from raftlog.metadata.controller.configs import BROKER_CONFIGS, TOPIC_CONFIGS
from raftlog.net.kafka.backend import ConfigEntry, ConfigSource
from raftlog.storage.config import DEFAULT_MAX_MESSAGE_BYTES, LogConfig


def _bool(value: bool) -> str:
    return "true" if value else "false"


TOPIC_DEFAULTS: dict[str, Callable[[NodeConfig], str]] = {
    "cleanup.policy": lambda c: c.cleanup_policy,
    "compression.type": lambda c: "producer",
    "delete.retention.ms": lambda c: str(c.delete_retention_ms),
    "flush.ms": lambda c: str(c.flush_interval_ms),
    "index.interval.bytes": lambda c: str(c.index_interval_bytes),
    "max.message.bytes": lambda c: str(DEFAULT_MAX_MESSAGE_BYTES),
    # No node-level log.message.timestamp.type yet: every topic defaults to what LogConfig does.
    "message.timestamp.type": lambda c: LogConfig.message_timestamp_type,
    "min.insync.replicas": lambda c: str(c.min_insync_replicas),
    "retention.bytes": lambda c: str(c.retention_bytes),
    "retention.ms": lambda c: str(c.retention_ms),
    "segment.bytes": lambda c: str(c.segment_bytes),
    "segment.ms": lambda c: str(c.segment_ms),
    "unclean.leader.election.enable": lambda c: _bool(c.unclean_leader_election),
}

BROKER_DEFAULTS: dict[str, Callable[[NodeConfig], str]] = {
    "auto.create.topics.enable": lambda c: _bool(c.auto_create_topics_enable),
    "log.cleanup.policy": lambda c: c.cleanup_policy,
    "log.retention.bytes": lambda c: str(c.retention_bytes),
    "log.retention.ms": lambda c: str(c.retention_ms),
    "log.segment.bytes": lambda c: str(c.segment_bytes),
    "message.max.bytes": lambda c: str(DEFAULT_MAX_MESSAGE_BYTES),
    "min.insync.replicas": lambda c: str(c.min_insync_replicas),
    "num.partitions": lambda c: str(c.num_partitions),
    "unclean.leader.election.enable": lambda c: _bool(c.unclean_leader_election),
}


def topic_config_entries(
    config: NodeConfig, dynamic: Mapping[str, str], keys: Sequence[str] | None
) -> list[ConfigEntry]:
    entries = []
    for key in sorted(TOPIC_CONFIGS):
        if keys is not None and key not in keys:
            continue
        if key in dynamic:
            entries.append(ConfigEntry(key, dynamic[key], source=ConfigSource.DYNAMIC_TOPIC_CONFIG))
        else:
            default = TOPIC_DEFAULTS.get(key)
            entries.append(
                ConfigEntry(
                    key, default(config) if default else None, source=ConfigSource.DEFAULT_CONFIG
                )
            )
    return entries


def broker_config_entries(
    config: NodeConfig,
    per_broker: Mapping[str, str],
    cluster: Mapping[str, str],
    keys: Sequence[str] | None,
) -> list[ConfigEntry]:
    entries = []
    for key in sorted(BROKER_CONFIGS):
        if keys is not None and key not in keys:
            continue
        if key in per_broker:
            entries.append(
                ConfigEntry(key, per_broker[key], source=ConfigSource.DYNAMIC_BROKER_CONFIG)
            )
        elif key in cluster:
            entries.append(
                ConfigEntry(key, cluster[key], source=ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
            )
        else:
            default = BROKER_DEFAULTS.get(key)
            entries.append(
                ConfigEntry(
                    key,
                    default(config) if default else None,
                    source=ConfigSource.STATIC_BROKER_CONFIG,
                )
            )
    return entries
