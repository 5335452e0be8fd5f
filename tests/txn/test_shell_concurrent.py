"""AddPartitionsToTxn and AddOffsetsToTxn that find the producer's last transaction still
writing its markers wait (bounded) for it to complete instead of answering
CONCURRENT_TRANSACTIONS at once: a producer that starts its next transaction right after
EndTxn would otherwise back off and retry on every transaction."""

from __future__ import annotations

import trio
import trio.testing

from raftlog.errors import ErrorCode
from raftlog.txn.log_format import TransactionState as S
from raftlog.txn.messages import AddOffsetsToTxnRequest, EndTxnRequest
from raftlog.txn.shell import CONCURRENT_TRANSACTIONS_WAIT_MS
from tests.txn.harness import txn_id_on
from tests.txn.test_shell import CONFIG, T0, T1, FakeNode, add, init, start_shell, state
from tests.waiting import wait_until


async def test_the_next_transaction_waits_for_the_last_ones_markers(autojump_clock) -> None:
    node = FakeNode()
    txn_id = txn_id_on(1, CONFIG)
    node.markers_hang = trio.Event()  # markers stay unanswered until markers_go
    async with trio.open_nursery() as nursery:
        shell = await start_shell(nursery, node)
        pid, epoch = await init(shell, txn_id)
        # Two partitions, so EndTxn is answered at its PrepareCommit record (one partition
        # would commit in one phase, answered once its marker is written).
        assert await add(shell, txn_id, pid, epoch, T0, T1) is ErrorCode.none
        ended = await shell.end_txn(EndTxnRequest(txn_id, pid, epoch, committed=True))
        assert ended.error_code is ErrorCode.none
        assert state(node, txn_id) is S.PREPARE_COMMIT

        answers: list[ErrorCode] = []

        async def next_transaction() -> None:
            answers.append(await add(shell, txn_id, pid, epoch, T1))

        nursery.start_soon(next_transaction)
        await trio.testing.wait_all_tasks_blocked()
        assert answers == []  # held, not refused
        node.markers_hang.set()
        node.markers_go.set()
        await wait_until("the held AddPartitionsToTxn's answer", lambda: bool(answers))
        assert answers == [ErrorCode.none]
        assert state(node, txn_id) is S.ONGOING
        nursery.cancel_scope.cancel()


async def test_the_wait_is_bounded(autojump_clock) -> None:
    node = FakeNode()
    txn_id = txn_id_on(0, CONFIG)
    node.markers_hang = trio.Event()  # the markers never land
    async with trio.open_nursery() as nursery:
        shell = await start_shell(nursery, node)
        pid, epoch = await init(shell, txn_id)
        await add(shell, txn_id, pid, epoch, T0)
        await shell.end_txn(EndTxnRequest(txn_id, pid, epoch, committed=False))
        began = trio.current_time()
        assert await add(shell, txn_id, pid, epoch, T1) is ErrorCode.concurrent_transactions
        offsets = await shell.add_offsets_to_txn(AddOffsetsToTxnRequest(txn_id, pid, epoch, "g"))
        assert offsets is ErrorCode.concurrent_transactions
        waited_s = trio.current_time() - began
        assert 2 * CONCURRENT_TRANSACTIONS_WAIT_MS / 1000 <= waited_s < 3
        nursery.cancel_scope.cancel()
