"""Limits and timings of the group coordinator, each with its unit in the name.

NodeConfig owns the keys an operator sets (partition count, initial rebalance delay); the
rest are Kafka's broker defaults, kept here as named bounds so nothing in the coordinator is
unbounded.
"""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.config import NodeConfig

OFFSETS_TOPIC = "__consumer_offsets"


@dataclass(frozen=True)
class GroupConfig:
    # Number of __consumer_offsets partitions; fixes the group → coordinator mapping.
    offsets_topic_num_partitions: int = 6
    # Wait this long after the first member joins an empty group, so a fleet of consumers
    # starting together lands in one rebalance instead of one per member.
    group_initial_rebalance_delay_ms: int = 0
    # Kafka's group.min/max.session.timeout.ms: bound how fast or slow failure detection is.
    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 1_800_000
    # Kafka leaves group.max.size unbounded; a bound keeps one group from eating the node.
    group_max_size: int = 1_000
    # Largest committed-offset metadata string (Kafka's offset.metadata.max.bytes).
    offset_metadata_max_bytes: int = 4_096
    # Groups one coordinator holds across all its partitions; new groups past it are refused.
    max_groups: int = 100_000
    # Records per append call the shell batches together (group commit of many commits).
    append_max_records: int = 10_000
    # KIP-848 (consumer protocol) groups: the coordinator, not the member, sets the session
    # timeout and heartbeat interval (Kafka's group.consumer.session.timeout.ms and
    # group.consumer.heartbeat.interval.ms) and hands the interval to every member.
    group_consumer_session_timeout_ms: int = 45_000
    group_consumer_heartbeat_interval_ms: int = 5_000
    # group.consumer.assignors: the server-side assignors a member may name; the first is the
    # default for members that name none.
    group_consumer_assignors: tuple[str, ...] = ("uniform", "range")

    def __post_init__(self) -> None:
        if self.offsets_topic_num_partitions < 1:
            raise ValueError("offsets_topic_num_partitions must be >= 1")
        if not 0 < self.group_min_session_timeout_ms <= self.group_max_session_timeout_ms:
            raise ValueError(
                "need 0 < group_min_session_timeout_ms <= group_max_session_timeout_ms"
            )
        if not (
            0 < self.group_consumer_heartbeat_interval_ms < self.group_consumer_session_timeout_ms
        ):
            raise ValueError(
                "need 0 < group_consumer_heartbeat_interval_ms < group_consumer_session_timeout_ms"
            )
        if not self.group_consumer_assignors or not set(self.group_consumer_assignors) <= {
            "uniform",
            "range",
        }:
            raise ValueError("group_consumer_assignors must name some of: uniform, range")
        for name in ("group_max_size", "max_groups", "append_max_records"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.group_initial_rebalance_delay_ms < 0 or self.offset_metadata_max_bytes < 0:
            raise ValueError("delays and byte limits must be >= 0")

    @classmethod
    def from_node_config(cls, config: NodeConfig) -> GroupConfig:
        return cls(
            offsets_topic_num_partitions=config.offsets_topic_num_partitions,
            group_initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            group_consumer_session_timeout_ms=config.group_consumer_session_timeout_ms,
            group_consumer_heartbeat_interval_ms=config.group_consumer_heartbeat_interval_ms,
            group_consumer_assignors=tuple(config.group_consumer_assignors),
        )
