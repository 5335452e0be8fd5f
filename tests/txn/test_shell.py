"""The transaction coordinator's trio shell on a MockClock, with the real TxnCoordinator: only
the node's edges are fakes (a replicated `__transaction_state` log, partitions that take
markers, a producer id allocator)."""

from __future__ import annotations

import math

import trio
import trio.testing

from raftlog.errors import ErrorCode, KafkaError
from raftlog.txn import log_format as fmt
from raftlog.txn.effects import WriteMarkers
from raftlog.txn.log_format import TransactionState as S
from raftlog.txn.messages import (
    AddPartitionsTxn,
    EndTxnRequest,
    EndTxnResult,
    InitProducerIdRequest,
)
from raftlog.txn.settings import TxnConfig
from raftlog.txn.shell import TxnCoordinatorShell
from tests.txn.harness import txn_id_on
from tests.waiting import wait_until

REPLICATION_DELAY_S = 0.005
START_MS = 1_700_000_000_000  # the shell is given wall-clock time
DEADLINE_S = 120.0  # virtual seconds
CONFIG = TxnConfig(
    transaction_state_log_num_partitions=2,
    transaction_abort_timed_out_transaction_cleanup_interval_ms=1_000,
)
T0, T1 = ("orders", 0), ("orders", 1)


def trio_clock_ms() -> int:
    return START_MS + math.ceil(trio.current_time() * 1000)


class FakeNode:
    """The node's side: a replicated `__transaction_state`, data partitions taking markers,
    producer id blocks."""

    def __init__(self) -> None:
        self.log: dict[int, list[fmt.Record]] = {}
        self.append_fails_with: ErrorCode | None = None
        # Marker answers to give before a partition takes its marker: partition -> codes.
        self.marker_failures: dict[fmt.TopicPartition, list[ErrorCode]] = {}
        self.marker_attempts = 0
        self.markers_hang = trio.Event()  # set: marker writes never answer
        self.markers_hang.set()
        self.markers_go = trio.Event()
        # Every marker a partition took: (partition, producer id, epoch, coordinator epoch, commit).
        self.written: list[tuple[fmt.TopicPartition, int, int, int, bool]] = []
        self.read_failures = 0  # reads that fail before one succeeds
        self.blocks = 0
        self.block_size = 10
        self.allocator_fails = 0

    async def append(self, partition: int, records: list[fmt.Record]) -> None:
        await trio.sleep(REPLICATION_DELAY_S)
        if self.append_fails_with is not None:
            raise KafkaError(self.append_fails_with)
        self.log.setdefault(partition, []).extend(records)

    async def read_all(self, partition: int) -> list[fmt.Record]:
        if self.read_failures:
            self.read_failures -= 1
            raise KafkaError(ErrorCode.offset_out_of_range, "the log moved under the read")
        return list(self.log.get(partition, []))

    async def write_markers(self, markers: WriteMarkers) -> dict[fmt.TopicPartition, ErrorCode]:
        self.marker_attempts += 1
        if not self.markers_hang.is_set():
            await self.markers_go.wait()
        await trio.sleep(REPLICATION_DELAY_S)
        results = {}
        for partition in markers.partitions:
            failures = self.marker_failures.get(partition)
            if failures:
                results[partition] = failures.pop(0)
                continue
            results[partition] = ErrorCode.none
            self.written.append(
                (
                    partition,
                    markers.producer_id,
                    markers.producer_epoch,
                    markers.coordinator_epoch,
                    markers.commit,
                )
            )
        return results

    async def allocate_block(self) -> range:
        await trio.sleep(REPLICATION_DELAY_S)
        if self.allocator_fails:
            self.allocator_fails -= 1
            raise KafkaError(ErrorCode.request_timed_out, "no controller")
        start = 1000 + self.blocks * self.block_size
        self.blocks += 1
        return range(start, start + self.block_size)

    def stored(self, partition: int) -> dict[str, fmt.TransactionLogValue]:
        return fmt.replay(self.log.get(partition, []))


async def start_shell(
    nursery: trio.Nursery, node: FakeNode, epoch: int = 0, partitions: tuple[int, ...] = (0, 1)
) -> TxnCoordinatorShell:
    shell = TxnCoordinatorShell(
        CONFIG,
        node.append,
        node.read_all,
        node.write_markers,
        node.allocate_block,
        clock_ms=trio_clock_ms,
    )
    await nursery.start(shell.run)
    for partition in partitions:
        shell.become_coordinator(partition, epoch)
        await shell.wait_loaded(partition)
    return shell


