"""The aborted transactions index (.txnindex): written with ABORT markers, verified on open,
rebuilt from the log when missing or damaged, cut with the log, deleted with its segment, and
carried through compaction (which keeps markers and drops aborted records)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlog.records import Record, build_batch, build_txn_marker, iter_all_records
from raftlog.storage import LogConfig, PartitionLog
from raftlog.storage.cleaner import clean_log
from raftlog.storage.index import IndexMismatch
from raftlog.storage.txn_index import (
    ENTRY_SIZE_BYTES,
    AbortedTxn,
    TxnIndex,
    decode_entries,
    replay_aborted_txns,
)

CONFIG = LogConfig(segment_bytes=400, index_interval_bytes=100)


def txn(pid: int, key: bytes = b"k", value: bytes = b"v") -> bytes:
    return build_batch(
        [Record(key=key, value=value, timestamp_ms=1000)],
        producer_id=pid,
        producer_epoch=0,
        base_sequence=0,
        is_transactional=True,
    )


def plain(key: bytes = b"k", value: bytes = b"v") -> bytes:
    return build_batch([Record(key=key, value=value, timestamp_ms=1000)])


def end(pid: int, *, commit: bool) -> bytes:
    return build_txn_marker(
        producer_id=pid, producer_epoch=0, coordinator_epoch=0, commit=commit, timestamp_ms=1000
    )


def write(plog: PartitionLog, steps: list[bytes]) -> None:
    """Append as a leader does, indexing aborts the way the replication driver does (replay's
    rules: the log's own view of open transactions)."""
    for data in steps:
        plog.append_as_leader(data, leader_epoch=1, now_ms=0)
        expected = replay_aborted_txns(plog.segments, plog.log_start_offset)
        have = [e for s in plog.segments for e in s.txn_index.entries]
        new = [e for entries in expected for e in entries if e not in have]
        plog.append_aborted_txns(new)


# Offsets: 0 A, 1 B, 2 plain, 3 abort B, 4 A, 5 commit A, 6 C, 7 abort C, 8 D (open)
STEPS = [
    txn(1),
    txn(2),
    plain(),
    end(2, commit=False),
    txn(1),
    end(1, commit=True),
    txn(3),
    end(3, commit=False),
    txn(4),
]
EXPECTED = [AbortedTxn(2, 1, 3, 0), AbortedTxn(3, 6, 7, 8)]


def entries(plog: PartitionLog) -> list[AbortedTxn]:
    return [e for s in plog.segments for e in s.txn_index.entries]


def opened(path: Path) -> PartitionLog:
    plog = PartitionLog.open(path, CONFIG, now_ms=0)
    write(plog, STEPS)
    assert len(plog.segments) > 1
    return plog


def test_entries_and_collect(tmp_path: Path) -> None:
    plog = opened(tmp_path / "t-0")
    assert entries(plog) == EXPECTED
    assert plog.collect_aborted_txns(0, 9) == EXPECTED
    assert plog.collect_aborted_txns(4, 6) == []  # B ended at 3; C starts at 6
    assert plog.collect_aborted_txns(4, 7) == [EXPECTED[1]]
    assert plog.collect_aborted_txns(3, 4) == [EXPECTED[0]]  # the marker itself
    assert plog.collect_aborted_txns(5, 5) == []
    plog.close()


def test_clean_restart_loads_the_files(tmp_path: Path) -> None:
    plog = opened(tmp_path / "t-0")
    plog.close()
    again = PartitionLog.open(tmp_path / "t-0", CONFIG, now_ms=0)
    assert entries(again) == EXPECTED
    again.close()


@pytest.mark.parametrize("damage", ["delete", "flip", "truncate", "garbage"])
def test_missing_or_damaged_index_is_rebuilt_from_the_log(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    plog = opened(tmp_path / "t-0")
    plog.close()
    files = sorted((tmp_path / "t-0").glob("*.txnindex"))
    target = next(f for f in files if f.stat().st_size > 8)
    if damage == "delete":
        target.unlink()
    elif damage == "flip":
        data = bytearray(target.read_bytes())
        data[20] ^= 0x40
        target.write_bytes(bytes(data))
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:-3])
    else:
        target.write_bytes(b"not an index")
    again = PartitionLog.open(tmp_path / "t-0", CONFIG, now_ms=0)
    assert entries(again) == EXPECTED
    assert "rebuilding the aborted transactions indexes" in caplog.text
    # The rebuilt files verify on the next open.
    again.close()
    caplog.clear()
    third = PartitionLog.open(tmp_path / "t-0", CONFIG, now_ms=0)
    assert entries(third) == EXPECTED and "rebuilding" not in caplog.text
    third.close()


