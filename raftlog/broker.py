"""The node's KafkaBackend: what the Kafka protocol layer asks of a broker.

Reads of cluster state come from this node's committed MetadataImage; the data path is the
ReplicaManager's produce and read paths, bound here; admin changes go to the active controller
(any broker forwards, as in KRaft) and are answered once committed AND visible in this
broker's own image, so a client that creates a topic and then asks this broker for its metadata
finds it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

import trio

from raftlog.broker_configs import broker_config_entries, topic_config_entries
from raftlog.config import NodeConfig
from raftlog.constants import NO_LEADER
from raftlog.errors import ErrorCode, KafkaError
from raftlog.groups.settings import OFFSETS_TOPIC
from raftlog.metadata.controller import messages as cm
from raftlog.metadata.controller.acls import check_filter
from raftlog.metadata.controller.broker_lifecycle import BrokerLifecycle, ControllerClient
from raftlog.metadata.controller.messages import CONFIG_OPS
from raftlog.metadata.image import MetadataDelta, MetadataImage
from raftlog.metadata.service import MetadataService
from raftlog.net.kafka.backend import (
    AclCreateResult,
    AclDeleteResult,
    AlterConfigOp,
    BrokerInfo,
    ConfigEntry,
    ConfigResourceType,
    ConfigSource,
    ConfigsResult,
    CreateTopicResult,
    DeleteRecordsResult,
    DeleteTopicResult,
    FetchResult,
    IsolationLevel,
    PartitionInfo,
    PartitionProducers,
    ProducerDescription,
    ProduceResult,
    ProducerIdResult,
    QuotaAlteration,
    QuotaAlterResult,
    QuotaEntity,
    QuotaFilter,
    ScramAlterResult,
    ScramUserDescription,
    TopicInfo,
    TopicPartitionKey,
    TxnMarkerWrite,
)
from raftlog.replication.manager import ReplicaManager
from raftlog.replication.txn_markers import MAX_PRODUCER_STATE_WAIT_MS, TxnMarkerRequest
from raftlog.security.acl import AclBinding, AclBindingFilter, ScramCredential, ScramMechanism
from raftlog.security.authorizer import Authorizer
from raftlog.txn.log_format import TRANSACTION_STATE_TOPIC

log = logging.getLogger("raftlog.broker")

# Metadata marks these is_internal (Kafka: clients skip them in pattern subscriptions).
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})
QUOTA_MATCH_EXACT, QUOTA_MATCH_DEFAULT, QUOTA_MATCH_ANY = 0, 1, 2

# A broker this node saw fenced stays in the broker list of Metadata this long after (a
# workaround for librdkafka): a producer whose leader was fenced learns the new leader and
# the old broker's absence from one answer; dropping the old broker then races with moving
# the partition off it ("Reverting from preferred replica ... to leader -1" in its trace) and
# costs one more 1 s metadata scan. Listed a little longer, the partition has moved by the
# time the client drops the broker. Clients that connect to it are refused and go elsewhere.
FENCED_BROKER_LISTED_MS = 3000

# Kafka lists broker.rack among a broker's configs: read-only (a broker registers its rack
# once, at start-up) and null when the broker has none. Described from the registration, so
# any node answers with the rack of the broker named, not its own.
BROKER_RACK_KEY = "broker.rack"

# What produce, fetch and delete_records answer for a partition this broker stepped down from.
_Answer = TypeVar("_Answer", ProduceResult, FetchResult, DeleteRecordsResult)
_produce_refusal = functools.partial(
    ProduceResult, error_message="this broker lost contact with the controller"
)


class BrokerBackend:
    """Implements raftlog.net.kafka.backend.KafkaBackend for one node."""

    def __init__(
        self,
        config: NodeConfig,
        metadata: MetadataService,
        controller: ControllerClient,
        lifecycle: BrokerLifecycle,
        replicas: ReplicaManager,
    ) -> None:
        self.config = config
        self.metadata = metadata
        self.controller = controller
        self.lifecycle = lifecycle
        # The data path is the replication layer's own: a produce or a fetch goes from the
        # protocol handler straight to ProducePath / ReadPaths, with no call of its own here.
        self._produce = replicas.writes.produce
        self._fetch = replicas.reads.fetch
        self.list_offset = replicas.reads.list_offset
        self.offset_for_leader_epoch = replicas.reads.offset_for_leader_epoch
        self.data_event = replicas.replicas.data_event
        self._unsafe_partitions = replicas.unsafe_partitions
        self._replica_manager = replicas
        # None only in tests that exercise the data path alone (no controller, no lease).
        if lifecycle is not None:
            lifecycle.lease_listeners.append(self._lease_changed)
        # broker id -> when this node saw it fenced (trio clock, s), for brokers it had seen
        # unfenced: a broker fenced since start-up is never listed.
        self._fenced_at_s: dict[int, float] = {}
        self._seen_unfenced: dict[int, uuid.UUID] = {}  # broker id -> incarnation seen unfenced
        # Not trio's clock: image listeners also run outside trio (tests replaying images).
        self.clock_s: Callable[[], float] = time.monotonic
        if metadata is not None:
            metadata.add_listener(self._note_fences)
        self._producer_ids: list[int] = []  # the rest of this broker's allocated block
        self._producer_id_lock = trio.Lock()
        # The ACL authorizer the Kafka handlers ask (raftlog.net.kafka.authz), or None when
        # authorizer_class_name is empty. Immutable: a change of the image's ACLs builds a
        # new one, so a request never sees half an update and a check is a few lookups.
        self.authorizer: Authorizer | None = None
        self._authorized_acls: object = None  # the image.acls the authorizer was built from
        if config.authorizer_enabled:
            metadata.add_listener(self._rebuild_authorizer)

    def _rebuild_authorizer(self, image: MetadataImage, delta: MetadataDelta) -> None:
        # The image is copy-on-write: the same acls mapping means no ACL changed.
        if image.acls is self._authorized_acls:
            return
        self._authorized_acls = image.acls
        self.authorizer = Authorizer(
            image.acls.values(),
            super_users=self.config.super_user_principals,
            allow_everyone_if_no_acl_found=self.config.allow_everyone_if_no_acl_found,
        )
        log.debug("authorizer rebuilt: %d ACLs", len(self.authorizer))

    # ---------------------------------------------------------------- leading
    async def produce(
        self,
        topic: str,
        partition: int,
        records: bytes,
        acks: int,
        timeout_ms: int,
        producer: object = None,
    ) -> ProduceResult:
        """The replication layer's produce, unless this broker stepped down (_refusal)."""
        refused = self._refusal(topic, partition, _produce_refusal)
        if refused is not None:
            return refused
        return await self._produce(topic, partition, records, acks, timeout_ms, producer)

    async def fetch(
        self,
        topic: str,
        partition: int,
        fetch_offset: int,
        partition_max_bytes: int,
        current_leader_epoch: int,
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> FetchResult:
        """The replication layer's consumer fetch, unless this broker stepped down (_refusal):
        what it holds is committed, but its high watermark no longer moves."""
        refused = self._refusal(topic, partition, FetchResult)
        if refused is not None:
            return refused
        return await self._fetch(
            topic, partition, fetch_offset, partition_max_bytes, current_leader_epoch, isolation
        )

    async def delete_records(self, topic: str, partition: int, offset: int) -> DeleteRecordsResult:
        """DeleteRecords on a partition this broker leads (replication/delete_records.py),
        unless it stepped down (_refusal)."""
        refused = self._refusal(topic, partition, DeleteRecordsResult)
        if refused is not None:
            return refused
        return await self._replica_manager.delete_records(topic, partition, offset)

    def _refusal(
        self, topic: str, partition: int, refuse: Callable[[ErrorCode], _Answer]
    ) -> _Answer | None:
        """`refuse(NOT_LEADER_OR_FOLLOWER)` when this broker gave up leading the partition
        (stepped_down), else None. Cut off from the controller for a session, it may have
        been replaced; NOT_LEADER_OR_FOLLOWER is what sends a client to find the new leader."""
        if self.stepped_down(topic, partition):
            return refuse(ErrorCode.not_leader_or_follower)
        return None

    def lease_lapsed(self) -> bool:
        """No heartbeat of this broker was answered for a session (BrokerLifecycle)."""
        return self.lifecycle is not None and self.lifecycle.lease_lapsed()

    def stepped_down(self, topic: str, partition: int) -> bool:
        """Whether this broker must not act as the partition's leader now: its lease lapsed
        and nothing says it still leads. Its followers still fetching from it does: they
        have not been told of another leader, so the controller has not replaced it (the
        controller itself may be what is silent: a paused or cut-off controller must not
        stop every broker). Nor can it be replaced when no other replica is in sync."""
        return self.lease_lapsed() and not self._still_followed((topic, partition))

    def _still_followed(self, key: tuple[str, int]) -> bool:
        replicas = self._replica_manager.replicas
        hosted = replicas.partitions.get(key)
        leader = None if hosted is None else hosted.replica.leader
        if leader is None:
            return False
        others = leader.isr - {self.config.node_id}
        if not others:
            return True
        # A follower fetches again at once after each answer, and an answer waits at most
        # replica_fetch_wait_max_ms: a heartbeat interval on top of that is quiet enough.
        window_ms = self.config.replica_fetch_wait_max_ms + self.config.broker_heartbeat_interval_ms
        since_ms = replicas.clock_ms() - window_ms
        return any(
            progress.last_fetch_time_ms >= since_ms
            for replica_id, progress in leader.followers.items()
            if replica_id in others
        )

    def _cut_off(self) -> bool:
        """Lapsed, and no partition it leads is still followed: nobody reaches it."""
        if not self.lease_lapsed():
            return False
        partitions = self._replica_manager.replicas.partitions
        return not any(
            hosted.replica.leader is not None and self._still_followed(key)
            for key, hosted in list(partitions.items())
        )

    def _lease_changed(self, lapsed: bool) -> None:
        if not lapsed:
            return
        # Produces already parked on a partition it gives up wait for followers that may
        # now follow another leader: answer them now rather than at their timeout.
        replicas = self._replica_manager.replicas
        for key, hosted in list(replicas.partitions.items()):
            if hosted.replica.leader is not None and not self._still_followed(key):
                replicas.fail_waiters(key)

    # ---------------------------------------------------------------- cluster view
    @property
    def image(self) -> MetadataImage:
        return self.metadata.image

    @property
    def cluster_id(self) -> str:
        return self.metadata.cluster_id

    @property
    def node_id(self) -> int:
        return self.config.node_id

    def controller_id(self) -> int:
        """Where clients should send admin requests. In combined mode the active controller
        is also a broker: naming it saves every admin write the forwarding hop. Otherwise
        (no leader known, or a controller-only leader) this broker takes them and forwards."""
        quorum = self.metadata.quorum
        leader = quorum.core.leader_id if quorum is not None else None
        if leader is None:
            return self.config.node_id
        registration = self.image.brokers.get(leader)
        if registration is not None and not registration.fenced:
            return leader
        return self.config.node_id

    def _note_fences(self, image: MetadataImage, delta: MetadataDelta) -> None:
        now_s = self.clock_s()
        for broker_id, reg in image.brokers.items():
            if not reg.fenced:
                self._seen_unfenced[broker_id] = reg.incarnation_id
                self._fenced_at_s.pop(broker_id, None)
            elif self._seen_unfenced.get(broker_id) == reg.incarnation_id:
                # The process seen serving was fenced (killed, cut off): list it a little
                # longer. A new incarnation (a restart) registers fenced and is not listed
                # until it is unfenced, as KRaft does.
                self._fenced_at_s.setdefault(broker_id, now_s)
            else:
                self._fenced_at_s.pop(broker_id, None)
        for broker_id in self._fenced_at_s.keys() - image.brokers.keys():
            del self._fenced_at_s[broker_id]

    def _listed(self, broker_id: int, fenced: bool, now_s: float) -> bool:
        if not fenced:
            return True
        fenced_at_s = self._fenced_at_s.get(broker_id)
        return fenced_at_s is not None and (now_s - fenced_at_s) * 1000 < FENCED_BROKER_LISTED_MS

    def brokers(self) -> Sequence[BrokerInfo]:
        """The unfenced brokers (KRaft lists no others), and one fenced moments ago
        (FENCED_BROKER_LISTED_MS)."""
        # A broker cut off from everyone counts itself fenced, as the controller is about
        # to: left out, it is no client's choice for the next metadata request either (a
        # client asks a broker it is connected to, and this one's view is stale).
        cut_off = self._cut_off()
        now_s = self.clock_s()
        return [
            BrokerInfo(b, *reg.client_endpoint, reg.rack, fenced=reg.fenced)
            for b, reg in sorted(self.image.brokers.items())
            if self._listed(b, reg.fenced, now_s) and not (cut_off and b == self.config.node_id)
        ]

    def registered_brokers(self) -> Sequence[BrokerInfo]:
        """Every registration in the image, fenced ones flagged (KIP-1073); this broker
        counts itself fenced when cut off, as brokers() does."""
        cut_off = self._cut_off()
        return [
            BrokerInfo(
                b,
                *reg.client_endpoint,
                reg.rack,
                fenced=reg.fenced or (cut_off and b == self.config.node_id),
            )
            for b, reg in sorted(self.image.brokers.items())
        ]

    def topics(self, names: Sequence[str] | None) -> Sequence[TopicInfo]:
        image = self.image
        by_name = image.topics_by_name
        wanted = sorted(by_name) if names is None else [n for n in names if n in by_name]
        fenced = {b for b, reg in image.brokers.items() if reg.fenced}
        # Offline replicas (Kafka: on a failed log dir): those of fenced or unregistered
        # brokers (an UnregisterBroker leaves the id in replica lists), and this
        # broker's own that lost or damaged data or sit on a failed disk (KIP-966's unsafe
        # replicas). Each broker knows only its own: `raftlog cluster status` asks them all.
        unsafe_here = set(self._unsafe_partitions())
        # A broker that stepped down names no leader where its image says it leads: the
        # controller may have elected another, and a client told "this broker" would come
        # straight back (Kafka: LEADER_NOT_AVAILABLE makes it ask again shortly).
        lapsed = self.lease_lapsed()
        out = []
        for name in wanted:
            topic = by_name[name]
            stepped_down = {
                index
                for index, state in topic.partitions.items()
                if lapsed
                and state.leader == self.config.node_id
                and not self._still_followed((name, index))
            }
            partitions = [
                PartitionInfo(
                    index,
                    NO_LEADER if index in stepped_down else state.leader,
                    state.leader_epoch,
                    tuple(state.replicas),
                    tuple(state.isr),
                    tuple(
                        r
                        for r in state.replicas
                        if r in fenced
                        or r not in image.brokers
                        or (r == self.config.node_id and (topic.topic_id, index) in unsafe_here)
                    ),
                    ErrorCode.leader_not_available
                    if state.leader == NO_LEADER or index in stepped_down
                    else ErrorCode.none,
                )
                for index, state in sorted(topic.partitions.items())
            ]
            out.append(TopicInfo(name, topic.topic_id, partitions, name in INTERNAL_TOPICS))
        return out

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        topic = self.image.topics_by_id.get(topic_id)
        return None if topic is None else topic.name

    def auto_create_topics(self) -> bool:
        value = self.image.cluster_config("auto.create.topics.enable")
        if value is None:
            return self.config.auto_create_topics_enable
        return str(value).lower() == "true"

    # ---------------------------------------------------------------- admin: topics
    async def _call(self, request: Any, timeout_ms: int) -> Any:
        timeout_ms = max(
            1000, min(timeout_ms or self.config.request_timeout_ms, self.config.request_timeout_ms)
        )
        return await self.controller.call(request, timeout_ms=timeout_ms)

    async def _await_image(
        self, predicate: Callable[[MetadataImage], bool], timeout_ms: int
    ) -> None:
        """Wait until this broker's image shows a committed change (bounded)."""
        with trio.move_on_after(max(timeout_ms, 1000) / 1000):
            while not predicate(self.image):
                await self.metadata.wait_for_change()

    async def create_topics(
        self, topics: Sequence[cm.NewTopic], timeout_ms: int, validate_only: bool
    ) -> Sequence[CreateTopicResult]:
        # A null config value (Kafka clients may send one) leaves the key at its default.
        request = cm.CreateTopics(
            tuple(
                dataclasses.replace(
                    t, configs={k: v for k, v in t.configs.items() if v is not None}
                )
                for t in topics
            ),
            validate_only,
        )
        reply = await self._call(request, timeout_ms)
        created = [r.name for r in reply.results if r.error_code == ErrorCode.none]
        if created and not validate_only:
            await self._await_image(lambda image: all(image.topic(n) for n in created), timeout_ms)
        return [
            CreateTopicResult(
                r.name,
                r.error_code,
                r.error_message,
                r.topic_id,
                r.num_partitions,
                r.replication_factor,
                topic_config_entries(self.config, self._topic_configs(r.name), None)
                if r.error_code == ErrorCode.none
                else (),
            )
            for r in reply.results
        ]

    async def delete_topics(
        self, topics: Sequence[str | uuid.UUID], timeout_ms: int
    ) -> Sequence[DeleteTopicResult]:
        names = tuple(t for t in topics if isinstance(t, str))
        ids = tuple(t for t in topics if isinstance(t, uuid.UUID))
        reply = await self._call(cm.DeleteTopics(names, ids), timeout_ms)
        gone = [
            r.topic_id
            for r in reply.results
            if r.error_code == ErrorCode.none and r.topic_id is not None
        ]
        if gone:
            await self._await_image(
                lambda image: not any(t in image.topics_by_id for t in gone), timeout_ms
            )
        return [
            DeleteTopicResult(r.name, r.topic_id, r.error_code, r.error_message)
            for r in reply.results
        ]

    async def create_partitions(
        self,
        topic: str,
        total_count: int,
        assignments: Sequence[Sequence[int]] | None,
        timeout_ms: int,
        validate_only: bool,
    ) -> tuple[ErrorCode, str | None]:
        request = cm.CreatePartitions(
            (
                cm.NewPartitions(
                    topic,
                    total_count,
                    tuple(tuple(a) for a in assignments) if assignments else None,
                ),
            ),
            validate_only,
        )
        reply = await self._call(request, timeout_ms)
        result = reply.results[0]
        if result.error_code == ErrorCode.none and not validate_only:
            await self._await_image(
                lambda image: (
                    (t := image.topic(topic)) is not None and len(t.partitions) >= total_count
                ),
                timeout_ms,
            )
        return result.error_code, result.error_message

    # ---------------------------------------------------------------- admin: configs
    def _topic_configs(self, name: str) -> dict[str, str]:
        return dict(self.image.configs.get(("topic", name), {}))

    @staticmethod
    def _resource(resource_type: ConfigResourceType, name: str) -> tuple[str, str]:
        if resource_type == ConfigResourceType.TOPIC:
            return "topic", name
        return ("cluster", "") if name == "" else ("broker", name)

    async def describe_configs(
        self, resource_type: ConfigResourceType, name: str, keys: Sequence[str] | None
    ) -> ConfigsResult:
        image = self.image
        if resource_type == ConfigResourceType.TOPIC:
            if image.topic(name) is None:
                return ConfigsResult(
                    ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist"
                )
            return ConfigsResult(
                configs=topic_config_entries(self.config, self._topic_configs(name), keys)
            )
        if resource_type == ConfigResourceType.BROKER:
            if name and (not name.isdigit() or int(name) not in image.brokers):
                return ConfigsResult(ErrorCode.invalid_request, f"unknown broker {name!r}")
            per_broker = dict(image.configs.get(("broker", name), {})) if name else {}
            cluster = dict(image.configs.get(("cluster", ""), {}))
            entries = broker_config_entries(self.config, per_broker, cluster, keys)
            if name and (keys is None or BROKER_RACK_KEY in keys):
                entries.append(_broker_rack_entry(image.brokers[int(name)].rack))
                entries.sort(key=lambda entry: entry.name)
            return ConfigsResult(configs=entries)
        return ConfigsResult(
            ErrorCode.invalid_request, f"config resource type {int(resource_type)} is not supported"
        )

    async def alter_configs(
        self,
        resource_type: ConfigResourceType,
        name: str,
        configs: dict[str, str | None],
        validate_only: bool,
    ) -> tuple[ErrorCode, str | None]:
        kind, resource_name = self._resource(resource_type, name)
        values = {k: v for k, v in configs.items() if v is not None}
        reply = await self._call(
            cm.AlterConfigs((cm.AlterConfigsResource(kind, resource_name, values),), validate_only),
            0,
        )
        return await self._config_result(reply, kind, resource_name, validate_only)

    async def incremental_alter_configs(
        self,
        resource_type: ConfigResourceType,
        name: str,
        ops: Sequence[tuple[str, AlterConfigOp, str | None]],
        validate_only: bool,
    ) -> tuple[ErrorCode, str | None]:
        kind, resource_name = self._resource(resource_type, name)
        request = cm.IncrementalAlterConfigs(
            (
                cm.IncrementalAlterConfigsResource(
                    kind,
                    resource_name,
                    tuple(cm.ConfigOp(key, CONFIG_OPS[int(op)], value) for key, op, value in ops),
                ),
            ),
            validate_only,
        )
        reply = await self._call(request, 0)
        return await self._config_result(reply, kind, resource_name, validate_only)

    async def _config_result(
        self, reply: cm.AlterConfigsReply, kind: str, name: str, validate_only: bool
    ) -> tuple[ErrorCode, str | None]:
        result = reply.results[0]
        if result.error_code == ErrorCode.none and not validate_only:
            # Make the change visible here before answering (read-your-writes for clients).
            target = self.controller.metadata.quorum
            if target is not None:
                hw = target.high_watermark
                await self._await_image(
                    lambda image: image.last_applied_offset + 1 >= hw,
                    self.config.request_timeout_ms,
                )
        return result.error_code, result.error_message

    # ---------------------------------------------------------------- quotas, ids
    async def describe_client_quotas(
        self, filters: Sequence[QuotaFilter], strict: bool
    ) -> Sequence[tuple[QuotaEntity, dict[str, float]]]:
        out = []
        for entity, values in sorted(self.image.client_quotas.items(), key=repr):
            if _quota_matches(entity, filters, strict) and values:
                out.append((entity, dict(values)))
        return out

    async def alter_client_quotas(
        self, alterations: Sequence[QuotaAlteration], validate_only: bool
    ) -> Sequence[QuotaAlterResult]:
        request = cm.AlterClientQuotas(
            tuple(
                cm.QuotaEntry(
                    a.entity,
                    tuple((key, None if remove else value) for key, value, remove in a.ops),
                )
                for a in alterations
            ),
            validate_only,
        )
        reply = await self._call(request, 0)
        if not validate_only and any(r.error_code == ErrorCode.none for r in reply.results):
            await self._config_result(
                cm.AlterConfigsReply((cm.ConfigResourceResult("", ""),)), "", "", validate_only
            )
        return [QuotaAlterResult(r.entity, r.error_code, r.error_message) for r in reply.results]

    async def init_producer_id(
        self,
        transactional_id: str | None,
        transaction_timeout_ms: int,
        producer_id: int,
        producer_epoch: int,
    ) -> ProducerIdResult:
        if transactional_id is not None:
            # The handlers send these to the transaction coordinator (handlers_txn.py); an id
            # handed out here would be one no coordinator knows.
            return ProducerIdResult(ErrorCode.coordinator_not_available)
        # Without a transactional id there is no state to check an offered id/epoch against
        # (KIP-360 verifies those only for transactional producers), so like Kafka every
        # call gets a fresh producer id at epoch 0. Bumping the offered id's epoch instead
        # would let any client fence another producer by naming its id.
        try:
            new_id = await self._next_producer_id()
        except KafkaError as exc:
            log.warning("producer id allocation failed: %s", exc)
            return ProducerIdResult(ErrorCode.coordinator_not_available)
        return ProducerIdResult(producer_id=new_id, producer_epoch=0)

    async def _next_producer_id(self) -> int:
        async with self._producer_id_lock:
            if not self._producer_ids:
                reply = await self._call(
                    cm.AllocateProducerIds(self.config.node_id, self.lifecycle.broker_epoch), 0
                )
                if reply.error_code != ErrorCode.none:
                    raise KafkaError(reply.error_code, reply.error_message or "")
                start = reply.producer_id_start
                self._producer_ids = list(range(start + reply.producer_id_len - 1, start - 1, -1))
            return self._producer_ids.pop()

    # ---------------------------------------------------------------- transactions
    async def write_txn_markers(
        self, markers: Sequence[TxnMarkerWrite]
    ) -> Sequence[dict[TopicPartitionKey, ErrorCode]]:
        requests = [
            TxnMarkerRequest(
                m.producer_id, m.producer_epoch, m.coordinator_epoch, m.commit, m.partitions
            )
            for m in markers
        ]
        return await self._replica_manager.write_txn_markers(requests)

    async def describe_producers(self, topic: str, partition: int) -> PartitionProducers:
        replicas = self._replica_manager.replicas
        key = (topic, partition)
        hosted = replicas.partitions.get(key)
        if hosted is not None and hosted.replica.leader is not None and not hosted.producers.loaded:
            # A new leader rebuilds its producer state from the log: wait for it (bounded),
            # as a marker does, rather than answer an empty table.
            with trio.move_on_after(MAX_PRODUCER_STATE_WAIT_MS / 1000):
                await hosted.producers.ready.wait()
            hosted = replicas.partitions.get(key)
        if hosted is None or hosted.replica.leader is None:
            return PartitionProducers(replicas.not_leader_error(topic, partition))
        if not hosted.producers.loaded:
            return PartitionProducers(ErrorCode.request_timed_out)
        return PartitionProducers(
            producers=[
                ProducerDescription(
                    producer_id=entry.producer_id,
                    producer_epoch=entry.epoch,
                    last_sequence=entry.last_seq,
                    last_timestamp_ms=entry.last_timestamp_ms,
                    coordinator_epoch=entry.coordinator_epoch,
                    current_txn_start_offset=entry.current_txn_first_offset,
                )
                for entry in hosted.producers.table.entries()
            ]
        )

    # ---------------------------------------------------------------- ACLs and SCRAM
    async def _await_visible(self, predicate: Callable[[MetadataImage], bool]) -> None:
        """Wait (bounded) until this broker's image shows a committed change, so a client
        that changed ACLs or credentials here reads its change back here. A predicate on the
        change itself, not the local high watermark: a broker that is not the controller
        learns of the commit only with its next metadata fetch."""
        await self._await_image(predicate, self.config.request_timeout_ms)

    async def create_acls(self, creations: Sequence[AclBinding]) -> Sequence[AclCreateResult]:
        if not creations:
            return []
        if len(creations) > cm.MAX_ACLS_PER_REQUEST:
            raise KafkaError(
                ErrorCode.invalid_request, f"over {cm.MAX_ACLS_PER_REQUEST} ACLs in one request"
            )
        reply: cm.CreateAclsReply = await self._call(cm.CreateAcls(tuple(creations)), 0)
        # One result per creation; strict: a reply that breaks that is an error, not a guess.
        results = zip(creations, reply.results, strict=True)
        created = {b for b, r in results if r.error_code == ErrorCode.none}
        if created:
            await self._await_visible(lambda image: created <= set(image.acls.values()))
        return [AclCreateResult(r.error_code, r.error_message) for r in reply.results]

    async def describe_acls(self, acl_filter: AclBindingFilter) -> Sequence[AclBinding]:
        message = check_filter(acl_filter)
        if message is not None:
            raise KafkaError(ErrorCode.invalid_request, message)
        return [b for b in self.image.acls.values() if acl_filter.matches(b)]

    async def delete_acls(self, filters: Sequence[AclBindingFilter]) -> Sequence[AclDeleteResult]:
        if not filters:
            return []
        if len(filters) > cm.MAX_ACLS_PER_REQUEST:
            raise KafkaError(
                ErrorCode.invalid_request, f"over {cm.MAX_ACLS_PER_REQUEST} filters in one request"
            )
        reply: cm.DeleteAclsReply = await self._call(cm.DeleteAcls(tuple(filters)), 0)
        deleted = {b for r in reply.results for b in r.matching}
        if deleted:
            await self._await_visible(lambda image: not deleted & set(image.acls.values()))
        return [AclDeleteResult(r.error_code, r.error_message, r.matching) for r in reply.results]

    async def describe_user_scram_credentials(
        self, users: Sequence[str] | None
    ) -> Sequence[ScramUserDescription]:
        return scram_descriptions(self.image, users)

    async def alter_user_scram_credentials(
        self,
        deletions: Sequence[cm.ScramCredentialDeletion],
        upsertions: Sequence[cm.ScramCredentialUpsertion],
    ) -> Sequence[ScramAlterResult]:
        if not deletions and not upsertions:
            return []
        limit = cm.MAX_SCRAM_ALTERATIONS_PER_REQUEST
        if len(deletions) > limit or len(upsertions) > limit:
            raise KafkaError(ErrorCode.invalid_request, f"over {limit} alterations in one request")
        request = cm.AlterUserScramCredentials(tuple(deletions), tuple(upsertions))
        reply: cm.AlterUserScramCredentialsReply = await self._call(request, 0)
        done = {r.user for r in reply.results if r.error_code == ErrorCode.none}
        gone = [(d.name, ScramMechanism(d.mechanism)) for d in deletions if d.name in done]
        # An upsertion is visible when the image holds its salt and iterations.
        upserted = {
            (u.name, ScramMechanism(u.mechanism)): (u.salt, u.iterations)
            for u in upsertions
            if u.name in done
        }

        def visible(image: MetadataImage) -> bool:
            held = image.scram_credentials
            return not any(key in held for key in gone) and all(
                (c := held.get(key)) is not None and (c.salt, c.iterations) == want
                for key, want in upserted.items()
            )

        if done:
            await self._await_visible(visible)
        return [ScramAlterResult(r.user, r.error_code, r.error_message) for r in reply.results]

    def scram_credential(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        return self.image.scram_credentials.get((user, mechanism))

    def acl_bindings(self) -> Collection[AclBinding]:
        # A view of the image's read-only map, which is never changed in place: a snapshot.
        return self.image.acls.values()


def _broker_rack_entry(rack: str | None) -> ConfigEntry:
    # Kafka: a static key left unset is described as its default (null), not as static.
    source = ConfigSource.STATIC_BROKER_CONFIG if rack else ConfigSource.DEFAULT_CONFIG
    return ConfigEntry(BROKER_RACK_KEY, rack or None, read_only=True, source=source)


def scram_descriptions(
    image: MetadataImage, users: Sequence[str] | None
) -> list[ScramUserDescription]:
    """DescribeUserScramCredentials from an image (KIP-554): every user when `users` is None
    or empty; otherwise one result per distinct name, in request order."""
    by_user: dict[str, list[tuple[ScramMechanism, int]]] = {}
    for (user, mechanism), credential in sorted(image.scram_credentials.items()):
        by_user.setdefault(user, []).append((mechanism, credential.iterations))
    if not users:
        return [ScramUserDescription(u, credentials=tuple(c)) for u, c in sorted(by_user.items())]
    counts = Counter(users)
    out = []
    for user in dict.fromkeys(users):
        if counts[user] > 1:
            out.append(
                ScramUserDescription(
                    user,
                    ErrorCode.duplicate_resource,
                    "cannot describe the same user twice in one request",
                )
            )
        elif user not in by_user:
            out.append(
                ScramUserDescription(
                    user, ErrorCode.resource_not_found, "the user has no SCRAM credentials"
                )
            )
        else:
            out.append(ScramUserDescription(user, credentials=tuple(by_user[user])))
    return out


def _quota_matches(entity: QuotaEntity, filters: Sequence[QuotaFilter], strict: bool) -> bool:
    components = dict(entity)
    for f in filters:
        if f.entity_type not in components:
            return False
        name = components[f.entity_type]
        if f.match_type == QUOTA_MATCH_EXACT and name != f.match:
            return False
        if f.match_type == QUOTA_MATCH_DEFAULT and name is not None:
            return False
    return not strict or len(components) == len(filters)
