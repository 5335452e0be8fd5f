"""MetadataImage: the immutable cluster state built from committed metadata records.

`image.apply(records, offset)` returns a new image and a MetadataDelta; the old image stays
valid (readers holding it are never surprised). Applying is copy-on-write: only the maps that a
batch touches are copied, once per batch, so applying a handful of records to a cluster with
thousands of partitions copies the topic map and one partition map, not the world.

Every map handed out is a read-only MappingProxyType so a consumer cannot corrupt the shared
state by accident.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from raftlog.config_keys import parse_topic_config
from raftlog.constants import NO_LEADER
from raftlog.errors import LocalError
from raftlog.metadata import records as r
from raftlog.security.acl import AclBinding, ScramCredential, ScramMechanism

__all__ = [
    "BrokerRegistration",
    "LocalChanges",
    "MetadataApplyError",
    "MetadataDelta",
    "MetadataImage",
    "PartitionState",
    "TopicImage",
]

_EMPTY: Mapping[Any, Any] = MappingProxyType({})
ConfigResource = tuple[str, str]
QuotaEntity = tuple[tuple[str, str | None], ...]
ScramKey = tuple[str, ScramMechanism]  # (user name, mechanism)


class MetadataApplyError(LocalError):
    """A committed record does not fit the image (a controller bug or a damaged log)."""


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    broker_id: int
    incarnation_id: uuid.UUID
    epoch: int
    client_endpoint: tuple[str, int]
    internal_endpoint: tuple[str, int]
    rack: str | None
    fenced: bool = True
    in_controlled_shutdown: bool = False
    # (name, host, port, security protocol) per client listener; empty: an older broker
    # whose one PLAINTEXT listener is client_endpoint.
    listeners: tuple[tuple[str, str, int, str], ...] = ()

    def listener_endpoint(self, name: str) -> tuple[str, int] | None:
        """The broker's advertised endpoint on listener `name`, None if it has none."""
        for listener_name, host, port, _protocol in self.listeners:
            if listener_name == name:
                return host, port
        return None

    @property
    def eligible_leader(self) -> bool:
        """May lead partitions and be elected: unfenced and not shutting down."""
        return not self.fenced and not self.in_controlled_shutdown


@dataclass(frozen=True, slots=True)
class PartitionState:
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    # A reassignment in progress (KIP-455): `replicas` is the target followed by the replicas
    # leaving; these name the joining and the leaving ones. Both empty: none in progress.
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()

    @property
    def offline(self) -> bool:
        return self.leader == NO_LEADER

    @property
    def reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)

    @property
    def target_replicas(self) -> tuple[int, ...]:
        """The replicas the partition has once its reassignment completes (the replicas
        when none is in progress)."""
        return tuple(b for b in self.replicas if b not in self.removing_replicas)

    @property
    def original_replicas(self) -> tuple[int, ...]:
        """The replicas before the reassignment began: what cancelling it returns to."""
        return tuple(b for b in self.replicas if b not in self.adding_replicas)


@dataclass(frozen=True, slots=True)
class TopicImage:
    name: str
    topic_id: uuid.UUID
    partitions: Mapping[int, PartitionState]


@dataclass(frozen=True, slots=True)
class LocalChanges:
    """What one broker must do after a delta (Kafka's TopicsDelta.localChanges)."""

    leaders: dict[tuple[uuid.UUID, int], PartitionState]
    followers: dict[tuple[uuid.UUID, int], PartitionState]
    deleted: set[tuple[uuid.UUID, int]]


