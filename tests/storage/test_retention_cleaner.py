from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from raftlog.compression import DECOMPRESSED_BATCH_MAX_BYTES, Compression
from raftlog.records import (
    CRC_OFFSET,
    HEADER_SIZE_BYTES,
    Record,
    build_batch,
    compute_crc,
    iter_all_records,
)
from raftlog.storage import LogConfig, PartitionLog
from raftlog.storage.cleaner import clean_log
from raftlog.storage.retention import apply_retention
from tests.storage.helpers import batch
from tests.test_batch_validation import forge, record


def _all(lg: PartitionLog) -> list[Record]:
    out: list[Record] = []
    for seg in lg.segments:
        out += iter_all_records(seg.read_range(0, seg.size_bytes))
    return [r for r in out if r.offset >= lg.log_start_offset]


def test_time_retention_deletes_old_segments_never_active(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=1000, retention_ms=10_000)
    lg = PartitionLog.open(tmp_path / "t-0", config, now_ms=0)
    for i in range(40):
        lg.append_as_leader(batch(2, ts_ms=i * 1000), leader_epoch=1, now_ms=0)
    segments = len(lg.segments)
    assert apply_retention(lg, now_ms=20_000) > 0
    assert all(s.max_timestamp_ms >= 10_000 for s in lg.segments[:-1])
    assert lg.log_start_offset == lg.segments[0].base_offset
    assert len(lg.segments) < segments
    # everything is old now, but the active segment stays
    apply_retention(lg, now_ms=10**9)
    assert len(lg.segments) == 1 and lg.log_end_offset == 80
    assert _all(lg)[-1].offset == 79


def test_retention_runs_for_compact_and_delete_and_not_for_compact_alone(tmp_path: Path) -> None:
    for policy, expect_deleted in (("compact,delete", True), ("compact", False)):
        config = LogConfig(segment_bytes=1000, retention_ms=10_000, cleanup_policy=policy)
        lg = PartitionLog.open(tmp_path / f"{policy}-0", config, now_ms=0)
        for i in range(40):
            lg.append_as_leader(batch(2, ts_ms=i * 1000), leader_epoch=1, now_ms=0)
        assert (apply_retention(lg, now_ms=20_000) > 0) is expect_deleted, policy


def test_size_retention_keeps_at_most_retention_bytes(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=1000, retention_bytes=2500, retention_ms=-1)
    lg = PartitionLog.open(tmp_path / "t-0", config, now_ms=0)
    for _ in range(60):
        lg.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
    apply_retention(lg, now_ms=0)
    assert lg.size_bytes <= 2500 + 1000
    assert sum(s.size_bytes for s in lg.segments[1:]) < 2500
    assert [r.offset for r in _all(lg)] == list(range(lg.log_start_offset, 120))


def key_of(i: int) -> bytes:
    return b"gone" if i in (10, 30) else b"key%d" % (i % 7)


async def test_compaction_keeps_newest_per_key_and_offsets(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=600, cleanup_policy="compact", delete_retention_ms=1000)
    lg = PartitionLog.open(tmp_path / "t-0", config, now_ms=0)
    for i in range(60):
        value = None if i == 30 else b"v%d" % i  # "gone" is deleted by a tombstone at 30
        lg.append_as_leader(
            build_batch([Record(key=key_of(i), value=value, timestamp_ms=0)]),
            leader_epoch=1,
            now_ms=0,
        )
    high_watermark = 55
    stats = await clean_log(lg, clean_below_offset=high_watermark, now_ms=500)
    assert stats.segments_cleaned > 0 and stats.records_removed > 0
    limit = min(high_watermark, lg.active_segment.base_offset)
    boundary = max(s.next_offset for s in lg.segments if s.next_offset <= limit)
    assert boundary > 31
    newest: dict[bytes, int] = {}
    for i in range(boundary):
        newest[key_of(i)] = i
    got = _all(lg)
    below = [(r.key, r.offset) for r in got if r.offset < boundary]
    assert sorted(below) == sorted(newest.items())  # newest per key, offsets unchanged
    assert (b"gone", 30) in below  # tombstone kept within delete.retention.ms
    # nothing at or above the cleaned range was touched
    assert [r.offset for r in got if r.offset >= boundary] == list(range(boundary, 60))

    await clean_log(lg, clean_below_offset=high_watermark, now_ms=5000)
    assert (b"gone", 30) not in [(r.key, r.offset) for r in _all(lg)]  # tombstone expired

    before = [(r.offset, r.key, r.value) for r in _all(lg)]
    lg.close()
    again = PartitionLog.open(tmp_path / "t-0", config, now_ms=0)
    assert [(r.offset, r.key, r.value) for r in _all(again)] == before
    assert again.log_end_offset == 60
    for start in range(again.log_start_offset, 60):
        assert again.read(start, 10**6).regions


