"""ReplicaManager: the trio driver of every partition replica this broker hosts.

The sans-IO core (partition.py, leader.py, follower.py, purgatory.py) decides; this module
does the I/O around it, in the order the core expects:
- metadata (apply_metadata) makes each replica leader or follower with the controller's
  epochs; stale states are refused by the core, deleted topics lose their data;
- produce appends through the leader, asks the leader-flush task for an fsync (group commit in
  the Flusher) and parks in the purgatory until acks are met or the deadline passes;
- follower fetchers (fetcher.py) pull from leaders; the leader side (serving.py) answers them
  with long-polls woken by LEO/HW events, and serves consumers never past the HW;
- background tasks tick the ISR rules, expire purgatory deadlines, checkpoint HWs and run
  retention/compaction; ISR changes go to the controller through alter_partition, one in
  flight per partition (LeaderState keeps that rule), and their answers are fed back.

docs/replication.md ("The driver") explains the flows.
"""

from __future__ import annotations

import functools
import logging
import math
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from raftlog.clock import wall_clock_ms
from raftlog.config import NodeConfig
from raftlog.constants import NO_LEADER
from raftlog.errors import ErrorCode, KafkaError
from raftlog.metadata.controller.messages import AlterPartition, AlterPartitionReply
from raftlog.metadata.image import MetadataDelta, MetadataImage
from raftlog.net.kafka.backend import (
    EpochEndOffset,
    FetchResult,
    IsolationLevel,
    LeaderHint,
    ListOffsetsResult,
    ProduceResult,
)
from raftlog.replication.assignment import ReplicaAssignment
from raftlog.replication.core.follower import FollowerAction, FollowerState, FollowerStep
from raftlog.replication.core.leader import LeaderState
from raftlog.replication.core.purgatory import Completion, ProduceCompletion, Purgatory
from raftlog.replication.core.types import (
    AlterPartitionRequest,
    LeaderAndIsr,
    LeaderEffects,
    ReplicationSettings,
)
from raftlog.replication.fetcher import FetcherPool, FetcherSettings, SendFetch
from raftlog.replication.hosted import (
    FLUSH_RETRY_BACKOFF_MS,
    HostedPartition,
    TopicPartition,
    flush_partitions,
)
from raftlog.replication.idempotence import PRODUCER_SNAPSHOT_INTERVAL_MS
from raftlog.replication.produce import Pending
from raftlog.replication.produce import produce as produce_as_leader
from raftlog.replication.serving import ReadPaths
from raftlog.replication.upkeep import PartitionStatus, clean_partitions, partition_status
from raftlog.storage import Flusher, LogManager

log = logging.getLogger("raftlog.replication")

AlterPartitionFn = Callable[[AlterPartition], Awaitable[AlterPartitionReply]]


# Kafka's replica.high.watermark.checkpoint.interval.ms.
HIGH_WATERMARK_CHECKPOINT_INTERVAL_MS = 5_000
# Kafka's log.retention.check.interval.ms is 5 minutes; compaction runs on the same beat.
LOG_CLEANUP_INTERVAL_MS = 300_000
# Parked produces (acks=all / acks=1 waiting for fsync) across all partitions.
MAX_DELAYED_PRODUCES = 100_000
# A follower waits this long after a failed fetch round before the next one.
REPLICA_FETCH_BACKOFF_MS = 100
# A replica fetch answer later than replica_fetch_wait_max_ms + this is treated as lost.
REPLICA_FETCH_RPC_SLACK_MS = 5_000
# The ISR check runs every replica_lag_time_max_ms / 2 (Kafka's rule), at most this often.
MIN_ISR_TICK_MS = 10


