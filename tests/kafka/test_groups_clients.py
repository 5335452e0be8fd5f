"""Stock clients use consumer groups against the server on loopback.

For kafka-python, confluent-kafka and aiokafka: the first member of a group owns every
partition of a 4-partition topic; a second member joins and they split them; when it leaves
the first gets every partition again; that member commits
offsets (a different one per partition, so a mix-up shows) and leaves; a new member of the
group resumes exactly at the committed offsets. kafka-python's KafkaAdminClient then lists,
describes and deletes the group. The broker is the in-memory test backend with the group
APIs registered on InProcessGroupService.

Blocking clients run in a worker thread and drive both members from there (each step is a
short poll; every wait is a condition with a deadline). The server runs on the test's trio
loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.kafka.test_groups_wire import GroupBroker, start_group_broker

PARTITIONS = 4
ALL_PARTITIONS = set(range(PARTITIONS))
RECORDS_PER_PARTITION = 10
# Distinct per partition, so resuming from the wrong partition's offset is caught.
COMMITTED = {0: 2, 1: 5, 2: 7, 3: 9}
# Kafka's minimum (group_min_session_timeout_ms); short heartbeats make members notice a
# rebalance within a fraction of a second instead of the 3 s default.
SESSION_TIMEOUT_MS = 6_000
HEARTBEAT_INTERVAL_MS = 100
POLL_STEP_MS = 100
# kafka-python 3.0.12 loses a rejoin that its leader starts because its metadata changed
# (its first assignment can run before it knows the topic's partitions) when poll()'s timeout
# ends while that JoinGroup/SyncGroup is in flight: the next poll sees nothing to rejoin, never
# completes the join and never re-enables heartbeats, so the member's session expires. A
# poll long enough for an uncontended join avoids that window; poll returns as soon as
# records arrive, so this costs no time when there is data.
KAFKA_PYTHON_POLL_MS = 1_000
CONDITION_DEADLINE_S = 20
CLIENT_DEADLINE_S = 60
LZ4 = 3  # RecordBatch attributes codec id


@pytest.fixture
async def gb(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[GroupBroker]:
    started = await start_group_broker(nursery, tmp_path)
    yield started
    started.broker.backend.close()


async def in_thread(fn: Callable[[], Any]) -> Any:
    with trio.fail_after(CLIENT_DEADLINE_S):
        return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)


def poll_until(what: str, condition: Callable[[], bool], step: Callable[[], Any]) -> None:
    """Drive the clients with `step` until `condition` holds, or fail after the deadline."""
    deadline = time.monotonic() + CONDITION_DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {CONDITION_DEADLINE_S} s waiting for {what}")
        step()


def is_split(a: set[int], b: set[int]) -> bool:
    return bool(a) and bool(b) and not a & b and a | b == ALL_PARTITIONS


def expected_value(partition: int, offset: int) -> bytes:
    return f"p{partition}-o{offset}".encode()


# ------------------------------------------------------------------------------ kafka-python
def _kafka_python_scenario(bootstrap: str, topic: str, group: str) -> dict[str, Any]:
    from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="kp-admin")
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for p in range(PARTITIONS):
        for o in range(RECORDS_PER_PARTITION):
            producer.send(topic, value=expected_value(p, o), partition=p)
    producer.flush(timeout=20)
    producer.close()

    def member(name: str) -> Any:
        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            client_id=name,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        )
        # Metadata first: a leader that assigns before its metadata names the topic rejoins
        # later, and kafka-python 3.0.12 can drop that rejoin if it outlasts one poll()
        # (see test_kafka_python_group_splits_and_rebalances in tests/integration).
        assert consumer.partitions_for_topic(topic) == ALL_PARTITIONS
        return consumer

    def owned(consumer: Any) -> set[int]:
        return {tp.partition for tp in consumer.assignment()}

    a = member("kp-a")
    poll_until(
        "the first member to own every partition",
        lambda: owned(a) == ALL_PARTITIONS,
        lambda: a.poll(timeout_ms=KAFKA_PYTHON_POLL_MS),
    )
    b = member("kp-b")
    poll_until(
        "two members to split the partitions",
        lambda: is_split(owned(a), owned(b)),
        lambda: (a.poll(timeout_ms=KAFKA_PYTHON_POLL_MS), b.poll(timeout_ms=KAFKA_PYTHON_POLL_MS)),
    )
    split = (owned(a), owned(b))
    b.close()  # LeaveGroup: the group rebalances at once
    poll_until(
        "the remaining member to own every partition",
        lambda: owned(a) == ALL_PARTITIONS,
        lambda: a.poll(timeout_ms=KAFKA_PYTHON_POLL_MS),
    )
    a.commit(
        {
            TopicPartition(topic, p): OffsetAndMetadata(o, f"kp-{p}", -1)
            for p, o in COMMITTED.items()
        }
    )
    a.close()

    c = member("kp-c")
    first: dict[int, Any] = {}

    def consume() -> None:
        for tp, records in c.poll(timeout_ms=KAFKA_PYTHON_POLL_MS).items():
            first.setdefault(tp.partition, records[0])

    poll_until("the new member to read every partition", lambda: len(first) == PARTITIONS, consume)
    committed = {p: c.committed(TopicPartition(topic, p), metadata=True) for p in range(PARTITIONS)}
    result: dict[str, Any] = {
        "split": split,
        "first": {p: (r.offset, r.value) for p, r in first.items()},
        "committed": committed,
    }

    # Admin APIs while the group has a live member, then after it left.
    result["listed"] = admin.list_groups()
    result["described"] = admin.describe_groups([group])[group]
    result["offsets"] = admin.list_group_offsets({group: None})[group]
    result["delete_live"] = admin.delete_groups([group])
    c.close()
    result["listed_empty"] = admin.list_groups(states_filter=["Empty"])
    result["delete_empty"] = admin.delete_groups([group])
    result["listed_after"] = admin.list_groups()
    result["offsets_after"] = admin.list_group_offsets({group: None})[group]
    admin.close()
    return result


async def test_kafka_python_group(gb: GroupBroker) -> None:
    topic, group = "kp-group-topic", "kp-group"
    r = await in_thread(lambda: _kafka_python_scenario(gb.bootstrap, topic, group))
    assert is_split(*r["split"]), r["split"]
    assert r["first"] == {p: (o, expected_value(p, o)) for p, o in COMMITTED.items()}
    assert {p: (x.offset, x.metadata) for p, x in r["committed"].items()} == {
        p: (o, f"kp-{p}") for p, o in COMMITTED.items()
    }

    assert [(g["group_id"], g["protocol_type"]) for g in r["listed"]] == [(group, "consumer")]
    described = r["described"]
    assert described["error"] is None
    assert (described["group_state"], described["protocol_type"]) == ("Stable", "consumer")
    (member,) = described["members"]
    assert member["client_id"] == "kp-c"
    assert member["client_host"] == "/127.0.0.1"
    assert member["member_metadata"]["topics"] == [topic]
    assert member["member_assignment"]["assigned_partitions"] == [
        {"topic": topic, "partitions": list(range(PARTITIONS))}
    ]
    assert {tp.partition: x.offset for tp, x in r["offsets"].items()} == COMMITTED

    assert r["delete_live"] == {group: "NonEmptyGroupError"}
    assert [g["group_id"] for g in r["listed_empty"]] == [group]
    assert r["delete_empty"] == {group: "OK"}
    assert r["listed_after"] == []
    assert r["offsets_after"] == {}


# ------------------------------------------------------------------------------ confluent-kafka
def _confluent_scenario(bootstrap: str, topic: str, group: str) -> dict[str, Any]:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)]
    )
    futures[topic].result(timeout=20)
    # LZ4: librdkafka compresses with it only when FindCoordinator v0 is advertised.
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4"})
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
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
                "partition.assignment.strategy": "range",
            }
        )
        consumer.subscribe([topic])
        return consumer

    def owned(consumer: Any) -> set[int]:
        return {tp.partition for tp in consumer.assignment()}

    def drain(consumer: Any) -> Any:
        msg = consumer.poll(POLL_STEP_MS / 1000)
        assert msg is None or msg.error() is None, msg.error()
        return msg

    a = member("ck-a")
    poll_until(
        "the first member to own every partition",
        lambda: owned(a) == ALL_PARTITIONS,
        lambda: drain(a),
    )
    b = member("ck-b")
    poll_until(
        "two members to split the partitions",
        lambda: is_split(owned(a), owned(b)),
        lambda: (drain(a), drain(b)),
    )
    split = (owned(a), owned(b))
    b.close()  # LeaveGroup: the group rebalances at once
    poll_until(
        "the remaining member to own every partition",
        lambda: owned(a) == ALL_PARTITIONS,
        lambda: drain(a),
    )
    a.commit(
        offsets=[TopicPartition(topic, p, o, metadata=f"ck-{p}") for p, o in COMMITTED.items()],
        asynchronous=False,
    )
    a.close()

    c = member("ck-c")
    first: dict[int, Any] = {}

    def consume() -> None:
        msg = drain(c)
        if msg is not None:
            first.setdefault(msg.partition(), (msg.offset(), msg.value()))

    poll_until("the new member to read every partition", lambda: len(first) == PARTITIONS, consume)
    committed = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
    c.close()
    return {
        "split": split,
        "first": first,
        "committed": {tp.partition: (tp.offset, tp.metadata) for tp in committed},
    }


async def test_confluent_kafka_group(gb: GroupBroker) -> None:
    topic, group = "ck-group-topic", "ck-group"
    r = await in_thread(lambda: _confluent_scenario(gb.bootstrap, topic, group))
    assert is_split(*r["split"]), r["split"]
    assert r["first"] == {p: (o, expected_value(p, o)) for p, o in COMMITTED.items()}
    assert r["committed"] == {p: (o, f"ck-{p}") for p, o in COMMITTED.items()}
    # With FindCoordinator v0 advertised, librdkafka's LZ4 reaches the broker compressed.
    assert gb.broker.backend.codecs_seen[topic] == {LZ4}


# ------------------------------------------------------------------------------ aiokafka
async def _aiokafka_scenario(bootstrap: str, topic: str, group: str) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.structs import OffsetAndMetadata

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    for p in range(PARTITIONS):
        for o in range(RECORDS_PER_PARTITION):
            await producer.send(topic, value=expected_value(p, o), partition=p)
    await producer.flush()
    await producer.stop()

    async def member(name: str) -> Any:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            client_id=name,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        )
        await consumer.start()
        return consumer

    def owned(consumer: Any) -> set[int]:
        return {tp.partition for tp in consumer.assignment()}

    async def apoll_until(what: str, condition: Callable[[], bool], *consumers: Any) -> None:
        deadline = time.monotonic() + CONDITION_DEADLINE_S
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {CONDITION_DEADLINE_S} s: {what}")
            await asyncio.gather(*(c.getmany(timeout_ms=POLL_STEP_MS) for c in consumers))

    a = await member("aio-a")
    await apoll_until(
        "the first member to own every partition", lambda: owned(a) == ALL_PARTITIONS, a
    )
    b = await member("aio-b")
    await apoll_until("two members to split", lambda: is_split(owned(a), owned(b)), a, b)
    split = (owned(a), owned(b))
    await b.stop()  # LeaveGroup: the group rebalances at once
    await apoll_until(
        "the remaining member to own every partition", lambda: owned(a) == ALL_PARTITIONS, a
    )
    await a.commit(
        {TopicPartition(topic, p): OffsetAndMetadata(o, f"aio-{p}") for p, o in COMMITTED.items()}
    )
    await a.stop()

    c = await member("aio-c")
    first: dict[int, Any] = {}

    deadline = time.monotonic() + CONDITION_DEADLINE_S
    while len(first) < PARTITIONS:
        if time.monotonic() > deadline:
            raise AssertionError("timed out: the new member to read every partition")
        for tp, records in (await c.getmany(timeout_ms=POLL_STEP_MS)).items():
            first.setdefault(tp.partition, (records[0].offset, records[0].value))
    committed = {p: await c.committed(TopicPartition(topic, p)) for p in range(PARTITIONS)}
    await c.stop()
    return {"split": split, "first": first, "committed": committed}


async def test_aiokafka_group(gb: GroupBroker) -> None:
    topic, group = "aio-group-topic", "aio-group"
    r = await in_thread(lambda: asyncio.run(_aiokafka_scenario(gb.bootstrap, topic, group)))
    assert is_split(*r["split"]), r["split"]
    assert r["first"] == {p: (o, expected_value(p, o)) for p, o in COMMITTED.items()}
    assert r["committed"] == COMMITTED


# ------------------------------------------------------------------------------ unknown topics
def _confluent_commit_unknown(bootstrap: str, topic: str, group: str) -> dict[str, Any]:
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(CLIENT_DEADLINE_S)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    wanted = [
        TopicPartition(topic, 0, 3),
        TopicPartition(topic, 7, 3),  # the topic has one partition
        TopicPartition("no-such-topic", 0, 3),
    ]
    try:
        answered = consumer.commit(offsets=wanted, asynchronous=False)
    except KafkaException as exc:
        # Some librdkafka versions raise the first partition error instead of listing them.
        answered = exc.args[0]
    committed = consumer.committed([TopicPartition(topic, 0)], timeout=CLIENT_DEADLINE_S)
    consumer.close()
    if not isinstance(answered, list):
        return {"raised": str(answered), "committed": committed[0].offset}
    errors = {(tp.topic, tp.partition): tp.error.name() if tp.error else None for tp in answered}
    return {"errors": errors, "committed": committed[0].offset}


async def test_an_offset_commit_for_a_partition_that_does_not_exist_is_refused(
    gb: GroupBroker,
) -> None:
    """Kafka answers UNKNOWN_TOPIC_OR_PARTITION per missing partition and commits the rest
    (librdkafka's test 0030 checks it)."""
    topic = "ck-commit-known"
    r = await in_thread(lambda: _confluent_commit_unknown(gb.bootstrap, topic, "ck-unknown"))
    assert r["committed"] == 3, r
    if "raised" in r:
        assert "UNKNOWN_TOPIC_OR_PART" in r["raised"], r
    else:
        assert r["errors"] == {
            (topic, 0): None,
            (topic, 7): "UNKNOWN_TOPIC_OR_PART",
            ("no-such-topic", 0): "UNKNOWN_TOPIC_OR_PART",
        }, r
