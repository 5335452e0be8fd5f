"""The scrubber's driver: verify every hosted log at `log_scrub_bytes_per_s`, repair damage.

`ScrubSchedule` (storage/scrubber.py) decides which range comes next and when; this task
reads it in a worker thread (`verify_range`) and acts on what it finds:
- a follower cuts its log before the damaged batch through the follower truncation step
  (the same one a diverging epoch asks for, off the event loop) and fetches it again from
  the leader;
- a leader (or a replica with no role yet) cannot fetch a good copy from anyone: the damaged
  range is marked in the log, whose reads then fail with the retriable KAFKA_STORAGE_ERROR
  instead of serving damaged bytes, and the damage is logged as an ERROR. Once metadata makes
  that replica a follower (another replica leads), the cut and the re-fetch follow.
The verify holds the partition's `disk_lock`, so no truncation, compaction or removal changes
the segment while a worker thread reads it.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from raftlog.replication.core.follower import FollowerState, FollowerStep
from raftlog.replication.hosted import HostedPartition, TopicPartition
from raftlog.storage.scrubber import (
    ScrubRange,
    ScrubResult,
    ScrubSchedule,
    SegmentExtent,
    verify_range,
)
from raftlog.storage.segment import LogSegment

log = logging.getLogger("raftlog.replication.scrub")

# With nothing to verify (no hosted log holds a byte), look again after this long.
SCRUB_IDLE_S = 1.0
# While a damaged replica waits for a follower role (a new leader elsewhere), its role is
# looked at this often even when the pacing says to sleep longer.
REPAIR_CHECK_S = 0.5
# The sorted list of hosted partitions is rebuilt at most this often (and whenever their
# number changes): a node with many small logs takes many short steps.
KEYS_REFRESH_S = 1.0

Truncate = Callable[[HostedPartition, FollowerState, FollowerStep], None]
RunSync = Callable[[Callable[[], ScrubResult]], Awaitable[ScrubResult]]


async def _to_thread(fn: Callable[[], ScrubResult]) -> ScrubResult:
    return await trio.to_thread.run_sync(fn)


class Scrubber:
    def __init__(
        self,
        *,
        partitions: dict[TopicPartition, HostedPartition],
        bytes_per_s: int,
        truncate: Truncate,
        run_sync: RunSync = _to_thread,
    ) -> None:
        self.partitions = partitions
        self.schedule = ScrubSchedule(bytes_per_s=bytes_per_s)
        self.truncate = truncate
        self.run_sync = run_sync
        # Replicas holding damage they could not repair yet (no follower role).
        self.damaged: dict[TopicPartition, HostedPartition] = {}
        self.damage_found = 0  # damaged batches found so far (status, tests)
        self._keys: list[TopicPartition] = []
        self._keys_built_s = -math.inf
        # Per log, the generation and segment object of the last verified step: a cursor
        # inside a segment is a batch boundary only of the bytes it was found in, and a cut
        # (a new generation) or a compaction (a new segment object) may have moved them.
        self._seen: dict[TopicPartition, tuple[int, LogSegment]] = {}

    def _sorted_keys(self) -> list[TopicPartition]:
        now_s = trio.current_time()
        if len(self._keys) != len(self.partitions) or now_s - self._keys_built_s >= KEYS_REFRESH_S:
            self._keys = sorted(self.partitions)
            self._keys_built_s = now_s
        return self._keys

    async def run(self) -> None:
        while True:
            self._repair_pending()
            step = self.schedule.next_step(
                now_s=trio.current_time(), keys=self._sorted_keys(), segments_of=self._segments_of
            )
            if step is None:
                await trio.sleep(REPAIR_CHECK_S if self.damaged else SCRUB_IDLE_S)
            elif isinstance(step, float):
                if self.damaged:
                    step = min(step, trio.current_time() + REPAIR_CHECK_S)
                await trio.sleep_until(step)
            else:
                await self._verify(self.partitions[step.key], step)

    @staticmethod
    def _scrubbable(hosted: HostedPartition) -> bool:
        """Not a log whose damage is known and not yet cut (found again, it would be reported
        again), nor one with a cut on its way."""
        plog = hosted.log
        follower = hosted.replica.follower
        return (
            not plog.closed
            and not plog.offline
            and plog.damaged_range is None
            and not (follower is not None and follower.awaiting_truncation)
        )

    def _segments_of(self, key: TopicPartition) -> list[SegmentExtent]:
        hosted = self.partitions.get(key)
        if hosted is None or not self._scrubbable(hosted):
            return []  # gone since the keys were listed, or not to be read now
        return [SegmentExtent(s.base_offset, s.size_bytes) for s in hosted.log.segments]

    async def _verify(self, hosted: HostedPartition, step: ScrubRange) -> None:
        schedule = self.schedule
        async with hosted.disk_lock:
            plog = hosted.log
            segment = next((s for s in plog.segments if s.base_offset == step.base_offset), None)
            if (
                segment is None
                or plog.closed
                or hosted.log_cut is not None
                or self.partitions.get(hosted.key) is not hosted
                or segment.size_bytes < step.end_position  # cut since the step was planned
            ):
                schedule.on_skipped(now_s=trio.current_time(), step=step)
                return
            generation = plog.generation
            seen = (generation, segment)
            if step.start_position > 0 and self._seen.get(hosted.key) != seen:
                # The cursor came from other bytes: start this segment again.
                self._seen[hosted.key] = seen
                schedule.on_skipped(now_s=trio.current_time(), step=step)
                return
            verify = functools.partial(verify_range, segment, step, allow_gaps=plog.config.compact)
            try:
                result = await self.run_sync(verify)
            except (OSError, ValueError) as exc:
                # A segment deleted or closed meanwhile (retention, removal) reads as an error;
                # anything else is logged and read again on the next pass.
                if not plog.closed and segment in plog.segments:
                    log.error("%s: scrub read failed: %r", segment.log_path, exc)
                schedule.on_skipped(now_s=trio.current_time(), step=step)
                return
            changed = (
                plog.closed
                or plog.generation != generation
                or segment not in plog.segments
                or self.partitions.get(hosted.key) is not hosted
            )
        if changed:
            schedule.on_skipped(now_s=trio.current_time(), step=step)
            return
        self._seen[hosted.key] = seen
        schedule.on_verified(now_s=trio.current_time(), step=step, result=result)
        segment.mark_verified(step.start_position, result.position)
        if result.damage is not None:
            self.damage_found += 1
            log.error(
                "%s-%d: the scrubber found a damaged batch at offset %d (%s): %s",
                hosted.topic,
                hosted.partition,
                result.next_offset,
                segment.log_path.name,
                result.damage,
            )
            self._on_damage(hosted, result.next_offset)

    def report_damage(self, hosted: HostedPartition, offset: int, reason: str) -> None:
        """A read found a damaged batch at `offset` before serving it: the same repair as
        the scrubber's own finding (reads stop short of it, the replica reports itself unsafe
        and, once a follower, fetches it again)."""
        plog = hosted.log
        if plog.damaged_range is not None and plog.damaged_range[0] <= offset:
            return  # known already
        self.damage_found += 1
        log.error(
            "%s-%d: a read found a damaged batch at offset %d: %s",
            hosted.topic,
            hosted.partition,
            offset,
            reason,
        )
        self._on_damage(hosted, offset)

    def _on_damage(self, hosted: HostedPartition, offset: int) -> None:
        plog = hosted.log
        plog.mark_damaged(offset)
        self.damaged[hosted.key] = hosted
        if hosted.replica.follower is not None:
            self._repair_pending()
            return
        assert plog.damaged_range is not None
        log.error(
            "%s-%d: not a follower, so no repair yet: reads of offsets [%d, %d) fail with "
            "KAFKA_STORAGE_ERROR until another replica leads and this one fetches them again",
            hosted.topic,
            hosted.partition,
            *plog.damaged_range,
        )

    def _repair_pending(self) -> None:
        """Cut every damaged replica that is now a follower (its leader has a good copy)."""
        for key, hosted in list(self.damaged.items()):
            plog = hosted.log
            if self.partitions.get(key) is not hosted or plog.closed or plog.damaged_range is None:
                del self.damaged[key]
                continue
            follower = hosted.replica.follower
            # A producer table being rebuilt reads this log in a worker thread; the fetcher
            # waits for it too before it touches the log.
            if follower is None or hosted.log_cut is not None or not hosted.producers.loaded:
                continue
            step = follower.truncation_for_damage(offset=plog.damaged_range[0])
            if step is None:
                continue  # another cut is out; ask again on the next step
            log.warning(
                "%s-%d: truncating to %s to fetch the damaged batches again from broker %d",
                hosted.topic,
                hosted.partition,
                step.truncate_to_offset,
                follower.leader_id,
            )
            del self.damaged[key]
            # The cut removes records this replica acknowledged: it is not a safe leader
            # until it has them back (the fetcher clears this).
            plog.lost_data = True
            self.truncate(hosted, follower, step)

    def status(self) -> dict[str, Any]:
        schedule = self.schedule
        return {
            "bytes_verified": schedule.bytes_verified,
            "passes": schedule.passes,
            "damage_found": self.damage_found,
            "damaged_partitions": sorted(self.damaged),
        }
