"""Sans-IO delayed produce and fetch bookkeeping (Kafka's purgatory, without timers or locks).

Waiters are keyed by partition. They complete when the driver reports progress of that
partition (HW, LEO or flushed offset moved, the ISR changed) or when their deadline passes;
the purgatory never polls the log. Parked produces sit in required-offset order, so a report
that covers none of them looks at one waiter. `next_deadline_ms` tells the driver how long it
may sleep. Completions come back as values; the driver sends the answers.
"""

from __future__ import annotations

import bisect
import enum
import heapq
import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from raftlog.errors import ErrorCode, LocalError
from raftlog.replication.core.types import PartitionProgress

# Bytes between two offsets of a partition's log: (key, start_offset, end_offset) -> bytes.
BytesBetween = Callable[[Hashable, int, int], int]


class ProduceWait(enum.Enum):
    HIGH_WATERMARK = "high_watermark"  # acks=all: every ISR member has it durably
    FLUSHED = "flushed"  # acks=1 under flush_policy=always: the leader fsynced it


class ProduceAnswer(enum.Enum):
    """When a produce is answered, after the leader appended it."""

    NEVER = "never"  # acks=0
    NOW = "now"  # acks=1 under flush_policy=interval
    AFTER_FLUSH = "after_flush"  # acks=1 under flush_policy=always (park: ProduceWait.FLUSHED)
    AFTER_HIGH_WATERMARK = "after_high_watermark"  # acks=all (park: HIGH_WATERMARK)


def produce_answer(acks: int, flush_policy: str) -> ProduceAnswer:
    if acks == 0:
        return ProduceAnswer.NEVER
    if acks == -1:
        return ProduceAnswer.AFTER_HIGH_WATERMARK
    if acks != 1:
        raise ValueError(f"acks must be -1, 0 or 1, got {acks}")
    return ProduceAnswer.AFTER_FLUSH if flush_policy == "always" else ProduceAnswer.NOW


class FetchIsolation(enum.Enum):
    LOG_END = "log_end"  # replica fetches read up to the LEO
    HIGH_WATERMARK = "high_watermark"  # consumers never see data past the HW


@dataclass(eq=False)
class DelayedProduce:
    key: Hashable
    required_offset: int  # last offset of the append + 1
    deadline_ms: int
    min_insync_replicas: int
    token: Any  # the driver's handle for the answer
    wait_for: ProduceWait = ProduceWait.HIGH_WATERMARK
    done: bool = field(default=False, init=False)


@dataclass(eq=False)
class DelayedFetch:
    key: Hashable
    fetch_offset: int
    min_bytes: int
    deadline_ms: int
    token: Any
    isolation: FetchIsolation = FetchIsolation.HIGH_WATERMARK
    done: bool = field(default=False, init=False)

    @classmethod
    def for_consumer(
        cls,
        key: Hashable,
        fetch_offset: int,
        fetch_min_bytes: int,
        fetch_max_wait_ms: int,
        now_ms: int,
        token: Any,
    ) -> DelayedFetch:
        """A consumer fetch: waits for fetch_min_bytes below the HW, at most fetch_max_wait_ms."""
        return cls(key, fetch_offset, fetch_min_bytes, now_ms + fetch_max_wait_ms, token)


@dataclass(frozen=True)
class ProduceCompletion:
    token: Any
    error: ErrorCode


@dataclass(frozen=True)
class FetchCompletion:
    token: Any
    error: ErrorCode
    # Read up to here (exclusive): the HW for consumers, the LEO for replicas.
    readable_end_offset: int


Completion = ProduceCompletion | FetchCompletion


class PurgatoryFullError(LocalError):
    """More waiters than max_waiters: the driver answers the request with an error instead."""


def produce_result(waiter: DelayedProduce, progress: PartitionProgress) -> ErrorCode | None:
    """The waiter's answer under `progress` (a leader PartitionProgress), or None to wait."""
    if waiter.wait_for is ProduceWait.FLUSHED:
        return ErrorCode.none if progress.flushed_offset >= waiter.required_offset else None
    if progress.high_watermark < waiter.required_offset:
        return None
    # Kafka's rule: the HW covers the batch, but the ISR that got it there is too small.
    if progress.isr_size < waiter.min_insync_replicas:
        return ErrorCode.not_enough_replicas_after_append
    return ErrorCode.none


def _required_offset(waiter: DelayedProduce) -> int:
    return waiter.required_offset


def readable_end(waiter: DelayedFetch, progress: PartitionProgress) -> int:
    if waiter.isolation is FetchIsolation.LOG_END:
        return int(progress.log_end_offset)
    return int(progress.high_watermark)


