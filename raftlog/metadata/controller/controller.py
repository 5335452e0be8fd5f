"""The controller: the Raft leader's request handling, as a sans-IO state machine.

The trio driver feeds it requests and the clock; the controller answers with a
ControllerResult: records to append through Raft as one atomic batch, and the reply to send
once they commit (at once when there are no records). It never touches a socket or a clock.

The controller applies its own records to `self.image` as soon as it hands them out, so the
next request already sees them (KRaft does the same). That image is therefore ahead of the
committed one. If this node loses Raft leadership the driver must drop the controller; the
next leader builds a fresh one from its committed image (`Controller.from_image`), so records
that never committed leave no trace.

The driver's duties:
- append `result.records` atomically, send `result.reply` after they commit;
- call `committed(offset)` when the metadata high watermark advances (brokers are caught up,
  and may be unfenced, only when their metadata offset reaches it);
- call `tick(now_ms)` at `next_deadline_ms(now_ms)` (session expiry, a due fence, periodic
  preferred-leader and offline-partition elections), and again after anything it was told
  (`broker_unreachable`, `broker_silent`) may have brought that deadline closer;
- call `broker_unreachable(broker_id, since_ms)` while this node's connection attempts to a
  broker's internal listener are refused (none succeeded since `since_ms`),
  and `broker_reachable(broker_id)` once one succeeds: a broker whose process is gone is
  fenced after broker_unreachable_fence_ms instead of a whole session timeout;
- call `broker_silent(broker_id, since_ms)` for the previous metadata leader when a majority
  has not heard from it for a whole session (controller/liveness.py); the same rule applies;
- on a standby controller, `replay(records, offset, now_ms)` committed records so the
  in-memory state (image, heartbeat times) is warm for a failover.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from raftlog.codec import I64_MAX
from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode
from raftlog.metadata import records as r
from raftlog.metadata.controller.acls import create_acls, delete_acls
from raftlog.metadata.controller.configs import alter_client_quotas, alter_configs
from raftlog.metadata.controller.elections import (
    Batch,
    alter_partition,
    elect_leaders,
    leave_changes,
    offline_changes,
    preferred_leader_changes,
    unsafe_changes,
)
from raftlog.metadata.controller.messages import (
    AllocateProducerIds,
    AllocateProducerIdsReply,
    AlterClientQuotas,
    AlterConfigs,
    AlterPartition,
    AlterPartitionReassignments,
    AlterPartitionReply,
    AlterUserScramCredentials,
    BrokerHeartbeat,
    BrokerHeartbeatReply,
    ControllerResult,
    CreateAcls,
    CreatePartitions,
    CreateTopics,
    DeleteAcls,
    DeleteTopics,
    ElectLeaders,
    IncrementalAlterConfigs,
    RegisterBroker,
    RegisterBrokerReply,
    UnregisterBroker,
    UnregisterBrokerReply,
)
from raftlog.metadata.controller.reassignments import (
    alter_partition_reassignments,
    completion_changes,
)
from raftlog.metadata.controller.scram import alter_user_scram_credentials
from raftlog.metadata.controller.topics import (
    create_partitions,
    create_topics,
    delete_topics,
    new_topic_id_factory,
)
from raftlog.metadata.image import MetadataDelta, MetadataImage

__all__ = ["PREFERRED_LEADER_CHECK_INTERVAL_MS", "PRODUCER_ID_BLOCK_SIZE", "Controller"]

# Kafka's leader.imbalance.check.interval.seconds default; the same pass elects leaders for
# offline partitions that became electable (e.g. unclean election was switched on).
log = logging.getLogger("raftlog.metadata")

PREFERRED_LEADER_CHECK_INTERVAL_MS = 300_000
PRODUCER_ID_BLOCK_SIZE = 1000
MAX_PRODUCER_ID = I64_MAX
# Refusals go back to the peer that sent the request: they never echo the current broker
# epoch (knowing it is all a forged heartbeat would need); the service logs the detail.
NOT_REGISTERED_TEXT = "the broker is not registered"
STALE_BROKER_EPOCH_TEXT = "the broker epoch is not the registered one"


class Controller:
    def __init__(
        self,
        image: MetadataImage,
        config: NodeConfig,
        now_ms: int,
        *,
        topic_id_source: Callable[[], uuid.UUID] = uuid.uuid4,
        preferred_leader_check_interval_ms: int = PREFERRED_LEADER_CHECK_INTERVAL_MS,
        acl_id_source: Callable[[], uuid.UUID] = uuid.uuid4,
    ) -> None:
        self.image = image
        self.config = config
        self.committed_offset = image.last_applied_offset
        self.preferred_leader_check_interval_ms = preferred_leader_check_interval_ms
        # Every known broker gets a fresh session on a new controller: the old leader's
        # heartbeat times died with it, and fencing everyone at once would be worse.
        self._last_contact_ms: dict[int, int] = {b: now_ms for b in image.brokers}
        # Brokers that registered or heartbeated with THIS controller. The grace sessions above
        # keep live brokers from being fenced at a failover, but must not make a dead
        # incarnation look alive: after a full restart the new incarnation would otherwise be
        # refused (DUPLICATE_BROKER_REGISTRATION) for a whole session timeout.
        self._heard_from: set[int] = set()
        # When each broker last registered or heartbeated with THIS controller (never the
        # grace sessions above): a broker that spoke after its connects began failing is
        # alive, whatever the connects say (an asymmetric cut, a listener being restarted).
        self._last_heartbeat_ms: dict[int, int] = {}
        # broker id -> since when this node's connects to the broker have all failed.
        self._unreachable_since_ms: dict[int, int] = {}
        # broker id -> since when a majority has not heard from it: the previous metadata
        # leader, silent (its Raft fetches unanswered) when this controller took over.
        self._silent_since_ms: dict[int, int] = {}
        # What each broker's last heartbeat reported unsafe to lead (elections.py). Kept in
        # memory: every heartbeat repeats it, so a new controller knows it within one.
        self._unsafe: dict[int, frozenset[tuple[uuid.UUID, int]]] = {}
        self._next_periodic_check_ms = now_ms + preferred_leader_check_interval_ms
        # Rotates placement so single-partition topics do not all land on one leader; seeded
        # from the topic count so a new controller continues roughly where the last stopped.
        self._placement_start = len(image.topics_by_id)
        self._new_topic_id = new_topic_id_factory(topic_id_source)
        self._handlers: dict[type, Callable[[Batch, Any, int], Any]] = {
            RegisterBroker: self._register_broker,
            BrokerHeartbeat: self._heartbeat,
            AllocateProducerIds: self._allocate_producer_ids,
            CreateTopics: self._create_topics,
            DeleteTopics: lambda batch, req, now_ms: delete_topics(batch, req),
            CreatePartitions: self._create_partitions,
            AlterPartition: self._alter_partition,
            AlterConfigs: lambda batch, req, now_ms: alter_configs(batch, req),
            IncrementalAlterConfigs: lambda batch, req, now_ms: alter_configs(batch, req),
            AlterClientQuotas: lambda batch, req, now_ms: alter_client_quotas(batch, req),
            CreateAcls: lambda batch, req, now_ms: create_acls(batch, req, acl_id_source),
            DeleteAcls: lambda batch, req, now_ms: delete_acls(batch, req),
            AlterUserScramCredentials: lambda batch, req, now_ms: alter_user_scram_credentials(
                batch, req
            ),
            AlterPartitionReassignments: lambda batch, req, now_ms: alter_partition_reassignments(
                batch, req, self._unsafe
            ),
            ElectLeaders: lambda batch, req, now_ms: elect_leaders(batch, req, self._unsafe),
            UnregisterBroker: self._unregister_broker,
        }

    @classmethod
    def from_image(
        cls, image: MetadataImage, config: NodeConfig, now_ms: int, **kw: Any
    ) -> Controller:
        """A controller for a node that just became Raft leader, from its committed image."""
        return cls(image, config, now_ms, **kw)

    # ---------------------------------------------------------------- driver events
    def handle(self, request: Any, now_ms: int) -> ControllerResult:
        handler = self._handlers.get(type(request))
        if handler is None:
            raise TypeError(f"the controller does not handle {type(request).__name__}")
        batch = Batch(self.image)
        reply = handler(batch, request, now_ms)
        self.image = batch.image
        return ControllerResult(tuple(batch.records), reply)

    def tick(self, now_ms: int) -> ControllerResult:
        """Fence brokers whose session expired; run the periodic election pass when due."""
        batch = Batch(self.image)
        timeout_ms = self.config.broker_session_timeout_ms
        for broker_id, reg in sorted(batch.image.brokers.items()):
            last_ms = self._last_contact_ms.setdefault(broker_id, now_ms)
            if reg.fenced:
                continue
            if now_ms - last_ms >= timeout_ms:
                log.warning("broker %d fenced: no heartbeat for %d ms", broker_id, now_ms - last_ms)
                self._fence(batch, broker_id)
            elif (
                self._unreachable_for_ms(broker_id, now_ms)
                >= self.config.broker_unreachable_fence_ms
            ):
                log.warning(
                    "broker %d fenced: its internal listener refused every connect for %d ms, "
                    "no heartbeat since",
                    broker_id,
                    self._unreachable_for_ms(broker_id, now_ms),
                )
                self._fence(batch, broker_id)
            elif self._silent_for_ms(broker_id, now_ms) >= self.config.broker_unreachable_fence_ms:
                log.warning(
                    "broker %d fenced: as the previous metadata leader it has not been heard "
                    "from for %d ms (its Raft fetches went unanswered), no heartbeat since",
                    broker_id,
                    self._silent_for_ms(broker_id, now_ms),
                )
                self._fence(batch, broker_id)
        if now_ms >= self._next_periodic_check_ms:
            self._next_periodic_check_ms = now_ms + self.preferred_leader_check_interval_ms
            batch.add(
                *offline_changes(
                    batch.image, self.config.unclean_leader_election, unsafe=self._unsafe
                )
            )
            batch.add(*preferred_leader_changes(batch.image, self._unsafe))
            # A reassignment whose last step waited for an eligible target leader.
            batch.add(*completion_changes(batch.image, self._unsafe))
        self.image = batch.image
        return ControllerResult(tuple(batch.records), None)

    def broker_unreachable(self, broker_id: int, since_ms: int) -> None:
        """Every connect from this node to the broker's internal listener since `since_ms`
        was refused. The next tick fences it once that has lasted broker_unreachable_fence_ms,
        unless it registers or heartbeats meanwhile. Repeating it with the same `since_ms`
        (every failed retry) is harmless; a later `since_ms` moves the start later."""
        self._unreachable_since_ms[broker_id] = since_ms

    def broker_reachable(self, broker_id: int) -> None:
        """A connect to the broker succeeded: its process listens again."""
        self._unreachable_since_ms.pop(broker_id, None)

    def broker_silent(self, broker_id: int, since_ms: int | None) -> None:
        """A majority of the metadata quorum has not heard from this broker, the previous
        metadata leader, since `since_ms` (None: withdrawn). Fenced on the same terms as
        refusals (broker_unreachable), unless it heartbeats this controller."""
        if since_ms is None:
            self._silent_since_ms.pop(broker_id, None)
        else:
            self._silent_since_ms[broker_id] = since_ms

    def _unreachable_for_ms(self, broker_id: int, now_ms: int) -> int:
        """How long the broker's listener has refused us while it also missed a heartbeat
        (-1: it has not)."""
        return self._suspect_for_ms(self._unreachable_since_ms.get(broker_id), broker_id, now_ms)

    def _silent_for_ms(self, broker_id: int, now_ms: int) -> int:
        """How long the previous metadata leader has been silent while it also missed a
        heartbeat to this controller (-1: it has not)."""
        return self._suspect_for_ms(self._silent_since_ms.get(broker_id), broker_id, now_ms)

    def _suspect_for_ms(self, since_ms: int | None, broker_id: int, now_ms: int) -> int:
        if since_ms is None:
            return -1
        heard_ms = self._last_heartbeat_ms.get(broker_id)
        if heard_ms is not None:
            if heard_ms >= since_ms:
                return -1
            # A live broker heartbeats every interval, so refusals alone are not enough
            # while its next heartbeat is not due: its listener may merely be out of this
            # controller's reach (a wrong advertised address, a one-way cut). Once the
            # refusals began with no heartbeat since, a heartbeat a whole interval late is
            # the missed one: no further grace on top (refusals already lasted
            # broker_unreachable_fence_ms).
            if now_ms - heard_ms < self.config.broker_heartbeat_interval_ms:
                return -1
        return now_ms - since_ms

    def _suspect_fence_ms(self, since_ms: int | None, broker_id: int) -> int | None:
        """When _suspect_for_ms reaches broker_unreachable_fence_ms (None: never, as
        things stand)."""
        if since_ms is None:
            return None
        due_ms = since_ms + self.config.broker_unreachable_fence_ms
        heard_ms = self._last_heartbeat_ms.get(broker_id)
        if heard_ms is not None:
            if heard_ms >= since_ms:
                return None
            due_ms = max(due_ms, heard_ms + self.config.broker_heartbeat_interval_ms)
        return due_ms

    def next_deadline_ms(self, now_ms: int) -> int:
        """When `tick` has something to do next, as things stand: the earliest session
        expiry or due fence of an unfenced broker, or the periodic election pass. Events fed
        in later (`broker_unreachable`, `broker_silent`) may bring it closer; requests
        (heartbeats, registrations) only move it later."""
        deadline_ms = self._next_periodic_check_ms
        timeout_ms = self.config.broker_session_timeout_ms
        for broker_id, reg in self.image.brokers.items():
            if reg.fenced:
                continue
            deadline_ms = min(
                deadline_ms, self._last_contact_ms.get(broker_id, now_ms) + timeout_ms
            )
            for since in (self._unreachable_since_ms, self._silent_since_ms):
                due_ms = self._suspect_fence_ms(since.get(broker_id), broker_id)
                if due_ms is not None:
                    deadline_ms = min(deadline_ms, due_ms)
        return deadline_ms

    def rebalance_preferred_leaders(self) -> ControllerResult:
        """Preferred-leader election now (the periodic pass also does this)."""
        batch = Batch(self.image)
        batch.add(*preferred_leader_changes(batch.image, self._unsafe))
        self.image = batch.image
        return ControllerResult(tuple(batch.records), None)

    def committed(self, offset: int) -> None:
        """The metadata log's high watermark advanced to `offset`."""
        self.committed_offset = max(self.committed_offset, offset)

    def replay(self, records: Iterable[r.Record], offset: int, now_ms: int) -> MetadataDelta:
        """Standby controller: apply committed records and note broker liveness from them."""
        records = tuple(records)
        self.image, delta = self.image.apply(records, offset)
        self.committed_offset = max(self.committed_offset, offset)
        for rec in records:
            if isinstance(rec, r.RegisterBroker | r.UnfenceBroker):
                self._last_contact_ms[rec.broker_id] = now_ms
            elif isinstance(rec, r.UnregisterBroker):
                self._forget(rec.broker_id)
            elif isinstance(rec, r.Topic):
                self._placement_start += 1
        return delta

    def become_leader(self, now_ms: int) -> None:
        """This standby just became Raft leader: everyone gets a fresh session (grace)."""
        self._last_contact_ms = {b: now_ms for b in self.image.brokers}
        self._heard_from = set()
        self._last_heartbeat_ms = {}
        self._unsafe = {}
        self._next_periodic_check_ms = now_ms + self.preferred_leader_check_interval_ms

    def last_contact_ms(self, broker_id: int) -> int | None:
        return self._last_contact_ms.get(broker_id)

    # ---------------------------------------------------------------- broker lifecycle
    def _fence(self, batch: Batch, broker_id: int) -> None:
        reg = batch.image.brokers[broker_id]
        batch.add(r.FenceBroker(broker_id, reg.epoch))
        batch.add(
            *leave_changes(
                batch.image, broker_id, self.config.unclean_leader_election, self._unsafe
            )
        )

    def _register_broker(
        self, batch: Batch, req: RegisterBroker, now_ms: int
    ) -> RegisterBrokerReply:
        image = batch.image
        if req.cluster_id is not None and image.cluster_id and req.cluster_id != image.cluster_id:
            return RegisterBrokerReply(
                ErrorCode.inconsistent_cluster_id,
                f"broker belongs to cluster {req.cluster_id!r}, this is {image.cluster_id!r}",
            )
        existing = image.brokers.get(req.broker_id)
        if existing is not None and existing.incarnation_id != req.incarnation_id:
            last_ms = self._last_contact_ms.get(req.broker_id)
            session_alive = (
                req.broker_id in self._heard_from
                and last_ms is not None
                and now_ms - last_ms < self.config.broker_session_timeout_ms
                and not existing.fenced
            )
            if session_alive:
                # The live incarnation's id stays out of the text: it is what a forger lacks.
                return RegisterBrokerReply(
                    ErrorCode.duplicate_broker_registration,
                    "the broker id is registered by another live incarnation",
                )
        if existing is not None:
            epoch = existing.epoch + 1
        else:
            # An id unregistered before continues from its last epoch (never reused).
            epoch = image.unregistered_broker_epochs.get(req.broker_id, 0) + 1
        batch.add(
            r.RegisterBroker(
                req.broker_id,
                req.incarnation_id,
                epoch,
                req.client_host,
                req.client_port,
                req.internal_host,
                req.internal_port,
                req.rack,
                req.listeners,
            )
        )
        # A re-registration means the old process is gone: it may have lost unflushed data,
        # so it gives up its leaderships and ISR places until it catches up again.
        if existing is not None:
            # The new incarnation reports its own unsafe replicas in its first heartbeat.
            self._unsafe.pop(req.broker_id, None)
            batch.add(
                *leave_changes(
                    batch.image, req.broker_id, self.config.unclean_leader_election, self._unsafe
                )
            )
        self._last_contact_ms[req.broker_id] = now_ms
        self._last_heartbeat_ms[req.broker_id] = now_ms
        self._heard_from.add(req.broker_id)
        return RegisterBrokerReply(broker_epoch=epoch)

    def _unregister_broker(
        self, batch: Batch, req: UnregisterBroker, now_ms: int
    ) -> UnregisterBrokerReply:
        """Kafka's UnregisterBroker: fence the broker as a session expiry would (its
        leaderships move, it leaves the ISRs it can), then drop its registration. Nothing
        stops a broker that is still running: its next heartbeat is answered
        BROKER_ID_NOT_REGISTERED and it registers again, so the operator stops it first."""
        reg = batch.image.brokers.get(req.broker_id)
        if reg is None:
            return UnregisterBrokerReply(
                ErrorCode.broker_id_not_registered, f"broker {req.broker_id} is not registered"
            )
        if not reg.fenced:
            self._fence(batch, req.broker_id)
        elif any(req.broker_id in state.isr for _, _, state in batch.image.iter_partitions()):
            # Fenced already, yet still an ISR member it could leave (a fenced broker stays
            # only as an ISR's last member, which leave_changes keeps as Kafka does).
            batch.add(
                *leave_changes(
                    batch.image, req.broker_id, self.config.unclean_leader_election, self._unsafe
                )
            )
        log.warning("broker %d unregistered (epoch %d)", req.broker_id, reg.epoch)
        batch.add(r.UnregisterBroker(req.broker_id, reg.epoch))
        self._forget(req.broker_id)
        return UnregisterBrokerReply()

    def _forget(self, broker_id: int) -> None:
        """Drop what this controller remembers of an unregistered broker's liveness."""
        self._last_contact_ms.pop(broker_id, None)
        self._last_heartbeat_ms.pop(broker_id, None)
        self._heard_from.discard(broker_id)
        self._unreachable_since_ms.pop(broker_id, None)
        self._silent_since_ms.pop(broker_id, None)
        self._unsafe.pop(broker_id, None)

    def _heartbeat(self, batch: Batch, req: BrokerHeartbeat, now_ms: int) -> BrokerHeartbeatReply:
        reg = batch.image.brokers.get(req.broker_id)
        if reg is None:
            return BrokerHeartbeatReply(ErrorCode.broker_id_not_registered, NOT_REGISTERED_TEXT)
        if reg.epoch != req.broker_epoch:
            return BrokerHeartbeatReply(ErrorCode.stale_broker_epoch, STALE_BROKER_EPOCH_TEXT)
        self._last_contact_ms[req.broker_id] = now_ms
        self._last_heartbeat_ms[req.broker_id] = now_ms
        self._heard_from.add(req.broker_id)
        caught_up = req.current_metadata_offset >= self.committed_offset
        unclean = self.config.unclean_leader_election
        self._note_unsafe(batch, req)

        if reg.fenced:
            if req.want_shutdown or reg.in_controlled_shutdown:
                # Nothing to hand over: a fenced broker leads nothing.
                return BrokerHeartbeatReply(
                    is_caught_up=caught_up, is_fenced=True, should_shutdown=req.want_shutdown
                )
            if req.want_fence or not caught_up:
                return BrokerHeartbeatReply(is_caught_up=caught_up, is_fenced=True)
            batch.add(r.UnfenceBroker(req.broker_id, reg.epoch))
            batch.add(
                *offline_changes(batch.image, unclean, broker_id=req.broker_id, unsafe=self._unsafe)
            )
            return BrokerHeartbeatReply(is_caught_up=True, is_fenced=False)

        if req.want_fence:
            self._fence(batch, req.broker_id)
            return BrokerHeartbeatReply(is_caught_up=caught_up, is_fenced=True)
        if req.want_shutdown and not reg.in_controlled_shutdown:
            # Step 1: stop electing it, move its leaderships away, take it out of ISRs.
            batch.add(r.BrokerShutdownBegin(req.broker_id, reg.epoch))
            batch.add(*leave_changes(batch.image, req.broker_id, unclean, self._unsafe))
            return BrokerHeartbeatReply(is_caught_up=caught_up, is_fenced=False)
        if reg.in_controlled_shutdown and caught_up:
            # Step 2: it has seen the leadership moves (its offset reached the committed
            # offset, which covers them), so it may stop; partitions only it could lead go
            # offline now rather than when its session expires.
            self._fence(batch, req.broker_id)
            return BrokerHeartbeatReply(is_caught_up=True, is_fenced=True, should_shutdown=True)
        return BrokerHeartbeatReply(is_caught_up=caught_up, is_fenced=False)

    def _note_unsafe(self, batch: Batch, req: BrokerHeartbeat) -> None:
        """Remember what the broker reports unsafe to lead; take it out of those ISRs and
        leaderships now (each heartbeat repeats it, so this also covers a replica that got
        back into an ISR before its broker stopped reporting it)."""
        unsafe = frozenset(req.unsafe_partitions)
        if unsafe != self._unsafe.get(req.broker_id, frozenset()):
            log.warning(
                "broker %d now reports %d replica(s) unsafe to lead (lost or damaged "
                "records, or a failed disk)",
                req.broker_id,
                len(unsafe),
            )
        if not unsafe:
            self._unsafe.pop(req.broker_id, None)
            return
        self._unsafe[req.broker_id] = unsafe
        batch.add(
            *unsafe_changes(
                batch.image, req.broker_id, self.config.unclean_leader_election, self._unsafe
            )
        )

    def _allocate_producer_ids(
        self, batch: Batch, req: AllocateProducerIds, now_ms: int
    ) -> AllocateProducerIdsReply:
        reg = batch.image.brokers.get(req.broker_id)
        if reg is None:
            return AllocateProducerIdsReply(ErrorCode.broker_id_not_registered, NOT_REGISTERED_TEXT)
        if reg.epoch != req.broker_epoch:
            return AllocateProducerIdsReply(ErrorCode.stale_broker_epoch, STALE_BROKER_EPOCH_TEXT)
        start = batch.image.next_producer_id
        if start > MAX_PRODUCER_ID - PRODUCER_ID_BLOCK_SIZE:
            return AllocateProducerIdsReply(
                ErrorCode.unknown_server_error, "producer ids are exhausted"
            )
        batch.add(r.ProducerIds(req.broker_id, reg.epoch, start + PRODUCER_ID_BLOCK_SIZE))
        return AllocateProducerIdsReply(
            producer_id_start=start, producer_id_len=PRODUCER_ID_BLOCK_SIZE
        )

    def _alter_partition(
        self, batch: Batch, req: AlterPartition, now_ms: int
    ) -> AlterPartitionReply:
        """An ISR change; when it puts the last target replica of a reassignment in the ISR
        the reassignment completes in a record of its own. The reply names the state after
        the ISR change alone: the leader takes the completed one (new replicas, maybe a new
        leader) from the metadata, never from a reply that carries no replicas."""
        reply = alter_partition(batch, req)
        if reply.error_code == ErrorCode.none:
            batch.add(*completion_changes(batch.image, self._unsafe, (req.topic_id, req.partition)))
        return reply

    # ---------------------------------------------------------------- topics
    def _create_topics(self, batch: Batch, req: CreateTopics, now_ms: int) -> Any:
        reply, self._placement_start = create_topics(
            batch, req, self.config, self._new_topic_id, self._placement_start
        )
        return reply

    def _create_partitions(self, batch: Batch, req: CreatePartitions, now_ms: int) -> Any:
        return create_partitions(batch, req, self._placement_start)