def test_crash_that_lost_an_index_entry_rebuilds_it(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", CONFIG, now_ms=0)
    write(plog, STEPS[:3])
    # The marker reached the log but its entry did not (the process died between the two
    # writes, before any flush: the recovery point is below the marker).
    plog.append_as_leader(end(2, commit=False), leader_epoch=1, now_ms=0)
    plog.abandon()  # no clean close: the segment is scanned at the next open
    again = PartitionLog.open(tmp_path / "t-0", CONFIG, now_ms=0)
    assert entries(again) == [AbortedTxn(2, 1, 3, 0)]
    again.close()


def test_file_layout_is_versioned_and_checksummed(tmp_path: Path) -> None:
    index = TxnIndex(tmp_path / "00000000000000000000.txnindex", 0)
    assert not index.path.exists()  # no file until the first abort (as Kafka's)
    assert index.append(AbortedTxn(7, 1, 5, 6)) is True
    index.close()
    data = index.path.read_bytes()
    assert data[:4] == b"RLTX" and len(data) == 8 + ENTRY_SIZE_BYTES
    assert decode_entries(data, "x") == [AbortedTxn(7, 1, 5, 6)]
    with pytest.raises(IndexMismatch, match="CRC32C"):
        decode_entries(data[:-1] + bytes([data[-1] ^ 1]), "x")
    with pytest.raises(ValueError, match="does not follow"):
        index.append(AbortedTxn(7, 1, 5, 6))


def test_truncation_and_retention_take_the_entries_with_them(tmp_path: Path) -> None:
    plog = opened(tmp_path / "t-0")
    plog.truncate_to(7)  # drops C's marker
    assert entries(plog) == EXPECTED[:1]
    plog.close()
    again = PartitionLog.open(tmp_path / "t-0", CONFIG, now_ms=0)
    assert entries(again) == EXPECTED[:1]
    first_files = {p.name for p in (tmp_path / "t-0").glob("*.txnindex")}
    again.advance_log_start(again.segments[1].base_offset)
    left = {p.name for p in (tmp_path / "t-0").glob("*.txnindex")}
    assert len(left) == len(first_files) - 1
    assert left == {f"{s.base_offset:020d}.txnindex" for s in again.segments if s.txn_index.entries}
    again.close()


async def test_compaction_keeps_markers_and_drops_aborted_records(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=400, cleanup_policy="compact")
    plog = PartitionLog.open(tmp_path / "c-0", config, now_ms=0)
    steps = [
        plain(b"k", b"committed-1"),  # 0
        txn(5, b"k", b"aborted"),  # 1: would hide offset 0 if it counted
        end(5, commit=False),  # 2
        txn(6, b"j", b"committed-2"),  # 3
        end(6, commit=True),  # 4
        plain(b"x", b"filler"),  # 5
        plain(b"y", b"filler"),  # 6
        plain(b"z", b"filler"),  # 7
    ]
    write(plog, steps)
    plog.roll()
    before = entries(plog)
    await clean_log(plog, clean_below_offset=plog.log_end_offset, now_ms=0)
    kept = {
        r.offset: r.value
        for s in plog.segments
        for r in iter_all_records(s.read_range(0, s.size_bytes))
    }
    assert kept[0] == b"committed-1" and 1 not in kept
    assert {2, 4} <= set(kept)  # both markers stay
    assert kept[3] == b"committed-2"
    assert entries(plog) == before
    plog.close()
    again = PartitionLog.open(tmp_path / "c-0", config, now_ms=0)
    assert entries(again) == before
    again.close()