class Purgatory:
    """Delayed produces and fetches of every partition a broker leads, bounded in count."""

    def __init__(self, max_waiters: int = 100_000) -> None:
        self.max_waiters = max_waiters
        # Per partition and ProduceWait, parked produces in required_offset order: progress
        # completes a prefix, so a report that covers none looks at one waiter per queue.
        self._produces: dict[Hashable, dict[ProduceWait, list[DelayedProduce]]] = {}
        self._fetches: dict[Hashable, list[DelayedFetch]] = {}
        self._deadlines: list[tuple[int, int, DelayedProduce | DelayedFetch]] = []
        self._order = itertools.count()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def next_deadline_ms(self) -> int | None:
        while self._deadlines and self._deadlines[0][2].done:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    def _admit(self, waiter: DelayedProduce | DelayedFetch) -> None:
        if self._count >= self.max_waiters:
            raise PurgatoryFullError(f"purgatory holds {self._count} waiters (max_waiters)")
        self._count += 1
        heapq.heappush(self._deadlines, (waiter.deadline_ms, next(self._order), waiter))

    def _finish(self, waiter: DelayedProduce | DelayedFetch) -> None:
        waiter.done = True
        self._count -= 1

    def add_produce(
        self, *, waiter: DelayedProduce, progress: PartitionProgress
    ) -> ProduceCompletion | None:
        """Park an appended produce, or complete it at once when progress already covers it."""
        error = produce_result(waiter, progress)
        if error is not None:
            return ProduceCompletion(waiter.token, error)
        self._admit(waiter)
        queue = self._produces.setdefault(waiter.key, {}).setdefault(waiter.wait_for, [])
        if queue and queue[-1].required_offset > waiter.required_offset:
            # Appends usually park in offset order; a produce that awaited in between does not.
            bisect.insort_right(queue, waiter, key=_required_offset)
        else:
            queue.append(waiter)
        return None

    def add_fetch(
        self, *, waiter: DelayedFetch, progress: PartitionProgress, bytes_between: BytesBetween
    ) -> FetchCompletion | None:
        """Park a fetch that has less than min_bytes to read, or complete it at once."""
        end = readable_end(waiter, progress)
        if self._fetch_ready(waiter, end, bytes_between):
            return FetchCompletion(waiter.token, ErrorCode.none, end)
        self._admit(waiter)
        self._fetches.setdefault(waiter.key, []).append(waiter)
        return None

    @staticmethod
    def _fetch_ready(waiter: DelayedFetch, end: int, bytes_between: BytesBetween) -> bool:
        if waiter.min_bytes <= 0 or end < waiter.fetch_offset:
            # Nothing to wait for, or the offset left the readable range (truncation): the
            # answer (with an error from the read) must go out now.
            return True
        return bytes_between(waiter.key, waiter.fetch_offset, end) >= waiter.min_bytes

    def on_progress(
        self, *, key: Hashable, progress: PartitionProgress, bytes_between: BytesBetween
    ) -> list[Completion]:
        """The partition's HW/LEO/flushed offset or ISR changed: complete what it covers."""
        completions: list[Completion] = []
        queues = self._produces.get(key)
        if queues:
            for wait_for, queue in list(queues.items()):
                covered = (
                    progress.flushed_offset
                    if wait_for is ProduceWait.FLUSHED
                    else progress.high_watermark
                )
                # Waiters up to the first one the offset does not cover complete, in order.
                done = 0
                while done < len(queue) and queue[done].required_offset <= covered:
                    done += 1
                if not done:
                    continue
                for waiter in queue[:done]:
                    error = produce_result(waiter, progress)
                    assert error is not None
                    self._finish(waiter)
                    completions.append(ProduceCompletion(waiter.token, error))
                del queue[:done]
                if not queue:
                    del queues[wait_for]
            if not queues:
                del self._produces[key]
        fetches = self._fetches.get(key)
        if fetches:
            still = []
            for fetch in fetches:
                end = readable_end(fetch, progress)
                if self._fetch_ready(fetch, end, bytes_between):
                    self._finish(fetch)
                    completions.append(FetchCompletion(fetch.token, ErrorCode.none, end))
                else:
                    still.append(fetch)
            if len(still) != len(fetches):
                self._store(self._fetches, key, still)
        return completions

    @staticmethod
    def _store(table: dict[Hashable, list[Any]], key: Hashable, waiters: list[Any]) -> None:
        if waiters:
            table[key] = waiters
        else:
            table.pop(key, None)

    def on_deadline(
        self, *, now_ms: int, progress_of: Callable[[Hashable], PartitionProgress | None]
    ) -> list[Completion]:
        """Expire waiters whose deadline is <= now_ms.

        Produces time out with REQUEST_TIMED_OUT; fetches answer with what is readable now
        (`progress_of(key)` gives the partition's progress, or None when no longer leader).
        """
        completions: list[Completion] = []
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            _, _, waiter = heapq.heappop(self._deadlines)
            if waiter.done:
                continue
            self._finish(waiter)
            if isinstance(waiter, DelayedProduce):
                self._remove_produce(waiter)
                completions.append(ProduceCompletion(waiter.token, ErrorCode.request_timed_out))
            else:
                self._remove(self._fetches, waiter)
                progress = progress_of(waiter.key)
                if progress is None:
                    completions.append(
                        FetchCompletion(waiter.token, ErrorCode.not_leader_or_follower, -1)
                    )
                else:
                    end = readable_end(waiter, progress)
                    completions.append(FetchCompletion(waiter.token, ErrorCode.none, end))
        return completions

    def _remove_produce(self, waiter: DelayedProduce) -> None:
        queues = self._produces.get(waiter.key, {})
        queue = [w for w in queues.get(waiter.wait_for, []) if w is not waiter]
        if queue:
            queues[waiter.wait_for] = queue
        else:
            queues.pop(waiter.wait_for, None)
        if not queues:
            self._produces.pop(waiter.key, None)

    def _remove(self, table: dict[Hashable, list[Any]], waiter: Any) -> None:
        waiters = table.get(waiter.key, [])
        self._store(table, waiter.key, [w for w in waiters if w is not waiter])

    def fail_partition(self, *, key: Hashable, error: ErrorCode) -> list[Completion]:
        """Leadership moved away: answer every waiter of the partition with `error`."""
        completions: list[Completion] = []
        queues = self._produces.pop(key, {})
        # In offset order across both kinds, as the answers were parked.
        waiters = sorted((w for queue in queues.values() for w in queue), key=_required_offset)
        for waiter in waiters:
            self._finish(waiter)
            completions.append(ProduceCompletion(waiter.token, error))
        for fetch in self._fetches.pop(key, []):
            self._finish(fetch)
            completions.append(FetchCompletion(fetch.token, error, -1))
        return completions
