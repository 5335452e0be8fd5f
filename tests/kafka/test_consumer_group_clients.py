"""librdkafka's KIP-848 consumer (`group.protocol=consumer`) against the server on loopback,
while an aiokafka classic group runs beside it.

Two confluent-kafka consumers split a 4-partition topic through ConsumerGroupHeartbeat; the
coordinator then fails over (resigns its offsets partition and loads it again from the log)
and both carry on at the same epochs with the same partitions; each commits an offset per
partition it owns (OffsetCommit v9 at its member epoch), one leaves, and the other takes
over its partitions and resumes exactly at the offsets committed for them. The admin client
then lists the group as a consumer-protocol group and reads its offsets. Meanwhile the
aiokafka scenario of test_groups_clients.py (JoinGroup/SyncGroup) runs to completion on
another topic and group of the same broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from raftlog.groups.settings import GroupConfig
from tests.kafka.test_consumer_group_wire import start_consumer_group_broker
from tests.kafka.test_groups_clients import (
    ALL_PARTITIONS,
    CLIENT_DEADLINE_S,
    COMMITTED,
    PARTITIONS,
    POLL_STEP_MS,
    RECORDS_PER_PARTITION,
    _aiokafka_scenario,
    expected_value,
    is_split,
    poll_until,
)
from tests.kafka.test_groups_wire import GroupBroker

# The coordinator hands this interval to members: short, so a rebalance takes a few polls.
HEARTBEAT_INTERVAL_MS = 200


@pytest.fixture
async def gb(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[GroupBroker]:
    config = GroupConfig(
        offsets_topic_num_partitions=3,
        group_consumer_heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
    )
    started = await start_consumer_group_broker(nursery, tmp_path, config)
    yield started
    started.broker.backend.close()


def _kip848_scenario(
    bootstrap: str, topic: str, group: str, failover: Callable[[], Any]
) -> dict[str, Any]:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[
        topic
    ].result(timeout=20)
    producer = Producer({"bootstrap.servers": bootstrap})
    for p in range(PARTITIONS):
        for o in range(RECORDS_PER_PARTITION):
            producer.produce(topic, value=expected_value(p, o), partition=p)
    assert producer.flush(20) == 0

    def member(name: str) -> Any:
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": name,
                "group.id": group,
                "group.protocol": "consumer",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([topic])
        return consumer

    def owned(consumer: Any) -> set[int]:
        return {tp.partition for tp in consumer.assignment()}

    seen: dict[str, dict[int, tuple[int, bytes]]] = {}

    def drain(name: str, consumer: Any) -> None:
        msg = consumer.poll(POLL_STEP_MS / 1000)
        if msg is None:
            return
        assert msg.error() is None, msg.error()
        seen.setdefault(name, {}).setdefault(msg.partition(), (msg.offset(), msg.value()))

    a = member("k848-a")
    poll_until(
        "the first member to own every partition",
        lambda: owned(a) == ALL_PARTITIONS,
        lambda: drain("a", a),
    )
    b = member("k848-b")
    poll_until(
        "two members to split the partitions",
        lambda: is_split(owned(a), owned(b)),
        lambda: (drain("a", a), drain("b", b)),
    )
    split = (owned(a), owned(b))
    epochs = failover()
    # Heartbeats go on at the reloaded coordinator (several intervals' worth of polls).
    deadline = time.monotonic() + 10 * HEARTBEAT_INTERVAL_MS / 1000
    while time.monotonic() < deadline:
        drain("a", a)
        drain("b", b)
    after_failover = (owned(a), owned(b))
    # Each commits an offset (distinct per partition) for what it owns, at its member epoch.
    for consumer in (a, b):
        consumer.commit(
            offsets=[
                TopicPartition(topic, p, COMMITTED[p], metadata=f"k848-{p}")
                for p in owned(consumer)
            ],
            asynchronous=False,
        )
    b.close()  # leaves with member epoch -1: its partitions are free at once
    seen.pop("a", None)
    poll_until(
        "the remaining member to take over every partition",
        lambda: owned(a) == ALL_PARTITIONS,
        lambda: drain("a", a),
    )
    poll_until(
        "the remaining member to read the partitions it took over",
        lambda: split[1] <= set(seen.get("a", {})),
        lambda: drain("a", a),
    )
    resumed = {p: seen["a"][p] for p in split[1]}
    committed = a.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
    groups = admin.list_consumer_groups().result(timeout=CLIENT_DEADLINE_S)
    listed = {g.group_id: g for g in groups.valid}
    offsets_future = admin.list_consumer_group_offsets(
        [_offsets_request(group)], request_timeout=CLIENT_DEADLINE_S
    )[group]
    group_offsets = {tp.partition: tp.offset for tp in offsets_future.result().topic_partitions}
    a.close()
    return {
        "split": split,
        "epochs": epochs,
        "after_failover": after_failover,
        "resumed": resumed,
        "committed": {tp.partition: (tp.offset, tp.metadata) for tp in committed},
        "listed_type": str(getattr(listed[group], "type", "")),
        "group_offsets": group_offsets,
    }


def _offsets_request(group: str) -> Any:
    from confluent_kafka import ConsumerGroupTopicPartitions

    return ConsumerGroupTopicPartitions(group)


async def test_kip848_consumers_split_hand_over_and_resume(gb: GroupBroker) -> None:
    results: dict[str, Any] = {}

    group = "k848-group"
    coordinator = gb.service.shell.coordinator

    def member_epochs() -> dict[str, int]:
        cg = coordinator.consumer.get(group)
        assert cg is not None
        return {m.member_id: m.member_epoch for m in cg.members.values()}

    async def reload() -> tuple[dict[str, int], dict[str, int]]:
        before = member_epochs()
        partition = coordinator.partition_for(group)
        gb.service.shell.resign(partition)
        await gb.service.shell.become_coordinator(partition)
        return before, member_epochs()

    def failover() -> Any:
        return trio.from_thread.run(reload)

    async def kip848() -> None:
        results["kip848"] = await _in_thread(
            lambda: _kip848_scenario(gb.bootstrap, "k848-topic", group, failover)
        )

    async def classic() -> None:
        results["classic"] = await _in_thread(
            lambda: asyncio.run(_aiokafka_scenario(gb.bootstrap, "classic-topic", "classic"))
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(kip848)
        nursery.start_soon(classic)

    r = results["kip848"]
    assert is_split(*r["split"]), r["split"]
    before, reloaded = r["epochs"]
    assert reloaded == before and len(before) == 2  # replayed from __consumer_offsets
    assert r["after_failover"] == r["split"]
    # The survivor starts the partitions it took over exactly at the offsets committed there.
    assert r["resumed"] == {
        p: (COMMITTED[p], expected_value(p, COMMITTED[p])) for p in r["split"][1]
    }
    assert r["committed"] == {p: (o, f"k848-{p}") for p, o in COMMITTED.items()}
    assert r["group_offsets"] == COMMITTED
    assert "CONSUMER" in r["listed_type"].upper(), r["listed_type"]

    c = results["classic"]
    assert is_split(*c["split"]), c["split"]
    assert c["first"] == {p: (o, expected_value(p, o)) for p, o in COMMITTED.items()}
    assert c["committed"] == COMMITTED


async def _in_thread(fn: Any) -> Any:
    # Both scenarios run for a while in parallel: twice the per-client deadline.
    with trio.fail_after(2 * CLIENT_DEADLINE_S):
        return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)
