"""Transactions in the producer table (KIP-98): open/extend/end, fencing, retried markers,
the LSO with interleaved transactions, snapshots and replay of the transaction state."""

from __future__ import annotations

from pathlib import Path

from raftlog.errors import ErrorCode
from raftlog.records import Record, TxnMarker, build_batch, build_txn_marker, parse_txn_marker
from raftlog.replication.producer_state import (
    CompletedTxn,
    ProducerStateConfig,
    ProducerStateTable,
    Verdict,
    read_snapshot,
    rebuild,
    write_snapshot,
)
from raftlog.storage import LogConfig, PartitionLog

SMALL = LogConfig(segment_bytes=300, index_interval_bytes=100)


def txn(pid: int, seq: int, count: int = 1, *, epoch: int = 0, ts_ms: int = 1000) -> bytes:
    records = [Record(value=f"{pid}-{seq + i}".encode()) for i in range(count)]
    return build_batch(
        records,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        is_transactional=True,
        now_ms=ts_ms,
    )


def marker(pid: int, *, commit: bool, epoch: int = 0, coordinator_epoch: int = 0) -> bytes:
    return build_txn_marker(
        producer_id=pid,
        producer_epoch=epoch,
        coordinator_epoch=coordinator_epoch,
        commit=commit,
        timestamp_ms=1000,
    )


def parsed(data: bytes) -> TxnMarker:
    found = parse_txn_marker(data)
    assert found is not None
    return found


def append(table: ProducerStateTable, data: bytes) -> list[CompletedTxn]:
    return table.update_leader_append(data, table.next_offset)


def test_transaction_opens_extends_and_ends() -> None:
    table = ProducerStateTable()
    assert append(table, txn(1, 0, 2)) == []  # offsets 0-1
    assert append(table, txn(1, 2, 3)) == []  # 2-4 extends it
    entry = table.get(1)
    assert entry is not None and entry.current_txn_first_offset == 0
    assert table.first_undecided_offset() == 0
    assert table.last_stable_offset(high_watermark=3) == 0
    done = append(table, marker(1, commit=True, coordinator_epoch=4))  # offset 5
    assert done == [CompletedTxn(1, 0, 5, 6, aborted=False)]
    assert table.first_undecided_offset() is None
    # Until the HW passes the marker, the transaction is still unstable.
    assert table.last_stable_offset(high_watermark=5) == 0
    assert table.last_stable_offset(high_watermark=6) == 6
    assert (entry.current_txn_first_offset, entry.coordinator_epoch) == (-1, 4)


def test_interleaved_transactions_and_the_lso() -> None:
    table = ProducerStateTable()
    append(table, txn(1, 0))  # 0: A opens
    append(table, build_batch([Record(value=b"plain")], now_ms=1000))  # 1
    append(table, txn(2, 0))  # 2: B opens
    append(table, txn(1, 1))  # 3
    assert table.ongoing_transactions() == {1: 0, 2: 2}
    # The LSO is the oldest open transaction's first offset, capped by the HW.
    assert table.last_stable_offset(high_watermark=4) == 0
    (b_done,) = append(table, marker(2, commit=False))  # 4: B aborted while A is open
    assert b_done == CompletedTxn(2, 2, 4, 0, aborted=True)
    assert table.last_stable_offset(high_watermark=5) == 0
    assert table.last_stable_offset(high_watermark=2) == 0
    (a_done,) = append(table, marker(1, commit=True))  # 5
    assert a_done == CompletedTxn(1, 0, 5, 6, aborted=False)
    assert table.last_stable_offset(high_watermark=3) == 0  # A's marker not replicated
    assert table.last_stable_offset(high_watermark=6) == 6


def test_lso_never_above_the_hw_and_waits_for_the_marker() -> None:
    table = ProducerStateTable()
    append(table, build_batch([Record(value=b"plain")], now_ms=1000))  # 0
    append(table, txn(1, 0))  # 1
    assert table.last_stable_offset(high_watermark=1) == 1
    assert table.last_stable_offset(high_watermark=0) == 0
    append(table, marker(1, commit=False))  # 2
    append(table, txn(2, 0))  # 3
    assert table.last_stable_offset(high_watermark=2) == 1  # marker at 2 not covered
    assert table.last_stable_offset(high_watermark=3) == 3  # covered; 2 opens at 3
    assert table.last_stable_offset(high_watermark=4) == 3


def test_marker_without_open_transaction_ends_an_empty_one() -> None:
    table = ProducerStateTable()
    assert append(table, marker(9, commit=False)) == [CompletedTxn(9, 0, 0, 1, aborted=True)]


