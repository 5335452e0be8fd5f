"""One partition replica hosted by this broker, as the trio driver holds it."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import trio

from raftlog.concurrency import run_all
from raftlog.errors import KafkaError
from raftlog.replication.core.partition import Partition
from raftlog.replication.idempotence import ProducerStateHolder
from raftlog.storage import Flusher, PartitionLog

log = logging.getLogger("raftlog.replication")

# After a failed fsync the driver waits this long before it tries the same logs again.
FLUSH_RETRY_BACKOFF_MS = 200

TopicPartition = tuple[str, int]


@dataclass(eq=False)
class HostedPartition:
    topic: str
    partition: int
    topic_id: uuid.UUID
    log: PartitionLog
    replica: Partition
    # Idempotent-producer state (loaded in a worker thread; see idempotence.py).
    producers: ProducerStateHolder
    # Parked replica fetches (leader side) that name this partition. Set on LEO or HW advance
    # and on role changes, so a long-poll wakes on the event instead of polling the log.
    waiters: set[trio.Event] = field(default_factory=set)
    # Held by work that writes into the log's directory from a worker thread outside the
    # flusher (compaction); removal takes it before renaming the directory away, so no such
    # write lands in the renamed directory or in one re-created under the old name.
    disk_lock: trio.Lock = field(default_factory=trio.Lock)
    # Set while a follower truncation cuts the log in a worker thread. Appends are held back
    # by the producer-state gate, and metadata waits for it before it changes the role, so
    # only a follower's log is ever cut; code reading a log it does not lead waits for it.
    log_cut: trio.Event | None = None
    # Set while a follower truncation waits for producers.lock and disk_lock (a snapshot
    # write or a compaction may hold them for long). A role change cancels the wait: the cut
    # belongs to the follower state that asked for it, and the new role must not wait for
    # the directory before its producer state is rebuilt.
    cut_wait: trio.CancelScope | None = None

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.partition)

    def wake_waiters(self) -> None:
        for event in self.waiters:
            event.set()
        self.waiters.clear()

    async def cut_log(self, run_cut: Callable[[], Awaitable[object]]) -> None:
        """Run `run_cut` (a truncation in a worker thread) with `log_cut` set. A failure is
        logged, not raised: the follower then finds its log uncut and asks again."""
        event = self.log_cut = trio.Event()
        try:
            await run_cut()
        except (OSError, ValueError, KafkaError) as exc:
            if self.log.closed:
                # Removed meanwhile (ValueError: a file closed under the thread); its
                # directory is going, so the cut does not matter any more.
                log.info("%s-%d: truncation stopped by removal", self.topic, self.partition)
            else:
                log.error("%s-%d: truncation failed: %r", self.topic, self.partition, exc)
        finally:
            self.log_cut = None
            event.set()

    def drop_queued_cut(self) -> None:
        """The role changed: a truncation still waiting for its locks will not cut."""
        if self.cut_wait is not None:
            self.cut_wait.cancel()

    async def wait_for_log_cut(self) -> None:
        """Return once no truncation is cutting the log."""
        while self.log_cut is not None:
            await self.log_cut.wait()


async def flush_partitions(flusher: Flusher, partitions: Sequence[HostedPartition]) -> bool:
    """fsync the partitions' logs up to their LEOs; False when any flush failed.

    The calls run concurrently so they share the flusher's fsync rounds (group commit). A failure
    is logged, never raised: the caller keeps the data unacknowledged and retries later.
    """
    failed = False
    alone = len(partitions) == 1

    async def flush_one(hosted: HostedPartition) -> None:
        nonlocal failed
        try:
            await flusher.flush(hosted.log, hosted.log.log_end_offset, alone=alone)
        except (OSError, RuntimeError, KafkaError) as exc:
            failed = True
            log.error("%s-%d: flush failed: %r", hosted.topic, hosted.partition, exc)

    await run_all(flush_one, [(hosted,) for hosted in partitions])
    return not failed
