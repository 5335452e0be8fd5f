from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import pytest

from raftlog.records import iter_all_records, iter_batches
from raftlog.storage import LogConfig, PartitionLog
from raftlog.storage.recovery import RECOVERY_POINT_FILE
from tests.storage.helpers import batch

CONFIG = LogConfig(segment_bytes=3000, index_interval_bytes=150)


def build(directory: Path, batches: int) -> list[int]:
    lg = PartitionLog.open(directory, CONFIG, now_ms=0)
    ends = []
    for i in range(batches):
        lg.append_as_leader(batch(2, ts_ms=i), leader_epoch=1 + i // 10, now_ms=0)
        ends.append(lg.log_end_offset)
    lg.close()
    return ends


def crash(directory: Path) -> None:
    """As after kill -9: no clean-shutdown recovery point."""
    (directory / RECOVERY_POINT_FILE).unlink()


def all_offsets(lg: PartitionLog) -> list[int]:
    out = []
    for seg in lg.segments:
        out += [r.offset for r in iter_all_records(seg.read_range(0, seg.size_bytes))]
    return out


def test_torn_tail_at_every_byte_of_the_last_batch(tmp_path: Path, caplog, monkeypatch) -> None:
    # This test checks what recovery keeps, not durability; ~100 reopenings with real fsyncs
    # would spend the test budget waiting on a shared disk.
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)
    ends = build(tmp_path / "t-0", 80)
    active = sorted((tmp_path / "t-0").glob("*.log"))[-1]
    pristine = active.read_bytes()
    last_batch_bytes = len(batch(2))
    caplog.set_level(logging.WARNING, logger="raftlog.storage")
    for cut in range(1, last_batch_bytes + 1):
        active.write_bytes(pristine[: len(pristine) - cut])
        crash(tmp_path / "t-0")
        lg = PartitionLog.open(tmp_path / "t-0", CONFIG, now_ms=0)
        assert lg.log_end_offset == ends[-2], cut
        assert all_offsets(lg) == list(range(ends[-2]))
        assert lg.latest_epoch() == 8
        lg.close()
        active.write_bytes(pristine)
    assert "truncated" in caplog.text


def test_flipped_bits_are_detected_and_cut(tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    ends = build(tmp_path / "t-0", 80)
    files = sorted((tmp_path / "t-0").glob("*.log"))
    target = files[-2]  # a middle segment: everything after it must go too
    data = bytearray(target.read_bytes())
    positions = [pos for pos, _ in iter_batches(data)]
    pos = rng.choice(positions)
    # anywhere but partitionLeaderEpoch (bytes 12..15), which no checksum covers (as in Kafka)
    flip_at = pos + rng.choice([*range(0, 12), *range(16, len(batch(2)))])
    data[flip_at] ^= 1 << rng.randrange(8)
    target.write_bytes(bytes(data))
    crash(tmp_path / "t-0")
    lg = PartitionLog.open(tmp_path / "t-0", CONFIG, now_ms=0)
    base = int(target.name[:20])
    assert base <= lg.log_end_offset < ends[-1], f"seed={seed}"
    assert all_offsets(lg) == list(range(lg.log_end_offset)), f"seed={seed}"
    assert len(lg.segments) == len(files) - 1, f"seed={seed}"


def test_clean_restart_trusts_segments_and_keeps_everything(tmp_path: Path) -> None:
    ends = build(tmp_path / "t-0", 80)
    lg = PartitionLog.open(tmp_path / "t-0", CONFIG, now_ms=0)
    assert lg.log_end_offset == ends[-1] == lg.flushed_offset
    assert [e.epoch for e in lg.epoch_cache.entries] == list(range(1, 9))


@pytest.mark.parametrize("damage", ["delete", "garbage", "truncate"])
def test_bad_index_is_rebuilt(tmp_path: Path, damage: str) -> None:
    build(tmp_path / "t-0", 25)
    index = sorted((tmp_path / "t-0").glob("*.index"))[0]
    good = index.read_bytes()
    assert len(good) > 16
    if damage == "delete":
        index.unlink()
    elif damage == "garbage":
        index.write_bytes(good[:8] + b"\xff" * 8 + good[16:])
    else:
        index.write_bytes(good[:-3])
    lg = PartitionLog.open(tmp_path / "t-0", CONFIG, now_ms=0)
    assert index.read_bytes() == good
    for start in range(0, lg.log_end_offset, 3):
        got = [r.offset for r in iter_all_records(lg.read(start, 400).read_bytes())]
        assert got[0] <= start <= got[-1]


def test_recovery_point_limits_the_scan(tmp_path: Path) -> None:
    build(tmp_path / "t-0", 80)
    first = sorted((tmp_path / "t-0").glob("*.log"))[0]
    # Corrupt a segment below the recovery point: recovery trusts it and does not rescan.
    data = bytearray(first.read_bytes())
    data[-1] ^= 1
    first.write_bytes(bytes(data))
    lg = PartitionLog.open(tmp_path / "t-0", CONFIG, now_ms=0)
    assert lg.log_end_offset == 160
