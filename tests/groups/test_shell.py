"""The trio shell end to end on MockClock: consumers as tasks, a fake replicated log."""

from __future__ import annotations

import math

import trio
import trio.testing

from raftlog.errors import ErrorCode, KafkaError
from raftlog.groups.coordinator import GroupCoordinator, TxnProducer
from raftlog.groups.coordinator_shell import GroupCoordinatorShell
from raftlog.groups.messages import (
    HeartbeatRequest,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitTopic,
    OffsetFetchRequest,
    OffsetFetchTopic,
    SyncGroupRequest,
    TxnOffsetCommitRequest,
)
from raftlog.groups.offsets_format import LogEntry, Record, TxnEnd, TxnRecord
from raftlog.groups.settings import GroupConfig
from tests.groups.harness import join_req
from tests.waiting import wait_until

G = "shell-group"
REPLICATION_DELAY_S = 0.005


class FakeLog:
    """Stands in for the node: appends 'replicate' after a delay, read_all returns them."""

    def __init__(self) -> None:
        self.partitions: dict[int, list[LogEntry]] = {}
        self.txn_batches: list[TxnProducer] = []
        self.append_calls = 0
        self.fail_with: ErrorCode | None = None
        self.read_failures = 0  # reads that fail before one succeeds

    async def append(
        self, partition: int, records: list[Record], txn: TxnProducer | None = None
    ) -> None:
        self.append_calls += 1
        await trio.sleep(REPLICATION_DELAY_S)
        if self.fail_with is not None:
            raise KafkaError(self.fail_with)
        entries = self.partitions.setdefault(partition, [])
        if txn is None:
            entries.extend(records)
        else:
            self.txn_batches.append(txn)
            entries.extend(TxnRecord(txn.producer_id, k, v) for k, v in records)

    async def read_all(self, partition: int) -> list[LogEntry]:
        if self.read_failures:
            self.read_failures -= 1
            raise KafkaError(ErrorCode.offset_out_of_range, "the log moved under the read")
        return list(self.partitions.get(partition, []))


def trio_clock_ms() -> int:
    return math.ceil(trio.current_time() * 1000)


async def start_shell(nursery: trio.Nursery, log: FakeLog) -> GroupCoordinatorShell:
    config = GroupConfig(offsets_topic_num_partitions=2)
    shell = GroupCoordinatorShell(
        GroupCoordinator(config), log.append, log.read_all, clock_ms=trio_clock_ms
    )
    await nursery.start(shell.run)
    for partition in range(config.offsets_topic_num_partitions):
        await shell.become_coordinator(partition)
    return shell


# Virtual seconds on the MockClock: a session timeout or two fits well inside.
DEADLINE_S = 60.0


class Consumer:
    """Just enough of a Kafka consumer: join (with KIP-394), sync, heartbeat every 3 s."""

    def __init__(self, shell: GroupCoordinatorShell, name: str) -> None:
        self.shell, self.name = shell, name
        self.member_id = ""
        self.generation = -1
        self.assignment = b""
        self.generations_seen: list[int] = []
        self.alive = True

    async def join_and_sync(self) -> None:
        while True:
            reply = await self.shell.join_group(join_req(G, self.member_id, client_id=self.name))
            self.member_id = reply.member_id
            if reply.error_code is ErrorCode.member_id_required:
                continue
            assert reply.error_code is ErrorCode.none, reply
            self.generation = reply.generation_id
            assignments = tuple((m.member_id, m.member_id.encode()) for m in reply.members)
            sync = await self.shell.sync_group(
                SyncGroupRequest(G, self.generation, self.member_id, assignments=assignments)
            )
            if sync.error_code is ErrorCode.none:
                self.assignment = sync.assignment
                self.generations_seen.append(self.generation)
                return
            assert sync.error_code is ErrorCode.rebalance_in_progress, sync

    async def run(self) -> None:
        await self.join_and_sync()
        while self.alive:
            await trio.sleep(3)
            if not self.alive:
                return
            beat = await self.shell.heartbeat(HeartbeatRequest(G, self.generation, self.member_id))
            if beat.error_code is not ErrorCode.none:
                await self.join_and_sync()


