"""The flusher's worker threads: every job runs off the event loop and has ended when the
round returns, threads are kept and reused, a failing job does not take its thread down, a
cancelled round still waits for its fsyncs, and stop() ends them."""

from __future__ import annotations

import threading

import pytest
import trio

from raftlog.storage import Flusher, LogConfig, PartitionLog
from raftlog.storage.flusher import SyncThreads
from tests.storage.helpers import batch
from tests.waiting import wait_until


class _Boom(BaseException):
    pass


def _fsync_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "raftlog-fsync"]


async def test_jobs_run_off_the_loop_and_threads_are_reused() -> None:
    threads = SyncThreads()
    loop_thread = threading.get_ident()
    seen: set[int] = set()
    ran: list[int] = []
    lock = threading.Lock()

    def job(i: int) -> None:
        with lock:
            seen.add(threading.get_ident())
            ran.append(i)

    try:
        for round_ in range(20):
            await threads.run([lambda n=round_ * 10 + i: job(n) for i in range(4)])
            assert len(ran) == (round_ + 1) * 4  # every job of the round has ended
        assert loop_thread not in seen
        assert len(seen) <= 4  # four threads, kept across rounds
        await threads.run([])  # nothing to do returns at once
    finally:
        threads.stop()


async def test_a_failing_job_leaves_its_thread_serving() -> None:
    threads = SyncThreads()
    ran: list[str] = []

    def boom() -> None:
        raise _Boom

    try:
        await threads.run([boom])
        await threads.run([lambda: ran.append("after")])
        assert ran == ["after"]
    finally:
        threads.stop()


async def test_a_cancelled_round_still_waits_for_its_jobs() -> None:
    threads = SyncThreads()
    started, release = threading.Event(), threading.Event()
    finished: list[bool] = []

    def slow() -> None:
        started.set()
        release.wait(10)
        finished.append(True)

    async def cancel_soon(scope: trio.CancelScope) -> None:
        await wait_until("the job runs", started.is_set, timeout_s=5)
        scope.cancel()
        release.set()

    try:
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as scope:
                nursery.start_soon(cancel_soon, scope)
                await threads.run([slow])
        assert finished == [True]
    finally:
        threads.stop()


async def test_stop_ends_the_threads() -> None:
    threads = SyncThreads()
    used: set[int] = set()
    lock = threading.Lock()

    def note() -> None:
        with lock:
            used.add(threading.get_ident())

    await threads.run([note, note])
    assert len(used) == 2

    def ours_alive() -> bool:
        return any(t.ident in used for t in _fsync_threads())

    assert ours_alive()
    threads.stop()
    await wait_until("the threads end", lambda: not ours_alive(), timeout_s=5)


async def test_a_caller_cancelled_after_the_flusher_stopped_ends_cancelled(tmp_path) -> None:
    """Shutdown cancels the flusher and its callers in no set order: a caller whose scope is
    cancelled ends with its cancellation, not 'Flusher.run() is not running'."""
    lg = PartitionLog.open(tmp_path / "t-0", LogConfig(), now_ms=0)
    lg.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
    flusher = Flusher()  # never run, as after its cancellation
    with trio.CancelScope() as scope:
        scope.cancel()
        await flusher.flush(lg, 2)
    assert scope.cancelled_caught
    with pytest.raises(RuntimeError, match="not running"):
        await flusher.flush(lg, 2)  # a caller not cancelled: the misuse is still named
    lg.close()


async def test_a_flush_that_ends_in_any_exception_is_never_counted_durable(tmp_path) -> None:
    lg = PartitionLog.open(tmp_path / "t-0", LogConfig(), now_ms=0)
    lg.append_as_leader(batch(2), leader_epoch=1, now_ms=0)

    def interrupted(ticket: object) -> None:
        raise _Boom

    lg.run_flush = interrupted  # type: ignore[method-assign]
    flusher = Flusher()
    with pytest.raises(BaseExceptionGroup) as raised:
        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            await flusher.flush(lg, 2)
    assert raised.group_contains(_Boom)
    assert lg.flushed_offset == 0
    lg.close()
