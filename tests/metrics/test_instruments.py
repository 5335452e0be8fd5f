"""The hot-path instruments: names, labels, bounds, and what each update counts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, Counter

from raftlog.errors import ErrorCode
from raftlog.metrics.instruments import (
    MAX_LABEL_SETS,
    MAX_TIMED_PROPOSALS,
    OTHER_LABEL,
    BoundedChildren,
    NodeMetrics,
    RaftMetrics,
    ReplicationMetrics,
    api_label,
    error_label,
    response_error_codes,
)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_api_and_error_labels_are_kafkas() -> None:
    assert api_label("produce") == "Produce"
    assert api_label("list_offsets") == "ListOffsets"
    assert error_label(ErrorCode.not_leader_or_follower) == "NOT_LEADER_OR_FOLLOWER"
    assert error_label(-12345) == "-12345"


def test_bounded_children_lump_label_sets_past_the_limit() -> None:
    registry = CollectorRegistry()
    family = Counter("c", "c", ["who"], registry=registry)
    children = BoundedChildren(family, max_children=2)
    children.get("a").inc()
    children.get("b").inc()
    children.get("c").inc()
    children.get("d").inc(2)
    assert children.get("a") is children.get("a")
    assert len(children) == 2
    assert sample(registry, "c_total", who="a") == 1
    assert sample(registry, "c_total", who="c") is None
    assert sample(registry, "c_total", who=OTHER_LABEL) == 3


def test_response_error_codes_walk_nested_partitions_only() -> None:
    response = {
        "error_code": 0,
        "responses": [
            {
                "name": "t",
                "partition_responses": [
                    {"index": 0, "error_code": ErrorCode.not_leader_or_follower},
                    {"index": 1, "error_code": 0},
                    {"index": 2, "error_code": ErrorCode.not_enough_replicas},
                ],
            }
        ],
    }
    assert sorted(response_error_codes(response)) == sorted(
        [ErrorCode.not_leader_or_follower, ErrorCode.not_enough_replicas]
    )
    assert response_error_codes({"error_code": ErrorCode.unknown_server_error}) == [
        ErrorCode.unknown_server_error
    ]
    assert response_error_codes(None) == []
    # Deeper than the walk goes: not counted (bounded cost per response).
    deep = {"a": [{"b": [{"c": [{"d": [{"error_code": 5}]}]}]}]}
    assert response_error_codes(deep) == []


def test_request_metrics_count_time_and_errors() -> None:
    metrics = NodeMetrics(lambda key: {0: "produce", 3: "metadata"}[key])
    registry = metrics.registry
    metrics.requests.observe(0, 0.002, [])
    metrics.requests.observe(0, 0.004, [ErrorCode.not_enough_replicas])
    metrics.requests.observe(3, 0.0001)
    requests = "raftlog_network_request_metrics_requests_total"
    assert sample(registry, requests, request="Produce") == 2
    assert sample(registry, requests, request="Metadata") == 1
    assert (
        sample(
            registry,
            "raftlog_network_request_metrics_errors_total",
            request="Produce",
            error="NOT_ENOUGH_REPLICAS",
        )
        == 1
    )
    count = "raftlog_network_request_metrics_total_time_seconds_count"
    assert sample(registry, count, request="Produce") == 2
    assert sample(
        registry, "raftlog_network_request_metrics_total_time_seconds_sum", request="Produce"
    ) == pytest.approx(0.006)


def test_replication_metrics_per_topic_and_isr_changes() -> None:
    registry = CollectorRegistry()
    metrics = ReplicationMetrics(registry)
    metrics.produced("t", 100, 3)
    metrics.produced("t", 50, 1)
    metrics.fetched("t", 120, 4)
    prefix = "raftlog_server_broker_topic_metrics_"
    assert sample(registry, prefix + "bytes_in_total", topic="t") == 150
    assert sample(registry, prefix + "messages_in_total", topic="t") == 4
    assert sample(registry, prefix + "bytes_out_total", topic="t") == 120
    assert sample(registry, prefix + "messages_out_total", topic="t") == 4
    metrics.forget_topic("t")
    assert sample(registry, prefix + "bytes_in_total", topic="t") is None
    metrics.forget_topic("never-seen")  # no error

    metrics.isr_changed({1, 2, 3}, {1, 2})
    metrics.isr_changed({1, 2}, {1, 2, 3})
    metrics.isr_changed({1, 2}, {1, 3})  # a swap: one of each
    metrics.isr_changed({1, 2}, {1, 2})  # nothing
    assert sample(registry, "raftlog_server_replica_manager_isr_shrinks_total") == 2
    assert sample(registry, "raftlog_server_replica_manager_isr_expands_total") == 2


def test_replication_topics_are_bounded() -> None:
    registry = CollectorRegistry()
    metrics = ReplicationMetrics(registry)
    for index in range(MAX_LABEL_SETS + 5):
        metrics.produced(f"t{index}", 1, 1)
    name = "raftlog_server_broker_topic_metrics_bytes_in_total"
    assert sample(registry, name, topic="t0") == 1
    assert sample(registry, name, topic=f"t{MAX_LABEL_SETS}") is None
    assert sample(registry, name, topic=OTHER_LABEL) == 5


def entries(*offsets: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(offset=offset) for offset in offsets]


def test_raft_metrics_time_commits_of_this_term_and_count_leader_changes() -> None:
    registry = CollectorRegistry()
    raft = RaftMetrics(registry)
    raft.role_changed(None)
    raft.role_changed(1)
    raft.proposed(10, now_ms=1000)
    raft.proposed(11, now_ms=1005)
    raft.committed(entries(9, 10, 11), now_ms=1020)  # 9 was not proposed here: not timed
    count = "raftlog_server_raft_metrics_commit_latency_seconds_count"
    assert sample(registry, count) == 2
    assert sample(registry, "raftlog_server_raft_metrics_commit_latency_seconds_sum") == (
        pytest.approx(0.035)
    )
    raft.proposed(12, now_ms=2000)
    raft.role_changed(None)  # an election: the pending entry's time would measure it
    raft.role_changed(1)  # the same leader again is a change seen
    raft.role_changed(1)  # a repeat report is not
    raft.committed(entries(12), now_ms=5000)
    assert sample(registry, count) == 2
    assert sample(registry, "raftlog_server_raft_metrics_leader_changes_total") == 2


def test_raft_metrics_remember_a_bounded_number_of_proposals() -> None:
    raft = RaftMetrics.detached()
    for offset in range(MAX_TIMED_PROPOSALS + 10):
        raft.proposed(offset, now_ms=0)
    assert len(raft._proposed_at_ms) == MAX_TIMED_PROPOSALS


def test_log_flush_histogram_is_shared_by_raft_and_replication() -> None:
    metrics = NodeMetrics(str)
    metrics.raft.log_flush.observe(0.001)
    metrics.replication.log_flush.observe(0.002)
    name = "raftlog_log_log_flush_stats_log_flush_time_seconds_count"
    assert metrics.registry.get_sample_value(name) == 2
