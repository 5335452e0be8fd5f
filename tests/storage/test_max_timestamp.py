"""ListOffsets MAX_TIMESTAMP (KIP-734) at the log: the exact record holding the largest
timestamp, not its batch's first offset."""

from __future__ import annotations

from pathlib import Path

from raftlog.records import Compression, Record, build_batch, stamp_log_append_time
from raftlog.storage import LogConfig, PartitionLog

SMALL = LogConfig(segment_bytes=2000, index_interval_bytes=200)


def records(*timestamps_ms: int) -> list[Record]:
    return [Record(key=b"k", value=b"v" * 20, timestamp_ms=ts) for ts in timestamps_ms]


def test_empty_log_has_no_max_timestamp(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    assert lg.max_timestamp_record() is None


def test_the_record_inside_the_batch(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    # 0081's case: one batch whose second record holds the max.
    lg.append_as_leader(build_batch(records(1000, 3000, 2000)), leader_epoch=1, now_ms=0)
    assert lg.max_timestamp_record() == (1, 3000)
    # A later batch with the same max does not move the answer (the first record holding it).
    lg.append_as_leader(build_batch(records(3000, 10)), leader_epoch=1, now_ms=0)
    assert lg.max_timestamp_record() == (1, 3000)
    lg.append_as_leader(build_batch(records(5, 4000, 4000, 1)), leader_epoch=1, now_ms=0)
    assert lg.max_timestamp_record() == (6, 4000)


def test_compressed_batch_and_many_segments_and_reopen(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    for i in range(40):
        # Batch i holds 1000+10i, then 1000+10i+5 at its third record: the max is in the
        # middle of the last batch; an earlier segment holds a max too (batch 7's 9000).
        stamps = [1000 + 10 * i, 1000 + 10 * i + 1, 1000 + 10 * i + 5, 1000 + 10 * i + 2]
        if i == 7:
            stamps[3] = 9000
        batch = build_batch(records(*stamps), compression=Compression.GZIP)
        lg.append_as_leader(batch, leader_epoch=1, now_ms=0)
    assert len(lg.segments) > 2
    assert lg.max_timestamp_record() == (7 * 4 + 3, 9000)
    lg.close()
    again = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    assert again.max_timestamp_record() == (31, 9000)


def test_log_append_time_answers_the_batch_first_record(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    stamped = stamp_log_append_time(build_batch(records(1, 2, 3)), 7000)
    lg.append_as_leader(build_batch(records(10, 20)), leader_epoch=1, now_ms=0)
    lg.append_as_leader(stamped, leader_epoch=1, now_ms=0)
    # Every record of a LOG_APPEND_TIME batch carries the batch's time: the first one is it.
    assert lg.max_timestamp_record() == (2, 7000)
