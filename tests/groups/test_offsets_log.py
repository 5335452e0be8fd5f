"""The node's view of an offsets partition: RecordBatch v2 batches in, replay entries out;
and the sequence a transactional offsets batch carries, checked by the real producer table."""

from __future__ import annotations

import pytest

from raftlog.errors import CorruptRecordError, ErrorCode
from raftlog.groups import offsets_format as fmt
from raftlog.groups.coordinator import GroupCoordinator
from raftlog.groups.messages import OffsetFetchRequest
from raftlog.groups.node_service import batch_entries, next_sequence
from raftlog.groups.offsets_format import CommittedOffset, OffsetKey, TxnEnd, TxnRecord
from raftlog.groups.settings import GroupConfig
from raftlog.records import (
    Record,
    build_batch,
    build_txn_marker,
    iter_batches,
)
from raftlog.replication.core.producer_table import (
    MAX_SEQUENCE,
    ProducerStateTable,
    Verdict,
)

G = "log-group"


def offset_record(topic: str, partition: int, offset: int) -> Record:
    key, value = fmt.offset_commit_record(
        OffsetKey(G, topic, partition), CommittedOffset(offset, -1, "", 1)
    )
    return Record(key=key, value=value)


def entries_of(log: bytes) -> list[fmt.LogEntry]:
    return [e for pos, header in iter_batches(log) for e in batch_entries(log, pos, header)]


def leader_change_batch() -> bytes:
    # A control batch that is no transaction marker (KRaft's LEADER_CHANGE, type 2).
    control = Record(key=b"\x00\x00\x00\x02", value=b"\x00\x00")
    return build_batch([control], is_control=True)


def test_batches_become_replay_entries() -> None:
    plain = build_batch([offset_record("t", 0, 1)])
    txn = build_batch(
        [offset_record("t", 0, 10), offset_record("t", 1, 11)],
        producer_id=7,
        producer_epoch=0,
        base_sequence=0,
        is_transactional=True,
    )
    commit = build_txn_marker(producer_id=7, producer_epoch=0, coordinator_epoch=1, commit=True)
    aborted = build_batch(
        [offset_record("t", 2, 20)],
        producer_id=8,
        producer_epoch=1,
        base_sequence=0,
        is_transactional=True,
    )
    abort = build_txn_marker(producer_id=8, producer_epoch=1, coordinator_epoch=1, commit=False)
    log = plain + txn + commit + leader_change_batch() + aborted + abort
    entries = entries_of(log)
    assert [type(e).__name__ for e in entries] == [
        "tuple",
        "TxnRecord",
        "TxnRecord",
        "TxnEnd",
        "TxnRecord",
        "TxnEnd",
    ]
    assert entries[3] == TxnEnd(7, True)
    assert entries[5] == TxnEnd(8, False)
    assert isinstance(entries[4], TxnRecord) and entries[4].producer_id == 8
    coord = GroupCoordinator(GroupConfig(offsets_topic_num_partitions=1))
    coord.begin_load(0, 0)
    coord.complete_load(0, entries, 0)
    response = coord.offset_fetch(OffsetFetchRequest(G))
    got = {(t.name, p.partition): p.offset for t in response.topics for p in t.partitions}
    assert got == {("t", 0): 10, ("t", 1): 11}


def test_malformed_marker_is_corrupt() -> None:
    bad = build_batch(
        [Record(key=b"\x00\x00\x00\x01", value=b"\x00")],
        producer_id=7,
        producer_epoch=0,
        is_transactional=True,
        is_control=True,
    )
    with pytest.raises(CorruptRecordError):
        entries_of(bad)


def test_next_sequence_is_what_the_producer_table_accepts() -> None:
    """Successive transactional offsets batches of one producer, markers and an epoch bump
    between them, each built with next_sequence: the partition's producer table (the one
    the produce path checks) accepts every one."""
    table = ProducerStateTable()
    offset = 0
    pid = 31

    def append(batch: bytes) -> None:
        nonlocal offset
        check = table.check_headers([header for _, header in iter_batches(batch)])
        assert check.verdict is Verdict.OK, check
        table.update_leader_append(batch, offset)
        offset += sum(h.last_offset_delta + 1 for _, h in iter_batches(batch))

    def offsets_batch(epoch: int, count: int) -> bytes:
        return build_batch(
            [offset_record("t", i, i) for i in range(count)],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=next_sequence(table.get(pid), epoch),
            is_transactional=True,
        )

    assert next_sequence(None, 0) == 0
    append(offsets_batch(0, 2))
    append(offsets_batch(0, 3))
    assert next_sequence(table.get(pid), 0) == 5
    append(build_txn_marker(producer_id=pid, producer_epoch=0, coordinator_epoch=0, commit=True))
    append(offsets_batch(0, 1))
    # The producer is re-initialised: the coordinator aborts its open transaction with the
    # bumped epoch (only a marker ends a transaction), and the new epoch starts over at 0.
    append(build_txn_marker(producer_id=pid, producer_epoch=1, coordinator_epoch=0, commit=False))
    assert next_sequence(table.get(pid), 1) == 0
    append(offsets_batch(1, 1))
    assert table.get(pid) is not None


def test_next_sequence_wraps() -> None:
    table = ProducerStateTable()
    batch = build_batch(
        [offset_record("t", 0, 0)],
        producer_id=5,
        producer_epoch=0,
        base_sequence=MAX_SEQUENCE,
        is_transactional=True,
    )
    check = table.check_headers([h for _, h in iter_batches(batch)])
    assert check.verdict is Verdict.OK and check.error is ErrorCode.none
    table.update_leader_append(batch, 0)
    assert next_sequence(table.get(5), 0) == 0
