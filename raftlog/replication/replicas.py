"""The replicas this broker hosts, and what every replication path shares about them.

ReplicaManager (manager.py) builds one `Replicas` and hands it to each collaborator: the
assignment (metadata -> hosted replicas), the produce path, the read paths and the fetchers'
callbacks. It holds the shared state (hosted partitions, the metadata image, the purgatory,
the HW checkpoint bookkeeping), turns the leader core's effects into I/O (AlterPartition
requests, completed produces, woken fetches, leader flushes) and spawns background work in the
manager's nursery.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode
from raftlog.metadata.controller.messages import AlterPartition, AlterPartitionReply
from raftlog.metadata.image import MetadataImage
from raftlog.metrics.instruments import ReplicationMetrics
from raftlog.net.kafka.backend import LeaderHint
from raftlog.replication.core.leader import LeaderState
from raftlog.replication.core.purgatory import Completion, ProduceCompletion, Purgatory
from raftlog.replication.core.types import (
    NO_LEADER,
    AlterPartitionRequest,
    LeaderAndIsr,
    LeaderEffects,
    PartitionProgress,
    ReplicationSettings,
    ReplicationStateError,
)
from raftlog.replication.hosted import (
    FLUSH_RETRY_BACKOFF_MS,
    HostedPartition,
    TopicPartition,
    flush_partitions,
)
from raftlog.storage import Flusher

log = logging.getLogger("raftlog.replication")

AlterPartitionFn = Callable[[AlterPartition], Awaitable[AlterPartitionReply]]

# Parked produces (acks=all / acks=1 waiting for fsync) across all partitions.
MAX_DELAYED_PRODUCES = 100_000


class PendingProduce:
    """A parked produce: the purgatory completes it, the produce coroutine waits on it."""

    __slots__ = ("error", "event")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.error = ErrorCode.none


class Replicas:
    """Hosted replicas, the image, the purgatory, leader effects and spawning."""

    def __init__(
        self,
        *,
        node_id: int,
        config: NodeConfig,
        settings: ReplicationSettings,
        flusher: Flusher,
        alter_partition: AlterPartitionFn,
        clock_ms: Callable[[], int],
        wall_clock_ms: Callable[[], int],
        metrics: ReplicationMetrics | None = None,
    ) -> None:
        self.node_id = node_id
        self.config = config
        self.settings = settings
        self.flusher = flusher
        self.clock_ms = clock_ms
        # Retention and producer-id expiry compare record timestamps (wall-clock ms, set by
        # producers) with now: they need the wall clock, not the monotonic clock_ms that
        # drives timeouts.
        self.wall_clock_ms = wall_clock_ms
        self._alter_partition = alter_partition
        self.image = MetadataImage.empty()
        # False while `image` does not yet hold this process's own broker registration (a
        # restarted broker replaying the metadata log): the image may be behind, so what it
        # lacks is not known to be missing (see not_leader_error).
        self.registered = True
        self.partitions: dict[TopicPartition, HostedPartition] = {}
        self.purgatory = Purgatory(max_waiters=MAX_DELAYED_PRODUCES)
        # The HWs last written to the checkpoint file (None until it was read).
        self.checkpointed_hws: dict[TopicPartition, int] | None = None
        self.hw_dirty = False
        self._data_events: dict[TopicPartition, trio.Event] = {}
        self._dirty_leaders: set[TopicPartition] = set()
        self._flush_wakeup = trio.Event()
        self._deadline_wakeup = trio.Event()
        # The purgatory deadline the deadline loop sleeps until (it reads the purgatory again
        # each time it wakes, before it sleeps: no await between).
        self._deadline_sleep_until_ms: float = math.inf
        self._nursery: trio.Nursery | None = None
        self._queued: list[tuple[Callable[..., Awaitable[Any]], tuple[Any, ...]]] = []
        # Bytes/records per topic, ISR changes, flush times (None: instruments nobody scrapes).
        self.metrics = metrics if metrics is not None else ReplicationMetrics.detached()

    # ------------------------------------------------------------------ spawning
    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run `fn(*args)` in the manager's nursery (queued until it runs)."""
        if self._nursery is None:
            self._queued.append((fn, args))
        else:
            self._nursery.start_soon(fn, *args)

    def attach(self, nursery: trio.Nursery) -> None:
        """Spawn into `nursery` from now on, starting what was queued before."""
        self._nursery = nursery
        for fn, args in self._queued:
            nursery.start_soon(fn, *args)
        self._queued.clear()

    def detach(self) -> None:
        self._nursery = None

    # ------------------------------------------------------------------ hosting
    def set_image(self, image: MetadataImage) -> None:
        """The metadata image the replicas were last assigned from."""
        self.image = image

    def host(self, hosted: HostedPartition) -> None:
        self.partitions[hosted.key] = hosted

    def unhost(self, hosted: HostedPartition) -> None:
        """Stop hosting the replica: its waiters are answered, its HW is forgotten."""
        key = hosted.key
        del self.partitions[key]
        self.fail_waiters(key)
        hosted.wake_waiters()
        self.signal_data(key)
        self.forget_leader_flush(key)
        self.hw_dirty = True
        if self.checkpointed_hws is not None:
            # A topic re-created under this name must not start from the old one's HW.
            self.checkpointed_hws.pop(key, None)

    def role_changed(self, hosted: HostedPartition) -> None:
        """The replica became leader or follower: parked fetches and consumers look again,
        and the next checkpoint records its HW."""
        hosted.wake_waiters()
        self.signal_data(hosted.key)
        self.hw_dirty = True

    # ------------------------------------------------------------------ the image
    def leader_hint(self, topic: str, partition: int) -> LeaderHint | None:
        info = self.image.topic(topic)
        state = None if info is None else info.partitions.get(partition)
        if state is None or state.leader == NO_LEADER:
            return None
        return LeaderHint(state.leader, state.leader_epoch)

    def not_leader_error(self, topic: str, partition: int) -> ErrorCode:
        info = self.image.topic(topic)
        if (info is None or partition not in info.partitions) and self.registered:
            return ErrorCode.unknown_topic_or_partition
        # Known, or perhaps only not known yet: a restarted broker still replaying the metadata
        # may be about to lead the partition. UNKNOWN_TOPIC_OR_PARTITION then would be wrong;
        # Kafka's broker answers nothing before it has caught up, and NOT_LEADER_OR_FOLLOWER
        # is what clients retry after a metadata refresh.
        return ErrorCode.not_leader_or_follower

    def min_insync_replicas(self, topic: str) -> int:
        return int(
            self.image.topic_config(topic, "min.insync.replicas", self.config.min_insync_replicas)
        )

    # ------------------------------------------------------------------ leader effects
    def handle_effects(self, hosted: HostedPartition, effects: LeaderEffects) -> None:
        leader = hosted.replica.leader
        if leader is None:
            return
        if effects.alter_partition is not None:
            self.spawn(self._send_alter_partition, hosted, leader, effects.alter_partition)
        self.complete(
            self.purgatory.on_progress(
                key=hosted.key, progress=leader.progress(), bytes_between=_no_bytes
            )
        )
        if effects.high_watermark_advanced:
            self.hw_dirty = True
            self.signal_data(hosted.key)
            # Parked follower fetches answer at once so followers learn the new HW.
            hosted.wake_waiters()

    def complete(self, completions: list[Completion]) -> None:
        for completion in completions:
            if isinstance(completion, ProduceCompletion):
                pending: PendingProduce = completion.token
                pending.error = completion.error
                pending.event.set()

    def fail_waiters(self, key: TopicPartition) -> None:
        """Leadership of `key` ended: answer its parked produces NOT_LEADER_OR_FOLLOWER."""
        self.complete(
            self.purgatory.fail_partition(key=key, error=ErrorCode.not_leader_or_follower)
        )

    def after_leader_append(self, hosted: HostedPartition, now_ms: int) -> None:
        """Bookkeeping after a leader append (the produce path calls it, no await)."""
        self.request_leader_flush(hosted.key)
        leader = hosted.replica.leader
        if leader is not None:
            self.handle_effects(hosted, leader.on_local_append(now_ms=now_ms))
        if hosted.producers.rolled():
            self.spawn(hosted.producers.write_snapshot, self.wall_clock_ms())

    async def _send_alter_partition(
        self, hosted: HostedPartition, leader: LeaderState, request: AlterPartitionRequest
    ) -> None:
        registration = self.image.brokers.get(self.node_id)
        message = AlterPartition(
            broker_id=self.node_id,
            broker_epoch=registration.epoch if registration is not None else -1,
            topic_id=hosted.topic_id,
            partition=hosted.partition,
            leader_epoch=request.leader_epoch,
            partition_epoch=request.partition_epoch,
            new_isr=tuple(sorted(request.new_isr)),
        )
        # The replicas the request was made against: by the time the answer comes, newer
        # metadata (a reassignment's completion) may have changed the leader's own.
        replicas = leader.state.replicas
        result: LeaderAndIsr | ErrorCode
        try:
            reply = await self._alter_partition(message)
        except Exception as exc:  # an unreachable controller: retry on a later tick
            log.warning("%s-%d: AlterPartition failed: %r", hosted.topic, hosted.partition, exc)
            result = ErrorCode.request_timed_out
        else:
            if reply.error_code != ErrorCode.none:
                log.info(
                    "%s-%d: AlterPartition %s refused: %s %s",
                    hosted.topic,
                    hosted.partition,
                    sorted(request.new_isr),
                    reply.error_code.name,
                    reply.error_message or "",
                )
                result = reply.error_code
            else:
                try:
                    result = LeaderAndIsr(
                        leader_id=reply.leader,
                        leader_epoch=reply.leader_epoch,
                        partition_epoch=reply.partition_epoch,
                        replicas=replicas,
                        isr=frozenset(reply.isr),
                    )
                except ReplicationStateError as exc:
                    # An answer that does not fit what was asked: wait for the metadata
                    # rather than act on it (and never let it end the node).
                    log.warning("%s-%d: AlterPartition answer ignored: %s", *hosted.key, exc)
                    result = ErrorCode.invalid_update_version
                else:
                    self.metrics.isr_changed(leader.isr, reply.isr)
        # Only the leader state that asked may take the answer (a newer epoch ignores it).
        if self.partitions.get(hosted.key) is hosted and hosted.replica.leader is leader:
            effects = leader.on_alter_partition_result(request=request, result=result)
            self.handle_effects(hosted, effects)

    # ------------------------------------------------------------------ consumer wakeups
    def signal_data(self, key: TopicPartition) -> None:
        event = self._data_events.pop(key, None)
        if event is not None:
            event.set()

    def data_event(self, topic: str, partition: int) -> trio.Event:
        """Set on the next HW advance or leadership change of the partition."""
        key = (topic, partition)
        event = self._data_events.get(key)
        if event is None:
            event = self._data_events[key] = trio.Event()
        return event

    # ------------------------------------------------------------------ leader flushes
    def request_leader_flush(self, key: TopicPartition) -> None:
        self._dirty_leaders.add(key)
        self._flush_wakeup.set()

    def forget_leader_flush(self, key: TopicPartition) -> None:
        self._dirty_leaders.discard(key)

    async def leader_flush_loop(self) -> None:
        """fsync what leaders appended (one group commit per round), then report it."""
        while True:
            await self._flush_wakeup.wait()
            self._flush_wakeup = trio.Event()
            keys, self._dirty_leaders = self._dirty_leaders, set()
            batch = [self.partitions[k] for k in sorted(keys) if k in self.partitions]
            started_s = trio.current_time()
            flushed = await flush_partitions(self.flusher, batch)
            if batch:
                self.metrics.log_flush.observe(trio.current_time() - started_s)
            if not flushed:
                # Nothing is acknowledged past what did reach the disk; try again shortly.
                self._dirty_leaders.update(h.key for h in batch)
                self._flush_wakeup.set()
                await trio.sleep(FLUSH_RETRY_BACKOFF_MS / 1000)
            now_ms = self.clock_ms()
            for hosted in batch:
                leader = hosted.replica.leader
                if leader is not None and self.partitions.get(hosted.key) is hosted:
                    self.handle_effects(hosted, leader.on_flushed(now_ms=now_ms))

    # ------------------------------------------------------------------ purgatory deadlines
    def deadline_wakeup(self) -> None:
        """A waiter was parked: the deadline loop sleeps anew if it now has to wake sooner
        (each produce parks one, almost always with a later deadline than the one the loop
        sleeps until: waking it for those would cost a task step per produce)."""
        next_ms = self.purgatory.next_deadline_ms()
        if next_ms is not None and next_ms < self._deadline_sleep_until_ms:
            self._deadline_wakeup.set()

    async def deadline_loop(self) -> None:
        while True:
            next_ms = self.purgatory.next_deadline_ms()
            self._deadline_sleep_until_ms = math.inf if next_ms is None else next_ms
            timeout_s = math.inf if next_ms is None else max(0, next_ms - self.clock_ms()) / 1000
            with trio.move_on_after(timeout_s):
                await self._deadline_wakeup.wait()
            self._deadline_wakeup = trio.Event()
            self.complete(
                self.purgatory.on_deadline(now_ms=self.clock_ms(), progress_of=self._progress_of)
            )

    def _progress_of(self, key: Any) -> PartitionProgress | None:
        hosted = self.partitions.get(key)
        leader = None if hosted is None else hosted.replica.leader
        return None if leader is None else leader.progress()


def _no_bytes(key: Any, start_offset: int, end_offset: int) -> int:
    # Consumer fetch waits live in the Kafka layer (data_event); the purgatory here only holds
    # produces, so it never asks for byte counts.
    return 0
