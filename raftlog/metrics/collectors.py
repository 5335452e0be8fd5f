"""Collectors that read a node's state when Prometheus scrapes it (nothing kept in between).

`HealthCollector` turns one `NodeHealth` (health.py, the same figures status views show) into
gauge families under Kafka's names (instruments.py explains the scheme).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from raftlog.metrics.health import NodeHealth

# (metric name, help, NodeHealth attribute path)
_GAUGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "raftlog_server_replica_manager_under_replicated_partitions",
        "Partitions led here whose ISR is smaller than their replica set.",
        ("replicas", "under_replicated_partitions"),
    ),
    (
        "raftlog_server_replica_manager_under_min_isr_partition_count",
        "Partitions led here whose ISR is below min.insync.replicas (acks=all refused).",
        ("replicas", "under_min_isr_partition_count"),
    ),
    (
        "raftlog_server_replica_manager_at_min_isr_partition_count",
        "Partitions led here whose ISR is exactly min.insync.replicas.",
        ("replicas", "at_min_isr_partition_count"),
    ),
    (
        "raftlog_server_replica_manager_partition_count",
        "Partition replicas hosted here.",
        ("replicas", "partition_count"),
    ),
    (
        "raftlog_server_replica_manager_leader_count",
        "Partitions led here.",
        ("replicas", "leader_count"),
    ),
    (
        "raftlog_controller_kafka_controller_active_controller_count",
        "1 on the active controller (the metadata quorum's leader), else 0.",
        ("controller", "active_controller_count"),
    ),
    (
        "raftlog_controller_kafka_controller_offline_partitions_count",
        "Partitions without a leader (reported by the active controller only).",
        ("controller", "offline_partitions_count"),
    ),
    (
        "raftlog_controller_kafka_controller_global_topic_count",
        "Topics in the cluster (reported by the active controller only).",
        ("controller", "global_topic_count"),
    ),
    (
        "raftlog_controller_kafka_controller_global_partition_count",
        "Partitions in the cluster (reported by the active controller only).",
        ("controller", "global_partition_count"),
    ),
    (
        "raftlog_controller_kafka_controller_fenced_broker_count",
        "Registered brokers that are fenced (reported by the active controller only).",
        ("controller", "fenced_broker_count"),
    ),
    (
        "raftlog_controller_kafka_controller_active_broker_count",
        "Registered brokers that are not fenced (reported by the active controller only).",
        ("controller", "active_broker_count"),
    ),
    (
        "raftlog_server_raft_metrics_current_epoch",
        "The metadata quorum's epoch as this node knows it.",
        ("quorum", "current_epoch"),
    ),
    (
        "raftlog_server_raft_metrics_current_leader",
        "The metadata quorum's leader as this node knows it (-1: none).",
        ("quorum", "current_leader"),
    ),
    (
        "raftlog_server_raft_metrics_high_watermark",
        "The metadata log's commit offset on this node.",
        ("quorum", "high_watermark"),
    ),
    (
        "raftlog_server_raft_metrics_log_end_offset",
        "The metadata log's end offset on this node.",
        ("quorum", "log_end_offset"),
    ),
)


class HealthCollector(Collector):
    """Gauges from `health()` (called once per scrape) under Kafka's names."""

    def __init__(self, health: Callable[[], NodeHealth]) -> None:
        self._health = health

    def collect(self) -> Iterator[GaugeMetricFamily]:
        health = self._health()
        for name, text, path in _GAUGES:
            value: object = health
            for attribute in path:
                value = getattr(value, attribute)
            assert isinstance(value, int)
            yield GaugeMetricFamily(name, text, value=value)
        purgatory = GaugeMetricFamily(
            "raftlog_server_delayed_operation_purgatory_purgatory_size",
            "Requests parked in a purgatory (Produce: acks waiting for the ISR or a flush).",
            labels=["delayed_operation"],
        )
        purgatory.add_metric(["Produce"], health.produce_purgatory_size)
        yield purgatory
