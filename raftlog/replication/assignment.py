"""Metadata to hosted replicas: which partitions this broker hosts, and their logs on disk.

`apply` runs on the event loop for every metadata change and stays
cheap: it decides, and log_work.py does the disk work in worker threads.

- A partition whose log is open (recovered at start, or hosted already) is hosted at once; its
  config file is rewritten in the background.
- A partition without a log gets one from a background job: directory, config and topic id
  made durable first, then the replica is hosted and given the *current* image's state (the
  metadata may have moved on while the directory was made). Until then it is not hosted, so
  clients get a retriable NOT_LEADER_OR_FOLLOWER, never a log that a crash could take away.
- A removed replica is dropped at once (fetchers, purgatory, waiters); its log is abandoned
  and its directory renamed to `...-delete` in the background, then deleted.
- Stray logs: once the controller has unfenced this broker incarnation (it does so only when
  our metadata offset has reached its committed offset), every open log the image does not
  assign to this broker is renamed to `...-stray` and deleted. Never earlier: an image still
  catching up would call live data stray. For the same reason an open log whose stored topic
  id differs from the image's topic of that name is left alone (and the partition unhosted)
  until then; the check removes it and the partition gets a new log.

Disk jobs for one partition run in order (log_work.py), so create, delete and re-create of one
topic name never race.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from raftlog.config_keys import log_overrides
from raftlog.constants import METADATA_TOPIC
from raftlog.metadata.image import MetadataDelta, MetadataImage
from raftlog.metadata.image import PartitionState as ImagePartitionState
from raftlog.replication.core.partition import Partition, Transition
from raftlog.replication.core.types import LeaderAndIsr, ReplicationStateError
from raftlog.replication.fetcher import FetcherPool
from raftlog.replication.hosted import HostedPartition, TopicPartition
from raftlog.replication.idempotence import ProducerStateHolder
from raftlog.replication.log_work import LogWork
from raftlog.replication.replicas import Replicas
from raftlog.storage import LogManager, PartitionLog
from raftlog.storage.log_dirs import (
    DELETE_SUFFIX,
    STRAY_SUFFIX,
    remove_directory,
    rename_for_removal,
    write_topic_id,
)

log = logging.getLogger("raftlog.replication")


def stray_reason(
    image: MetadataImage, node_id: int, key: TopicPartition, stored_topic_id: uuid.UUID | None
) -> str | None:
    """Why a log on disk is stray under `image` (a caught-up one), or None if it is assigned."""
    topic, index = key
    info = image.topic(topic)
    if info is None:
        return "its topic is not in the metadata"
    if stored_topic_id is not None and stored_topic_id != info.topic_id:
        return f"it belongs to an earlier topic of that name (id {stored_topic_id})"
    state = info.partitions.get(index)
    if state is None:
        return "its topic has no such partition"
    if node_id not in state.replicas:
        return f"this broker is not one of its replicas {list(state.replicas)}"
    return None


class ReplicaAssignment:
    """Applies metadata to the hosted replicas and their logs."""

    def __init__(
        self,
        replicas: Replicas,
        *,
        log_manager: LogManager,
        fetchers: FetcherPool,
        work: LogWork,
        reload_producers: Callable[[HostedPartition], Awaitable[None]],
        incarnation_id: uuid.UUID | None,
    ) -> None:
        self.replicas = replicas
        self.log_manager = log_manager
        self.fetchers = fetchers
        # Disk jobs, in order per partition (shared with the fetchers' truncations).
        self.work = work
        self._reload_producers = reload_producers
        # This process's broker registration: its unfencing is the "caught up" signal for the
        # stray-log check. None (tools, some tests): stray logs are never looked for.
        self.incarnation_id = incarnation_id
        # Partitions whose log a queued job is creating, with the topic id it is created for.
        self._creating: dict[TopicPartition, uuid.UUID] = {}
        # Open logs whose stored topic id differs from the image's, left alone until the
        # stray check (which runs on a caught-up image) decides which one is old.
        self._held: set[TopicPartition] = set()
        # Replicas whose metadata waits for a truncation cutting their log (see _apply_state).
        self._after_cut: set[TopicPartition] = set()
        # Replicas the image names this broker leader of while it does not hold this process's
        # registration yet (see _apply_state); applied once it does.
        self._before_registration: set[TopicPartition] = set()
        self.strays_checked = False

    # ------------------------------------------------------------------ apply
    def apply(self, image: MetadataImage, delta: MetadataDelta) -> None:
        replicas = self.replicas
        replicas.set_image(image)
        was_registered = replicas.registered
        replicas.registered = self._holds_own_registration(image)
        if replicas.checkpointed_hws is None:
            # Called before run(): a small file, read once.
            replicas.checkpointed_hws = self.log_manager.read_high_watermarks()
        changes = delta.local_changes(replicas.node_id)
        for topic_id, index in sorted(changes.deleted, key=lambda k: (k[0].int, k[1])):
            self._remove_replica(topic_id, index)
        assigned = {**changes.leaders, **changes.followers}
        for (topic_id, index), state in sorted(
            assigned.items(), key=lambda i: (i[0][0].int, i[0][1])
        ):
            topic = image.topics_by_id[topic_id]
            try:
                self._assign(topic.name, index, topic_id, state)
            except ReplicationStateError:
                # A state the core calls impossible: keep serving the other partitions and say
                # exactly what was refused (the message carries both states).
                log.exception("%s-%d: metadata not applied", topic.name, index)
        if replicas.registered and not was_registered:
            self._apply_held_leaderships(image)
        for resource_type, name in delta.changed_configs:
            if resource_type == "topic":
                self._update_topic_config(name)
        self._maybe_remove_strays(image)

    def _holds_own_registration(self, image: MetadataImage) -> bool:
        """`image` holds this process's broker registration (always, without an incarnation)."""
        if self.incarnation_id is None:
            return True
        registration = image.brokers.get(self.replicas.node_id)
        return registration is not None and registration.incarnation_id == self.incarnation_id

    def _apply_held_leaderships(self, image: MetadataImage) -> None:
        """Our registration arrived: apply the states held back for want of it (it usually
        moved those leaderships already, and the states came with it)."""
        held, self._before_registration = self._before_registration, set()
        for key in sorted(held):
            hosted = self.replicas.partitions.get(key)
            info = image.topic(key[0])
            state = None if info is None else info.partitions.get(key[1])
            if hosted is None or info is None or state is None or hosted.topic_id != info.topic_id:
                continue
            if self.replicas.node_id not in state.replicas:
                continue  # a removal is on its way
            try:
                self._apply_state(hosted, state)
            except ReplicationStateError:
                log.exception("%s-%d: metadata not applied", *key)

    def _log_overrides(self, topic: str) -> dict[str, str]:
        raw = self.replicas.image.configs.get(("topic", topic), {})
        # Only log settings reach storage; min.insync.replicas and friends are read there.
        return log_overrides(raw)

    def _update_topic_config(self, topic: str) -> None:
        overrides = self._log_overrides(topic)
        for hosted in list(self.replicas.partitions.values()):
            if hosted.topic == topic and not hosted.log.closed:
                self.log_manager.set_config(topic, hosted.partition, overrides)
                self._persist_config(hosted.key, hosted.log, overrides, None)

    def _persist_config(
        self,
        key: TopicPartition,
        plog: PartitionLog,
        overrides: dict[str, str],
        topic_id: uuid.UUID | None,
    ) -> None:
        """Rewrite the log's config file (and a missing topic id) in the background."""
        log_manager = self.log_manager

        def write(directory: Path) -> None:
            log_manager.write_overrides(directory, overrides)
            if topic_id is not None:
                write_topic_id(directory, topic_id)

        async def job() -> None:
            if not plog.closed:  # removed meanwhile: its directory is gone or going
                await self.work.run_sync(write, plog.directory)

        self.work.submit(key, "writing the topic config", job)

    def _assign(
        self, topic: str, index: int, topic_id: uuid.UUID, image_state: ImagePartitionState
    ) -> None:
        replicas = self.replicas
        key = (topic, index)
        hosted = replicas.partitions.get(key)
        if hosted is not None and hosted.topic_id != topic_id:
            # A topic deleted and re-created under the same name: the old data must go.
            self._drop(hosted)
            hosted = None
        if hosted is None and self.log_manager.get(topic, index) is not None:
            stored = self.log_manager.topic_id(topic, index)
            if stored is None or stored == topic_id:
                hosted = self._host_open_log(topic, index, topic_id, stored)
            elif not self.strays_checked:
                # The log says it belongs to another topic of that name. Whichever of the two
                # is the older one, an image still catching up may be what is stale (a node
                # replaying its metadata from scratch passes through old topics): leave the
                # log alone and the partition unhosted until the stray check decides.
                if key not in self._held:
                    self._held.add(key)
                    log.warning(
                        "%s-%d: the log on disk belongs to topic id %s, the metadata names %s; "
                        "not hosted until this broker has caught up with the metadata",
                        topic,
                        index,
                        stored,
                        topic_id,
                    )
                return
            else:
                log.info("%s-%d: the log on disk belongs to an earlier topic", topic, index)
                self._remove_log(key, DELETE_SUFFIX)
        if hosted is None:
            self._create_log_later(topic, index, topic_id)
            return
        self._apply_state(hosted, image_state)

    def _host_open_log(
        self, topic: str, index: int, topic_id: uuid.UUID, stored: uuid.UUID | None
    ) -> HostedPartition:
        log_manager = self.log_manager
        plog = log_manager.get(topic, index)
        assert plog is not None, (topic, index)
        overrides = self._log_overrides(topic)
        log_manager.set_config(topic, index, overrides)
        self._persist_config((topic, index), plog, overrides, topic_id if stored is None else None)
        if stored is None:
            log_manager.topic_ids[(topic, index)] = topic_id
        return self._host(topic, index, topic_id, plog, existed=True)

    def _create_log_later(self, topic: str, index: int, topic_id: uuid.UUID) -> None:
        key = (topic, index)
        if self._creating.get(key) == topic_id:
            return  # the queued job applies the newest state when the log exists
        self._creating[key] = topic_id
        replicas = self.replicas
        log_manager = self.log_manager

        async def create() -> None:
            if self._creating.get(key) != topic_id:
                return  # a newer topic of that name took over
            if not self._wanted(key, topic_id) or key in replicas.partitions:
                del self._creating[key]
                return
            # Only this job hosts a partition without an open log, and jobs for one name run
            # one at a time: nothing else can have opened a log in that directory meanwhile.
            assert log_manager.get(topic, index) is None, key
            create_log = functools.partial(
                log_manager.create_log,
                topic,
                index,
                self._log_overrides(topic),
                topic_id=topic_id,
                now_ms=replicas.wall_clock_ms(),
            )
            try:
                plog = await self.work.run_sync(create_log)
            finally:
                if self._creating.get(key) == topic_id:
                    del self._creating[key]
            if not self._wanted(key, topic_id):
                # Deleted while the directory was made: it goes again, before anything else
                # queued for the name.
                target = await self.work.run_sync(rename_for_removal, plog, DELETE_SUFFIX)
                await self.work.run_sync(remove_directory, target)
                return
            log_manager.adopt(topic, index, plog, topic_id)
            hosted = self._host(topic, index, topic_id, plog, existed=False)
            log.info("%s-%d: log created", topic, index)
            state = replicas.image.topics_by_id[topic_id].partitions[index]
            try:
                self._apply_state(hosted, state)
            except ReplicationStateError:
                log.exception("%s-%d: metadata not applied", topic, index)

        self.work.submit(key, "creating the log", create)

    def _wanted(self, key: TopicPartition, topic_id: uuid.UUID) -> bool:
        """The current image assigns partition `key` of topic `topic_id` to this broker."""
        replicas = self.replicas
        info = replicas.image.topics_by_id.get(topic_id)
        if info is None or info.name != key[0]:
            return False
        state = info.partitions.get(key[1])
        return state is not None and replicas.node_id in state.replicas

    def _host(
        self, topic: str, index: int, topic_id: uuid.UUID, plog: PartitionLog, *, existed: bool
    ) -> HostedPartition:
        replicas = self.replicas
        key = (topic, index)
        settings = dataclasses.replace(replicas.settings, flush_policy=plog.config.flush_policy)
        assert replicas.checkpointed_hws is not None
        high_watermark = replicas.checkpointed_hws.get(key, 0) if existed else 0
        replica = Partition(
            replica_id=replicas.node_id, log=plog, settings=settings, high_watermark=high_watermark
        )
        producers = ProducerStateHolder(plog)
        hosted = HostedPartition(topic, index, topic_id, plog, replica, producers)
        replicas.host(hosted)
        if existed:
            producers.invalidate()
            replicas.spawn(self._reload_producers, hosted)
        else:
            producers.start_empty()
        return hosted

    def _apply_state(self, hosted: HostedPartition, image_state: ImagePartitionState) -> None:
        if hosted.log_cut is not None:
            # A worker thread is cutting the log: a role built now would read its end and
            # epochs half-cut (a leader would start its epoch and HW past the cut), and the
            # cut belongs to the follower state it was asked for. Apply after it.
            self._apply_after_cut(hosted)
            return
        replicas = self.replicas
        topic, index = hosted.key
        if image_state.leader == replicas.node_id and not replicas.registered:
            # A leadership granted to an earlier process of this broker (killed and restarted
            # before its session ran out): that process may have had batches replicated that
            # this log lost unflushed, and producers' retries may already be on their way to
            # another replica. The controller moves every leadership away when this process
            # registers; until the image holds that registration the replica does not lead
            # (clients get NOT_LEADER_OR_FOLLOWER), as Kafka's broker acts on no metadata before
            # it is registered and caught up.
            self._before_registration.add(hosted.key)
            return
        self._before_registration.discard(hosted.key)
        state = LeaderAndIsr(
            leader_id=image_state.leader,
            leader_epoch=image_state.leader_epoch,
            partition_epoch=image_state.partition_epoch,
            replicas=tuple(image_state.replicas),
            isr=frozenset(image_state.isr),
        )
        leader_before = hosted.replica.leader
        isr_before = None if leader_before is None else leader_before.isr
        result = hosted.replica.apply_metadata(now_ms=replicas.clock_ms(), state=state)
        if leader_before is not None and isr_before and hosted.replica.leader is leader_before:
            # The controller changed our ISR (it drops a fenced broker itself): counted as
            # the shrinks and expansions this leader asked for are (Replicas).
            replicas.metrics.isr_changed(isr_before, leader_before.isr)
        if result.transition is Transition.STALE:
            log.info(
                "%s-%d: refused stale metadata %s (have %s)",
                topic,
                index,
                state,
                hosted.replica.state,
            )
            return
        if result.transition is Transition.UNCHANGED:
            return
        if result.lost_leadership:
            replicas.fail_waiters(hosted.key)
        if result.transition in (Transition.BECAME_LEADER, Transition.BECAME_FOLLOWER):
            hosted.drop_queued_cut()
            follower = hosted.replica.follower
            self.fetchers.assign(hosted.key, None if follower is None else follower.leader_id)
            replicas.role_changed(hosted)
            log.info(
                "%s-%d: %s at leader epoch %d (leader %d, ISR %s)",
                topic,
                index,
                result.transition.value,
                state.leader_epoch,
                state.leader_id,
                sorted(state.isr),
            )
        if result.transition is Transition.BECAME_LEADER:
            # Our own acknowledgement is the flushed offset: make sure it is current.
            replicas.request_leader_flush(hosted.key)
        if result.effects is not None:
            replicas.handle_effects(hosted, result.effects)

    def _apply_after_cut(self, hosted: HostedPartition) -> None:
        """Apply the image's newest state of the replica once the running truncation is done.

        The truncation is the job running for this key, so a job queued now runs right after
        it; it reads the image then, so one job covers every change that arrives meanwhile.
        """
        key = hosted.key
        if key in self._after_cut:
            return
        self._after_cut.add(key)
        replicas = self.replicas

        async def apply() -> None:
            self._after_cut.discard(key)
            if replicas.partitions.get(key) is not hosted:
                return  # removed or replaced meanwhile: that path applied its own state
            info = replicas.image.topics_by_id.get(hosted.topic_id)
            state = None if info is None else info.partitions.get(hosted.partition)
            if state is None or replicas.node_id not in state.replicas:
                return  # a removal is on its way
            try:
                self._apply_state(hosted, state)
            except ReplicationStateError:
                log.exception("%s-%d: metadata not applied", *key)

        self.work.submit(key, "applying metadata after the truncation", apply)

    # ------------------------------------------------------------------ removal
    def _remove_replica(self, topic_id: uuid.UUID, index: int) -> None:
        for hosted in list(self.replicas.partitions.values()):
            if hosted.topic_id == topic_id and hosted.partition == index:
                self._drop(hosted)

    def _drop(self, hosted: HostedPartition, suffix: str = DELETE_SUFFIX) -> None:
        """Stop hosting the replica at once; its data goes in the background."""
        key = hosted.key
        self.fetchers.assign(key, None)
        self.replicas.unhost(hosted)
        self._remove_log(key, suffix, hosted)
        log.info("%s-%d: replica removed; deleting its data", hosted.topic, hosted.partition)

    def _remove_log(
        self, key: TopicPartition, suffix: str, hosted: HostedPartition | None = None
    ) -> None:
        """Abandon the open log now; rename its directory, then delete it, in the background."""
        plog = self.log_manager.detach(*key)
        if plog is None:
            return

        async def rename() -> None:
            async with contextlib.AsyncExitStack() as stack:
                if hosted is not None:
                    # A producer snapshot or compaction writing into the directory from a
                    # worker thread finishes first; after these locks they see a closed log.
                    await stack.enter_async_context(hosted.producers.lock)
                    await stack.enter_async_context(hosted.disk_lock)
                target = await self.work.run_sync(rename_for_removal, plog, suffix)
            self.work.submit(
                target, "deleting the directory", functools.partial(self._rmtree, target)
            )

        self.work.submit(key, f"renaming the log to *{suffix}", rename)

    async def _rmtree(self, target: Path) -> None:
        if await self.work.run_sync(remove_directory, target):
            log.info("deleted %s", target.name)

    # ------------------------------------------------------------------ stray logs
    def _maybe_remove_strays(self, image: MetadataImage) -> None:
        if self.strays_checked or self.incarnation_id is None:
            return
        registration = image.brokers.get(self.replicas.node_id)
        if (
            registration is None
            or registration.incarnation_id != self.incarnation_id
            or registration.fenced
        ):
            return
        # The controller unfences an incarnation only once its heartbeat reported a metadata
        # offset at or past the committed one, and this image holds that unfencing: it is
        # caught up with everything committed when this process started.
        self.strays_checked = True
        self.remove_stray_logs(image)

    def remove_stray_logs(self, image: MetadataImage) -> list[TopicPartition]:
        """Rename and delete every log that `image` (a caught-up one) does not assign here.

        Hosted replicas are checked too: an image that jumped forward through a snapshot
        carries no "deleted" entries for what it skipped, so a replica hosted from an older
        image may be stray as well; it is dropped like a deleted one.
        """
        replicas = self.replicas
        log_manager = self.log_manager
        removed = []
        for key in sorted(log_manager.all_logs()):
            # The metadata log has its own driver: the replica manager never touches it.
            if key[0].startswith(METADATA_TOPIC):
                continue
            hosted = replicas.partitions.get(key)
            stored = hosted.topic_id if hosted is not None else log_manager.topic_id(*key)
            reason = stray_reason(image, replicas.node_id, key, stored)
            if reason is None:
                continue
            log.warning("%s-%d: stray log (%s); deleting it", key[0], key[1], reason)
            if hosted is not None:
                self._drop(hosted, STRAY_SUFFIX)
            else:
                self._remove_log(key, STRAY_SUFFIX)
            removed.append(key)
        self._held.clear()
        for topic, index in removed:
            # A held log of an earlier topic made way: the current one gets its own log.
            info = image.topic(topic)
            state = None if info is None else info.partitions.get(index)
            if info is not None and state is not None and replicas.node_id in state.replicas:
                try:
                    self._assign(topic, index, info.topic_id, state)
                except ReplicationStateError:
                    log.exception("%s-%d: metadata not applied", topic, index)
        return removed
