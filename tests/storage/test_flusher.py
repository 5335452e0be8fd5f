from __future__ import annotations

from pathlib import Path

import trio
import trio.lowlevel
import trio.testing

from raftlog.storage import Flusher, LogConfig, PartitionLog
from raftlog.storage.log_types import FlushTicket
from tests.storage.helpers import batch


async def test_group_commit_shares_fsyncs(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", LogConfig(), now_ms=0)
    flusher = Flusher()
    producers = 50
    rounds = 4
    acknowledged: list[int] = []

    async def producer() -> None:
        for _ in range(rounds):
            info = lg.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
            await flusher.flush(lg, info.last_offset + 1)
            # Persist before you promise: acknowledged means fsynced.
            assert lg.flushed_offset > info.last_offset
            acknowledged.append(info.last_offset)
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        async with trio.open_nursery() as producers_nursery:
            for _ in range(producers):
                producers_nursery.start_soon(producer)
        nursery.cancel_scope.cancel()
    assert len(acknowledged) == producers * rounds
    assert lg.flushed_offset == lg.log_end_offset == producers * rounds * 2
    # far fewer fsync rounds than acknowledged appends
    assert flusher.fsync_rounds <= producers * rounds // 10, flusher.fsync_rounds


async def test_flush_returns_at_once_when_already_covered(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", LogConfig(), now_ms=0)
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        await flusher.flush(lg, 0)
        assert flusher.fsync_rounds == 0
        nursery.cancel_scope.cancel()


async def test_interval_policy_does_not_force_but_ticks(tmp_path: Path) -> None:
    # Real clock: a MockClock would jump ahead while the fsync runs in its worker thread.
    config = LogConfig(flush_policy="interval", flush_interval_ms=50)
    lg = PartitionLog.open(tmp_path / "t-0", config, now_ms=0)
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        lg.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
        await flusher.flush(lg, 2)
        assert lg.flushed_offset == 0  # not forced
        with trio.fail_after(10):
            while lg.flushed_offset < 2:
                await flusher.wait_round()
        nursery.cancel_scope.cancel()


async def test_truncation_during_flush_does_not_overstate_flushed(tmp_path: Path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", LogConfig(), now_ms=0)
    lg.append_as_leader(batch(5), leader_epoch=1, now_ms=0)
    ticket = lg.prepare_flush()
    lg.truncate_to(2)
    lg.append_as_leader(batch(5), leader_epoch=2, now_ms=0)
    await trio.to_thread.run_sync(lg.run_flush, ticket)
    lg.complete_flush(ticket)
    assert lg.flushed_offset <= 2


async def test_crash_after_rolls_recovers_from_flusher_checkpoint(tmp_path: Path) -> None:
    """No close(): the recovery point on disk is the one the flusher wrote after a roll."""
    config = LogConfig(segment_bytes=800)
    lg = PartitionLog.open(tmp_path / "t-0", config, now_ms=0)
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        for i in range(30):
            info = lg.append_as_leader(batch(2), leader_epoch=1 + i // 10, now_ms=0)
            await flusher.flush(lg, info.last_offset + 1)
        nursery.cancel_scope.cancel()
    from raftlog.storage.checkpoint import read_checkpoint
    from raftlog.storage.recovery import RECOVERY_POINT_FILE

    recovery_point = read_checkpoint(tmp_path / "t-0" / RECOVERY_POINT_FILE, "recovery-point")
    assert 0 < recovery_point["recovery_point"] <= 60
    # simulate kill -9: drop the object without closing, then reopen
    again = PartitionLog.open(tmp_path / "t-0", config, now_ms=0)
    assert again.log_end_offset == 60
    assert [e.epoch for e in again.epoch_cache.entries] == [1, 2, 3]


async def test_a_flush_that_misses_a_running_round_does_not_wait_for_it(tmp_path: Path) -> None:
    """A round's fds are taken when it begins, so a request arriving during it cannot join
    it; the next round starts at once beside it (ROUNDS_IN_FLIGHT) rather than after it."""
    import threading

    slow = PartitionLog.open(tmp_path / "slow-0", LogConfig(), now_ms=0)
    quick = PartitionLog.open(tmp_path / "quick-0", LogConfig(), now_ms=0)
    release = threading.Event()
    real_run_flush = slow.run_flush

    def stalled_run_flush(ticket: FlushTicket) -> None:
        release.wait(30)  # a disk that takes its time with this one fsync
        real_run_flush(ticket)

    slow.run_flush = stalled_run_flush  # type: ignore[method-assign]
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        slow.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
        nursery.start_soon(flusher.flush, slow, 2)
        # Every task is then parked: the slow log's round waits in its worker thread.
        await trio.testing.wait_all_tasks_blocked()
        assert flusher.rounds_running == 1
        quick.append_as_leader(batch(3), leader_epoch=1, now_ms=0)
        try:
            with trio.fail_after(10):
                await flusher.flush(quick, 3)
            assert quick.flushed_offset == 3
            assert slow.flushed_offset == 0  # its round is still in its fsync
        finally:
            release.set()
        with trio.fail_after(10):
            await flusher.flush(slow, 2)
        assert slow.flushed_offset == 2
        nursery.cancel_scope.cancel()


async def test_a_log_in_a_running_round_is_not_reported_flushed_before_that_round_ends(
    tmp_path: Path,
) -> None:
    """A second request for a log whose fsync is running (nothing appended since) must wait
    for that fsync: a second round would find no dirty segment left and report the log
    flushed at once, and a produce would be acknowledged before its bytes were on disk."""
    import threading

    lg = PartitionLog.open(tmp_path / "t-0", LogConfig(), now_ms=0)
    release = threading.Event()
    real_run_flush = lg.run_flush
    fsyncs_done: list[int] = []

    def stalled_run_flush(ticket: FlushTicket) -> None:
        release.wait(30)
        real_run_flush(ticket)
        fsyncs_done.append(ticket.target_offset)

    lg.run_flush = stalled_run_flush  # type: ignore[method-assign]
    flusher = Flusher()
    reported: list[tuple[int, list[int]]] = []

    async def second_caller() -> None:
        await flusher.flush(lg, 2)
        reported.append((lg.flushed_offset, list(fsyncs_done)))

    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        lg.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
        nursery.start_soon(flusher.flush, lg, 2)
        try:
            await trio.testing.wait_all_tasks_blocked()
            assert flusher.rounds_running == 1
            nursery.start_soon(second_caller)
            await trio.testing.wait_all_tasks_blocked()
            assert reported == [] and flusher.rounds_running == 1  # held, not a second round
        finally:
            release.set()
        with trio.fail_after(10):
            while not reported:
                await flusher.wait_round()
        nursery.cancel_scope.cancel()
    [(flushed, done_then)] = reported
    assert flushed == 2 and done_then and done_then[0] == 2


async def test_logs_flushed_together_share_one_round_and_a_lone_flush_takes_its_own(
    tmp_path: Path,
) -> None:
    import functools

    logs = [PartitionLog.open(tmp_path / f"t-{i}", LogConfig(), now_ms=0) for i in range(3)]
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        for lg in logs:
            lg.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
        with trio.fail_after(10):
            async with trio.open_nursery() as together:
                for lg in logs:
                    together.start_soon(functools.partial(flusher.flush, lg, 2, alone=False))
        assert flusher.fsync_rounds == 1
        assert [lg.flushed_offset for lg in logs] == [2, 2, 2]
        # A flush with nothing else asked for runs its round at once.
        logs[0].append_as_leader(batch(3), leader_epoch=1, now_ms=0)
        with trio.fail_after(10):
            await flusher.flush(logs[0], 5)
        assert flusher.fsync_rounds == 2 and logs[0].flushed_offset == 5
        nursery.cancel_scope.cancel()