async def init(
    shell: TxnCoordinatorShell, txn_id: str, timeout_ms: int = 60_000
) -> tuple[int, int]:
    """InitProducerId, retried while the coordinator has no producer id at hand."""
    while True:
        result = await shell.init_producer_id(InitProducerIdRequest(txn_id, timeout_ms))
        if result.error_code is ErrorCode.coordinator_load_in_progress:
            await trio.sleep(0.1)  # the client's retry backoff
            continue
        assert result.error_code is ErrorCode.none, result
        return result.producer_id, result.producer_epoch


async def add(shell: TxnCoordinatorShell, txn_id: str, pid: int, epoch: int, *parts) -> ErrorCode:
    [result] = await shell.add_partitions_to_txn([AddPartitionsTxn(txn_id, pid, epoch, parts)])
    codes = set(result.errors.values())
    assert len(codes) == 1, result
    return codes.pop()


def state(node: FakeNode, txn_id: str) -> S | None:
    value = node.stored(CONFIG.partition_for(txn_id)).get(txn_id)
    return None if value is None else value.state


async def test_commit_then_abort_write_markers_and_complete(autojump_clock) -> None:
    node = FakeNode()
    txn_id = txn_id_on(1, CONFIG)
    async with trio.open_nursery() as nursery:
        shell = await start_shell(nursery, node, epoch=4)
        pid, epoch = await init(shell, txn_id)
        assert pid >= 1000 and epoch == 0
        assert await add(shell, txn_id, pid, epoch, T0, T1) is ErrorCode.none
        assert shell.verify(txn_id, pid, epoch, *T0) is ErrorCode.none
        assert shell.verify(txn_id, pid, epoch, "other", 0) is ErrorCode.invalid_txn_state

        result = await shell.end_txn(EndTxnRequest(txn_id, pid, epoch, committed=True))
        assert result.error_code is ErrorCode.none
        # Answered once PrepareCommit is replicated; markers and CompleteCommit follow.
        assert state(node, txn_id) in (S.PREPARE_COMMIT, S.COMPLETE_COMMIT)
        await wait_until("CompleteCommit", lambda: state(node, txn_id) is S.COMPLETE_COMMIT)
        assert sorted(node.written) == [(T0, pid, 0, 4, True), (T1, pid, 0, 4, True)]

        assert await add(shell, txn_id, pid, epoch, T1) is ErrorCode.none
        result = await shell.end_txn(EndTxnRequest(txn_id, pid, epoch, committed=False))
        assert result.error_code is ErrorCode.none
        await wait_until("CompleteAbort", lambda: state(node, txn_id) is S.COMPLETE_ABORT)
        assert node.written[-1] == (T1, pid, 0, 4, False)
        nursery.cancel_scope.cancel()


async def test_failed_markers_are_retried_until_they_land(autojump_clock) -> None:
    node = FakeNode()
    txn_id = txn_id_on(0, CONFIG)
    node.marker_failures[T1] = [ErrorCode.not_enough_replicas] * 3 + [ErrorCode.request_timed_out]
    async with trio.open_nursery() as nursery:
        shell = await start_shell(nursery, node)
        pid, epoch = await init(shell, txn_id)
        await add(shell, txn_id, pid, epoch, T0, T1)
        await shell.end_txn(EndTxnRequest(txn_id, pid, epoch, committed=True))
        await wait_until("CompleteCommit", lambda: state(node, txn_id) is S.COMPLETE_COMMIT)
        assert node.marker_attempts == 5  # both, then T1 alone four more times
        # T0's marker is written once: only the partitions still owed one are tried again.
        assert [w[0] for w in node.written] == [T0, T1]
        nursery.cancel_scope.cancel()


