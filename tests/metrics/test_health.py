"""Health figures from replicas and the image, and the collector that exports them."""

from __future__ import annotations

import uuid
from types import MappingProxyType, SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from raftlog.constants import NO_LEADER
from raftlog.metadata.image import BrokerRegistration, MetadataImage, PartitionState, TopicImage
from raftlog.metrics.collectors import GroupLagCollector, HealthCollector, QuotaCollector
from raftlog.metrics.health import (
    ControllerHealth,
    GroupLag,
    NodeHealth,
    QuorumHealth,
    ReplicaHealth,
    controller_health,
    group_lag,
    replica_health,
)
from raftlog.quotas import QuotaEntity
from raftlog.quotas.entity import PRODUCER_BYTE_RATE
from raftlog.quotas.manager import QuotaUsage


def hosted(
    topic: str, replicas: tuple[int, ...], isr: set[int] | None, uncleanable: str | None = None
) -> Any:
    """A hosted replica as replica_health reads it; isr None: this broker follows."""
    leader = None
    if isr is not None:
        leader = SimpleNamespace(isr=frozenset(isr), state=SimpleNamespace(replicas=replicas))
    return SimpleNamespace(
        topic=topic,
        replica=SimpleNamespace(leader=leader),
        log=SimpleNamespace(uncleanable_reason=uncleanable),
    )


def test_replica_health_judges_led_partitions_by_the_leaders_isr() -> None:
    partitions = [
        hosted("a", (1, 2, 3), {1, 2, 3}),  # healthy
        hosted("a", (1, 2, 3), {1, 2}),  # under-replicated, at min ISR 2
        hosted("a", (1, 2, 3), {1}),  # under-replicated, under min ISR
        hosted("b", (1, 2, 3), {1, 2}),  # under-replicated; b's min ISR is 1
        hosted("a", (2, 1, 3), None),  # followed: not this broker's to report
        hosted("c", (2, 1, 3), None, "CORRUPT_MESSAGE: ..."),  # followed; compaction stopped
    ]
    asked: list[str] = []

    def min_isr(topic: str) -> int:
        asked.append(topic)
        return {"a": 2, "b": 1}[topic]

    health = replica_health(partitions, min_isr)
    assert health == ReplicaHealth(
        partition_count=6,
        leader_count=4,
        under_replicated_partitions=3,
        under_min_isr_partition_count=1,
        at_min_isr_partition_count=1,
        uncleanable_partitions_count=1,
    )
    assert sorted(asked) == ["a", "b"]  # once per topic per scrape


def image(*states: PartitionState, fenced: tuple[bool, ...] = (False, False)) -> MetadataImage:
    topic_id = uuid.uuid4()
    topic = TopicImage("t", topic_id, MappingProxyType(dict(enumerate(states))))
    brokers = {
        index + 1: BrokerRegistration(
            index + 1, uuid.uuid4(), 1, ("h", 1), ("h", 2), None, fenced=is_fenced
        )
        for index, is_fenced in enumerate(fenced)
    }
    return MetadataImage(
        brokers=MappingProxyType(brokers),
        topics_by_id=MappingProxyType({topic_id: topic}),
        topic_ids_by_name=MappingProxyType({"t": topic_id}),
    )


def test_controller_health_is_reported_by_the_active_controller_only() -> None:
    state = image(
        PartitionState((1, 2), (1, 2), 1),
        PartitionState((2,), (2,), NO_LEADER),
        fenced=(False, True),
    )
    assert controller_health(state, active=False) == ControllerHealth()
    assert controller_health(state, active=True) == ControllerHealth(
        active_controller_count=1,
        offline_partitions_count=1,
        global_topic_count=1,
        global_partition_count=2,
        fenced_broker_count=1,
        active_broker_count=1,
    )


def test_collector_exports_one_node_health_under_kafkas_names() -> None:
    health = NodeHealth(
        node_id=1,
        replicas=ReplicaHealth(4, 3, 2, 1, 1),
        controller=ControllerHealth(1, 5, 2, 9, 0, 3),
        quorum=QuorumHealth(7, 1, 120, 121, "leader"),
        produce_purgatory_size=6,
    )
    calls: list[int] = []

    def read() -> NodeHealth:
        calls.append(1)
        return health

    registry = CollectorRegistry(auto_describe=False)
    registry.register(HealthCollector(read))
    assert calls == []  # nothing is read before a scrape
    value = registry.get_sample_value
    assert value("raftlog_server_replica_manager_under_replicated_partitions") == 2
    assert value("raftlog_server_replica_manager_under_min_isr_partition_count") == 1
    assert value("raftlog_controller_kafka_controller_active_controller_count") == 1
    assert value("raftlog_controller_kafka_controller_offline_partitions_count") == 5
    assert value("raftlog_server_raft_metrics_current_epoch") == 7
    assert value("raftlog_server_raft_metrics_current_leader") == 1
    assert value("raftlog_server_raft_metrics_high_watermark") == 120
    assert (
        value(
            "raftlog_server_delayed_operation_purgatory_purgatory_size",
            {"delayed_operation": "Produce"},
        )
        == 6
    )
    assert health.as_dict()["replicas"]["under_replicated_partitions"] == 2


def test_group_lag_uses_the_hosted_high_watermarks_largest_first() -> None:
    committed = {
        ("g1", "t", 0): 40,
        ("g1", "t", 1): 100,
        ("g2", "t", 0): 90,
        ("g2", "elsewhere", 0): 5,  # no replica here: HW unknown, not reported
        ("g3", "t", 0): -1,  # no offset committed
    }
    high_watermarks = {("t", 0): 100, ("t", 1): 90}
    rows = group_lag(committed, lambda t, p: high_watermarks.get((t, p)), max_rows=10)
    assert [(r.group, r.topic, r.partition, r.lag) for r in rows] == [
        ("g1", "t", 0, 60),
        ("g2", "t", 0, 10),
        ("g1", "t", 1, 0),  # committed past a follower's HW: never negative
    ]
    assert len(group_lag(committed, lambda t, p: high_watermarks.get((t, p)), max_rows=1)) == 1


def test_quota_and_lag_collectors_export_their_rows() -> None:
    usage = [
        QuotaUsage(
            quota_key=PRODUCER_BYTE_RATE,
            user="",
            client_id="slow",
            entity=QuotaEntity.client("slow"),
            quota=1024.0,
            rate=2048.0,
            throttle_time_total_ms=1500,
        )
    ]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QuotaCollector(lambda: usage))
    registry.register(GroupLagCollector(lambda: [GroupLag("g", "t", 3, 7, 10)]))
    who = {"quota_type": "Produce", "user": "", "client_id": "slow"}
    value = registry.get_sample_value
    assert value("raftlog_server_quota_throttle_time_seconds_total", who) == 1.5
    assert value("raftlog_server_quota_rate", who) == 2048
    assert value("raftlog_server_quota_limit", who) == 1024
    where = {"group": "g", "topic": "t", "partition": "3"}
    assert value("raftlog_consumer_group_lag", where) == 3
    assert value("raftlog_consumer_group_committed_offset", where) == 7