def test_fenced_markers_and_batches_are_refused() -> None:
    table = ProducerStateTable()
    append(table, txn(1, 0, epoch=3))
    append(table, marker(1, commit=True, epoch=3, coordinator_epoch=5))
    old_epoch = table.check_marker(parsed(marker(1, commit=False, epoch=2, coordinator_epoch=5)))
    assert (old_epoch.verdict, old_epoch.error) == (Verdict.ERROR, ErrorCode.invalid_producer_epoch)
    old_coordinator = table.check_marker(
        parsed(marker(1, commit=False, epoch=3, coordinator_epoch=4))
    )
    assert old_coordinator.error == ErrorCode.transaction_coordinator_fenced
    # The coordinator fences a zombie: it aborts with a bumped epoch; the zombie's
    # transactional batches of the old epoch are refused from then on.
    append(table, txn(1, 1, epoch=3))
    assert (
        table.check_marker(parsed(marker(1, commit=False, epoch=4, coordinator_epoch=5))).verdict
        is Verdict.OK
    )
    append(table, marker(1, commit=False, epoch=4, coordinator_epoch=5))
    zombie = table.check_batches(txn(1, 2, epoch=3))
    assert (zombie.verdict, zombie.error) == (Verdict.ERROR, ErrorCode.invalid_producer_epoch)
    assert table.check_batches(txn(1, 0, epoch=4)).verdict is Verdict.OK


def test_retried_marker_is_a_duplicate_until_a_new_transaction_opens() -> None:
    table = ProducerStateTable()
    append(table, txn(1, 0))
    commit = marker(1, commit=True, coordinator_epoch=2)
    assert table.check_marker(parsed(commit)).verdict is Verdict.OK
    append(table, commit)  # offset 1
    retry = table.check_marker(parsed(commit))
    assert (retry.verdict, retry.duplicate_offset) == (Verdict.DUPLICATE, 1)
    # Another type or coordinator epoch is no retry of it.
    assert (
        table.check_marker(parsed(marker(1, commit=False, coordinator_epoch=2))).verdict
        is Verdict.OK
    )
    assert (
        table.check_marker(parsed(marker(1, commit=True, coordinator_epoch=3))).verdict
        is Verdict.OK
    )
    append(table, txn(1, 1))  # a new transaction: the same marker now ends it
    assert table.check_marker(parsed(commit)).verdict is Verdict.OK


def test_open_transactions_are_neither_expired_nor_evicted() -> None:
    table = ProducerStateTable(
        ProducerStateConfig(max_producer_ids=2, producer_id_expiration_ms=10)
    )
    append(table, txn(1, 0, ts_ms=0))
    append(
        table,
        build_batch(
            [Record(value=b"x")], producer_id=2, producer_epoch=0, base_sequence=0, now_ms=0
        ),
    )
    append(
        table,
        build_batch(
            [Record(value=b"y")], producer_id=3, producer_epoch=0, base_sequence=0, now_ms=0
        ),
    )
    assert table.get(1) is not None and table.get(2) is None  # 2 evicted, not the open 1
    assert table.expire(now_ms=1_000) == [3]
    assert table.get(1) is not None and table.first_undecided_offset() == 0


def _log_with_transactions(tmp_path: Path) -> tuple[PartitionLog, ProducerStateTable]:
    plog = PartitionLog.open(tmp_path, SMALL, now_ms=0)
    table = ProducerStateTable()
    steps = [
        txn(1, 0, 2),
        txn(2, 0),
        marker(1, commit=False, coordinator_epoch=1),
        txn(3, 0, 3),
        txn(2, 1),
        marker(2, commit=True, coordinator_epoch=1),
        txn(1, 2, epoch=1),
    ]
    for data in steps:
        info = plog.append_as_leader(data, leader_epoch=1, now_ms=0)
        table.update_leader_append(data, info.first_offset)
    assert len(plog.segments) > 1
    return plog, table


def test_rebuild_from_the_log_equals_the_live_table(tmp_path: Path) -> None:
    plog, table = _log_with_transactions(tmp_path)
    fresh = rebuild(plog, tmp_path / "no-snapshots")
    assert fresh.as_tuple() == table.as_tuple()
    assert fresh.ongoing_transactions() == table.ongoing_transactions() == {3: 4, 1: 9}


def test_snapshot_keeps_the_transaction_state(tmp_path: Path) -> None:
    _plog, table = _log_with_transactions(tmp_path)
    path = write_snapshot(table, tmp_path, now_ms=1000)
    restored = read_snapshot(path)
    assert restored.as_tuple() == table.as_tuple()
    assert restored.ongoing_transactions() == {3: 4, 1: 9}
    assert restored.first_undecided_offset() == 4
