"""Disk work that metadata asks for: creating, reconfiguring and removing partition logs.

apply_metadata runs on the event loop whenever a metadata change arrives and must stay cheap:
it decides, and the blocking half (mkdir + fsync, a log's recovery, checkpoint files, renames,
recursive deletes) runs here, in worker threads, from tasks of the replica manager's nursery.

- Jobs for one key (a partition, or a renamed directory) run one at a time in submission order,
  so a create, delete and re-create of one topic name never race.
- Jobs for different keys run concurrently, but at most MAX_LOG_WORK_THREADS threads at once
  and on their own limiter, so deleting a thousand partitions neither floods the machine nor
  queues the flusher's fsyncs behind it.
- A failing job is logged and the key's next job still runs: one bad directory must not stop
  the broker from applying metadata to the others.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

import trio

log = logging.getLogger("raftlog.replication")

# Worker threads the log work uses at most (trio's default limiter, shared by everything else,
# allows 40). Creating or deleting many logs is bound by the disk, not by parallelism.
MAX_LOG_WORK_THREADS = 4

Job = Callable[[], Awaitable[None]]
T = TypeVar("T")


class LogWork:
    """Per-key FIFO queues of async jobs, each key drained by one task."""

    def __init__(self, spawn: Callable[..., None]) -> None:
        self._spawn = spawn  # starts a task in the replica manager's nursery (or queues it)
        self._queues: dict[Hashable, deque[tuple[str, Job]]] = {}
        self._idle = trio.Event()
        self._idle.set()
        self.limiter = trio.CapacityLimiter(MAX_LOG_WORK_THREADS)

    def submit(self, key: Hashable, what: str, job: Job) -> None:
        """Run `job` after every job already submitted for `key`."""
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
            self._spawn(self._drain, key)
            if self._idle.is_set():
                self._idle = trio.Event()
        queue.append((what, job))

    def busy(self, key: Hashable) -> bool:
        """True while a job for `key` waits or runs."""
        return key in self._queues

    @property
    def pending_keys(self) -> int:
        return len(self._queues)

    async def wait_idle(self) -> None:
        """Return once no job waits or runs (tests, tools, shutdown)."""
        while self._queues:
            await self._idle.wait()

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """The blocking call of a job, in a worker thread of the log-work limiter."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    async def _drain(self, key: Hashable) -> None:
        queue = self._queues[key]
        try:
            while queue:
                what, job = queue[0]
                try:
                    await job()
                except Exception:
                    log.exception("%s: %s failed", _describe(key), what)
                finally:
                    queue.popleft()
        finally:
            del self._queues[key]
            if not self._queues:
                self._idle.set()


def _describe(key: Hashable) -> str:
    if isinstance(key, tuple) and len(key) == 2:
        return f"{key[0]}-{key[1]}"
    return str(key)