async def test_consumers_rebalance_and_a_silent_one_is_expelled(autojump_clock) -> None:
    log = FakeLog()
    async with trio.open_nursery() as nursery:
        shell = await start_shell(nursery, log)
        a, b = Consumer(shell, "a"), Consumer(shell, "b")
        nursery.start_soon(a.run)
        nursery.start_soon(b.run)
        await wait_until(
            "both members assigned in one generation",
            lambda: a.assignment and b.assignment and a.generation == b.generation,
            DEADLINE_S,
        )
        assert a.assignment == a.member_id.encode() and b.assignment == b.member_id.encode()
        b.alive = False  # b stops heartbeating without leaving: only the session notices
        stopped_at = trio.current_time()
        gen = a.generation
        await wait_until("a rebalance without b", lambda: a.generation > gen, DEADLINE_S)
        # Expelled after its 10 s session, not before.
        assert trio.current_time() - stopped_at >= 10 - 3
        [described] = await shell.describe_groups([G])
        assert [m.member_id for m in described.members] == [a.member_id]
        nursery.cancel_scope.cancel()


async def test_commit_is_answered_after_replication_and_survives_failover(autojump_clock) -> None:
    log = FakeLog()
    request = OffsetCommitRequest(
        G, (OffsetCommitTopic("t", (OffsetCommitPartition(0, 11), OffsetCommitPartition(1, 12))),)
    )
    async with trio.open_nursery() as nursery:
        first = await start_shell(nursery, log)
        started = trio.current_time()
        replies = []

        async def commit() -> None:
            replies.append(await first.offset_commit(request))

        for _ in range(5):
            nursery.start_soon(commit)
        await wait_until("five commits answered", lambda: len(replies) == 5, DEADLINE_S)
        assert trio.current_time() - started >= REPLICATION_DELAY_S
        assert all(p.error_code is ErrorCode.none for r in replies for p in r.topics[0].partitions)
        # Queued commits share append calls (group commit), in order.
        assert log.append_calls <= 1 + 2 + 2  # two partitions loaded empty, then <= 2 batches
        first.resign(first.coordinator.partition_for(G))
        assert (await first.offset_fetch(OffsetFetchRequest(G))).error_code is (
            ErrorCode.not_coordinator
        )

        second = await start_shell(nursery, log)
        fetched = await second.offset_fetch(OffsetFetchRequest(G))
        assert [(p.partition, p.offset) for p in fetched.topics[0].partitions] == [(0, 11), (1, 12)]

        log.fail_with = ErrorCode.not_leader_or_follower
        failed = await second.offset_commit(request)
        assert {p.error_code for p in failed.topics[0].partitions} == {ErrorCode.not_coordinator}
        nursery.cancel_scope.cancel()


async def test_a_failed_load_is_retried_then_given_up(autojump_clock) -> None:
    log = FakeLog()
    commit = OffsetCommitRequest(G, (OffsetCommitTopic("t", (OffsetCommitPartition(0, 7),)),))
    async with trio.open_nursery() as nursery:
        first = await start_shell(nursery, log)
        await first.offset_commit(commit)
        partition = first.coordinator.partition_for(G)
        first.resign(partition)

        # One read fails (the log moved under it): the next attempt loads and serves.
        log.read_failures = 1
        await first.become_coordinator(partition)
        fetched = await first.offset_fetch(OffsetFetchRequest(G))
        assert [(p.partition, p.offset) for p in fetched.topics[0].partitions] == [(0, 7)]

        # Every read fails: the partition is given up, answered NOT_COORDINATOR, not served
        # from a partial state and not crashing the shell.
        first.resign(partition)
        log.read_failures = 1_000
        await first.become_coordinator(partition)
        assert (await first.offset_fetch(OffsetFetchRequest(G))).error_code is (
            ErrorCode.not_coordinator
        )
        nursery.cancel_scope.cancel()