async def test_a_new_coordinator_finishes_a_commit_its_predecessor_began(autojump_clock) -> None:
    node = FakeNode()
    txn_id = txn_id_on(1, CONFIG)
    node.markers_hang = trio.Event()  # markers stay unanswered until markers_go
    async with trio.open_nursery() as nursery:
        first = await start_shell(nursery, node, epoch=1)
        pid, epoch = await init(first, txn_id)
        # Two partitions: the commit writes PrepareCommit (one would commit in one phase).
        await add(first, txn_id, pid, epoch, T0, T1)
        result = await first.end_txn(EndTxnRequest(txn_id, pid, epoch, committed=True))
        assert result.error_code is ErrorCode.none
        await wait_until("markers sent", lambda: node.marker_attempts == 1)
        assert state(node, txn_id) is S.PREPARE_COMMIT

        # Leadership moves mid-commit; callers of the old coordinator are told to look again.
        first.resign(1)
        assert first.coordinator(1) is None
        retried = await first.end_txn(EndTxnRequest(txn_id, pid, epoch, committed=True))
        assert retried.error_code is ErrorCode.not_coordinator
        node.markers_hang.set()
        node.markers_go.set()  # the old coordinator's marker lands late: it is ignored

        second = await start_shell(nursery, node, epoch=2, partitions=(1,))
        await wait_until("CompleteCommit", lambda: state(node, txn_id) is S.COMPLETE_COMMIT)
        # The replayed PrepareCommit was finished with the new coordinator epoch.
        assert (T0, pid, epoch, 2, True) in node.written
        assert len([w for w in node.written if w[4]]) == len(node.written)
        again = await second.end_txn(EndTxnRequest(txn_id, pid, epoch, committed=True))
        assert again.error_code is ErrorCode.none  # a retry finds its own outcome
        nursery.cancel_scope.cancel()


async def _one_phase_commit_cut_short(
    nursery: trio.Nursery, node: FakeNode, txn_id: str
) -> tuple[TxnCoordinatorShell, int, int]:
    """A commit of one partition whose marker is in flight when leadership moves: its
    caller is told NOT_COORDINATOR, the marker lands late, and a new coordinator takes over
    (returned, with the producer id and epoch)."""
    node.markers_hang = trio.Event()  # markers stay unanswered until markers_go
    first = await start_shell(nursery, node, epoch=1)
    pid, epoch = await init(first, txn_id)
    await add(first, txn_id, pid, epoch, T0)
    answers: list[EndTxnResult] = []

    async def commit() -> None:
        answers.append(await first.end_txn(EndTxnRequest(txn_id, pid, epoch, committed=True)))

    nursery.start_soon(commit)
    await wait_until("marker sent", lambda: node.marker_attempts == 1)
    # No PrepareCommit record: the COMMIT marker is the decision, and the caller waits for it.
    assert state(node, txn_id) is S.ONGOING
    assert answers == []
    first.resign(1)
    await wait_until("the caller answered", lambda: answers != [])
    assert answers[0].error_code is ErrorCode.not_coordinator
    node.markers_hang.set()
    node.markers_go.set()
    second = await start_shell(nursery, node, epoch=2, partitions=(1,))
    return second, pid, epoch


async def test_a_one_phase_commit_cut_short_is_committed_by_the_next_coordinator(
    autojump_clock,
) -> None:
    node = FakeNode()
    txn_id = txn_id_on(1, CONFIG)
    async with trio.open_nursery() as nursery:
        second, pid, epoch = await _one_phase_commit_cut_short(nursery, node, txn_id)
        # In doubt, but a commit is a commit: only COMMIT markers can have been written.
        again = await second.end_txn(EndTxnRequest(txn_id, pid, epoch, committed=True))
        assert again.error_code is ErrorCode.none
        await wait_until("CompleteCommit", lambda: state(node, txn_id) is S.COMPLETE_COMMIT)
        assert (T0, pid, epoch, 2, True) in node.written
        assert all(commit for *_, commit in node.written)
        nursery.cancel_scope.cancel()


async def test_an_abort_in_doubt_fences_the_producer_and_never_says_aborted(
    autojump_clock,
) -> None:
    """The old coordinator's COMMIT may have landed: "aborted" could be a lie. The abort
    bumps the epoch (the partition refuses the old epoch's markers from then on) and every
    answer for the old epoch is PRODUCER_FENCED."""
    node = FakeNode()
    txn_id = txn_id_on(1, CONFIG)
    async with trio.open_nursery() as nursery:
        second, pid, epoch = await _one_phase_commit_cut_short(nursery, node, txn_id)
        aborted = await second.end_txn(EndTxnRequest(txn_id, pid, epoch, committed=False))
        assert aborted.error_code is ErrorCode.producer_fenced
        await wait_until("CompleteAbort", lambda: state(node, txn_id) is S.COMPLETE_ABORT)
        assert (T0, pid, epoch + 1, 2, False) in node.written
        retried = await second.end_txn(EndTxnRequest(txn_id, pid, epoch, committed=False))
        assert retried.error_code is ErrorCode.producer_fenced
        # The producer starts over with InitProducerId, past the bumped epoch.
        new_pid, new_epoch = await init(second, txn_id)
        assert (new_pid, new_epoch) == (pid, epoch + 2)
        nursery.cancel_scope.cancel()


