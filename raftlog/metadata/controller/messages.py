"""Requests the controller handles and the replies it returns (plain dataclasses).

The protocol layers (Kafka admin APIs on the client listener, broker lifecycle RPC on the
internal listener) translate their wire messages into these and back. On the internal
listener they travel through CODEC: each as msgpack extension CONTROLLER_EXT holding
``[class name, [fields...]]``, error codes as extension raftlog.codec.ERROR_CODE_EXT; the
annotations below are the schema decoding checks. Every reply carries a
Kafka error code; requests that name several items (topics, resources, quota entities) answer
with one result per item, as Kafka does, so one bad item does not fail the others.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from raftlog.codec import (
    I32_MAX,
    I32_MIN,
    Added,
    Codec,
    Int32,
    MaxLen,
    NamedExt,
    NodeId,
    Offset,
    Port,
    Range,
)
from raftlog.errors import ErrorCode
from raftlog.metadata.records import BrokerListeners, Rack, Record
from raftlog.security.acl import AclBinding, AclBindingFilter

NONE = ErrorCode.none
QuotaEntity = tuple[tuple[str, str | None], ...]
CONTROLLER_EXT = 3


@dataclass(frozen=True, slots=True)
class ControllerResult:
    """Records to append atomically through Raft, and the reply to send once they commit.

    With no records the reply can be sent at once (errors, validate_only, no-op changes).
    """

    records: tuple[Record, ...]
    reply: Any

    @property
    def error_code(self) -> ErrorCode:
        """The reply's error code; replies with per-item results carry theirs per item."""
        return getattr(self.reply, "error_code", NONE)


# ---------------------------------------------------------------- broker lifecycle
@dataclass(frozen=True, slots=True)
class RegisterBroker:
    broker_id: NodeId
    incarnation_id: uuid.UUID
    client_host: str
    client_port: Port
    internal_host: str
    internal_port: Port
    rack: Rack | None = None
    cluster_id: str | None = None  # None skips the check (tests, single-node bootstrap)
    # The broker's client listeners (records.BrokerListener); empty: client_host/port only.
    listeners: Annotated[BrokerListeners, Added()] = ()


@dataclass(frozen=True, slots=True)
class RegisterBrokerReply:
    error_code: ErrorCode = NONE
    error_message: str | None = None
    broker_epoch: Offset = -1


@dataclass(frozen=True, slots=True)
class BrokerHeartbeat:
    broker_id: NodeId
    broker_epoch: Offset
    current_metadata_offset: Offset
    want_fence: bool = False
    want_shutdown: bool = False
    # Replicas (topic id, partition) this broker must not lead: they lost records they may
    # have acknowledged, hold a damaged batch, or sit on a failed disk (KIP-966, KIP-858).
    unsafe_partitions: Annotated[
        tuple[tuple[uuid.UUID, Annotated[int, Range(0, I32_MAX)]], ...],
        MaxLen(1_000_000),
        Added(),
    ] = ()


@dataclass(frozen=True, slots=True)
class BrokerHeartbeatReply:
    error_code: ErrorCode = NONE
    error_message: str | None = None
    is_caught_up: bool = False
    is_fenced: bool = True
    should_shutdown: bool = False


@dataclass(frozen=True, slots=True)
class AllocateProducerIds:
    broker_id: NodeId
    broker_epoch: Offset


@dataclass(frozen=True, slots=True)
class AllocateProducerIdsReply:
    error_code: ErrorCode = NONE
    error_message: str | None = None
    producer_id_start: Offset = -1
    producer_id_len: Int32 = 0


