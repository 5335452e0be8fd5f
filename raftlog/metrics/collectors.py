"""Collectors that read a node's state when Prometheus scrapes it (nothing kept in between).

`HealthCollector` turns one `NodeHealth` (health.py, the same figures status views show) into
gauge families under Kafka's names (instruments.py explains the scheme); `QuotaCollector`
exports the quota manager's own sensors and `GroupLagCollector` the lag of the groups this
node coordinates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from raftlog.metrics.health import GroupLag, NodeHealth
from raftlog.quotas.entity import (
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
)
from raftlog.quotas.manager import QuotaUsage

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
        "raftlog_log_log_cleaner_manager_uncleanable_partitions_count",
        "Replicas hosted here whose compaction stopped on a batch it could not read.",
        ("replicas", "uncleanable_partitions_count"),
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


# Kafka's quota sensor types (kafka.server:type=<Type>,user=..,client-id=..) by quota key.
QUOTA_TYPES = {
    PRODUCER_BYTE_RATE: "Produce",
    CONSUMER_BYTE_RATE: "Fetch",
    REQUEST_PERCENTAGE: "Request",
    CONTROLLER_MUTATION_RATE: "ControllerMutation",
}


class QuotaCollector(Collector):
    """Throttle time, rate and quota of every sensor the quota manager tracks (only entities
    a quota applies to have one, so the label sets are as many as the quotas in use).

    The throttle total is the sensor's own (`raftlog quotas describe --usage` shows the same
    figure); it starts again from 0 when an idle sensor expires, which rate() treats as a
    counter reset."""

    def __init__(self, usage: Callable[[], Iterable[QuotaUsage]]) -> None:
        self._usage = usage

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        labels = ["quota_type", "user", "client_id"]
        throttle = CounterMetricFamily(
            "raftlog_server_quota_throttle_time_seconds",
            "Time clients were told to wait by a quota, per quota type and entity (Kafka "
            "throttle-time of the Produce, Fetch, Request and ControllerMutation sensors).",
            labels=labels,
        )
        rate = GaugeMetricFamily(
            "raftlog_server_quota_rate",
            "Current rate of the entity against its quota (bytes/s, request time percent, "
            "or mutations/s; Kafka byte-rate / request-time).",
            labels=labels,
        )
        limit = GaugeMetricFamily(
            "raftlog_server_quota_limit",
            "The quota that applies to the entity, in the units of raftlog_server_quota_rate.",
            labels=labels,
        )
        for row in self._usage():
            values = [QUOTA_TYPES.get(row.quota_key, row.quota_key), row.user, row.client_id]
            throttle.add_metric(values, row.throttle_time_total_ms / 1000)
            rate.add_metric(values, row.rate)
            limit.add_metric(values, row.quota)
        yield throttle
        yield rate
        yield limit


class GroupLagCollector(Collector):
    """Consumer group lag per partition, from the groups this node coordinates (the metric
    kafka_exporter calls kafka_consumergroup_lag)."""

    def __init__(self, lag: Callable[[], Iterable[GroupLag]]) -> None:
        self._lag = lag

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["group", "topic", "partition"]
        lag = GaugeMetricFamily(
            "raftlog_consumer_group_lag",
            "High watermark minus the group's committed offset, per partition (groups "
            "coordinated by this node, partitions it hosts a replica of).",
            labels=labels,
        )
        committed = GaugeMetricFamily(
            "raftlog_consumer_group_committed_offset",
            "The group's committed offset, per partition (groups coordinated by this node).",
            labels=labels,
        )
        for row in self._lag():
            values = [row.group, row.topic, str(row.partition)]
            lag.add_metric(values, row.lag)
            committed.add_metric(values, row.committed_offset)
        yield lag
        yield committed