async def test_a_new_leader_epoch_replaces_the_coordinator(autojump_clock) -> None:
    node = FakeNode()
    txn_id = txn_id_on(0, CONFIG)
    async with trio.open_nursery() as nursery:
        shell = await start_shell(nursery, node, epoch=3)
        pid, epoch = await init(shell, txn_id)
        old = shell.coordinator(0)
        shell.become_coordinator(0, 3)  # the same leadership: nothing changes
        assert shell.coordinator(0) is old
        shell.become_coordinator(0, 4)
        await shell.wait_loaded(0)
        new = shell.coordinator(0)
        assert new is not old and new is not None and new.coordinator_epoch == 4
        assert old is not None and old.resigned
        assert shell.partitions == {0: 4, 1: 3}
        assert await add(shell, txn_id, pid, epoch, T0) is ErrorCode.none
        nursery.cancel_scope.cancel()


async def test_the_timer_aborts_a_timed_out_transaction(autojump_clock) -> None:
    node = FakeNode()
    txn_id = txn_id_on(0, CONFIG)
    async with trio.open_nursery() as nursery:
        shell = await start_shell(nursery, node)
        pid, epoch = await init(shell, txn_id, timeout_ms=5_000)
        await add(shell, txn_id, pid, epoch, T0)
        began = trio.current_time()
        await wait_until("CompleteAbort", lambda: state(node, txn_id) is S.COMPLETE_ABORT, 60)
        waited_s = trio.current_time() - began
        assert 5 <= waited_s <= 5 + 1 + 1  # the timeout, then at most one scan interval
        # The abort bumped the epoch: the zombie is fenced on the partition and here.
        assert node.written == [(T0, pid, epoch + 1, 0, False)]
        late = await shell.end_txn(EndTxnRequest(txn_id, pid, epoch, committed=True))
        assert late.error_code is ErrorCode.producer_fenced
        nursery.cancel_scope.cancel()


async def test_failed_appends_answer_their_callers(autojump_clock) -> None:
    node = FakeNode()
    txn_id = txn_id_on(0, CONFIG)
    async with trio.open_nursery() as nursery:
        shell = await start_shell(nursery, node)
        pid, epoch = await init(shell, txn_id)
        node.append_fails_with = ErrorCode.not_enough_replicas
        assert await add(shell, txn_id, pid, epoch, T0) is ErrorCode.coordinator_not_available
        node.append_fails_with = None
        assert await add(shell, txn_id, pid, epoch, T0) is ErrorCode.none
        nursery.cancel_scope.cancel()


async def test_producer_ids_come_from_prefetched_blocks(autojump_clock) -> None:
    node = FakeNode()
    node.allocator_fails = 2
    async with trio.open_nursery() as nursery:
        shell = await start_shell(nursery, node)
        # The first block fails twice: InitProducerId is answered a retriable error meanwhile.
        first = await shell.init_producer_id(InitProducerIdRequest(txn_id_on(0, CONFIG, "a"), 1000))
        assert first.error_code is ErrorCode.coordinator_load_in_progress
        ids = []
        for n in range(25):
            pid, _ = await init(shell, txn_id_on(n % 2, CONFIG, f"p{n}"))
            ids.append(pid)
        assert len(set(ids)) == 25
        # Blocks of 10, each fetched ahead once 90% spent: never more than one spare block.
        assert node.blocks == 3
        nursery.cancel_scope.cancel()