# ---------------------------------------------------------------- topics
@dataclass(frozen=True, slots=True)
class NewTopic:
    name: str
    num_partitions: Int32 = -1  # -1: the cluster default (NodeConfig.num_partitions)
    replication_factor: Int32 = -1  # -1: NodeConfig.default_replication_factor
    # Explicit placement {partition: replicas}; then both counts above must be -1.
    assignments: Mapping[Int32, tuple[Int32, ...]] | None = None
    # A Kafka client may send a null value; the controller refuses it.
    configs: Mapping[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CreateTopics:
    topics: tuple[NewTopic, ...]
    validate_only: bool = False


@dataclass(frozen=True, slots=True)
class CreateTopicResult:
    name: str
    error_code: ErrorCode = NONE
    error_message: str | None = None
    topic_id: uuid.UUID | None = None
    num_partitions: Int32 = -1
    replication_factor: Int32 = -1


@dataclass(frozen=True, slots=True)
class CreateTopicsReply:
    results: tuple[CreateTopicResult, ...]


@dataclass(frozen=True, slots=True)
class DeleteTopics:
    names: tuple[str, ...] = ()
    topic_ids: tuple[uuid.UUID, ...] = ()


@dataclass(frozen=True, slots=True)
class DeleteTopicResult:
    name: str | None
    topic_id: uuid.UUID | None
    error_code: ErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class DeleteTopicsReply:
    results: tuple[DeleteTopicResult, ...]


@dataclass(frozen=True, slots=True)
class NewPartitions:
    name: str
    count: Int32  # the new total number of partitions
    assignments: tuple[tuple[Int32, ...], ...] | None = None  # one per added partition


@dataclass(frozen=True, slots=True)
class CreatePartitions:
    topics: tuple[NewPartitions, ...]
    validate_only: bool = False


@dataclass(frozen=True, slots=True)
class CreatePartitionsResult:
    name: str
    error_code: ErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class CreatePartitionsReply:
    results: tuple[CreatePartitionsResult, ...]


@dataclass(frozen=True, slots=True)
class AlterPartition:
    broker_id: NodeId
    broker_epoch: Offset
    topic_id: uuid.UUID
    partition: Int32
    leader_epoch: Int32
    partition_epoch: Int32
    new_isr: tuple[NodeId, ...]


@dataclass(frozen=True, slots=True)
class AlterPartitionReply:
    error_code: ErrorCode = NONE
    error_message: str | None = None
    leader: NodeId = -1
    leader_epoch: Int32 = -1
    isr: tuple[NodeId, ...] = ()
    partition_epoch: Int32 = -1


# ---------------------------------------------------------------- configs and quotas
@dataclass(frozen=True, slots=True)
class AlterConfigsResource:
    """Legacy AlterConfigs: `configs` replaces the resource's whole config set."""

    resource_type: str  # "topic", "broker" (name = broker id) or "cluster" (name "")
    resource_name: str
    configs: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class AlterConfigs:
    resources: tuple[AlterConfigsResource, ...]
    validate_only: bool = False


CONFIG_OPS = ("set", "delete", "append", "subtract")  # Kafka's op codes 0..3, in order


@dataclass(frozen=True, slots=True)
class ConfigOp:
    key: str
    op: str  # one of CONFIG_OPS
    value: str | None = None


@dataclass(frozen=True, slots=True)
class IncrementalAlterConfigsResource:
    resource_type: str
    resource_name: str
    ops: tuple[ConfigOp, ...]


@dataclass(frozen=True, slots=True)
class IncrementalAlterConfigs:
    resources: tuple[IncrementalAlterConfigsResource, ...]
    validate_only: bool = False


@dataclass(frozen=True, slots=True)
class ConfigResourceResult:
    resource_type: str
    resource_name: str
    error_code: ErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class AlterConfigsReply:
    results: tuple[ConfigResourceResult, ...]


@dataclass(frozen=True, slots=True)
class QuotaEntry:
    """Changes to one entity; entity pairs are (type, name or None for the default)."""

    entity: QuotaEntity
    ops: tuple[tuple[str, float | None], ...]  # (key, value or None = remove)


@dataclass(frozen=True, slots=True)
class AlterClientQuotas:
    entries: tuple[QuotaEntry, ...]
    validate_only: bool = False


@dataclass(frozen=True, slots=True)
class QuotaEntryResult:
    entity: QuotaEntity
    error_code: ErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class AlterClientQuotasReply:
    results: tuple[QuotaEntryResult, ...]


# ---------------------------------------------------------------- ACLs and SCRAM (#14)
# Bound what one request can make the controller write or hold, beyond the frame size.
MAX_ACLS_PER_REQUEST = 10_000
MAX_SCRAM_ALTERATIONS_PER_REQUEST = 10_000
Int8 = Annotated[int, Range(-128, 127)]  # what a Kafka client may send as INT8


@dataclass(frozen=True, slots=True)
class CreateAcls:
    """Kafka's CreateAcls; enum codes a client sent that Kafka does not know arrive as the
    enum's UNKNOWN member, which validation refuses."""

    creations: Annotated[tuple[AclBinding, ...], MaxLen(MAX_ACLS_PER_REQUEST)]


@dataclass(frozen=True, slots=True)
class AclCreationResult:
    error_code: ErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class CreateAclsReply:
    results: tuple[AclCreationResult, ...]


@dataclass(frozen=True, slots=True)
class DeleteAcls:
    filters: Annotated[tuple[AclBindingFilter, ...], MaxLen(MAX_ACLS_PER_REQUEST)]


@dataclass(frozen=True, slots=True)
class DeleteAclsFilterResult:
    """What one filter matched (and so deleted); an ACL two filters match is in both."""

    error_code: ErrorCode = NONE
    error_message: str | None = None
    matching: tuple[AclBinding, ...] = ()


@dataclass(frozen=True, slots=True)
class DeleteAclsReply:
    results: tuple[DeleteAclsFilterResult, ...]


@dataclass(frozen=True, slots=True)
class ScramCredentialDeletion:
    name: str
    mechanism: Int8  # ScramMechanism's code; others get UNSUPPORTED_SASL_MECHANISM


@dataclass(frozen=True, slots=True)
class ScramCredentialUpsertion:
    """KIP-554: the client salts and hashes the password; the controller derives the stored
    and server keys from the salted password and keeps only those."""

    name: str
    mechanism: Int8
    iterations: Int32
    salt: bytes
    salted_password: bytes


@dataclass(frozen=True, slots=True)
class AlterUserScramCredentials:
    deletions: Annotated[
        tuple[ScramCredentialDeletion, ...], MaxLen(MAX_SCRAM_ALTERATIONS_PER_REQUEST)
    ] = ()
    upsertions: Annotated[
        tuple[ScramCredentialUpsertion, ...], MaxLen(MAX_SCRAM_ALTERATIONS_PER_REQUEST)
    ] = ()


@dataclass(frozen=True, slots=True)
class ScramUserResult:
    user: str
    error_code: ErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class AlterUserScramCredentialsReply:
    results: tuple[ScramUserResult, ...]


# ---------------------------------------------------------------- reassignments, elections
# One request moves or elects at most this many partitions (a cluster-wide plan of 100,000
# partitions still fits in one; beyond that an operator splits it).
MAX_PARTITIONS_PER_REQUEST = 100_000
PartitionIndex32 = Annotated[int, Range(I32_MIN, I32_MAX)]  # refused by the controller if < 0
BrokerId32 = Annotated[int, Range(I32_MIN, I32_MAX)]  # refused by the controller if unknown


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    """Kafka's ReassignablePartition: the target replicas, or None to cancel."""

    topic: Annotated[str, MaxLen(32767)]
    partition: PartitionIndex32
    replicas: Annotated[tuple[BrokerId32, ...], MaxLen(1024)] | None


@dataclass(frozen=True, slots=True)
class AlterPartitionReassignments:
    """KIP-455's AlterPartitionReassignments. allow_replication_factor_change False (v1):
    a target of another size than the current replicas is refused."""

    partitions: Annotated[tuple[PartitionReassignment, ...], MaxLen(MAX_PARTITIONS_PER_REQUEST)]
    allow_replication_factor_change: bool = True


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """One partition's outcome, in the request's order (reassignments, elections)."""

    topic: str
    partition: Int32
    error_code: ErrorCode = NONE
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class AlterPartitionReassignmentsReply:
    results: tuple[PartitionResult, ...]
    error_code: ErrorCode = NONE
    error_message: str | None = None


ELECTION_PREFERRED = 0  # Kafka's ElectionType.PREFERRED
ELECTION_UNCLEAN = 1  # Kafka's ElectionType.UNCLEAN


@dataclass(frozen=True, slots=True)
class ElectLeaders:
    """Kafka's ElectLeaders; partitions None: every partition (and the reply leaves out
    those where no election was needed, as Kafka does)."""

    election_type: Annotated[int, Range(ELECTION_PREFERRED, ELECTION_UNCLEAN)]
    partitions: (
        Annotated[
            tuple[tuple[Annotated[str, MaxLen(32767)], PartitionIndex32], ...],
            MaxLen(MAX_PARTITIONS_PER_REQUEST),
        ]
        | None
    ) = None


@dataclass(frozen=True, slots=True)
class ElectLeadersReply:
    results: tuple[PartitionResult, ...]
    error_code: ErrorCode = NONE
    error_message: str | None = None


# ---------------------------------------------------------------- UnregisterBroker
@dataclass(frozen=True, slots=True)
class UnregisterBroker:
    """Kafka's UnregisterBroker (KIP-500 era, `kafka-cluster.sh unregister`): remove the
    broker's registration. A broker still running registers again on its next heartbeat,
    so the operator stops it first."""

    broker_id: NodeId


@dataclass(frozen=True, slots=True)
class UnregisterBrokerReply:
    error_code: ErrorCode = NONE
    error_message: str | None = None


ControllerRequest = (
    RegisterBroker
    | BrokerHeartbeat
    | AllocateProducerIds
    | CreateTopics
    | DeleteTopics
    | CreatePartitions
    | AlterPartition
    | AlterConfigs
    | IncrementalAlterConfigs
    | AlterClientQuotas
    | CreateAcls
    | DeleteAcls
    | AlterUserScramCredentials
    | AlterPartitionReassignments
    | ElectLeaders
    | UnregisterBroker
)
ControllerReply = (
    RegisterBrokerReply
    | BrokerHeartbeatReply
    | AllocateProducerIdsReply
    | CreateTopicsReply
    | DeleteTopicsReply
    | CreatePartitionsReply
    | AlterPartitionReply
    | AlterConfigsReply
    | AlterClientQuotasReply
    | CreateAclsReply
    | DeleteAclsReply
    | AlterUserScramCredentialsReply
    | AlterPartitionReassignmentsReply
    | ElectLeadersReply
    | UnregisterBrokerReply
)
# Every class above without a layout of its own travels as a named extension.
CODEC = Codec(error_code_ext=True, default_layout=NamedExt(CONTROLLER_EXT))
