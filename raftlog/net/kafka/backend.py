"""The seam between the Kafka protocol layer and the node.

The protocol layer (codec, server, handlers) speaks kio; the node speaks these plain-Python
types. A node implements `KafkaBackend`; the handlers translate each Kafka request into calls
on it and its answers back into the version of the response the client asked for. Nothing in
here imports kio, so storage/replication/metadata never see protocol types.

Errors: a method returns an ErrorCode inside its result where Kafka reports errors per item
(per partition, per topic, per resource), or raises `raftlog.errors.KafkaError` for an error
of the whole call. Any other exception is a bug: the handler answers UNKNOWN_SERVER_ERROR and
logs the traceback.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol, runtime_checkable

import trio

from raftlog.errors import ErrorCode
from raftlog.metadata.controller.messages import (
    NewTopic,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
)
from raftlog.security.acl import AclBinding, AclBindingFilter, ScramCredential, ScramMechanism
from raftlog.storage.segment import FileRegion

# Kafka's special ListOffsets timestamps.


class IsolationLevel(IntEnum):
    READ_UNCOMMITTED = 0
    READ_COMMITTED = 1


class ConfigResourceType(IntEnum):
    TOPIC = 2
    BROKER = 4


class ConfigSource(IntEnum):
    """Kafka's DescribeConfigs config_source values."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


class AlterConfigOp(IntEnum):
    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