async def test_requests_for_other_partitions_are_not_coordinator(autojump_clock) -> None:
    node = FakeNode()
    mine, theirs = txn_id_on(0, CONFIG), txn_id_on(1, CONFIG)
    async with trio.open_nursery() as nursery:
        shell = await start_shell(nursery, node, partitions=(0,))
        pid, epoch = await init(shell, mine)
        result = await shell.init_producer_id(InitProducerIdRequest(theirs, 1000))
        assert result.error_code is ErrorCode.not_coordinator
        assert shell.verify(theirs, pid, epoch, *T0) is ErrorCode.not_coordinator
        # A batch naming ids of several partitions: each answered by its own coordinator.
        results = await shell.add_partitions_to_txn(
            [AddPartitionsTxn(theirs, 1, 0, (T0,)), AddPartitionsTxn(mine, pid, epoch, (T1,))]
        )
        assert [r.transactional_id for r in results] == [theirs, mine]
        assert results[0].errors == {T0: ErrorCode.not_coordinator}
        assert results[1].errors == {T1: ErrorCode.none}
        [described_theirs, described_mine] = await shell.describe_transactions([theirs, mine])
        assert described_theirs.error_code is ErrorCode.not_coordinator
        assert described_mine.state == "Ongoing"
        nursery.cancel_scope.cancel()


async def test_list_transactions_merges_partitions(autojump_clock) -> None:
    node = FakeNode()
    ids = [txn_id_on(0, CONFIG, "x"), txn_id_on(1, CONFIG, "y")]
    async with trio.open_nursery() as nursery:
        shell = await start_shell(nursery, node)
        for txn_id in ids:
            await init(shell, txn_id)
        listed = await shell.list_transactions(["Empty", "Bogus"], [], -1)
        assert listed.error_code is ErrorCode.none
        assert [t.transactional_id for t in listed.transactions] == sorted(ids)
        assert listed.unknown_state_filters == ("Bogus",)
        nursery.cancel_scope.cancel()


async def test_list_transactions_is_cut_short_at_its_limit(autojump_clock, monkeypatch) -> None:
    import raftlog.txn.shell as shell_module

    node = FakeNode()
    node.log[0] = [
        fmt.record(
            txn_id_on(0, CONFIG, f"id-{i}"),
            fmt.TransactionLogValue(1000 + i, 0, 60_000, S.EMPTY, (), START_MS, -1),
        )
        for i in range(5)
    ]
    monkeypatch.setattr(shell_module, "MAX_LISTED_TRANSACTIONS", 3)
    monkeypatch.setattr(shell_module, "LIST_STEP_TRANSACTIONS", 2)
    async with trio.open_nursery() as nursery:
        shell = await start_shell(nursery, node, partitions=(0,))
        listed = await shell.list_transactions()
        assert listed.error_code is ErrorCode.none
        assert len(listed.transactions) == 3
        nursery.cancel_scope.cancel()


async def test_cancelled_caller_leaves_nothing_parked(autojump_clock) -> None:
    node = FakeNode()
    txn_id = txn_id_on(0, CONFIG)
    async with trio.open_nursery() as nursery:
        shell = await start_shell(nursery, node)
        pid, epoch = await init(shell, txn_id)
        with trio.move_on_after(REPLICATION_DELAY_S / 2) as scope:
            await add(shell, txn_id, pid, epoch, T0)
        assert scope.cancelled_caught
        assert not shell._replies
        await wait_until("the record lands anyway", lambda: state(node, txn_id) is S.ONGOING)
        nursery.cancel_scope.cancel()


async def test_a_partition_that_cannot_be_loaded_is_not_served(autojump_clock) -> None:
    node = FakeNode()
    txn_id = txn_id_on(0, CONFIG)
    async with trio.open_nursery() as nursery:
        shell = await start_shell(nursery, node, partitions=(1,))
        # One read fails (the log moved under it): the next attempt loads and serves.
        node.read_failures = 1
        shell.become_coordinator(0, 0)
        await shell.wait_loaded(0)
        pid, epoch = await init(shell, txn_id)
        shell.resign(0)

        # Every read fails: given up, answered NOT_COORDINATOR, the shell still serving.
        node.read_failures = 1_000
        shell.become_coordinator(0, 1)
        await shell.wait_loaded(0)
        assert shell.partitions == {1: 0}
        result = await shell.init_producer_id(InitProducerIdRequest(txn_id, 1000))
        assert result.error_code is ErrorCode.not_coordinator

        # A record that does not decode: not served from a partial state either.
        node.read_failures = 0
        node.log[0].append((b"\xff\xffgarbage", b"\x00"))
        shell.become_coordinator(0, 2)
        await shell.wait_loaded(0)
        assert shell.partitions == {1: 0}
        assert shell.verify(txn_id, pid, epoch, *T0) is ErrorCode.not_coordinator
        nursery.cancel_scope.cancel()
