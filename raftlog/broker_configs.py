"""What DescribeConfigs shows: every known topic/broker key with its value and source.

A topic's effective value is its dynamic config if set, else the node default (from
NodeConfig, spelled the Kafka way); the same lookup feeds the replica manager through
MetadataImage.topic_config, so what a client is shown is what the broker enforces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from raftlog.config import NodeConfig
from raftlog.config_keys import BROKER_CONFIGS, TOPIC_CONFIGS
from raftlog.net.kafka.backend import ConfigEntry, ConfigSource


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
            default = TOPIC_CONFIGS[key].default
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
            default = BROKER_CONFIGS[key].default
            entries.append(
                ConfigEntry(
                    key,
                    default(config) if default else None,
                    source=ConfigSource.STATIC_BROKER_CONFIG,
                )
            )
    return entries
