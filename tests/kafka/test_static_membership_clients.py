"""A stock client's static membership (KIP-345, group.instance.id): a member that restarts
under the same instance id gets its partitions back, and the other member sees no
rebalance (librdkafka's 0102_static_group_rebalance checks the same on a cluster).

confluent-kafka runs in a worker thread against the in-memory test broker with the group
APIs (tests/kafka/test_groups_wire.py); every wait is a condition with a deadline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.kafka.test_groups_clients import (
    ALL_PARTITIONS,
    HEARTBEAT_INTERVAL_MS,
    PARTITIONS,
    POLL_STEP_MS,
    SESSION_TIMEOUT_MS,
    in_thread,
    is_split,
    poll_until,
)
from tests.kafka.test_groups_wire import GroupBroker, start_group_broker


@pytest.fixture
async def gb(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[GroupBroker]:
    started = await start_group_broker(nursery, tmp_path)
    yield started
    started.broker.backend.close()


def _restart_scenario(bootstrap: str, topic: str, group: str) -> dict[str, Any]:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)]
    )
    futures[topic].result(timeout=20)
    events: dict[str, list[str]] = {}

    def member(instance: str) -> Any:
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "group.instance.id": instance,
                "enable.auto.commit": False,
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
                "partition.assignment.strategy": "range",
            }
        )
        log = events.setdefault(instance, [])
        consumer.subscribe(
            [topic],
            on_assign=lambda c, parts: log.append("assign"),
            on_revoke=lambda c, parts: log.append("revoke"),
        )
        return consumer

    def owned(consumer: Any) -> set[int]:
        return {tp.partition for tp in consumer.assignment()}

    def drain(*consumers: Any) -> None:
        for consumer in consumers:
            msg = consumer.poll(POLL_STEP_MS / 1000)
            assert msg is None or msg.error() is None, msg.error()

    a, b = member("pod-a"), member("pod-b")
    poll_until(
        "two static members to split the partitions",
        lambda: is_split(owned(a), owned(b)),
        lambda: drain(a, b),
    )
    a_events_before = list(events["pod-a"])
    b_partitions = owned(b)
    b.close()  # a static member sends no LeaveGroup: its place is kept for it
    restarted = member("pod-b")
    poll_until(
        "the restarted member to own its partitions again",
        lambda: owned(restarted) == b_partitions,
        lambda: drain(a, restarted),
    )
    # A few more polls of both: a rebalance the restart caused would show now.
    for _ in range(10):
        drain(a, restarted)
    result = {
        "a_events_after_restart": events["pod-a"][len(a_events_before) :],
        "a_owned": owned(a),
        "restarted_owned": owned(restarted),
        "b_partitions": b_partitions,
    }
    a.close()
    restarted.close()
    return result


async def test_a_restarted_static_member_gets_its_partitions_back_without_a_rebalance(
    gb: GroupBroker,
) -> None:
    r = await in_thread(lambda: _restart_scenario(gb.bootstrap, "static-topic", "static-group"))
    assert r["a_events_after_restart"] == [], "the other member was rebalanced"
    assert r["restarted_owned"] == r["b_partitions"]
    assert r["a_owned"] | r["restarted_owned"] == ALL_PARTITIONS
