"""Which fetched batches a consumer returns under each isolation level (VisibleBatches, sans
IO): Kafka's rule over hand-built logs of transactional batches and markers."""

from __future__ import annotations

import pytest

from raftlog.client.consumer import (
    AbortedTxn,
    VisibleBatches,
    decode_records,
    iter_visible_batches,
)
from raftlog.client.protocol import IsolationLevel
from raftlog.errors import CorruptRecordError
from raftlog.records import Record, build_batch, build_txn_marker, iter_batches

COMMITTED = IsolationLevel.READ_COMMITTED
UNCOMMITTED = IsolationLevel.READ_UNCOMMITTED


class Log:
    """Batches appended at consecutive offsets."""

    def __init__(self, start: int = 0) -> None:
        self.data = bytearray()
        self.next_offset = start

    def data_batch(self, values: list[str], producer_id: int = -1, txn: bool = False) -> int:
        first = self.next_offset
        self.data += build_batch(
            [Record(value=v.encode()) for v in values],
            first,
            producer_id=producer_id,
            producer_epoch=0 if producer_id >= 0 else -1,
            base_sequence=0 if producer_id >= 0 else -1,
            is_transactional=txn,
            now_ms=1,
        )
        self.next_offset += len(values)
        return first

    def marker(self, producer_id: int, *, commit: bool) -> int:
        offset = self.next_offset
        self.data += build_txn_marker(
            producer_id=producer_id,
            producer_epoch=0,
            coordinator_epoch=0,
            commit=commit,
            base_offset=offset,
            timestamp_ms=1,
        )
        self.next_offset += 1
        return offset


def values(data: bytes, level: IsolationLevel, aborted: tuple[AbortedTxn, ...] = ()) -> list[str]:
    return [(r.value or b"").decode() for r in decode_records(data, level, aborted).records]


def interleaved() -> tuple[Log, tuple[AbortedTxn, ...]]:
    """Producer 1 aborts (a1 a2), producer 2 commits (c1 c2) around it, producer 1 then
    commits (b1); a plain batch (p1) sits in the middle."""
    log = Log()
    first_abort = log.data_batch(["a1"], 1, txn=True)
    log.data_batch(["c1"], 2, txn=True)
    log.data_batch(["p1"])
    log.data_batch(["a2"], 1, txn=True)
    log.marker(1, commit=False)
    log.data_batch(["c2"], 2, txn=True)
    log.marker(2, commit=True)
    log.data_batch(["b1"], 1, txn=True)
    log.marker(1, commit=True)
    return log, (AbortedTxn(first_abort, 1),)


def test_read_uncommitted_returns_every_data_record_and_no_marker() -> None:
    log, aborted = interleaved()
    assert values(bytes(log.data), UNCOMMITTED, aborted) == ["a1", "c1", "p1", "a2", "c2", "b1"]


def test_read_committed_leaves_out_the_aborted_transaction_only() -> None:
    log, aborted = interleaved()
    assert values(bytes(log.data), COMMITTED, aborted) == ["c1", "p1", "c2", "b1"]
    # Without the broker's list nothing is known to be aborted (markers alone say nothing
    # of the batches before them, as in Kafka).
    assert values(bytes(log.data), COMMITTED) == ["a1", "c1", "p1", "a2", "c2", "b1"]


def test_a_fetch_that_starts_inside_an_aborted_transaction() -> None:
    log = Log(start=100)
    log.data_batch(["a2"], 7, txn=True)
    log.marker(7, commit=False)
    log.data_batch(["x"], 8, txn=True)
    # The transaction began before this response's first offset.
    assert values(bytes(log.data), COMMITTED, (AbortedTxn(90, 7),)) == ["x"]


def test_two_aborted_transactions_of_one_producer_in_one_response() -> None:
    log = Log()
    first = log.data_batch(["a1"], 3, txn=True)
    log.marker(3, commit=False)
    log.data_batch(["k1"], 3, txn=True)
    log.marker(3, commit=True)
    second = log.data_batch(["a2"], 3, txn=True)
    log.marker(3, commit=False)
    aborted = (AbortedTxn(second, 3), AbortedTxn(first, 3))  # any order
    assert values(bytes(log.data), COMMITTED, aborted) == ["k1"]


def test_visibility_and_positions_of_every_batch() -> None:
    log, aborted = interleaved()
    seen = [
        (h.base_offset, visible)
        for _, h, visible in iter_visible_batches(bytes(log.data), COMMITTED, aborted)
    ]
    assert seen == [
        (0, False), (1, True), (2, True), (3, False), (4, False),
        (5, True), (6, False), (7, True), (8, False),
    ]  # fmt: skip
    # A cut batch at the end is neither decoded nor counted.
    cut = bytes(log.data) + build_batch([Record(value=b"late")], log.next_offset, now_ms=1)[:-3]
    assert values(cut, COMMITTED, aborted) == ["c1", "p1", "c2", "b1"]
    assert decode_records(cut, COMMITTED, aborted).next_offset == log.next_offset == 9
    assert decode_records(b"").next_offset == -1


def test_a_malformed_control_key_is_refused() -> None:
    bad = build_batch(
        [Record(key=b"\x00", value=b"\x00\x00\x00\x00\x00\x00")],
        0,
        producer_id=5,
        producer_epoch=0,
        is_transactional=True,
        is_control=True,
        now_ms=1,
    )
    rule = VisibleBatches(COMMITTED, (AbortedTxn(0, 5),))
    ((pos, header),) = list(iter_batches(bad))
    with pytest.raises(CorruptRecordError):
        rule.visible(bad, pos, header)
    # read_uncommitted never looks inside a control batch.
    assert VisibleBatches().visible(bad, pos, header) is False


def test_isolation_level_names() -> None:
    assert IsolationLevel.parse(" read_committed ") is COMMITTED
    assert IsolationLevel.parse("READ_UNCOMMITTED") is UNCOMMITTED
    assert COMMITTED.config_name == "read_committed"
    with pytest.raises(ValueError, match="read_uncommitted or read_committed"):
        IsolationLevel.parse("serializable")