async def test_compaction_ignores_delete_policy(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=500), now_ms=0)
    for _ in range(20):
        lg.append_as_leader(batch(2, keys=[b"a", b"a"]), leader_epoch=1, now_ms=0)
    stats = await clean_log(lg, clean_below_offset=40, now_ms=0)
    assert stats.segments_cleaned == 0


def _undecodable_batch() -> bytes:
    """A batch with a correct CRC whose one record claims more bytes than the batch holds."""
    out = bytearray(build_batch([Record(key=b"bad", value=b"v", timestamp_ms=0)]))
    out[HEADER_SIZE_BYTES] = 0x7E  # record length varint: 63 bytes, far past the end
    struct.pack_into(">I", out, CRC_OFFSET, compute_crc(out, 0, len(out)))
    return bytes(out)


def _bomb_batch() -> bytes:
    """A few KiB on disk whose one record decompresses past DECOMPRESSED_BATCH_MAX_BYTES."""
    value = bytes(DECOMPRESSED_BATCH_MAX_BYTES)
    record = Record(key=b"bomb", value=value, timestamp_ms=0)
    return build_batch([record], compression=Compression.ZSTD)


def _timestamp_overflow_batch() -> bytes:
    """A superseded record, then a kept one whose timestamp (base + delta) is past int64: it
    reads, but the batch the cleaner rebuilds cannot hold it (produce refuses it; this one
    came from a disk)."""
    body = record(0, key=b"same") + record(1, key=b"kept", timestamp_delta=2**62)
    return forge(body, 2, base_timestamp_ms=2**62)


@pytest.mark.parametrize("hostile", [_undecodable_batch, _bomb_batch, _timestamp_overflow_batch])
async def test_a_batch_the_cleaner_cannot_read_stops_compaction_of_that_log_only(
    tmp_path: Path, hostile: Callable[[], bytes], caplog: pytest.LogCaptureFixture
) -> None:
    """CRC-correct bytes on disk that do not decode: compaction of the log stops with an
    ERROR line (Kafka's uncleanable partition), the log keeps every segment as it is, and
    nothing is raised into the node."""
    config = LogConfig(segment_bytes=16 * 1024, cleanup_policy="compact")
    lg = PartitionLog.open(tmp_path / "t-0", config, now_ms=0)
    bad = hostile()
    for i in range(200):
        data = bad if i == 100 else batch(1, keys=[b"same"], value_bytes=200, ts_ms=0)
        lg.append_as_leader(data, leader_epoch=1, now_ms=0)
    assert len(lg.segments) > 2
    holding = next(i for i, s in enumerate(lg.segments) if s.base_offset <= 100 < s.next_offset)
    sizes = [s.size_bytes for s in lg.segments]
    with caplog.at_level(logging.ERROR, logger="raftlog.storage"):
        await clean_log(lg, clean_below_offset=200, now_ms=0)
    assert lg.uncleanable_reason
    assert any("compaction stopped" in r.getMessage() for r in caplog.records)
    # The segment holding the batch and every one after it are as they were (one before it
    # may have been compacted already, when only a rebuilt batch fails).
    assert [s.size_bytes for s in lg.segments][holding:] == sizes[holding:]
    # Marked: the next round does not read the segments again.
    assert (await clean_log(lg, clean_below_offset=200, now_ms=0)).segments_cleaned == 0
    assert lg.read(101, 10**6).regions  # reads of the log go on
    lg.close()
    again = PartitionLog.open(tmp_path / "t-0", config, now_ms=0)
    assert again.uncleanable_reason is None  # a restart tries again
    again.close()
