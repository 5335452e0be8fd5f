"""Group-commit flusher: many `await flush(log, offset)` callers share one fsync.

While one fsync round runs, new requests pile up; the next round covers them all,
so the number of fsyncs tracks the disk's speed, not the number of producers. Up to
ROUNDS_IN_FLIGHT rounds run at once: a request that arrives while a round is running starts the
next round at once instead of waiting for that one to end (it could not join it: its fds were
taken when it began), which halves the wait of a flush that just missed a round. A log is in
one round at a time: a second round of the same log would find no dirty segment left to fsync
(the first took them) and report the log flushed before the first round's fsync had ended.
A flush of one log with nothing else asked for and a slot free runs its round in the caller's
task rather than through run(): the same round, without two task hops.
A round that only fdatasyncs goes to the kernel as native AIO where it can (storage/aio.py:
no thread hand-off per fsync); the others, and every round where AIO is not to be had, use the
worker threads (SyncThreads).
Logs whose flush_policy is 'interval' are never forced: a background tick fsyncs them every
flush_interval_ms (their promise is weaker: replication, not the disk, protects recent data).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import queue
import threading
from collections.abc import Callable

import trio

from raftlog.storage.aio import FsyncRing
from raftlog.storage.log import FlushTicket, LogOfflineError, PartitionLog

log = logging.getLogger("raftlog.storage")

# How often the background tick looks for interval-policy logs and overdue checkpoints when no
# interval log asks for something shorter.
DEFAULT_TICK_MS = 1000
# Worker threads one flush round uses at most (see _flush_round).
FLUSH_THREADS_PER_ROUND = 4
# Flush rounds running at once (over different logs). More would split group commits further
# without shortening a wait: a third request waits for the first round to end either way.
ROUNDS_IN_FLIGHT = 2
# fdatasyncs one AIO ring takes at once; a round with more files goes through the threads.
AIO_RING_CAPACITY = 256


class SyncThreads:
    """Worker threads kept for fsyncs: a job goes to an idle thread through its queue and its
    end comes back with run_sync_soon. trio.to_thread's per-call dispatch (thread cache,
    contextvars, outcome capture, a nursery per round) was the largest single item of the
    nodes' Python time under produce load (docs/results.md, flame graphs); this costs about
    half as much CPU per hand-off (7-13 % less node CPU per MB streamed, measured)."""

    def __init__(self) -> None:
        self._idle: list[queue.SimpleQueue[Callable[[], None] | None]] = []
        self._all: list[queue.SimpleQueue[Callable[[], None] | None]] = []

    async def run(self, jobs: list[Callable[[], None]]) -> None:
        """Run `jobs` at once, one per thread; return when every one has ended."""
        if not jobs:
            return
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        left = [len(jobs)]

        def finished() -> None:
            left[0] -= 1
            if left[0] == 0:
                done.set()

        used = []
        for job in jobs:
            inbox = self._idle.pop() if self._idle else self._start()
            used.append(inbox)

            def work(job: Callable[[], None] = job) -> None:
                # A cancelled round still waits for its fsyncs (shielded below), as
                # to_thread.run_sync did: a flush is never abandoned half-way.
                try:
                    job()
                finally:
                    try:
                        token.run_sync_soon(finished)
                    except trio.RunFinishedError:
                        pass

            inbox.put(work)
        try:
            with trio.CancelScope(shield=True):
                await done.wait()
        finally:
            self._idle.extend(used)

    def _start(self) -> queue.SimpleQueue[Callable[[], None] | None]:
        inbox: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()

        def loop() -> None:
            while (job := inbox.get()) is not None:
                try:
                    job()
                except BaseException:  # the thread must stay to serve its queue
                    log.exception("fsync worker job failed")

        threading.Thread(target=loop, name="raftlog-fsync", daemon=True).start()
        self._all.append(inbox)
        return inbox

    def stop(self) -> None:
        for inbox in self._all:
            inbox.put(None)
        self._all.clear()
        self._idle.clear()


class Flusher:
    def __init__(self, *, aio: bool = True) -> None:
        self._threads = SyncThreads()
        # Rounds that only fdatasync go to the kernel's AIO (storage/aio.py) while it takes
        # them; rounds with a directory fsync or checkpoints, and every round where AIO is not
        # to be had, use the worker threads.
        self._aio = aio
        self._idle_rings: list[FsyncRing] = []
        self._logs: dict[int, PartitionLog] = {}  # id(log) -> log, every log seen
        self._requested: dict[int, PartitionLog] = {}  # logs a caller is waiting on
        self._wakeup = trio.Event()
        # Set when the round that will collect the requests made until then has ended (or,
        # with nothing to flush, when the tick that found nothing has).
        self._next_round_done = trio.Event()
        self._slots = trio.Semaphore(ROUNDS_IN_FLIGHT)
        self._in_rounds: set[int] = set()  # id(log) of the logs in a running round
        self.fsync_rounds = 0  # for tests and benchmarks: how many fsync rounds ran
        self.rounds_running = 0
        self._running = False
        self._last_interval_flush_ms: dict[int, float] = {}

    def register(self, log_: PartitionLog) -> None:
        self._logs[id(log_)] = log_

    def unregister(self, log_: PartitionLog) -> None:
        self._logs.pop(id(log_), None)
        self._requested.pop(id(log_), None)
        self._last_interval_flush_ms.pop(id(log_), None)

    async def flush(self, log_: PartitionLog, up_to_offset: int, *, alone: bool = True) -> None:
        """Return once every offset < up_to_offset of `log_` is fsynced.

        Under flush_policy='interval' this returns at once (the background tick flushes).
        alone=False: the caller flushes other logs at the same moment, which should share
        one round (and its threads) rather than each take a round of its own in turn.
        """
        self.register(log_)
        if log_.config.flush_policy == "interval":
            return
        up_to_offset = min(up_to_offset, log_.log_end_offset)
        while log_.flushed_offset < up_to_offset and not log_.closed:
            if log_.offline_reason is not None:
                raise LogOfflineError()
            if not self._running:
                # At shutdown the flusher may be cancelled before its callers are: they end
                # with their own cancellation, not with this error.
                await trio.lowlevel.checkpoint_if_cancelled()
                raise RuntimeError("Flusher.run() is not running")
            if alone and self._may_run_inline(log_):
                await self._round_in_slot([log_], None)
                continue
            self._requested[id(log_)] = log_
            self._wakeup.set()
            await self._next_round_done.wait()

    def _may_run_inline(self, log_: PartitionLog) -> bool:
        """Whether the caller may run a round of its own log at once, in its own task (and
        takes a slot for it): only when nothing else is asked for, the log is in no running
        round and a slot is free, which is when run() would start that same round right away.
        It spares the two task hops (wake run(), start a round task) each flush paid at low
        load; under load requests pile up and share run()'s rounds as before."""
        if self._requested or id(log_) in self._in_rounds:
            return False
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            return False
        self._in_rounds.add(id(log_))
        return True

    async def wait_round(self) -> None:
        """Wait until the next flush round (or idle tick) completes."""
        await self._next_round_done.wait()

    def wake(self) -> None:
        """Ask for a round soon (e.g. checkpoints became due after retention)."""
        self._wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._running = True
        try:
            async with trio.open_nursery() as rounds:
                task_status.started()
                while True:
                    with trio.move_on_after(self._tick_seconds()):
                        await self._wakeup.wait()
                    # Requests keep piling up while both slots are busy: the next round takes
                    # them all together.
                    await self._slots.acquire()
                    self._wakeup = trio.Event()
                    logs = self._collect()
                    if logs:
                        done, self._next_round_done = self._next_round_done, trio.Event()
                        self._in_rounds.update(id(lg) for lg in logs)
                        rounds.start_soon(self._round_in_slot, logs, done)
                        continue
                    self._slots.release()
                    if not self._requested:
                        # An idle tick (nothing asked for, nothing due) ends a "round" too.
                        done, self._next_round_done = self._next_round_done, trio.Event()
                        done.set()
                    # Otherwise every log asked for is in a running round, whose end wakes
                    # this loop for it.
        finally:
            self._running = False
            self._next_round_done.set()
            self._threads.stop()
            # A ring still in a round (an inline one) is closed when that round returns it.
            for ring in self._idle_rings:
                ring.close()
            self._idle_rings.clear()

    async def _round_in_slot(self, logs: list[PartitionLog], done: trio.Event | None) -> None:
        self.rounds_running += 1
        try:
            await self._flush_round(logs)
        finally:
            self.rounds_running -= 1
            self._in_rounds.difference_update(id(lg) for lg in logs)
            self._slots.release()
            if done is not None:
                done.set()
            if self._requested:
                self._wakeup.set()  # logs held back while this round had them

    def _tick_seconds(self) -> float:
        intervals = [
            log_.config.flush_interval_ms
            for log_ in self._logs.values()
            if log_.config.flush_policy == "interval"
        ]
        return min([DEFAULT_TICK_MS, *intervals]) / 1000

    def _collect(self) -> list[PartitionLog]:
        now_ms = trio.current_time() * 1000
        busy = self._in_rounds
        # A log in a running round waits for its end (see the module docstring).
        held = {k: v for k, v in self._requested.items() if k in busy}
        chosen = {
            k: v
            for k, v in self._requested.items()
            if k not in busy and not v.closed and v.offline_reason is None
        }
        self._requested = held
        for key, log_ in list(self._logs.items()):
            if log_.closed or log_.offline_reason is not None:
                self.unregister(log_)
                continue
            if key in chosen or key in busy or not log_.needs_flush():
                continue
            if log_.config.flush_policy == "interval":
                last = self._last_interval_flush_ms.get(key, -math.inf)
                if now_ms - last >= log_.config.flush_interval_ms:
                    chosen[key] = log_
                    self._last_interval_flush_ms[key] = now_ms
            elif log_.checkpoint_due:  # a roll or retention wants checkpoints written
                chosen[key] = log_
        return list(chosen.values())

    async def _flush_round(self, logs: list[PartitionLog]) -> None:
        tickets: list[tuple[PartitionLog, FlushTicket]] = [(lg, lg.prepare_flush()) for lg in logs]
        if self._aio and all(not t.fsync_directory and not t.checkpoints for _, t in tickets):
            fd_count = sum(len(t.fds) for _, t in tickets)
            ring = self._take_ring() if fd_count <= AIO_RING_CAPACITY else None
            if ring is not None:
                await self._aio_round(ring, tickets)
                return

        # A few worker threads per round, each fsyncing its share of the logs in turn. The
        # filesystem merges concurrent fdatasyncs into one journal commit, so a single loop
        # over the logs pays one commit per log (measured: 7 logs, round p50 1.7 -> 2.5 ms);
        # a thread per log costs a dispatch per log per round instead (7 logs: 1.9 ms of CPU
        # a round against 1.5 ms with 3 or 4 threads, at the same round time).
        failures: list[tuple[PartitionLog, BaseException]] = []
        failed_disks: list[PartitionLog] = []

        def sync_share(share: list[tuple[PartitionLog, FlushTicket]]) -> None:
            for lg, ticket in share:
                try:
                    lg.run_flush(ticket)
                except OSError:
                    # The log took itself offline (run_flush): the node goes on with the
                    # others, and flush() callers waiting for it get LogOfflineError.
                    failed_disks.append(lg)
                except BaseException as exc:  # whatever it was, this log is not durable
                    failures.append((lg, exc))

        workers = min(FLUSH_THREADS_PER_ROUND, len(tickets))
        await self._threads.run(
            [functools.partial(sync_share, tickets[i::workers]) for i in range(workers)]
        )
        self.fsync_rounds += 1
        failed = {id(lg) for lg, _ in failures} | {id(lg) for lg in failed_disks}
        for lg, ticket in tickets:
            if id(lg) not in failed:
                lg.complete_flush(ticket)
        if failures:
            raise failures[0][1]

    def _take_ring(self) -> FsyncRing | None:
        if self._idle_rings:
            return self._idle_rings.pop()
        ring = FsyncRing.open(AIO_RING_CAPACITY)
        if ring is None:
            self._aio = False  # FsyncRing.open said why, once
        return ring

    async def _aio_round(
        self, ring: FsyncRing, tickets: list[tuple[PartitionLog, FlushTicket]]
    ) -> None:
        """The round's fdatasyncs through `ring`; what the kernel would not take goes through
        the threads. A log whose fsync failed goes offline, as run_flush takes it."""
        owners = [(lg, fd) for lg, t in tickets for fd in t.fds]
        errors: dict[int, OSError] = {}
        reusable = False
        try:
            results = await ring.fdatasync([fd for _, fd in owners])
            reusable = True
            for (lg, _), result in zip(owners, results, strict=True):
                if result:
                    errors.setdefault(id(lg), OSError(result, os.strerror(result)))
            leftover = [
                (lg, fd) for (lg, fd), result in zip(owners, results, strict=True) if result is None
            ]
            if leftover:

                def sync_leftover() -> None:
                    for lg, fd in leftover:
                        try:
                            os.fdatasync(fd)
                        except OSError as exc:
                            errors.setdefault(id(lg), exc)

                await self._threads.run([sync_leftover])
        finally:
            for _, fd in owners:
                os.close(fd)
            if ring.unsupported is not None:
                log.info(
                    "fsyncs go through worker threads: AIO fsync refused: %s", ring.unsupported
                )
                self._aio = False
            if reusable and self._running and self._aio:
                self._idle_rings.append(ring)
            else:
                ring.close()
        self.fsync_rounds += 1
        for lg, ticket in tickets:
            exc = errors.get(id(lg))
            if exc is None:
                lg.complete_flush(ticket)
            else:
                # As run_flush: the page cache can no longer be trusted to be on disk.
                lg.mark_offline(f"flush failed: {exc}")
