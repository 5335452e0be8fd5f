"""fdatasync through Linux AIO (storage/aio.py) and the flusher's use of it: real files are
made durable without a worker thread, a file the kernel will not fsync that way falls back to
the threads (and its error takes only that log offline), and a cancelled caller never
abandons a round's fsyncs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from raftlog.storage import Flusher, LogConfig, LogOfflineError, PartitionLog
from raftlog.storage.aio import FsyncRing
from raftlog.storage.flusher import SyncThreads
from raftlog.storage.log import FlushTicket
from tests.storage.helpers import batch


def _available() -> bool:
    ring = FsyncRing.open(8)
    if ring is None:
        return False
    ring.close()
    return True


pytestmark = pytest.mark.skipif(not _available(), reason="no Linux AIO fsync on this machine")


def _ring() -> FsyncRing:
    ring = FsyncRing.open(8)
    assert ring is not None
    return ring


async def test_a_ring_fsyncs_real_files_at_once(tmp_path: Path) -> None:
    ring = _ring()
    fds = [os.open(tmp_path / f"f{i}", os.O_CREAT | os.O_WRONLY) for i in range(5)]
    try:
        for _ in range(3):  # the ring is reused round after round
            for fd in fds:
                os.write(fd, b"x" * 1100)
            assert await ring.fdatasync(fds) == [0] * 5
        assert ring.unsupported is None
        with pytest.raises(ValueError):
            await ring.fdatasync(fds * 2)  # more than the ring holds: refused before any
    finally:
        for fd in fds:
            os.close(fd)
        ring.close()
        ring.close()  # twice is harmless


async def test_a_file_without_fsync_is_refused_and_says_why() -> None:
    ring = _ring()
    read_end, write_end = os.pipe()
    try:
        assert await ring.fdatasync([write_end]) == [None]
        assert ring.unsupported  # the kernel refused outright: the caller stops using AIO
    finally:
        os.close(read_end)
        os.close(write_end)
        ring.close()


async def test_the_flusher_syncs_through_the_ring_without_its_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread_rounds = []
    original = SyncThreads.run

    async def counted(self: SyncThreads, jobs: list) -> None:
        thread_rounds.append(len(jobs))
        await original(self, jobs)

    monkeypatch.setattr(SyncThreads, "run", counted)
    logs = [PartitionLog.open(tmp_path / f"t-{i}", LogConfig(), now_ms=0) for i in range(3)]
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        for lg in logs:  # a new log's first round also fsyncs its directory: threads
            lg.append_as_leader(batch(1), leader_epoch=1, now_ms=0)
            await flusher.flush(lg, lg.log_end_offset)
        before = len(thread_rounds)
        for _ in range(20):
            async with trio.open_nursery() as writers:
                for lg in logs:
                    lg.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
                    writers.start_soon(flusher.flush, lg, lg.log_end_offset)
        assert len(thread_rounds) == before  # every later round went through the ring
        for lg in logs:
            assert lg.flushed_offset == lg.log_end_offset == 41
        nursery.cancel_scope.cancel()
    for lg in logs:
        lg.close()


async def test_an_fsync_the_ring_refuses_falls_back_and_fails_only_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = PartitionLog.open(tmp_path / "b-0", LogConfig(), now_ms=0)
    healthy = PartitionLog.open(tmp_path / "h-0", LogConfig(), now_ms=0)
    flusher = Flusher()
    read_end, write_end = os.pipe()
    original = PartitionLog.prepare_flush

    def with_a_pipe(self: PartitionLog) -> FlushTicket:
        ticket = original(self)
        if self is broken:
            # A descriptor neither AIO nor fdatasync can make durable (EINVAL), as a device
            # that lost fsync support would be.
            ticket.fds.append(os.dup(write_end))
        return ticket

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            for lg in (broken, healthy):  # a new log's first round also fsyncs its directory
                lg.append_as_leader(batch(1), leader_epoch=1, now_ms=0)
                await flusher.flush(lg, lg.log_end_offset)
            monkeypatch.setattr(PartitionLog, "prepare_flush", with_a_pipe)
            for lg in (broken, healthy):
                lg.append_as_leader(batch(1), leader_epoch=1, now_ms=0)
            with pytest.raises(LogOfflineError):
                await flusher.flush(broken, broken.log_end_offset)
            assert broken.offline and broken.flushed_offset == 1
            assert not flusher._aio  # refused outright: the threads from now on
            await flusher.flush(healthy, healthy.log_end_offset)
            assert healthy.flushed_offset == 2
            nursery.cancel_scope.cancel()
    finally:
        os.close(read_end)
        os.close(write_end)
        healthy.close()


async def test_a_cancelled_caller_leaves_the_round_to_finish(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", LogConfig(), now_ms=0)
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        lg.append_as_leader(batch(1), leader_epoch=1, now_ms=0)
        await flusher.flush(lg, lg.log_end_offset)
        lg.append_as_leader(batch(1), leader_epoch=1, now_ms=0)
        await flusher.flush(lg, lg.log_end_offset)  # the ring (and its eventfd) now exists
        open_fds = len(os.listdir("/proc/self/fd"))
        for _ in range(10):
            lg.append_as_leader(batch(1), leader_epoch=1, now_ms=0)
            with trio.CancelScope() as scope:
                scope.cancel()  # cancelled before its fsync could even start waiting
                await flusher.flush(lg, lg.log_end_offset)
            # The round ran to its end: the log is durable, its descriptors are closed and
            # the ring is back for the next round.
            assert lg.flushed_offset == lg.log_end_offset
            assert len(os.listdir("/proc/self/fd")) == open_fds
            assert len(flusher._idle_rings) == 1
        await flusher.flush(lg, lg.log_end_offset)  # the ring still serves
        assert lg.flushed_offset == lg.log_end_offset == 12
        nursery.cancel_scope.cancel()
    lg.close()
