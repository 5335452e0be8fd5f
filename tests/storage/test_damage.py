"""A damaged disk or a damaged fetch answer, on real segment files: what the log refuses,
what recovery cuts, what the scrubber finds."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from raftlog.errors import CorruptRecordError, ErrorCode, KafkaError
from raftlog.records import set_offset_and_epoch
from raftlog.storage import Flusher, LogConfig, LogOfflineError, PartitionLog
from raftlog.storage import log as log_module
from raftlog.storage import segment as segment_module
from raftlog.storage.scrubber import (
    ScrubResult,
    ScrubSchedule,
    SegmentExtent,
    verify_range,
    verify_read,
)
from tests.storage.helpers import batch

SMALL = LogConfig(segment_bytes=2000, index_interval_bytes=200)


def leader_log(path: Path, batches: int = 6, epoch: int = 3) -> PartitionLog:
    lg = PartitionLog.open(path, SMALL, now_ms=0)
    for i in range(batches):
        lg.append_as_leader(batch(3, ts_ms=1000 + i), leader_epoch=epoch, now_ms=0)
    return lg


def test_follower_refuses_a_fetched_batch_with_a_flipped_byte_and_stores_nothing(
    tmp_path: Path,
) -> None:
    leader = leader_log(tmp_path / "l-0")
    follower = PartitionLog.open(tmp_path / "f-0", SMALL, now_ms=0)
    data = bytearray(leader.read(0, 10**6).read_bytes())
    data[-5] ^= 0x40  # a record byte of the last batch: covered by its CRC
    with pytest.raises(CorruptRecordError, match="CRC"):
        follower.append_as_follower(bytes(data), max_leader_epoch=3)
    assert follower.log_end_offset == 0 and follower.active_segment.size_bytes == 0


@pytest.mark.parametrize("epoch", [4, 1, -1, 2**31 - 1])
def test_follower_refuses_a_leader_epoch_outside_the_crc_that_cannot_be_right(
    tmp_path: Path, epoch: int
) -> None:
    leader = leader_log(tmp_path / "l-0")
    follower = PartitionLog.open(tmp_path / "f-0", SMALL, now_ms=0)
    follower.append_as_follower(leader.read(0, 10**6, max_offset=6).read_bytes())
    assert follower.latest_epoch() == 3
    data = bytearray(leader.read(6, 10**6).read_bytes())
    # partitionLeaderEpoch is not covered by the CRC: a flipped bit there passes it. Above
    # the epoch of the leader we fetch from, or below the epoch we already hold, it is damage.
    set_offset_and_epoch(data, 0, 6, epoch)
    with pytest.raises(CorruptRecordError, match="leader epoch"):
        follower.append_as_follower(bytes(data), max_leader_epoch=3)
    assert follower.log_end_offset == 6
    follower.append_as_follower(leader.read(6, 10**6).read_bytes(), max_leader_epoch=3)
    assert follower.log_end_offset == leader.log_end_offset


# ------------------------------------------------------------------ the scrubber's steps
def scrub_all(lg: PartitionLog, schedule: ScrubSchedule) -> list[ScrubResult]:
    """One pass over `lg` with the pacing ignored (time jumps to each ready time)."""
    results = []
    now_s = 0.0
    while schedule.passes == 0:
        step = schedule.next_step(
            now_s=now_s,
            keys=[("t", 0)],
            segments_of=lambda key: [
                SegmentExtent(s.base_offset, s.size_bytes) for s in lg.segments
            ],
        )
        assert step is not None
        if schedule.passes:
            break
        if isinstance(step, float):
            now_s = step
            continue
        segment = next(s for s in lg.segments if s.base_offset == step.base_offset)
        result = verify_range(segment, step, allow_gaps=False)
        schedule.on_verified(now_s=now_s, step=step, result=result)
        results.append(result)
    return results


def flip_byte_on_disk(lg: PartitionLog, offset: int, *, from_end: int = 5) -> Path:
    """Flip a record byte of the batch holding `offset`, in the segment file itself."""
    segment = next(s for s in reversed(lg.segments) if s.base_offset <= offset)
    position = segment.locate(offset)
    assert position is not None
    header = segment.header_at(position)
    at = position + header.size_bytes - from_end
    with open(segment.log_path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x10]))
    return segment.log_path


def test_a_scrub_pass_verifies_every_byte_of_every_segment(tmp_path: Path) -> None:
    lg = leader_log(tmp_path / "t-0", batches=60)
    assert len(lg.segments) > 3
    schedule = ScrubSchedule(bytes_per_s=10_000, chunk_bytes=500)
    results = scrub_all(lg, schedule)
    assert all(r.damage is None for r in results)
    assert schedule.bytes_verified == lg.size_bytes


def test_the_scrubber_finds_a_flipped_byte_below_the_recovery_point(tmp_path: Path) -> None:
    lg = leader_log(tmp_path / "t-0", batches=60)
    flip_byte_on_disk(lg, 100)
    lg.close()
    # A clean shutdown left the recovery point at the end: recovery trusts every segment.
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    assert lg.log_end_offset == 180
    damaged = [r for r in scrub_all(lg, ScrubSchedule(bytes_per_s=10_000)) if r.damage]
    assert len(damaged) == 1
    assert damaged[0].next_offset == 99 and "CRC" in str(damaged[0].damage)  # batch 99..101


def test_the_scrubber_finds_a_batch_cut_mid_way_and_a_damaged_length(tmp_path: Path) -> None:
    lg = leader_log(tmp_path / "t-0", batches=20)
    lg.close()
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    segment = lg.segments[-1]
    position = segment.locate(segment.next_offset - 1)
    assert position is not None
    # A length field that claims more than the segment holds.
    with open(segment.log_path, "r+b") as f:
        f.seek(position + 8)
        f.write((10**6).to_bytes(4, "big"))
    damaged = [r for r in scrub_all(lg, ScrubSchedule(bytes_per_s=10**6)) if r.damage]
    assert len(damaged) == 1 and "past the segment" in str(damaged[0].damage)
    assert damaged[0].next_offset == segment.next_offset - 3


def test_scrub_pacing_never_exceeds_the_rate() -> None:
    segments = [SegmentExtent(0, 10_000), SegmentExtent(100, 5_000)]
    schedule = ScrubSchedule(bytes_per_s=1_000, chunk_bytes=4_000, pass_interval_s=20)
    assert schedule.chunk_bytes == 1_000  # one step is at most a second's worth
    now_s = 0.0
    starts = []
    while schedule.passes < 2:
        step = schedule.next_step(now_s=now_s, keys=[("a", 0)], segments_of=lambda k: segments)
        assert step is not None
        if isinstance(step, float):
            assert step > now_s
            now_s = step
            continue
        starts.append((now_s, step.base_offset, step.start_position))
        size = step.end_position - step.start_position
        result = ScrubResult(step.end_position, 0, size)
        schedule.on_verified(now_s=now_s, step=step, result=result)
    # 15 steps of 1000 bytes a pass, one a second, then a new pass from the start once 20 s
    # have passed since the first one started.
    assert [s[0] for s in starts[:30]] == [float(i) for i in range(15)] + [
        float(i) for i in range(20, 35)
    ]
    assert starts[10][1:] == (100, 0) and starts[15][1:] == (0, 0)


def test_a_leader_log_refuses_reads_of_a_damaged_range_until_it_is_cut(tmp_path: Path) -> None:
    lg = leader_log(tmp_path / "t-0", batches=10)
    lg.mark_damaged(9)
    with pytest.raises(KafkaError) as info:
        lg.read(10, 10**6)
    assert info.value.code == ErrorCode.kafka_storage_error
    assert lg.read(0, 10**6).next_offset == 9  # stops before the damaged batch
    lg.append_as_leader(batch(3), leader_epoch=3, now_ms=0)
    assert lg.read(30, 10**6).next_offset == 33  # appended after the damage: served
    lg.truncate_to(9)
    assert lg.damaged_range is None and lg.read(0, 10**6).next_offset == 9


# ------------------------------------------------------------------ a failing disk
class FailingDisk:
    """`os` as storage sees it, with writes or fsyncs of chosen files failing like a full or
    broken disk: the first write to a failing file lands `partial_bytes`, the next fails."""

    def __init__(self, error: int = errno.ENOSPC, partial_bytes: int = 0) -> None:
        self.fds: set[int] = set()
        self.files: set[tuple[int, int]] = set()  # (st_dev, st_ino): fsyncs use duplicates
        self.error = error
        self.partial_bytes = partial_bytes
        self.failed = 0

    def fail(self, fd: int) -> None:
        """Writes and fsyncs of this file fail from now on."""
        self.fds.add(fd)
        stat = os.fstat(fd)
        self.files.add((stat.st_dev, stat.st_ino))

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def write(self, fd: int, data: Any) -> int:
        if fd in self.fds:
            if self.partial_bytes and not self.failed:
                self.failed += 1
                return os.write(fd, bytes(data[: self.partial_bytes]))
            self.failed += 1
            raise OSError(self.error, os.strerror(self.error))
        return os.write(fd, data)

    def writev(self, fd: int, buffers: Any) -> int:
        if fd in self.fds:
            return self.write(fd, b"".join(bytes(b) for b in buffers))
        return os.writev(fd, buffers)

    def fdatasync(self, fd: int) -> None:
        stat = os.fstat(fd)
        if (stat.st_dev, stat.st_ino) in self.files:
            self.failed += 1
            raise OSError(self.error, os.strerror(self.error))
        os.fdatasync(fd)


def test_a_full_disk_takes_the_log_offline_and_a_restart_recovers_what_was_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    leader = leader_log(tmp_path / "l-0", batches=8)
    follower = PartitionLog.open(tmp_path / "f-0", SMALL, now_ms=0)
    follower.append_as_follower(leader.read(0, 10**6, max_offset=12).read_bytes())
    follower.flush_now()
    disk = FailingDisk(partial_bytes=40)
    disk.fail(follower.active_segment.file.fileno())
    monkeypatch.setattr(segment_module, "os", disk)
    with pytest.raises(LogOfflineError):
        follower.append_as_follower(leader.read(12, 10**6).read_bytes())
    assert follower.offline and disk.failed == 2
    # Offline: nothing is appended, read or flushed any more; one ERROR line said so.
    for call in (
        lambda: follower.append_as_follower(leader.read(12, 10**6).read_bytes()),
        lambda: follower.read(0, 10**6),
        lambda: follower.truncate_to(3),
    ):
        with pytest.raises(KafkaError) as info:
            call()
        assert info.value.code == ErrorCode.kafka_storage_error
    lines = [r for r in caplog.records if "log directory failed" in r.getMessage()]
    assert len(lines) == 1 and "No space left" in lines[0].getMessage()
    follower.close()  # no fsync, no checkpoint over a failed disk
    monkeypatch.undo()
    # Space is back: recovery cuts the partial batch, everything acknowledged is there.
    follower = PartitionLog.open(tmp_path / "f-0", SMALL, now_ms=0)
    assert follower.log_end_offset == 12
    assert follower.read(0, 10**6).read_bytes() == leader.read(0, 10**6, max_offset=12).read_bytes()


async def test_a_failed_fsync_takes_only_that_log_offline_and_the_flusher_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = leader_log(tmp_path / "b-0", batches=1)
    healthy = leader_log(tmp_path / "h-0", batches=1)
    # The worker threads' path (the failing disk stands in for os there); the AIO path's
    # failures are tests/storage/test_aio_fsync.py's.
    flusher = Flusher(aio=False)
    disk = FailingDisk(error=errno.EIO)
    disk.fail(broken.active_segment.file.fileno())
    monkeypatch.setattr(log_module, "os", disk)
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        with pytest.raises(LogOfflineError):
            await flusher.flush(broken, broken.log_end_offset)
        assert broken.offline and broken.flushed_offset == 0
        await flusher.flush(healthy, healthy.log_end_offset)
        healthy.append_as_leader(batch(3), leader_epoch=3, now_ms=0)
        await flusher.flush(healthy, healthy.log_end_offset)
        assert healthy.flushed_offset == 6
        nursery.cancel_scope.cancel()


# ------------------------------------------------------------------ recovery that lost data
def test_recovery_reports_data_lost_below_the_recovery_point_and_not_a_torn_tail(
    tmp_path: Path,
) -> None:
    lg = leader_log(tmp_path / "t-0", batches=20)
    end = lg.log_end_offset
    last = lg.segments[-1]
    cut_at = last.size_bytes - 30
    lg.close()  # a clean shutdown: the recovery point is the log end
    assert not PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0).lost_data
    # The last segment cut in the middle of a batch below the recovery point: acknowledged
    # records are gone, and the log says it lost data.
    with open(last.log_path, "r+b") as f:
        f.truncate(cut_at)
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    assert lg.log_end_offset == end - 3 and lg.lost_data and lg.unsafe_to_lead
    lg.close()
    # The same cut after a crash above the recovery point (data never acknowledged under
    # flush_policy=always): a torn tail, not lost data.
    lg = leader_log(tmp_path / "u-0", batches=20)
    lg.flush_now()
    recovery_point = lg.log_end_offset
    lg.append_as_leader(batch(3), leader_epoch=3, now_ms=0)
    last = lg.segments[-1]
    size = last.size_bytes
    lg.abandon()  # as after kill -9: no clean-shutdown checkpoint
    with open(last.log_path, "r+b") as f:
        f.truncate(size - 10)
    lg = PartitionLog.open(tmp_path / "u-0", SMALL, now_ms=0)
    assert lg.log_end_offset == recovery_point and not lg.lost_data


def test_a_damaged_trusted_segment_cut_by_its_index_check_drops_what_follows(
    tmp_path: Path,
) -> None:
    lg = leader_log(tmp_path / "t-0", batches=40)
    assert len(lg.segments) >= 3
    first = lg.segments[0]
    size = first.size_bytes
    lg.close()
    with open(first.log_path, "r+b") as f:
        f.truncate(size - 20)  # the index's last entry now points past the end
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    # No gap may remain between the cut segment and the next one.
    assert len(lg.segments) == 1 and lg.log_end_offset == lg.segments[0].next_offset
    assert lg.lost_data


async def test_a_recovery_point_brought_up_to_date_lets_recovery_see_lost_fsynced_data(
    tmp_path: Path,
) -> None:
    lg = leader_log(tmp_path / "t-0", batches=3)  # one segment: no roll wrote a recovery point
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        await flusher.flush(lg, lg.log_end_offset)
        # More data in the same epoch and segment: fsynced, but no checkpoint is due.
        lg.append_as_leader(batch(3), leader_epoch=3, now_ms=0)
        await flusher.flush(lg, lg.log_end_offset)
        assert lg.checkpoint_recovery_point_soon()
        flusher.wake()
        await flusher.wait_round()
        assert not lg.checkpoint_recovery_point_soon()  # nothing fsynced past it since
        nursery.cancel_scope.cancel()
    size = lg.active_segment.size_bytes
    path = lg.active_segment.log_path
    lg.abandon()  # as after kill -9
    os.truncate(path, size - 10)  # fsynced, acknowledged data cut away
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    assert lg.log_end_offset == 9 and lg.lost_data


def test_a_batch_larger_than_a_scrub_step_is_checked_piece_by_piece(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    lg.append_as_leader(batch(3), leader_epoch=1, now_ms=0)
    lg.append_as_leader(batch(5, value_bytes=900), leader_epoch=1, now_ms=0)  # ~4.6 KB
    lg.append_as_leader(batch(3), leader_epoch=1, now_ms=0)
    results = scrub_all(lg, ScrubSchedule(bytes_per_s=10**6, chunk_bytes=1000))
    assert all(r.damage is None for r in results)
    assert max(r.bytes_read for r in results) > 1000  # the large batch, read in pieces
    flip_byte_on_disk(lg, 3, from_end=2000)  # inside the large batch, far from its end
    results = scrub_all(lg, ScrubSchedule(bytes_per_s=10**6, chunk_bytes=1000))
    bad = [r for r in results if r.damage]
    assert len(bad) == 1 and bad[0].next_offset == 3 and "CRC" in str(bad[0].damage)


def test_a_truncation_whose_checkpoint_cannot_be_written_takes_the_log_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lg = leader_log(tmp_path / "t-0", batches=8)
    lg.flush_now()

    def full_disk(payloads: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(lg, "_write_checkpoints_locked", full_disk)
    with pytest.raises(LogOfflineError):
        lg.truncate_to(6)
    # Nothing may be appended over a cut whose checkpoints still describe the uncut log.
    assert lg.offline
    with pytest.raises(LogOfflineError):
        lg.read(0, 10**6)
    lg.close()
    monkeypatch.undo()
    # The segment was cut before the checkpoint failed: recovery finds the log below its
    # recorded recovery point and keeps the replica from leading until it catches up.
    reopened = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    assert reopened.log_end_offset == 6 and reopened.unsafe_to_lead


def test_reads_of_bytes_taken_on_trust_are_verified_once_and_stop_at_damage(
    tmp_path: Path,
) -> None:
    lg = leader_log(tmp_path / "t-0", batches=60)
    flip_byte_on_disk(lg, 100)
    lg.close()
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    # Everything below the recovery point was taken on trust: a read says so.
    first = lg.read(0, 10_000)
    assert first.unverified is not None and first.unverified.first_batch_offset == 0
    outcome = verify_read(first.unverified)
    assert outcome.damage is None
    first.unverified.segment.mark_verified(first.unverified.start_position, outcome.position)
    assert lg.read(0, 10_000).unverified is None  # verified once, served by sendfile after
    # The damaged batch (99..101) is found before it is served; what precedes it is good.
    damaged = lg.read(96, 10_000)
    assert damaged.unverified is not None
    outcome = verify_read(damaged.unverified)
    assert outcome.next_offset == 99 and "CRC" in str(outcome.damage)
    # A log this process wrote, or one recovery scanned, needs no second look.
    fresh = leader_log(tmp_path / "t-1", batches=10)
    assert fresh.read(0, 10_000).unverified is None


def test_the_scrubber_and_reads_shrink_the_unverified_range_from_below(tmp_path: Path) -> None:
    lg = leader_log(tmp_path / "t-0", batches=60)
    lg.close()
    lg = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    segment = lg.segments[0]
    size = segment.size_bytes
    assert (segment.unverified_from, segment.unverified_to) == (0, size)
    segment.mark_verified(size // 2, size)  # above the range's start: not recorded
    assert segment.needs_verify(size // 2, size)
    segment.mark_verified(0, size // 2)
    assert (segment.unverified_from, segment.unverified_to) == (size // 2, size)
    segment.mark_verified(size // 2, size)
    assert not segment.needs_verify(0, size)