# ------------------------------------------------------------------------------ cluster
@dataclass(frozen=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None = None
    # Registered but not let serve by the controller (DescribeCluster v2, KIP-1073).
    fenced: bool = False


@dataclass(frozen=True)
class LeaderHint:
    """Where a partition's leader is now (KIP-951: lets a client re-route without a
    metadata round trip)."""

    leader_id: int
    leader_epoch: int


@dataclass(frozen=True)
class PartitionInfo:
    partition: int
    leader_id: int  # -1 when offline
    leader_epoch: int
    replicas: Sequence[int]
    isr: Sequence[int]
    offline_replicas: Sequence[int] = ()
    error: ErrorCode = ErrorCode.none


@dataclass(frozen=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: Sequence[PartitionInfo]
    is_internal: bool = False


# ------------------------------------------------------------------------------ produce
@dataclass(frozen=True)
class ProducerInfo:
    """Who sent a produce request; the batches themselves carry producer id/epoch/sequence."""

    client_id: str | None = None
    transactional_id: str | None = None
    # Called once the partition's batches are appended, or refused, before any acks wait:
    # the next Produce of the connection may then go (raftlog.net.kafka.turns).
    appended: Callable[[], None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ProduceResult:
    error: ErrorCode = ErrorCode.none
    base_offset: int = -1
    log_append_time_ms: int = -1  # -1: CreateTime topic
    log_start_offset: int = -1
    error_message: str | None = None
    current_leader: LeaderHint | None = None  # set with NOT_LEADER_OR_FOLLOWER
    # KIP-467: (index in the batch, why) of the records that made INVALID_RECORD refuse it.
    record_errors: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class DeleteRecordsResult:
    """DeleteRecords for one partition: the log start it has now (its low watermark)."""

    error: ErrorCode = ErrorCode.none
    low_watermark: int = -1
    error_message: str | None = None


# ------------------------------------------------------------------------------ fetch
@dataclass(frozen=True)
class FetchResult:
    error: ErrorCode = ErrorCode.none
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    # Whole record batches, in offset order, never past the high watermark (for
    # read_committed: never past the last stable offset).
    records: Sequence[bytes | FileRegion] = ()
    diverging_epoch: tuple[int, int] | None = None  # (epoch, end_offset) for a follower
    current_leader: LeaderHint | None = None
    preferred_read_replica: int = -1
    # read_committed: (producer_id, first_offset) of every aborted transaction overlapping
    # `records`, oldest first (Kafka's FetchResponse aborted_transactions).
    aborted_transactions: Sequence[tuple[int, int]] = ()

    @property
    def records_bytes(self) -> int:
        return sum(r.length_bytes if isinstance(r, FileRegion) else len(r) for r in self.records)


@dataclass(frozen=True)
class ListOffsetsResult:
    error: ErrorCode = ErrorCode.none
    timestamp_ms: int = -1
    offset: int = -1
    leader_epoch: int = -1


@dataclass(frozen=True)
class EpochEndOffset:
    error: ErrorCode = ErrorCode.none
    leader_epoch: int = -1
    end_offset: int = -1


# ------------------------------------------------------------------------------ admin
@dataclass(frozen=True)
class ConfigEntry:
    name: str
    value: str | None
    read_only: bool = False
    source: ConfigSource = ConfigSource.DEFAULT_CONFIG
    sensitive: bool = False
    doc: str | None = None

    @property
    def is_default(self) -> bool:
        return self.source == ConfigSource.DEFAULT_CONFIG


@dataclass(frozen=True)
class CreateTopicResult:
    name: str
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    topic_id: uuid.UUID | None = None
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Sequence[ConfigEntry] = ()


@dataclass(frozen=True)
class DeleteTopicResult:
    name: str | None
    topic_id: uuid.UUID | None = None
    error: ErrorCode = ErrorCode.none
    message: str | None = None


@dataclass(frozen=True)
class ConfigsResult:
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    configs: Sequence[ConfigEntry] = ()


# A client-quota entity: (entity_type, name) pairs, e.g. (("user", "alice"),); name None is
# the default entity of that type.
QuotaEntity = tuple[tuple[str, str | None], ...]


@dataclass(frozen=True)
class QuotaFilter:
    entity_type: str
    match_type: int  # 0: exact name, 1: default entity, 2: any
    match: str | None = None


@dataclass(frozen=True)
class QuotaAlteration:
    entity: QuotaEntity
    # (key, value, remove) — remove=True deletes the key.
    ops: Sequence[tuple[str, float, bool]]


@dataclass(frozen=True)
class QuotaAlterResult:
    entity: QuotaEntity
    error: ErrorCode = ErrorCode.none
    message: str | None = None


@dataclass(frozen=True)
class ProducerIdResult:
    error: ErrorCode = ErrorCode.none
    producer_id: int = -1
    producer_epoch: int = -1


# ------------------------------------------------------------------------------ transactions
# (topic, partition)
TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True)
class TxnMarkerWrite:
    """One COMMIT/ABORT marker of a WriteTxnMarkers request, to write on `partitions`
    (Kafka's WritableTxnMarker)."""

    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    commit: bool
    partitions: tuple[TopicPartitionKey, ...]


@dataclass(frozen=True)
class ProducerDescription:
    """One active producer of a partition, as DescribeProducers reports it."""

    producer_id: int
    producer_epoch: int
    last_sequence: int = -1
    last_timestamp_ms: int = -1
    coordinator_epoch: int = -1  # of the last marker; -1: none seen
    current_txn_start_offset: int = -1  # first offset of the open transaction; -1: none


@dataclass(frozen=True)
class PartitionProducers:
    error: ErrorCode = ErrorCode.none
    producers: Sequence[ProducerDescription] = ()


# ------------------------------------------------------------------------------ security
@dataclass(frozen=True)
class AclCreateResult:
    error: ErrorCode = ErrorCode.none
    message: str | None = None


@dataclass(frozen=True)
class AclDeleteResult:
    """What one DeleteAcls filter matched, and so deleted."""

    error: ErrorCode = ErrorCode.none
    message: str | None = None
    matching: Sequence[AclBinding] = ()


@dataclass(frozen=True)
class ScramUserDescription:
    """DescribeUserScramCredentials for one user: mechanisms and iteration counts only,
    never salts or keys."""

    user: str
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    credentials: Sequence[tuple[ScramMechanism, int]] = ()  # (mechanism, iterations)


@dataclass(frozen=True)
class ScramAlterResult:
    user: str
    error: ErrorCode = ErrorCode.none
    message: str | None = None


# ------------------------------------------------------------------------------ the seam
@runtime_checkable
class KafkaBackend(Protocol):
    """What the Kafka protocol layer needs from a node. All offsets are Kafka offsets."""

    # -- cluster view (cheap, synchronous: served from the node's metadata image)
    @property
    def cluster_id(self) -> str: ...

    @property
    def node_id(self) -> int: ...

    def controller_id(self) -> int:
        """The active controller (Raft leader) or -1 while there is none."""
        ...

    def brokers(self) -> Sequence[BrokerInfo]:
        """Live (unfenced) brokers with their advertised client listeners."""
        ...

    def registered_brokers(self) -> Sequence[BrokerInfo]:
        """Every registered broker, fenced ones included with `fenced` set (DescribeCluster
        v2 with include_fenced_brokers, KIP-1073)."""
        ...

    def topics(self, names: Sequence[str] | None) -> Sequence[TopicInfo]:
        """Metadata of the named topics that exist (all topics when names is None)."""
        ...

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        """Resolve a topic id (None when unknown)."""
        ...

    def auto_create_topics(self) -> bool:
        """Whether a Metadata request may create the topics it names."""
        ...

    # -- data path
    async def produce(
        self,
        topic: str,
        partition: int,
        records: bytes,
        acks: int,
        timeout_ms: int,
        producer: ProducerInfo,
    ) -> ProduceResult:
        """Validate and append one partition's record batches; return once `acks` is met
        (acks=-1: HW covers the batch on every ISR member) or timeout_ms passed."""
        ...

    async def fetch(
        self,
        topic: str,
        partition: int,
        fetch_offset: int,
        partition_max_bytes: int,
        current_leader_epoch: int,
        isolation: IsolationLevel,
    ) -> FetchResult:
        """Whole batches from fetch_offset on, at most ~partition_max_bytes (at least one
        batch when there is one), never past the HW (LSO for read_committed)."""
        ...

    def data_event(self, topic: str, partition: int) -> trio.Event:
        """An event the backend sets the next time the partition's readable end (HW) moves
        or its leadership changes; fetches with min_bytes wait on it instead of polling.
        Take it before reading, so an advance between read and wait is not missed."""
        ...

    async def list_offset(
        self,
        topic: str,
        partition: int,
        timestamp_ms: int,
        current_leader_epoch: int,
        isolation: IsolationLevel,
    ) -> ListOffsetsResult:
        """EARLIEST_TIMESTAMP: log start; LATEST_TIMESTAMP: HW (LSO); MAX_TIMESTAMP: the
        first record holding the largest timestamp (nothing above the HW); else the first
        offset with timestamp >= timestamp_ms."""
        ...

    async def delete_records(self, topic: str, partition: int, offset: int) -> DeleteRecordsResult:
        """Move the log start of a partition this broker leads to `offset` (-1: the high
        watermark); answered once the new start is durable on the leader (KIP-107)."""
        ...

    async def offset_for_leader_epoch(
        self, topic: str, partition: int, current_leader_epoch: int, leader_epoch: int
    ) -> EpochEndOffset: ...

    # -- admin
    async def create_topics(
        self, topics: Sequence[NewTopic], timeout_ms: int, validate_only: bool
    ) -> Sequence[CreateTopicResult]: ...

    async def delete_topics(
        self, topics: Sequence[str | uuid.UUID], timeout_ms: int
    ) -> Sequence[DeleteTopicResult]: ...

    async def create_partitions(
        self,
        topic: str,
        total_count: int,
        assignments: Sequence[Sequence[int]] | None,
        timeout_ms: int,
        validate_only: bool,
    ) -> tuple[ErrorCode, str | None]: ...

    async def describe_configs(
        self, resource_type: ConfigResourceType, name: str, keys: Sequence[str] | None
    ) -> ConfigsResult: ...

    async def alter_configs(
        self,
        resource_type: ConfigResourceType,
        name: str,
        configs: dict[str, str | None],
        validate_only: bool,
    ) -> tuple[ErrorCode, str | None]:
        """Replace the resource's dynamic configs with `configs` (legacy AlterConfigs)."""
        ...

    async def incremental_alter_configs(
        self,
        resource_type: ConfigResourceType,
        name: str,
        ops: Sequence[tuple[str, AlterConfigOp, str | None]],
        validate_only: bool,
    ) -> tuple[ErrorCode, str | None]: ...

    async def describe_client_quotas(
        self, filters: Sequence[QuotaFilter], strict: bool
    ) -> Sequence[tuple[QuotaEntity, dict[str, float]]]: ...

    async def alter_client_quotas(
        self, alterations: Sequence[QuotaAlteration], validate_only: bool
    ) -> Sequence[QuotaAlterResult]: ...

    async def init_producer_id(
        self,
        transactional_id: str | None,
        transaction_timeout_ms: int,
        producer_id: int,
        producer_epoch: int,
    ) -> ProducerIdResult:
        """A producer id for an idempotent producer. The handlers never pass a
        transactional id: those go to the transaction coordinator (TxnService)."""
        ...

    # -- transactions (the coordinator's side is raftlog.txn.service.TxnService)
    async def write_txn_markers(
        self, markers: Sequence[TxnMarkerWrite]
    ) -> Sequence[dict[TopicPartitionKey, ErrorCode]]:
        """WriteTxnMarkers: each marker on each of its partitions this broker leads, answered
        once committed (acks=all); one error code per partition (NOT_LEADER_OR_FOLLOWER for
        partitions led elsewhere), one mapping per marker, in order."""
        ...

    async def describe_producers(self, topic: str, partition: int) -> PartitionProducers:
        """DescribeProducers: the active producers of a partition this broker leads
        (NOT_LEADER_OR_FOLLOWER / UNKNOWN_TOPIC_OR_PARTITION otherwise)."""
        ...

    # -- ACLs and SCRAM credentials (writes go to the controller; reads from this image)
    async def create_acls(self, creations: Sequence[AclBinding]) -> Sequence[AclCreateResult]:
        """One result per creation; answered once the ACLs are committed and in this node's
        image. Creating a binding that exists succeeds and changes nothing."""
        ...

    async def describe_acls(self, acl_filter: AclBindingFilter) -> Sequence[AclBinding]:
        """The ACLs the filter matches; raises KafkaError(INVALID_REQUEST) for a filter
        with an UNKNOWN field."""
        ...

    async def delete_acls(self, filters: Sequence[AclBindingFilter]) -> Sequence[AclDeleteResult]:
        """Delete what each filter matches; one result per filter."""
        ...

    async def describe_user_scram_credentials(
        self, users: Sequence[str] | None
    ) -> Sequence[ScramUserDescription]:
        """Every user with a credential when users is None (or empty), else one result per
        named user (RESOURCE_NOT_FOUND, DUPLICATE_RESOURCE per KIP-554)."""
        ...

    async def alter_user_scram_credentials(
        self,
        deletions: Sequence[ScramCredentialDeletion],
        upsertions: Sequence[ScramCredentialUpsertion],
    ) -> Sequence[ScramAlterResult]:
        """One result per user named; answered once the changes are committed and here."""
        ...

    def scram_credential(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        """The user's stored credential for SASL/SCRAM authentication (None: no such user)."""
        ...

    def acl_bindings(self) -> Collection[AclBinding]:
        """Every ACL in this node's committed image, for the authorizer. The collection
        is a snapshot: a later change gives a new one."""
        ...
