from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftlog.batch_validation import ValidatedBatches, validated_client_batches
from raftlog.errors import CorruptRecordError
from raftlog.records import Record, build_batch, iter_all_records, iter_batches, validate_batch
from raftlog.storage import (
    LogConfig,
    OffsetOutOfRangeError,
    PartitionLog,
    RecordTooLargeError,
    UnexpectedAppendOffsetError,
)
from raftlog.storage import segment as segment_module
from tests.storage.helpers import batch

SMALL = LogConfig(segment_bytes=2000, index_interval_bytes=200)


def offsets_of(data: bytes) -> list[int]:
    return [r.offset for r in iter_all_records(data)]


def fill(lg: PartitionLog, batches: int, *, epoch: int = 1, ts_ms: int = 1000) -> None:
    for i in range(batches):
        lg.append_as_leader(batch(3, ts_ms=ts_ms + 10 * i), leader_epoch=epoch, now_ms=0)


def test_append_assigns_offsets_and_reads_back(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    info = lg.append_as_leader(batch(3) + batch(2), leader_epoch=4, now_ms=0)
    assert (info.first_offset, info.last_offset, info.batch_count) == (0, 4, 2)
    fill(lg, 40)
    assert lg.log_end_offset == 125 and len(lg.segments) > 3
    result = lg.read(0, 10**6)
    stored = result.read_bytes()
    assert offsets_of(stored)[:5] == [0, 1, 2, 3, 4]
    assert validate_batch(stored).partition_leader_epoch == 4
    # a read starting mid-batch returns the whole batch holding the offset
    assert offsets_of(lg.read(4, 10**6).read_bytes())[0] == 3
    for start in range(lg.log_end_offset):
        got = offsets_of(lg.read(start, 300).read_bytes())
        assert (got and got[0] <= start <= got[-1] + 0) or got[0] <= start, start
    assert lg.read(125, 100).regions == []
    with pytest.raises(OffsetOutOfRangeError):
        lg.read(126, 100)


def test_read_stops_at_max_offset_and_max_bytes(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    fill(lg, 20)
    got = offsets_of(lg.read(0, 10**6, max_offset=10).read_bytes())
    assert got[-1] == 8  # batch 9..11 crosses the high watermark: excluded whole
    assert lg.read(9, 10**6, max_offset=10).regions == []
    one = lg.read(0, 1)  # min_one_batch: one batch even when it exceeds max_bytes
    assert offsets_of(one.read_bytes()) == [0, 1, 2]
    assert lg.read(0, 1, min_one_batch=False).regions == []
    assert len(lg.read(0, 500).read_bytes()) <= 500
    # next_offset lets a reader walk the whole log without decoding anything
    offset, seen = 0, []
    while offset < lg.log_end_offset:
        result = lg.read(offset, 700)
        seen += offsets_of(result.read_bytes())
        offset = result.next_offset
    assert seen == list(range(lg.log_end_offset))


def test_invalid_batch_is_rejected_and_nothing_appended(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    fill(lg, 2)
    good = batch(3)
    bad = bytearray(good)
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match=f"byte {len(good)}.*CRC32C"):
        lg.append_as_leader(good + bytes(bad), leader_epoch=1, now_ms=0)
    with pytest.raises(CorruptRecordError, match="incomplete"):
        lg.append_as_leader(good + good[:30], leader_epoch=1, now_ms=0)
    with pytest.raises(CorruptRecordError):
        lg.append_as_leader(b"", leader_epoch=1, now_ms=0)
    big = build_batch([Record(value=b"x" * 5000, timestamp_ms=1)])
    small = PartitionLog.open(tmp_path / "t-1", LogConfig(max_message_bytes=1000), now_ms=0)
    with pytest.raises(RecordTooLargeError):
        small.append_as_leader(big, leader_epoch=1, now_ms=0)
    assert lg.log_end_offset == 6
    assert offsets_of(lg.read(0, 10**6).read_bytes()) == list(range(6))


def test_follower_append_must_continue_at_log_end(tmp_path: Path) -> None:
    leader = PartitionLog.open(tmp_path / "l-0", SMALL, now_ms=0)
    follower = PartitionLog.open(tmp_path / "f-0", SMALL, now_ms=0)
    fill(leader, 3, epoch=2)
    fill(leader, 2, epoch=5)
    data = leader.read(0, 10**6).read_bytes()
    with pytest.raises(UnexpectedAppendOffsetError, match="expects 0"):
        follower.append_as_follower(leader.read(3, 10**6).read_bytes())
    follower.append_as_follower(data)
    assert follower.log_end_offset == leader.log_end_offset == 15
    assert follower.epoch_cache.entries == leader.epoch_cache.entries
    with pytest.raises(UnexpectedAppendOffsetError):
        follower.append_as_follower(data)  # overlapping: refused
    assert follower.log_end_offset == 15


def test_truncate_to_and_start_at(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    fill(lg, 10, epoch=1)
    fill(lg, 10, epoch=3)
    lg.truncate_to(40)  # mid-batch: the batch 39..41 goes entirely
    assert lg.log_end_offset == 39
    assert offsets_of(lg.read(0, 10**6).read_bytes())[-1] <= 38
    assert lg.epoch_cache.latest_epoch() == 3
    lg.truncate_to(30)
    assert lg.log_end_offset == 30 and lg.latest_epoch() == 1
    lg.append_as_leader(batch(2), leader_epoch=7, now_ms=0)
    assert offsets_of(lg.read(30, 10**6).read_bytes()) == [30, 31]
    lg.close()
    again = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    assert again.log_end_offset == 32 and again.latest_epoch() == 7
    again.truncate_fully_and_start_at(1000)
    assert (again.log_start_offset, again.log_end_offset, again.latest_epoch()) == (1000, 1000, -1)
    info = again.append_as_leader(batch(1), leader_epoch=8, now_ms=0)
    assert info.first_offset == 1000
    again.close()
    third = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    assert (third.log_start_offset, third.log_end_offset) == (1000, 1001)


def test_advance_log_start_deletes_whole_segments_only(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    fill(lg, 30)
    held = lg.read(0, 100)  # a reader holding a region keeps the deleted file readable
    bases = [s.base_offset for s in lg.segments]
    deleted = lg.advance_log_start(bases[2] + 1)
    assert deleted == 2 and lg.segments[0].base_offset == bases[2]
    assert lg.log_start_offset == bases[2] + 1
    assert offsets_of(held.read_bytes())[0] == 0
    with pytest.raises(OffsetOutOfRangeError):
        lg.read(bases[2], 100)
    lg.close()
    again = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    assert again.log_start_offset == bases[2] + 1
    again.advance_log_start(again.log_end_offset)
    assert again.log_start_offset == again.log_end_offset and len(again.segments) == 1


def test_segment_rolls_by_time(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_ms=1000), now_ms=0)
    lg.append_as_leader(batch(1), leader_epoch=1, now_ms=0)
    lg.append_as_leader(batch(1), leader_epoch=1, now_ms=999)
    assert len(lg.segments) == 1
    lg.append_as_leader(batch(1), leader_epoch=1, now_ms=1000)
    assert [s.base_offset for s in lg.segments] == [0, 2]
    assert sorted(p.name for p in (tmp_path / "t-0").glob("*.log")) == [
        "00000000000000000000.log",
        "00000000000000000002.log",
    ]


def test_offset_for_timestamp(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    fill(lg, 30, ts_ms=1000)  # batch i holds timestamps 1000+10i .. +2
    assert lg.offset_for_timestamp(0) == (0, 1000)
    assert lg.offset_for_timestamp(1001) == (1, 1001)
    assert lg.offset_for_timestamp(1003) == (3, 1010)
    assert lg.offset_for_timestamp(1252) == (77, 1252)
    assert lg.offset_for_timestamp(10**9) is None
    assert lg.offset_for_timestamp(-2) == (0, -1)
    assert lg.offset_for_timestamp(-1) == (90, -1)
    lg.close()
    again = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    assert again.offset_for_timestamp(1252) == (77, 1252)


def test_regions_survive_truncation_of_their_segment(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    fill(lg, 30)
    held = lg.read(80, 10**6)
    lg.truncate_fully_and_start_at(500)
    assert offsets_of(held.read_bytes())[0] <= 80


def test_validated_batches_append_stores_the_same_bytes_as_a_checked_append(
    tmp_path: Path,
) -> None:
    data = batch(3, ts_ms=1000) + batch(2, ts_ms=2000) + batch(1, ts_ms=3000)
    checked = PartitionLog.open(tmp_path / "c-0", SMALL, now_ms=0)
    trusted = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    for lg in (checked, trusted):
        fill(lg, 2)
    validated = validated_client_batches(data, max_message_bytes=SMALL.max_message_bytes)
    info = trusted.append_as_leader(validated, leader_epoch=5, now_ms=0)
    assert info == checked.append_as_leader(data, leader_epoch=5, now_ms=0)
    assert (info.first_offset, info.last_offset, info.batch_count) == (6, 11, 3)
    stored = trusted.read(6, 10**6).read_bytes()
    assert stored == checked.read(6, 10**6).read_bytes()
    assert [h.base_offset for _, h in iter_batches(stored)] == [6, 9, 11]
    assert {h.partition_leader_epoch for _, h in iter_batches(stored)} == {5}
    # The headers were checked against the config of the moment: a lower max.message.bytes
    # set since is still enforced, and nothing is written.
    trusted.update_config(LogConfig(segment_bytes=2000, max_message_bytes=100))
    with pytest.raises(RecordTooLargeError):
        trusted.append_as_leader(validated, leader_epoch=5, now_ms=0)
    assert trusted.log_end_offset == 12


def test_validated_batches_that_do_not_tile_their_data_are_refused(tmp_path: Path) -> None:
    data = batch(3, ts_ms=1000) + batch(2, ts_ms=2000)
    lg = PartitionLog.open(tmp_path / "v-0", SMALL, now_ms=0)
    validated = validated_client_batches(data, max_message_bytes=SMALL.max_message_bytes)
    first, second = validated.headers
    for headers in ([second], [first], [first, first], [(first[0] + 1, first[1]), second]):
        forged = ValidatedBatches(data, headers)
        with pytest.raises(CorruptRecordError):
            lg.append_as_leader(forged, leader_epoch=1, now_ms=0)
    assert lg.log_end_offset == 0


def test_write_all_resumes_after_short_writes(tmp_path: Path) -> None:
    class ShortWrites:
        """`os` whose writev takes at most 7 bytes a call."""

        def __getattr__(self, name: str) -> object:
            return getattr(os, name)

        def writev(self, fd: int, buffers: list[memoryview]) -> int:
            return os.write(fd, b"".join(bytes(b) for b in buffers)[:7])

    pieces = [b"abc", b"", memoryview(b"defghijklmnop")[2:], bytearray(b"qrstuvwxyz")]
    path = tmp_path / "f"
    with open(path, "wb") as f:
        real_os = segment_module.os
        segment_module.os = ShortWrites()  # type: ignore[assignment]
        try:
            assert segment_module.write_all(f.fileno(), pieces) == 24
        finally:
            segment_module.os = real_os
    assert path.read_bytes() == b"abcfghijklmnopqrstuvwxyz"
