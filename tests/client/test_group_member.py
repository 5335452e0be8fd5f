"""The client's group member and group consumer against raftlog's Kafka server with the real
group coordinator (the in-memory test backend with InProcessGroupService, as in
tests/kafka/test_groups_wire.py): two members split a 4-partition topic, the second leaving
hands its partitions to the first at the committed offsets, and closing commits and leaves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from raftlog.client import Admin, Cluster, NewTopic, Producer, open_cluster
from raftlog.client.group_consumer import (
    GroupConsumer,
    GroupConsumerConfig,
    open_group_consumer,
)
from raftlog.client.group_member import CommitFailed, GroupMemberError, MemberConfig
from raftlog.client.groups import GroupAdmin
from raftlog.errors import ErrorCode
from raftlog.records import Record
from tests.kafka.test_groups_wire import GroupBroker, start_group_broker
from tests.waiting import wait_until

TOPIC = "events"
PARTITIONS = 4
ALL = frozenset((TOPIC, p) for p in range(PARTITIONS))
# The coordinator's minimum session; heartbeats this often notice a rebalance at once.
FAST = MemberConfig(session_timeout_ms=6_000, heartbeat_interval_ms=50, retry_backoff_ms=20)
CONFIG = GroupConsumerConfig(member=FAST, reset="earliest", fetch_max_wait_ms=50)
CONDITION_DEADLINE_S = 20


@pytest.fixture
async def gb(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[GroupBroker]:
    started = await start_group_broker(nursery, tmp_path)
    yield started
    started.broker.backend.close()


@pytest.fixture
async def cluster(gb: GroupBroker) -> AsyncIterator[Cluster]:
    async with open_cluster(gb.bootstrap) as opened:
        await Admin(opened).create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS)])
        yield opened


@dataclass
class Running:
    """A group consumer draining records in a task of its own; cancel `scope` to close it."""

    consumer: GroupConsumer
    scope: trio.CancelScope
    seen: list[tuple[int, int, bytes]] = field(default_factory=list)
    done: trio.Event = field(default_factory=trio.Event)

    async def close(self) -> None:
        self.scope.cancel()
        with trio.fail_after(CONDITION_DEADLINE_S):
            await self.done.wait()


async def start_member(
    nursery: trio.Nursery, cluster: Cluster, group: str, config: GroupConsumerConfig = CONFIG
) -> Running:
    async def run(task_status: trio.TaskStatus[Running]) -> None:
        scope = trio.CancelScope()
        running: Running | None = None
        try:
            with scope:
                async with open_group_consumer(cluster, group, [TOPIC], config) as consumer:
                    running = Running(consumer, scope)
                    task_status.started(running)
                    while True:
                        item = await consumer.receive()
                        running.seen.append(
                            (item.partition, item.record.offset, item.record.value or b"")
                        )
        finally:
            if running is not None:
                running.done.set()

    with trio.fail_after(CONDITION_DEADLINE_S):
        return await nursery.start(run)


async def produce_round(cluster: Cluster, round_: int, per_partition: int = 5) -> set[bytes]:
    producer = Producer(cluster)
    values: set[bytes] = set()
    for p in range(PARTITIONS):
        batch = [Record(value=f"r{round_}-p{p}-{i}".encode()) for i in range(per_partition)]
        await producer.produce(TOPIC, batch, partition=p)
        values.update(r.value for r in batch if r.value)
    return values


def partitions_of(running: Running) -> set[int]:
    return {p for p, _, _ in running.seen}


async def test_two_members_split_and_one_takes_over_at_the_committed_offsets(
    nursery: trio.Nursery, cluster: Cluster
) -> None:
    a = await start_member(nursery, cluster, "g")
    assert a.consumer.assignment == ALL
    assert a.consumer.member.member_id  # given by the coordinator (KIP-394 round trip)
    b = await start_member(nursery, cluster, "g")
    await wait_until(
        "a 2/2 split",
        lambda: len(a.consumer.assignment) == 2 and len(b.consumer.assignment) == 2,
        CONDITION_DEADLINE_S,
    )
    assert a.consumer.assignment | b.consumer.assignment == ALL
    assert a.consumer.member.generation is not None and b.consumer.member.generation is not None
    assert a.consumer.member.generation.generation_id == b.consumer.member.generation.generation_id

    first = await produce_round(cluster, 1)
    await wait_until(
        "round 1 read", lambda: len(a.seen) + len(b.seen) == len(first), CONDITION_DEADLINE_S
    )
    assert partitions_of(a) == {p for _, p in a.consumer.assignment}
    assert partitions_of(b) == {p for _, p in b.consumer.assignment}
    assert {v for *_, v in a.seen + b.seen} == first

    description = await GroupAdmin(cluster).describe_group("g")
    assert description.state == "Stable" and description.protocol == "range"
    assert {m.member_id: frozenset(m.assignment) for m in description.members} == {
        a.consumer.member.member_id: a.consumer.assignment,
        b.consumer.member.member_id: b.consumer.assignment,
    }

    b_partitions = {p for _, p in b.consumer.assignment}
    await b.close()  # commits what it read and leaves: a gets everything at once
    await wait_until(
        "a owns every partition", lambda: a.consumer.assignment == ALL, CONDITION_DEADLINE_S
    )
    committed = await GroupAdmin(cluster).committed_positions("g", sorted(ALL))
    assert {p: committed[(TOPIC, p)] for p in b_partitions} == dict.fromkeys(b_partitions, 5)

    second = await produce_round(cluster, 2)
    await wait_until(
        "round 2 read",
        lambda: len(a.seen) + len(b.seen) == len(first | second),
        CONDITION_DEADLINE_S,
    )
    values = [v for *_, v in a.seen + b.seen]
    assert sorted(values) == sorted(first | second), "no record lost, none read twice"

    await a.close()
    committed = await GroupAdmin(cluster).committed_positions("g", sorted(ALL))
    assert committed == dict.fromkeys(ALL, 10)
    description = await GroupAdmin(cluster).describe_group("g")
    assert (description.state, description.members) == ("Empty", ())


async def test_a_new_member_resumes_where_the_last_one_committed(
    nursery: trio.Nursery, cluster: Cluster
) -> None:
    first = await produce_round(cluster, 1, per_partition=3)
    a = await start_member(nursery, cluster, "resume")
    await wait_until("everything read", lambda: len(a.seen) == len(first), CONDITION_DEADLINE_S)
    await a.close()
    again = await start_member(nursery, cluster, "resume")
    second = await produce_round(cluster, 2, per_partition=2)
    await wait_until(
        "the new records read", lambda: len(again.seen) == len(second), CONDITION_DEADLINE_S
    )
    assert {v for *_, v in again.seen} == second
    await again.close()


async def test_latest_reset_skips_old_records_and_commit_is_explicit(
    nursery: trio.Nursery, cluster: Cluster
) -> None:
    await produce_round(cluster, 1, per_partition=2)
    config = GroupConsumerConfig(member=FAST, reset="latest", fetch_max_wait_ms=50)
    a = await start_member(nursery, cluster, "tail", config)
    fresh = await produce_round(cluster, 2, per_partition=1)
    await wait_until(
        "the new records read", lambda: len(a.seen) == len(fresh), CONDITION_DEADLINE_S
    )
    assert {v for *_, v in a.seen} == fresh
    await a.consumer.commit()
    committed = await GroupAdmin(cluster).committed_positions("tail", sorted(ALL))
    assert committed == dict.fromkeys(ALL, 3)
    await a.close()


async def test_commit_outside_a_generation_is_refused(
    nursery: trio.Nursery, cluster: Cluster
) -> None:
    a = await start_member(nursery, cluster, "closed")
    member = a.consumer.member
    await a.close()
    with pytest.raises(CommitFailed) as failed:
        await member.commit({(TOPIC, 0): 1})
    assert failed.value.code == ErrorCode.rebalance_in_progress


async def test_a_session_below_the_brokers_minimum_is_a_clear_error(cluster: Cluster) -> None:
    config = GroupConsumerConfig(
        member=MemberConfig(session_timeout_ms=1_000, heartbeat_interval_ms=100)
    )
    with pytest.raises(BaseExceptionGroup) as raised, trio.fail_after(CONDITION_DEADLINE_S):
        async with open_group_consumer(cluster, "short", [TOPIC], config):
            pytest.fail("joined with a session the coordinator refuses")
    errors = [e for e in _leaves(raised.value) if isinstance(e, GroupMemberError)]
    assert errors and "INVALID_SESSION_TIMEOUT" in str(errors[0]).upper()


async def test_an_empty_assignment_waits_without_records(
    nursery: trio.Nursery, cluster: Cluster
) -> None:
    """More members than partitions: the extra member owns nothing and reads nothing."""
    members = [await start_member(nursery, cluster, "crowd") for _ in range(PARTITIONS + 1)]
    await wait_until(
        "one partition each, one member idle",
        lambda: sorted(len(m.consumer.assignment) for m in members) == [0, 1, 1, 1, 1],
        CONDITION_DEADLINE_S,
    )
    await produce_round(cluster, 1, per_partition=1)
    await wait_until(
        "every record read", lambda: sum(len(m.seen) for m in members) == 4, CONDITION_DEADLINE_S
    )
    assert sorted(len(m.seen) for m in members) == [0, 1, 1, 1, 1]
    for m in members:
        await m.close()


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]
