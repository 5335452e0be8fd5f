"""ReplicaManager: the composition root of every partition replica this broker hosts.

The sans-IO core (core/) decides; the trio drivers around it do the I/O, in the order the core
expects. This module builds them and runs their background tasks:
- `Replicas` (replicas.py): the hosted replicas, the image, the purgatory, leader effects;
- `ReplicaAssignment` (assignment.py): metadata makes each replica leader or follower with
  the controller's epochs; logs are created and removed by `LogWork` jobs;
- `ProducePath` (produce.py): leader appends, acks through the purgatory;
- `ReadPaths` (serving.py): consumer fetches and list offsets, never past the HW (the LSO
  for read_committed), and the leader side of replica fetches (long-polls woken by LEO/HW
  events);
- `TxnMarkerPath` (txn_markers.py): COMMIT/ABORT markers the transaction coordinator writes;
- `FetcherPool` (fetcher.py): follower fetchers; their truncations run here, off the loop;
- background tasks tick the ISR rules, expire purgatory deadlines, flush leaders, checkpoint
  HWs and run retention/compaction.

The Kafka backend and the internal RPC call `writes`, `reads` and `replicas` directly.
docs/replication.md ("The driver") explains the flows.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from collections.abc import Callable, Sequence

import trio

from raftlog.clock import wall_clock_ms
from raftlog.config import NodeConfig
from raftlog.metadata.image import MetadataDelta, MetadataImage
from raftlog.metrics.instruments import ReplicationMetrics
from raftlog.net.kafka.backend import DeleteRecordsResult
from raftlog.replication.assignment import ReplicaAssignment
from raftlog.replication.core.follower import FollowerAction, FollowerState, FollowerStep
from raftlog.replication.core.types import ReplicationSettings
from raftlog.replication.delete_records import delete_records
from raftlog.replication.fetcher import FetcherPool, FetcherSettings, SendFetch
from raftlog.replication.hosted import HostedPartition, TopicPartition
from raftlog.replication.idempotence import PRODUCER_SNAPSHOT_INTERVAL_MS
from raftlog.replication.log_work import LogWork
from raftlog.replication.produce import ProducePath
from raftlog.replication.replicas import AlterPartitionFn, Replicas
from raftlog.replication.scrub import Scrubber
from raftlog.replication.serving import ReadPaths
from raftlog.replication.txn_markers import MarkerResults, TxnMarkerPath, TxnMarkerRequest
from raftlog.replication.upkeep import PartitionStatus, clean_partitions, partition_status
from raftlog.storage import Flusher, LogManager

log = logging.getLogger("raftlog.replication")

# Kafka's replica.high.watermark.checkpoint.interval.ms.
HIGH_WATERMARK_CHECKPOINT_INTERVAL_MS = 5_000
# Kafka's log.flush.offset.checkpoint.interval.ms: how often each log's recovery point is
# brought up to what was fsynced (recovery's "lost data" test reaches up to it).
RECOVERY_POINT_CHECKPOINT_INTERVAL_MS = 60_000
# Kafka's log.retention.check.interval.ms is 5 minutes; compaction runs on the same beat.
LOG_CLEANUP_INTERVAL_MS = 300_000
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
        metrics: ReplicationMetrics | None = None,
    ) -> None:
        self.config = config
        self.log_manager = log_manager
        self.flusher = flusher
        self.high_watermark_checkpoint_interval_ms = high_watermark_checkpoint_interval_ms
        self.log_cleanup_interval_ms = log_cleanup_interval_ms
        self.producer_snapshot_interval_ms = producer_snapshot_interval_ms
        self.replicas = Replicas(
            node_id=node_id,
            config=config,
            settings=ReplicationSettings(
                replica_lag_time_max_ms=config.replica_lag_time_max_ms,
                flush_policy=config.flush_policy,
                replica_fetch_timeout_ms=(
                    config.replica_fetch_wait_max_ms + REPLICA_FETCH_RPC_SLACK_MS
                ),
                replica_fetch_backoff_ms=REPLICA_FETCH_BACKOFF_MS,
            ),
            flusher=flusher,
            alter_partition=alter_partition,
            clock_ms=clock_ms,
            wall_clock_ms=wall_clock_ms,
            metrics=metrics,
        )
        self.work = LogWork(self.replicas.spawn)
        self.fetchers = FetcherPool(
            FetcherSettings(
                replica_id=node_id,
                max_wait_ms=config.replica_fetch_wait_max_ms,
                backoff_ms=REPLICA_FETCH_BACKOFF_MS,
                rpc_timeout_slack_ms=REPLICA_FETCH_RPC_SLACK_MS,
            ),
            hosted=self.replicas.partitions.get,
            send_fetch=send_fetch,
            flusher=flusher,
            clock_ms=clock_ms,
            on_progress=self._on_follower_progress,
            truncate=self._truncate_follower,
            rebuild_producers=self._rebuild_producers,
            configs=lambda: self.replicas.image.configs,
        )
        # Verifies every hosted log's batches in the background (off when the rate is 0).
        self.scrubber = Scrubber(
            partitions=self.replicas.partitions,
            bytes_per_s=max(1, config.log_scrub_bytes_per_s),
            truncate=self._truncate_follower,
        )
        self.reads = ReadPaths(self.replicas, on_damage=self.scrubber.report_damage)
        self.writes = ProducePath(self.replicas)
        self.markers = TxnMarkerPath(self.replicas)
        # incarnation_id: this process's broker registration (BrokerLifecycle); its unfencing
        # tells the assignment the image is caught up, so stray logs may go.
        self.assignment = ReplicaAssignment(
            self.replicas,
            log_manager=log_manager,
            fetchers=self.fetchers,
            work=self.work,
            reload_producers=self.reload_producers,
            incarnation_id=incarnation_id,
        )

    # ------------------------------------------------------------------ transactions
    async def write_txn_markers(
        self, markers: Sequence[TxnMarkerRequest], timeout_ms: int | None = None
    ) -> list[MarkerResults]:
        """Write each COMMIT/ABORT marker on its partitions as their leader and answer once
        each is committed (acks=all); one ErrorCode per partition (txn_markers.py)."""
        return await self.markers.write_markers(markers, timeout_ms)

    # ------------------------------------------------------------------ DeleteRecords
    async def delete_records(self, topic: str, partition: int, offset: int) -> DeleteRecordsResult:
        """KIP-107 on a partition this broker leads (delete_records.py)."""
        return await delete_records(self.replicas, topic, partition, offset)

    # ------------------------------------------------------------------ lifecycle
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Background tasks until cancelled: fetchers, ticks, flushes, checkpoints, cleanup."""
        replicas = self.replicas
        if replicas.checkpointed_hws is None:
            replicas.checkpointed_hws = await trio.to_thread.run_sync(
                self.log_manager.read_high_watermarks
            )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._isr_tick_loop)
            nursery.start_soon(replicas.deadline_loop)
            nursery.start_soon(replicas.leader_flush_loop)
            nursery.start_soon(self._checkpoint_loop)
            nursery.start_soon(self._cleanup_loop)
            nursery.start_soon(self._producer_snapshot_loop)
            if self.config.log_scrub_bytes_per_s > 0:
                nursery.start_soon(self.scrubber.run)
            self.fetchers.start(nursery)
            replicas.attach(nursery)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                replicas.detach()

    async def shutdown(self) -> None:
        """Controlled shutdown: stop fetching, fail parked requests, final flush, HW checkpoint.

        Call before cancelling run(); the node closes the LogManager afterwards.
        """
        self.fetchers.stop()
        partitions = self.replicas.partitions
        for key in list(partitions):
            self.replicas.fail_waiters(key)
        logs = [h.log for h in partitions.values() if not h.log.closed]

        def flush_all() -> None:
            for partition_log in logs:
                # An offline log's disk failed: it is closed without a flush (LogManager).
                if not partition_log.closed and not partition_log.offline:
                    partition_log.flush_now()

        # Straight to disk in one worker call: the flusher may already be stopping.
        await trio.to_thread.run_sync(flush_all)
        await self.checkpoint_high_watermarks()
        # A restart then replays no batch headers (the snapshots sit at the log ends).
        now_ms = self.replicas.wall_clock_ms()
        for hosted in list(partitions.values()):
            await hosted.producers.write_snapshot(now_ms)

    # ------------------------------------------------------------------ metadata
    def apply_metadata(self, image: MetadataImage, delta: MetadataDelta) -> None:
        """Become leader/follower of assigned partitions, drop unassigned or deleted ones.

        Never blocks on the disk: logs are created and removed by background jobs
        (assignment.py); wait_log_work() waits for them.
        """
        self.assignment.apply(image, delta)

    async def wait_log_work(self) -> None:
        """Return once every log creation, config write, truncation and removal asked for so
        far is done."""
        await self.work.wait_idle()

    # ------------------------------------------------------------------ followers
    def _on_follower_progress(self, hosted: HostedPartition) -> None:
        self.replicas.hw_dirty = True
        if hosted.producers.rolled():
            self.replicas.spawn(hosted.producers.write_snapshot, self.replicas.wall_clock_ms())

    def _rebuild_producers(self, hosted: HostedPartition) -> None:
        # The fetcher leaves the partition alone until the table matches the log again.
        if hosted.producers.invalidate():
            self.replicas.spawn(self.reload_producers, hosted)

    async def reload_producers(self, hosted: HostedPartition) -> None:
        await hosted.producers.reload(self.replicas.wall_clock_ms())
        if hosted.producers.loaded:
            self.fetchers.wake(hosted.key)  # it skipped the partition while loading

    def _truncate_follower(
        self, hosted: HostedPartition, follower: FollowerState, step: FollowerStep
    ) -> None:
        """Cut the follower's log as `step` asks, in a worker thread, then rebuild its table.

        Invalidating the producer table first is what holds the log still: the fetchers skip
        the partition and cleanup skips it. A role change waits until a running cut is done
        (ReplicaAssignment defers it while `log_cut` is set) and drops a cut still waiting for
        its locks (`cut_wait`), so the cut only ever runs on a follower's log and no leader
        reads a half-cut one. The fetch that asked for the cut was sent while the table was
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
        replicas = self.replicas

        async def truncate() -> None:
            waiting = hosted.cut_wait = trio.CancelScope()
            try:
                async with contextlib.AsyncExitStack() as locks:
                    # A snapshot write or a compaction in the directory finishes first, unless
                    # the role changes meanwhile (drop_queued_cut).
                    with waiting:
                        if hosted.replica.follower is not follower:
                            waiting.cancel()  # the role changed while the job was queued
                        await locks.enter_async_context(hosted.producers.lock)
                        await locks.enter_async_context(hosted.disk_lock)
                    hosted.cut_wait = None
                    # Removed meanwhile: its directory is going. A new role meanwhile (another
                    # epoch's follower, or the leader): the cut was computed for a follower
                    # state that no longer exists, and a leader's log is never cut; the new
                    # follower finds any divergence again on its first fetch.
                    if (
                        not waiting.cancelled_caught
                        and not plog.closed
                        and hosted.replica.follower is follower
                    ):
                        await hosted.cut_log(functools.partial(self.work.run_sync, cut))
            finally:
                if hosted.cut_wait is waiting:
                    hosted.cut_wait = None
                # Even after an unexpected failure: the follower and the table must not wait
                # for a cut that will never be reported.
                if hosted.replica.follower is follower:
                    follower.on_truncated(now_ms=replicas.clock_ms())
                if must_reload:
                    replicas.spawn(self.reload_producers, hosted)

        self.work.submit(hosted.key, "truncating the log", truncate)

    # ------------------------------------------------------------------ background tasks
    async def _isr_tick_loop(self) -> None:
        interval_ms = max(MIN_ISR_TICK_MS, self.config.replica_lag_time_max_ms // 2)
        replicas = self.replicas
        while True:
            await trio.sleep(interval_ms / 1000)
            now_ms = replicas.clock_ms()
            for hosted in list(replicas.partitions.values()):
                leader = hosted.replica.leader
                # A leader whose disk failed cannot judge its followers (it serves them
                # nothing): it must not shrink the ISR to itself.
                if leader is not None and not hosted.log.offline:
                    replicas.handle_effects(hosted, leader.on_tick(now_ms=now_ms))

    async def checkpoint_high_watermarks(self) -> None:
        """Write every hosted replica's HW to the checkpoint file (worker thread)."""
        replicas = self.replicas
        replicas.hw_dirty = False
        hws = {k: h.replica.high_watermark for k, h in replicas.partitions.items()}
        await trio.to_thread.run_sync(self.log_manager.write_high_watermarks, hws)
        replicas.checkpointed_hws = {**(replicas.checkpointed_hws or {}), **hws}

    def checkpoint_recovery_points(self) -> None:
        """Ask the flusher to persist every hosted log's recovery point at what it fsynced."""
        due = [h.log.checkpoint_recovery_point_soon() for h in self.replicas.partitions.values()]
        if any(due):
            self.flusher.wake()

    async def _checkpoint_loop(self) -> None:
        next_recovery_points_s = trio.current_time() + RECOVERY_POINT_CHECKPOINT_INTERVAL_MS / 1000
        while True:
            await trio.sleep(self.high_watermark_checkpoint_interval_ms / 1000)
            if trio.current_time() >= next_recovery_points_s:
                next_recovery_points_s = (
                    trio.current_time() + RECOVERY_POINT_CHECKPOINT_INTERVAL_MS / 1000
                )
                self.checkpoint_recovery_points()
            if self.replicas.hw_dirty:
                try:
                    await self.checkpoint_high_watermarks()
                except OSError as exc:
                    # A full or failing disk: a stale HW checkpoint only makes a restarted
                    # replica start lower; try again on the next beat.
                    self.replicas.hw_dirty = True
                    log.error("high-watermark checkpoint failed: %r", exc)

    async def _producer_snapshot_loop(self) -> None:
        while True:
            await trio.sleep(self.producer_snapshot_interval_ms / 1000)
            for hosted in list(self.replicas.partitions.values()):
                await hosted.producers.write_snapshot(self.replicas.wall_clock_ms())

    async def _cleanup_loop(self) -> None:
        while True:
            await trio.sleep(self.log_cleanup_interval_ms / 1000)
            try:
                await self.run_log_cleanup()
            except OSError as exc:
                # Compaction writes new segments: a full disk stops this round, not the node.
                log.error("log cleanup failed: %r", exc)

    async def run_log_cleanup(self) -> None:
        """Retention and compaction of every hosted log, never past its HW."""
        partitions = list(self.replicas.partitions.values())
        await clean_partitions(partitions, self.replicas.wall_clock_ms)
        self.flusher.wake()  # checkpoints (log start, recovery point) are now due

    # ------------------------------------------------------------------ status
    def unsafe_partitions(self) -> tuple[tuple[uuid.UUID, int], ...]:
        """Hosted replicas that must not lead nor count as in sync (KIP-966): they lost
        records they may have acknowledged, hold a damaged batch, or their disk failed. The
        broker reports them in every heartbeat; the controller keeps them out of ISRs and
        elections until they stop appearing here."""
        return tuple(
            sorted(
                (h.topic_id, h.partition)
                for h in self.replicas.partitions.values()
                if h.log.unsafe_to_lead
            )
        )

    def partition_states(self) -> dict[TopicPartition, PartitionStatus]:
        """Leader, epochs, ISR, HW and offsets of every hosted replica (status, describe)."""
        partitions = self.replicas.partitions
        return {key: partition_status(h) for key, h in sorted(partitions.items())}