async def test_cancelled_join_leaves_nothing_parked(autojump_clock) -> None:
    log = FakeLog()
    async with trio.open_nursery() as nursery:
        shell = await start_shell(nursery, log)
        first = await shell.join_group(join_req(G))
        await shell.join_group(join_req(G))  # a second member is now pending
        with trio.move_on_after(1) as scope:
            await shell.join_group(join_req(G, first.member_id))  # parked behind it
        assert scope.cancelled_caught
        assert not shell._slots
        nursery.cancel_scope.cancel()


def _txn_request(producer_id: int, offset: int) -> TxnOffsetCommitRequest:
    return TxnOffsetCommitRequest(
        "txn", G, producer_id, 0, (OffsetCommitTopic("t", (OffsetCommitPartition(0, offset),)),)
    )


async def test_txn_offsets_wait_for_complete_transaction(autojump_clock) -> None:
    log = FakeLog()
    plain = OffsetCommitRequest(G, (OffsetCommitTopic("u", (OffsetCommitPartition(0, 1),)),))
    async with trio.open_nursery() as nursery:
        shell = await start_shell(nursery, log)
        partition = shell.coordinator.partition_for(G)
        replies = []

        async def send(request: object) -> None:
            if isinstance(request, TxnOffsetCommitRequest):
                replies.append(await shell.txn_offset_commit(request))
            else:
                replies.append(await shell.offset_commit(request))  # type: ignore[arg-type]

        # Queued together, yet each producer's records land in a batch of their own.
        for request in (plain, _txn_request(7, 40), _txn_request(8, 50), plain):
            nursery.start_soon(send, request)
        await wait_until("four commits answered", lambda: len(replies) == 4, DEADLINE_S)
        assert all(p.error_code is ErrorCode.none for r in replies for p in r.topics[0].partitions)
        assert sorted(t.producer_id for t in log.txn_batches) == [7, 8]
        stable = OffsetFetchRequest(G, (OffsetFetchTopic("t", (0,)),), require_stable=True)
        [before] = (await shell.offset_fetch(stable)).topics[0].partitions
        assert before.error_code is ErrorCode.unstable_offset_commit

        # Producer 7 aborts, producer 8 commits (in whichever order they were written).
        log.partitions[partition].append(TxnEnd(7, False))
        await shell.complete_transaction(partition, 7, False)
        [still] = (await shell.offset_fetch(stable)).topics[0].partitions
        assert still.error_code is ErrorCode.unstable_offset_commit  # producer 8 is open
        log.partitions[partition].append(TxnEnd(8, True))
        await shell.complete_transaction(partition, 8, True)
        [after] = (await shell.offset_fetch(stable)).topics[0].partitions
        assert (after.offset, after.error_code) == (50, ErrorCode.none)

        # A new coordinator replays the same from the log, markers included.
        second = await start_shell(nursery, log)
        [replayed] = (await second.offset_fetch(stable)).topics[0].partitions
        assert (replayed.offset, replayed.error_code) == (50, ErrorCode.none)
        nursery.cancel_scope.cancel()


async def test_loading_a_large_offsets_partition_lets_the_node_run() -> None:
    """The offsets partition is decoded off the event loop: a task that only yields keeps
    running while 20 000 records are replayed (in one event-loop step they take ~0.3 s)."""
    from raftlog.groups.offsets_format import CommittedOffset, OffsetKey, offset_commit_record

    log = FakeLog()
    log.partitions[0] = [
        offset_commit_record(OffsetKey(f"g-{i}", "t", 0), CommittedOffset(i, -1, "", 1))
        for i in range(20_000)
    ]
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.lowlevel.checkpoint()
        before = ticks
        shell = await start_shell(nursery, log)
        loading_ticks = ticks - before
        fetched = await shell.offset_fetch(
            OffsetFetchRequest("g-7", (OffsetFetchTopic("t", (0,)),))
        )
        nursery.cancel_scope.cancel()
    assert loading_ticks > 10, loading_ticks
    assert fetched.topics[0].partitions[0].offset == 7