@dataclass(frozen=True, slots=True)
class MetadataDelta:
    """What one apply() changed, with old and new states so consumers can diff."""

    created_topics: dict[uuid.UUID, TopicImage] = field(default_factory=dict)
    deleted_topics: dict[uuid.UUID, TopicImage] = field(default_factory=dict)
    # (topic_id, partition) -> (old state or None if new, new state or None if deleted)
    changed_partitions: dict[
        tuple[uuid.UUID, int], tuple[PartitionState | None, PartitionState | None]
    ] = field(default_factory=dict)
    changed_brokers: dict[int, tuple[BrokerRegistration | None, BrokerRegistration | None]] = field(
        default_factory=dict
    )
    changed_configs: set[ConfigResource] = field(default_factory=set)
    changed_quotas: set[QuotaEntity] = field(default_factory=set)
    producer_ids_changed: bool = False
    controller_changed: bool = False
    features_changed: bool = False
    acls_changed: bool = False
    changed_scram_credentials: set[ScramKey] = field(default_factory=set)

    @property
    def empty(self) -> bool:
        return not (
            self.created_topics
            or self.deleted_topics
            or self.changed_partitions
            or self.changed_brokers
            or self.changed_configs
            or self.changed_quotas
            or self.producer_ids_changed
            or self.controller_changed
            or self.features_changed
            or self.acls_changed
            or self.changed_scram_credentials
        )

    def local_changes(self, broker_id: int) -> LocalChanges:
        """Partitions this broker must now lead, follow, or drop (no longer a replica)."""
        leaders: dict[tuple[uuid.UUID, int], PartitionState] = {}
        followers: dict[tuple[uuid.UUID, int], PartitionState] = {}
        deleted: set[tuple[uuid.UUID, int]] = set()
        for key, (old, new) in self.changed_partitions.items():
            if new is None or broker_id not in new.replicas:
                if old is not None and broker_id in old.replicas:
                    deleted.add(key)
            elif new.leader == broker_id:
                leaders[key] = new
            else:
                followers[key] = new
        return LocalChanges(leaders, followers, deleted)


class _Cow:
    """A map copied on its first write; result() freezes it again."""

    __slots__ = ("_base", "_copy")

    def __init__(self, base: Mapping[Any, Any]) -> None:
        self._base = base
        self._copy: dict[Any, Any] | None = None

    def _view(self) -> Mapping[Any, Any]:
        return self._base if self._copy is None else self._copy

    def get(self, key: Any, default: Any = None) -> Any:
        return self._view().get(key, default)

    def __contains__(self, key: Any) -> bool:
        return key in self._view()

    def _write(self) -> dict[Any, Any]:
        if self._copy is None:
            self._copy = dict(self._base)
        return self._copy

    def set(self, key: Any, value: Any) -> None:
        self._write()[key] = value

    def pop(self, key: Any) -> Any:
        return self._write().pop(key, None)

    def result(self) -> Mapping[Any, Any]:
        return self._base if self._copy is None else MappingProxyType(self._copy)