class ReplicaManager:
    def __init__(
        self,
        node_id: int,
        config: NodeConfig,
        log_manager: LogManager,
        flusher: Flusher,
        *,
        alter_partition: AlterPartitionFn,
        send_fetch: SendFetch,
        clock_ms: Callable[[], int],
        high_watermark_checkpoint_interval_ms: int = HIGH_WATERMARK_CHECKPOINT_INTERVAL_MS,
        log_cleanup_interval_ms: int = LOG_CLEANUP_INTERVAL_MS,
        producer_snapshot_interval_ms: int = PRODUCER_SNAPSHOT_INTERVAL_MS,
        wall_clock_ms: Callable[[], int] = wall_clock_ms,
        incarnation_id: uuid.UUID | None = None,
    ) -> None:
        self.node_id = node_id
        self.config = config
        self.log_manager = log_manager
        self.flusher = flusher
        self.clock_ms = clock_ms
        self._alter_partition = alter_partition
        self.high_watermark_checkpoint_interval_ms = high_watermark_checkpoint_interval_ms
        self.log_cleanup_interval_ms = log_cleanup_interval_ms
        # Retention and producer-id expiry compare record timestamps (wall-clock ms, set by
        # producers) with now: they need the wall clock, not the monotonic clock_ms that
        # drives timeouts.
        self.wall_clock_ms = wall_clock_ms
        self.producer_snapshot_interval_ms = producer_snapshot_interval_ms
        self.settings = ReplicationSettings(
            replica_lag_time_max_ms=config.replica_lag_time_max_ms,
            flush_policy=config.flush_policy,
            replica_fetch_timeout_ms=config.replica_fetch_wait_max_ms + REPLICA_FETCH_RPC_SLACK_MS,
            replica_fetch_backoff_ms=REPLICA_FETCH_BACKOFF_MS,
        )
        self.image = MetadataImage.empty()
        self.partitions: dict[TopicPartition, HostedPartition] = {}
        self.purgatory = Purgatory(max_waiters=MAX_DELAYED_PRODUCES)
        self._data_events: dict[TopicPartition, trio.Event] = {}
        self.checkpointed_hws: dict[TopicPartition, int] | None = None
        self.hw_dirty = False
        self._dirty_leaders: set[TopicPartition] = set()
        self._flush_wakeup = trio.Event()
        self._deadline_wakeup = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._queued: list[tuple[Callable[..., Awaitable[Any]], tuple[Any, ...]]] = []
        self.fetchers = FetcherPool(
            FetcherSettings(
                replica_id=node_id,
                max_wait_ms=config.replica_fetch_wait_max_ms,
                backoff_ms=REPLICA_FETCH_BACKOFF_MS,
                rpc_timeout_slack_ms=REPLICA_FETCH_RPC_SLACK_MS,
            ),
            hosted=self.partitions.get,
            send_fetch=send_fetch,
            flusher=flusher,
            clock_ms=clock_ms,
            on_progress=self._on_follower_progress,
            truncate=self._truncate_follower,
            rebuild_producers=self._rebuild_producers,
        )
        self.reads = ReadPaths(self)
        # incarnation_id: this process's broker registration (BrokerLifecycle); its unfencing
        # tells the assignment the image is caught up, so stray logs may go.
        self.assignment = ReplicaAssignment(self, incarnation_id)

    # ------------------------------------------------------------------ lifecycle
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Background tasks until cancelled: fetchers, ticks, flushes, checkpoints, cleanup."""
        if self.checkpointed_hws is None:
            self.checkpointed_hws = await trio.to_thread.run_sync(
                self.log_manager.read_high_watermarks
            )
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._isr_tick_loop)
            nursery.start_soon(self._deadline_loop)
            nursery.start_soon(self._leader_flush_loop)
            nursery.start_soon(self._checkpoint_loop)
            nursery.start_soon(self._cleanup_loop)
            nursery.start_soon(self._producer_snapshot_loop)
            self.fetchers.start(nursery)
            for fn, args in self._queued:
                nursery.start_soon(fn, *args)
            self._queued.clear()
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        if self._nursery is None:
            self._queued.append((fn, args))
        else:
            self._nursery.start_soon(fn, *args)

    async def shutdown(self) -> None:
        """Controlled shutdown: stop fetching, fail parked requests, final flush, HW checkpoint.

        Call before cancelling run(); the node closes the LogManager afterwards.
        """
        self.fetchers.stop()
        for key in list(self.partitions):
            self.complete(self.purgatory.fail_partition(key, ErrorCode.not_leader_or_follower))
        logs = [h.log for h in self.partitions.values() if not h.log.closed]

        def flush_all() -> None:
            for partition_log in logs:
                if not partition_log.closed:
                    partition_log.flush_now()

        # Straight to disk in one worker call: the flusher may already be stopping.
        await trio.to_thread.run_sync(flush_all)
        await self.checkpoint_high_watermarks()
        # A restart then replays no batch headers (the snapshots sit at the log ends).
        now_ms = self.wall_clock_ms()
        for hosted in list(self.partitions.values()):
            await hosted.producers.write_snapshot(now_ms)

    # ------------------------------------------------------------------ metadata
    def apply_metadata(self, image: MetadataImage, delta: MetadataDelta) -> None:
        """Become leader/follower of assigned partitions, drop unassigned or deleted ones.

        Never blocks on the disk: logs are created and removed by background jobs
        (assignment.py); wait_log_work() waits for them.
        """
        self.assignment.apply(image, delta)

    async def wait_log_work(self) -> None:
        """Return once every log creation, config write and removal asked for so far is done."""
        await self.assignment.work.wait_idle()

    # ------------------------------------------------------------------ leader effects
    def handle_effects(self, hosted: HostedPartition, effects: LeaderEffects) -> None:
        leader = hosted.replica.leader
        if leader is None:
            return
        if effects.alter_partition is not None:
            self.spawn(self._send_alter_partition, hosted, leader, effects.alter_partition)
        self.complete(self.purgatory.on_progress(hosted.key, leader.progress(), _no_bytes))
        if effects.high_watermark_advanced:
            self.hw_dirty = True
            self.signal_data(hosted.key)
            # Parked follower fetches answer at once so followers learn the new HW.
            hosted.wake_waiters()

    def complete(self, completions: list[Completion]) -> None:
        for completion in completions:
            if isinstance(completion, ProduceCompletion):
                pending: Pending = completion.token
                pending.error = completion.error
                pending.event.set()

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
                result = LeaderAndIsr(
                    leader_id=reply.leader,
                    leader_epoch=reply.leader_epoch,
                    partition_epoch=reply.partition_epoch,
                    replicas=leader.state.replicas,
                    isr=frozenset(reply.isr),
                )
        # Only the leader state that asked may take the answer (a newer epoch ignores it).
        if self.partitions.get(hosted.key) is hosted and hosted.replica.leader is leader:
            self.handle_effects(
                hosted, leader.on_alter_partition_result(request=request, result=result)
            )

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

    def _on_follower_progress(self, hosted: HostedPartition) -> None:
        self.hw_dirty = True
        if hosted.producers.rolled():
            self.spawn(hosted.producers.write_snapshot, self.wall_clock_ms())

    def _rebuild_producers(self, hosted: HostedPartition) -> None:
        # The fetcher leaves the partition alone until the table matches the log again.
        if hosted.producers.invalidate():
            self.spawn(self.reload_producers, hosted)

    def _truncate_follower(
        self, hosted: HostedPartition, follower: FollowerState, step: FollowerStep
    ) -> None:
        """Cut the follower's log as `step` asks, in a worker thread, then rebuild its table.

        Invalidating the producer table first is what holds the log still: leader produces
        wait for it, the fetchers skip the partition and cleanup skips it, whatever role the
        replica takes meanwhile. The fetch that asked for the cut was sent while the table was
        loaded and only this path invalidates a followed replica's table, so no reload is
        running: the one spawned after the cut reads the cut log.
        """
        reset = step.action is FollowerAction.RESET
        plog = hosted.log
        if reset:
            assert step.reset_to_offset is not None
            cut = functools.partial(plog.truncate_fully_and_start_at, step.reset_to_offset)
        else:
            assert step.truncate_to_offset is not None
            cut = functools.partial(plog.truncate_to, step.truncate_to_offset)
        must_reload = hosted.producers.invalidate(reset=reset, truncated=not reset)
        work = self.assignment.work

        async def truncate() -> None:
            # A snapshot write or a compaction in the directory finishes first.
            async with hosted.producers.lock, hosted.disk_lock:
                if not plog.closed:  # removed meanwhile: its directory is going
                    try:
                        await work.run_sync(cut)
                    except (OSError, KafkaError) as exc:
                        log.error("%s-%d: truncation failed: %r", *hosted.key, exc)
            if hosted.replica.follower is follower:
                follower.on_truncated(now_ms=self.clock_ms())
            if must_reload:
                self.spawn(self.reload_producers, hosted)

        work.submit(hosted.key, "truncating the log", truncate)

    async def reload_producers(self, hosted: HostedPartition) -> None:
        await hosted.producers.reload(self.wall_clock_ms())
        if hosted.producers.loaded:
            self.fetchers.wake(hosted.key)  # it skipped the partition while loading

    def after_leader_append(self, hosted: HostedPartition, now_ms: int) -> None:
        """Bookkeeping after a leader append (the produce path calls it, no await)."""
        self.request_leader_flush(hosted.key)
        leader = hosted.replica.leader
        if leader is not None:
            self.handle_effects(hosted, leader.on_local_append(now_ms=now_ms))
        if hosted.producers.rolled():
            self.spawn(hosted.producers.write_snapshot, self.wall_clock_ms())

    def deadline_wakeup(self) -> None:
        self._deadline_wakeup.set()

    # ------------------------------------------------------------------ produce
    def leader_hint(self, topic: str, partition: int) -> LeaderHint | None:
        info = self.image.topic(topic)
        state = None if info is None else info.partitions.get(partition)
        if state is None or state.leader == NO_LEADER:
            return None
        return LeaderHint(state.leader, state.leader_epoch)

    def not_leader_error(self, topic: str, partition: int) -> ErrorCode:
        info = self.image.topic(topic)
        if info is None or partition not in info.partitions:
            return ErrorCode.unknown_topic_or_partition
        return ErrorCode.not_leader_or_follower

    def min_insync_replicas(self, topic: str) -> int:
        return int(
            self.image.topic_config(topic, "min.insync.replicas", self.config.min_insync_replicas)
        )

    async def produce(
        self,
        topic: str,
        partition: int,
        records: bytes,
        acks: int,
        timeout_ms: int,
        producer: object = None,
    ) -> ProduceResult:
        """Append as leader and answer when `acks` is met (see produce.py)."""
        return await produce_as_leader(self, topic, partition, records, acks, timeout_ms)

    def request_leader_flush(self, key: TopicPartition) -> None:
        self._dirty_leaders.add(key)
        self._flush_wakeup.set()

    def forget_leader_flush(self, key: TopicPartition) -> None:
        self._dirty_leaders.discard(key)

    # ------------------------------------------------------------------ read paths (serving.py)
    async def fetch(
        self,
        topic: str,
        partition: int,
        fetch_offset: int,
        max_bytes: int,
        current_leader_epoch: int,
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> FetchResult:
        """Consumer fetch: FileRegions of whole batches, never past the HW."""
        return await self.reads.fetch(
            topic, partition, fetch_offset, max_bytes, current_leader_epoch, isolation
        )

    async def list_offset(
        self,
        topic: str,
        partition: int,
        timestamp_ms: int,
        current_leader_epoch: int,
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> ListOffsetsResult:
        return await self.reads.list_offset(
            topic, partition, timestamp_ms, current_leader_epoch, isolation
        )

    async def offset_for_leader_epoch(
        self, topic: str, partition: int, current_leader_epoch: int, leader_epoch: int
    ) -> EpochEndOffset:
        return await self.reads.offset_for_leader_epoch(
            topic, partition, current_leader_epoch, leader_epoch
        )

    async def handle_replica_fetch(self, body: dict) -> dict:
        """RPC method "replica.fetch": the leader side of follower fetches (long-poll)."""
        return await self.reads.handle_replica_fetch(body)

    # ------------------------------------------------------------------ background tasks
    async def _leader_flush_loop(self) -> None:
        """fsync what leaders appended (one group commit per round), then report it."""
        while True:
            await self._flush_wakeup.wait()
            self._flush_wakeup = trio.Event()
            keys, self._dirty_leaders = self._dirty_leaders, set()
            batch = [self.partitions[k] for k in sorted(keys) if k in self.partitions]
            if not await flush_partitions(self.flusher, batch):
                # Nothing is acknowledged past what did reach the disk; try again shortly.
                self._dirty_leaders.update(h.key for h in batch)
                self._flush_wakeup.set()
                await trio.sleep(FLUSH_RETRY_BACKOFF_MS / 1000)
            now_ms = self.clock_ms()
            for hosted in batch:
                leader = hosted.replica.leader
                if leader is not None and self.partitions.get(hosted.key) is hosted:
                    self.handle_effects(hosted, leader.on_flushed(now_ms=now_ms))

    async def _isr_tick_loop(self) -> None:
        interval_ms = max(MIN_ISR_TICK_MS, self.config.replica_lag_time_max_ms // 2)
        while True:
            await trio.sleep(interval_ms / 1000)
            now_ms = self.clock_ms()
            for hosted in list(self.partitions.values()):
                leader = hosted.replica.leader
                if leader is not None:
                    self.handle_effects(hosted, leader.on_tick(now_ms=now_ms))

    async def _deadline_loop(self) -> None:
        while True:
            next_ms = self.purgatory.next_deadline_ms()
            timeout_s = math.inf if next_ms is None else max(0, next_ms - self.clock_ms()) / 1000
            with trio.move_on_after(timeout_s):
                await self._deadline_wakeup.wait()
            self._deadline_wakeup = trio.Event()
            self.complete(self.purgatory.on_deadline(self.clock_ms(), self._progress_of))

    def _progress_of(self, key: Any) -> Any:
        hosted = self.partitions.get(key)
        leader = None if hosted is None else hosted.replica.leader
        return None if leader is None else leader.progress()

    async def checkpoint_high_watermarks(self) -> None:
        """Write every hosted replica's HW to the checkpoint file (worker thread)."""
        self.hw_dirty = False
        hws = {k: h.replica.high_watermark for k, h in self.partitions.items()}
        await trio.to_thread.run_sync(self.log_manager.write_high_watermarks, hws)
        self.checkpointed_hws = {**(self.checkpointed_hws or {}), **hws}

    async def _checkpoint_loop(self) -> None:
        while True:
            await trio.sleep(self.high_watermark_checkpoint_interval_ms / 1000)
            if self.hw_dirty:
                await self.checkpoint_high_watermarks()

    async def _producer_snapshot_loop(self) -> None:
        while True:
            await trio.sleep(self.producer_snapshot_interval_ms / 1000)
            for hosted in list(self.partitions.values()):
                await hosted.producers.write_snapshot(self.wall_clock_ms())

    async def _cleanup_loop(self) -> None:
        while True:
            await trio.sleep(self.log_cleanup_interval_ms / 1000)
            await self.run_log_cleanup()

    async def run_log_cleanup(self) -> None:
        """Retention and compaction of every hosted log, never past its HW."""
        await clean_partitions(list(self.partitions.values()), self.wall_clock_ms)
        self.flusher.wake()  # checkpoints (log start, recovery point) are now due

    # ------------------------------------------------------------------ status
    def partition_states(self) -> dict[TopicPartition, PartitionStatus]:
        """Leader, epochs, ISR, HW and offsets of every hosted replica (status, describe)."""
        return {key: partition_status(h) for key, h in sorted(self.partitions.items())}


def _no_bytes(key: Any, start_offset: int, end_offset: int) -> int:
    # Consumer fetch waits live in the Kafka layer (data_event); the purgatory here only holds
    # produces, so it never asks for byte counts.
    return 0