@dataclass(frozen=True, slots=True)
class MetadataImage:
    cluster_id: str = ""
    brokers: Mapping[int, BrokerRegistration] = field(default_factory=lambda: _EMPTY)
    topics_by_id: Mapping[uuid.UUID, TopicImage] = field(default_factory=lambda: _EMPTY)
    topic_ids_by_name: Mapping[str, uuid.UUID] = field(default_factory=lambda: _EMPTY)
    configs: Mapping[ConfigResource, Mapping[str, str]] = field(default_factory=lambda: _EMPTY)
    client_quotas: Mapping[QuotaEntity, Mapping[str, float]] = field(default_factory=lambda: _EMPTY)
    features: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    next_producer_id: int = 0
    controller_id: int = -1
    controller_epoch: int = -1
    last_applied_offset: int = -1
    last_applied_epoch: int = -1
    # ACLs by the id their AccessControlEntry record gave them (Kafka's AclControlManager).
    acls: Mapping[uuid.UUID, AclBinding] = field(default_factory=lambda: _EMPTY)
    scram_credentials: Mapping[ScramKey, ScramCredential] = field(default_factory=lambda: _EMPTY)
    # broker id -> the epoch of its last registration, for brokers unregistered since: the
    # next registration of that id continues from it, so a broker epoch is never reused and
    # a stale process of the removed incarnation stays fenced by epoch.
    unregistered_broker_epochs: Mapping[int, int] = field(default_factory=lambda: _EMPTY)

    # ---------------------------------------------------------------- lookups
    @classmethod
    def empty(cls, cluster_id: str = "") -> MetadataImage:
        return cls(cluster_id=cluster_id)

    def topic(self, name: str) -> TopicImage | None:
        topic_id = self.topic_ids_by_name.get(name)
        return None if topic_id is None else self.topics_by_id[topic_id]

    @property
    def topics_by_name(self) -> Mapping[str, TopicImage]:
        return MappingProxyType(
            {name: self.topics_by_id[t] for name, t in self.topic_ids_by_name.items()}
        )

    def partition(self, topic_id: uuid.UUID, index: int) -> PartitionState | None:
        topic = self.topics_by_id.get(topic_id)
        return None if topic is None else topic.partitions.get(index)

    def iter_partitions(self) -> Iterator[tuple[TopicImage, int, PartitionState]]:
        for topic in self.topics_by_id.values():
            for index, state in topic.partitions.items():
                yield topic, index, state

    def partitions_led_by(self, broker_id: int) -> list[tuple[str, int]]:
        """(topic name, partition) pairs this broker leads, sorted."""
        return sorted(
            (topic.name, index)
            for topic, index, state in self.iter_partitions()
            if state.leader == broker_id
        )

    def unfenced_brokers(self) -> list[int]:
        return sorted(b for b, reg in self.brokers.items() if not reg.fenced)

    def topic_config(self, name: str, key: str, default: Any = None) -> Any:
        """A topic's config value, parsed to its type when the key is a known topic config."""
        raw = self.configs.get(("topic", name), _EMPTY).get(key)
        if raw is None:
            return default
        return parse_topic_config(key, raw)

    def cluster_config(self, key: str, default: Any = None) -> str | Any:
        return self.configs.get(("cluster", ""), _EMPTY).get(key, default)

    # ---------------------------------------------------------------- invariants
    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant (used by tests and replay)."""
        for topic, index, p in self.iter_partitions():
            where = f"{topic.name}-{index}: {p}"
            assert len(set(p.replicas)) == len(p.replicas) and p.replicas, f"replicas {where}"
            assert set(p.isr) <= set(p.replicas), f"ISR not within replicas {where}"
            assert p.isr, f"empty ISR {where}"
            assert p.leader == NO_LEADER or p.leader in p.isr, f"leader not in ISR {where}"
            assert p.leader_epoch >= 0 and p.partition_epoch >= 0, f"epochs {where}"
            moving = set(p.adding_replicas) | set(p.removing_replicas)
            assert moving <= set(p.replicas), f"reassigning replicas not within replicas {where}"
            assert not set(p.adding_replicas) & set(p.removing_replicas), f"adding+removing {where}"
            assert p.target_replicas, f"a reassignment that removes every replica {where}"
        for name, topic_id in self.topic_ids_by_name.items():
            assert self.topics_by_id[topic_id].name == name, f"name index broken for {name}"
        assert len(self.topic_ids_by_name) == len(self.topics_by_id), "topic indexes differ"

    # ---------------------------------------------------------------- apply
    def apply(
        self, records: Iterable[r.Record], offset: int, epoch: int | None = None
    ) -> tuple[MetadataImage, MetadataDelta]:
        """Apply committed records; `offset` is the log offset of the last of them.

        `epoch` is the Raft epoch of that entry (defaults to the last LeaderChange seen).
        """
        builder = _Builder(self)
        for record in records:
            builder.apply(record)
        return builder.finish(offset, epoch)


class _Builder:
    def __init__(self, image: MetadataImage) -> None:
        self.old = image
        self.brokers = _Cow(image.brokers)
        self.topics = _Cow(image.topics_by_id)
        self.names = _Cow(image.topic_ids_by_name)
        # topic id -> mutable partition map of a topic touched in this batch
        self.partitions: dict[uuid.UUID, dict[int, PartitionState]] = {}
        # partitions written in this batch, so finish() diffs only those
        self.touched: set[tuple[uuid.UUID, int]] = set()
        self.configs = _Cow(image.configs)
        self.config_maps: dict[ConfigResource, dict[str, str]] = {}
        self.quotas = _Cow(image.client_quotas)
        self.quota_maps: dict[QuotaEntity, dict[str, float]] = {}
        self.features = _Cow(image.features)
        self.next_producer_id = image.next_producer_id
        self.controller = (image.controller_id, image.controller_epoch)
        self.delta = MetadataDelta()
        self.acls = _Cow(image.acls)
        self.scram = _Cow(image.scram_credentials)
        self.unregistered = _Cow(image.unregistered_broker_epochs)

    # -------------------------------------------------------------- helpers
    def _broker(self, broker_id: int, what: str) -> BrokerRegistration:
        reg = self.brokers.get(broker_id)
        if reg is None:
            raise MetadataApplyError(f"{what}: broker {broker_id} is not registered")
        return reg

    def _set_broker(self, reg: BrokerRegistration) -> None:
        old = self.old.brokers.get(reg.broker_id)
        self.brokers.set(reg.broker_id, reg)
        self.delta.changed_brokers[reg.broker_id] = (old, reg)

    def _partition_map(self, topic_id: uuid.UUID, what: str) -> dict[int, PartitionState]:
        parts = self.partitions.get(topic_id)
        if parts is None:
            topic = self.topics.get(topic_id)
            if topic is None:
                raise MetadataApplyError(f"{what}: unknown topic id {topic_id}")
            parts = self.partitions[topic_id] = dict(topic.partitions)
        return parts

    def _set_partition(self, topic_id: uuid.UUID, index: int, state: PartitionState) -> None:
        self.touched.add((topic_id, index))
        self._partition_map(topic_id, "partition")[index] = state

    def _config_map(self, resource: ConfigResource) -> dict[str, str]:
        values = self.config_maps.get(resource)
        if values is None:
            values = self.config_maps[resource] = dict(self.configs.get(resource, _EMPTY))
        return values

    def _quota_map(self, entity: QuotaEntity) -> dict[str, float]:
        values = self.quota_maps.get(entity)
        if values is None:
            values = self.quota_maps[entity] = dict(self.quotas.get(entity, _EMPTY))
        return values

    # -------------------------------------------------------------- records
    def apply(self, rec: r.Record) -> None:
        handler = _HANDLERS.get(type(rec))
        if handler is None:
            raise MetadataApplyError(f"no image handler for {type(rec).__name__}")
        handler(self, rec)

    def register_broker(self, rec: r.RegisterBroker) -> None:
        if rec.broker_id in self.unregistered:
            self.unregistered.pop(rec.broker_id)
        self._set_broker(
            BrokerRegistration(
                broker_id=rec.broker_id,
                incarnation_id=rec.incarnation_id,
                epoch=rec.broker_epoch,
                client_endpoint=(rec.client_host, rec.client_port),
                internal_endpoint=(rec.internal_host, rec.internal_port),
                rack=rec.rack,
                listeners=rec.listeners,
            )
        )

    def fence_broker(self, rec: r.FenceBroker) -> None:
        reg = self._broker(rec.broker_id, "FenceBroker")
        self._set_broker(replace(reg, fenced=True))

    def unfence_broker(self, rec: r.UnfenceBroker) -> None:
        reg = self._broker(rec.broker_id, "UnfenceBroker")
        self._set_broker(replace(reg, fenced=False, in_controlled_shutdown=False))

    def shutdown_begin(self, rec: r.BrokerShutdownBegin) -> None:
        reg = self._broker(rec.broker_id, "BrokerShutdownBegin")
        self._set_broker(replace(reg, in_controlled_shutdown=True))

    def unregister_broker(self, rec: r.UnregisterBroker) -> None:
        reg = self._broker(rec.broker_id, "UnregisterBroker")
        if reg.epoch != rec.broker_epoch:
            raise MetadataApplyError(
                f"UnregisterBroker of broker {rec.broker_id} epoch {rec.broker_epoch}, "
                f"registered with epoch {reg.epoch}"
            )
        # Replica lists keep the id (Kafka's offline replicas): the controller fenced the
        # broker first, so it leads nothing and stays only in ISRs it was the last member of.
        old = self.old.brokers.get(rec.broker_id)
        self.brokers.pop(rec.broker_id)
        self.unregistered.set(rec.broker_id, rec.broker_epoch)
        if old is None:
            # Registered and unregistered within this batch: no change to report.
            self.delta.changed_brokers.pop(rec.broker_id, None)
        else:
            self.delta.changed_brokers[rec.broker_id] = (old, None)

    def topic(self, rec: r.Topic) -> None:
        if rec.name in self.names or rec.topic_id in self.topics:
            raise MetadataApplyError(f"Topic {rec.name} ({rec.topic_id}) already exists")
        topic = TopicImage(rec.name, rec.topic_id, _EMPTY)
        self.topics.set(rec.topic_id, topic)
        self.names.set(rec.name, rec.topic_id)
        self.partitions[rec.topic_id] = {}
        self.delta.created_topics[rec.topic_id] = topic

    def partition(self, rec: r.Partition) -> None:
        self._partition_map(rec.topic_id, "Partition")  # raises for an unknown topic
        self._set_partition(
            rec.topic_id,
            rec.partition,
            PartitionState(
                rec.replicas,
                rec.isr,
                rec.leader,
                rec.leader_epoch,
                rec.partition_epoch,
                rec.adding_replicas,
                rec.removing_replicas,
            ),
        )

    def partition_change(self, rec: r.PartitionChange) -> None:
        old = self._partition_map(rec.topic_id, "PartitionChange").get(rec.partition)
        if old is None:
            raise MetadataApplyError(f"PartitionChange for unknown partition {rec}")
        leader = old.leader if rec.leader is None else rec.leader  # None: leader unchanged
        leader_changed = leader != old.leader
        self._set_partition(
            rec.topic_id,
            rec.partition,
            PartitionState(
                replicas=old.replicas if rec.replicas is None else rec.replicas,
                isr=old.isr if rec.isr is None else rec.isr,
                leader=leader,
                leader_epoch=old.leader_epoch + 1 if leader_changed else old.leader_epoch,
                partition_epoch=old.partition_epoch + 1,
                adding_replicas=old.adding_replicas
                if rec.adding_replicas is None
                else rec.adding_replicas,
                removing_replicas=old.removing_replicas
                if rec.removing_replicas is None
                else rec.removing_replicas,
            ),
        )

    def remove_topic(self, rec: r.RemoveTopic) -> None:
        topic = self.topics.get(rec.topic_id)
        if topic is None:
            raise MetadataApplyError(f"RemoveTopic for unknown topic id {rec.topic_id}")
        self.topics.pop(rec.topic_id)
        self.names.pop(topic.name)
        self.partitions.pop(rec.topic_id, None)
        # Kafka drops a topic's configs with the topic, so a re-created topic starts clean.
        resource = ("topic", topic.name)
        had_configs = self.config_maps.pop(resource, None) is not None
        if resource in self.configs:
            self.configs.pop(resource)
            had_configs = True
        if had_configs:
            self.delta.changed_configs.add(resource)
        if rec.topic_id in self.delta.created_topics:
            del self.delta.created_topics[rec.topic_id]
        else:
            self.delta.deleted_topics[rec.topic_id] = self.old.topics_by_id[rec.topic_id]

    def config(self, rec: r.Config) -> None:
        resource = (rec.resource_type, rec.resource_name)
        values = self._config_map(resource)
        if rec.value is None:
            values.pop(rec.key, None)
        else:
            values[rec.key] = rec.value
        self.delta.changed_configs.add(resource)

    def client_quota(self, rec: r.ClientQuota) -> None:
        values = self._quota_map(rec.entity)
        if rec.value is None:
            values.pop(rec.key, None)
        else:
            values[rec.key] = rec.value
        self.delta.changed_quotas.add(rec.entity)

    def producer_ids(self, rec: r.ProducerIds) -> None:
        if rec.next_producer_id < self.next_producer_id:
            raise MetadataApplyError(
                f"ProducerIds would move next id back from {self.next_producer_id} to "
                f"{rec.next_producer_id}"
            )
        self.next_producer_id = rec.next_producer_id
        self.delta = replace(self.delta, producer_ids_changed=True)

    def leader_change(self, rec: r.LeaderChange) -> None:
        self.controller = (rec.leader_id, rec.epoch)
        self.delta = replace(self.delta, controller_changed=True)

    def feature_level(self, rec: r.FeatureLevel) -> None:
        self.features.set(rec.name, rec.level)
        self.delta = replace(self.delta, features_changed=True)

    def access_control_entry(self, rec: r.AccessControlEntry) -> None:
        if rec.id in self.acls:
            raise MetadataApplyError(f"AccessControlEntry {rec.id} already exists")
        self.acls.set(rec.id, rec.binding)
        self.delta = replace(self.delta, acls_changed=True)

    def remove_access_control_entry(self, rec: r.RemoveAccessControlEntry) -> None:
        if self.acls.pop(rec.id) is None:
            raise MetadataApplyError(f"RemoveAccessControlEntry for unknown ACL id {rec.id}")
        self.delta = replace(self.delta, acls_changed=True)

    def user_scram_credential(self, rec: r.UserScramCredential) -> None:
        credential = rec.credential
        key = (rec.name, credential.mechanism)
        self.scram.set(key, credential)
        self.delta.changed_scram_credentials.add(key)

    def remove_user_scram_credential(self, rec: r.RemoveUserScramCredential) -> None:
        key = (rec.name, ScramMechanism(rec.mechanism))
        if self.scram.pop(key) is None:
            raise MetadataApplyError(
                f"RemoveUserScramCredential for {rec.name!r} {key[1].sasl_name}, which has none"
            )
        self.delta.changed_scram_credentials.add(key)

    # -------------------------------------------------------------- finish
    def finish(self, offset: int, epoch: int | None) -> tuple[MetadataImage, MetadataDelta]:
        old = self.old
        for topic_id, parts in self.partitions.items():
            topic = self.topics.get(topic_id)
            self.topics.set(topic_id, replace(topic, partitions=MappingProxyType(parts)))
        for topic_id, index in sorted(self.touched, key=lambda key: (key[0].int, key[1])):
            touched_parts = self.partitions.get(topic_id)
            if touched_parts is None:
                continue  # the topic was removed later in the batch
            before = old.topics_by_id.get(topic_id)
            old_state = before.partitions.get(index) if before is not None else None
            new_state = touched_parts[index]
            if old_state != new_state:
                self.delta.changed_partitions[(topic_id, index)] = (old_state, new_state)
        for topic_id in self.delta.deleted_topics:
            for index, state in old.topics_by_id[topic_id].partitions.items():
                self.delta.changed_partitions[(topic_id, index)] = (state, None)
        for topic_id in self.delta.created_topics:
            self.delta.created_topics[topic_id] = self.topics.get(topic_id)
        for resource, values in self.config_maps.items():
            if values:
                self.configs.set(resource, MappingProxyType(values))
            elif resource in self.configs:
                self.configs.pop(resource)
        for entity, quota in self.quota_maps.items():
            if quota:
                self.quotas.set(entity, MappingProxyType(quota))
            elif entity in self.quotas:
                self.quotas.pop(entity)
        controller_id, controller_epoch = self.controller
        image = MetadataImage(
            cluster_id=old.cluster_id,
            brokers=self.brokers.result(),
            topics_by_id=self.topics.result(),
            topic_ids_by_name=self.names.result(),
            configs=self.configs.result(),
            client_quotas=self.quotas.result(),
            features=self.features.result(),
            next_producer_id=self.next_producer_id,
            controller_id=controller_id,
            controller_epoch=controller_epoch,
            last_applied_offset=offset,
            last_applied_epoch=epoch
            if epoch is not None
            else max(old.last_applied_epoch, controller_epoch),
            acls=self.acls.result(),
            scram_credentials=self.scram.result(),
            unregistered_broker_epochs=self.unregistered.result(),
        )
        return image, self.delta


_HANDLERS: dict[type[r.Record], Any] = {
    r.RegisterBroker: _Builder.register_broker,
    r.FenceBroker: _Builder.fence_broker,
    r.UnfenceBroker: _Builder.unfence_broker,
    r.BrokerShutdownBegin: _Builder.shutdown_begin,
    r.UnregisterBroker: _Builder.unregister_broker,
    r.Topic: _Builder.topic,
    r.Partition: _Builder.partition,
    r.PartitionChange: _Builder.partition_change,
    r.RemoveTopic: _Builder.remove_topic,
    r.Config: _Builder.config,
    r.ClientQuota: _Builder.client_quota,
    r.ProducerIds: _Builder.producer_ids,
    r.LeaderChange: _Builder.leader_change,
    r.FeatureLevel: _Builder.feature_level,
    r.AccessControlEntry: _Builder.access_control_entry,
    r.RemoveAccessControlEntry: _Builder.remove_access_control_entry,
    r.UserScramCredential: _Builder.user_scram_credential,
    r.RemoveUserScramCredential: _Builder.remove_user_scram_credential,
}


def diff_images(old: MetadataImage, new: MetadataImage) -> MetadataDelta:
    """The delta that takes `old` to `new`, for a jump no record-by-record apply describes: a
    snapshot loaded over a running image. Deletions are in it too, so a broker drops the
    replicas of topics deleted in the part of the log the snapshot skipped."""
    created = {tid: t for tid, t in new.topics_by_id.items() if tid not in old.topics_by_id}
    deleted = {tid: t for tid, t in old.topics_by_id.items() if tid not in new.topics_by_id}
    partitions: dict[
        tuple[uuid.UUID, int], tuple[PartitionState | None, PartitionState | None]
    ] = {}
    for topic_id in old.topics_by_id.keys() | new.topics_by_id.keys():
        old_topic, new_topic = old.topics_by_id.get(topic_id), new.topics_by_id.get(topic_id)
        old_parts = old_topic.partitions if old_topic is not None else {}
        new_parts = new_topic.partitions if new_topic is not None else {}
        for index in old_parts.keys() | new_parts.keys():
            before, after = old_parts.get(index), new_parts.get(index)
            if before != after:
                partitions[(topic_id, index)] = (before, after)
    brokers = {
        broker_id: (old.brokers.get(broker_id), new.brokers.get(broker_id))
        for broker_id in old.brokers.keys() | new.brokers.keys()
        if old.brokers.get(broker_id) != new.brokers.get(broker_id)
    }
    return MetadataDelta(
        created_topics=created,
        deleted_topics=deleted,
        changed_partitions=partitions,
        changed_brokers=brokers,
        changed_configs={
            resource
            for resource in old.configs.keys() | new.configs.keys()
            if dict(old.configs.get(resource, {})) != dict(new.configs.get(resource, {}))
        },
        changed_quotas={
            entity
            for entity in old.client_quotas.keys() | new.client_quotas.keys()
            if dict(old.client_quotas.get(entity, {})) != dict(new.client_quotas.get(entity, {}))
        },
        producer_ids_changed=old.next_producer_id != new.next_producer_id,
        controller_changed=(old.controller_id, old.controller_epoch)
        != (new.controller_id, new.controller_epoch),
        features_changed=dict(old.features) != dict(new.features),
        acls_changed=dict(old.acls) != dict(new.acls),
        changed_scram_credentials={
            key
            for key in old.scram_credentials.keys() | new.scram_credentials.keys()
            if old.scram_credentials.get(key) != new.scram_credentials.get(key)
        },
    )
