"""Metadata records: the entries of `__cluster_metadata`, and their msgpack encoding.

Every record is a frozen dataclass with a type id and a version, whose annotations are its
schema (raftlog.codec). On the wire a record is the msgpack array
``[type_id, version, field0, field1, ...]`` with fields in declaration order; topic ids (UUIDs)
travel as a msgpack extension type so they never look like plain bytes. Decoding checks the
type/version pair and every field's type and range, so a record written by a newer node or a
damaged entry fails with a message that names the record, instead of building a half-valid
object that breaks the image later.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated, ClassVar

from raftlog.codec import (
    I32_MAX,
    Added,
    Array,
    Codec,
    DecodeError,
    Epoch,
    MaxLen,
    NodeId,
    Offset,
    Port,
    Range,
    Size,
    unpack,
)
from raftlog.constants import MAX_RACK_CHARS
from raftlog.errors import CorruptRecordError
from raftlog.security.acl import (
    CONCRETE_OPERATIONS,
    CONCRETE_PATTERN_TYPES,
    CONCRETE_PERMISSIONS,
    CONCRETE_RESOURCE_TYPES,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    ScramCredential,
    ScramMechanism,
)

__all__ = [
    "RECORD_TYPES",
    "AccessControlEntry",
    "BrokerShutdownBegin",
    "ClientQuota",
    "Config",
    "FeatureLevel",
    "FenceBroker",
    "LeaderChange",
    "Partition",
    "PartitionChange",
    "ProducerIds",
    "Record",
    "RecordDecodeError",
    "RegisterBroker",
    "RemoveAccessControlEntry",
    "RemoveTopic",
    "RemoveUserScramCredential",
    "Topic",
    "UnfenceBroker",
    "UnregisterBroker",
    "UserScramCredential",
    "decode_entry",
    "decode_record",
    "encode_entry",
    "encode_record",
]

# A metadata record is small (the largest is a Partition with its replica lists); anything
# bigger is damage, and refusing it early bounds what a bad entry can make us allocate.
MAX_RECORD_BYTES = 1024 * 1024
RESOURCE_TYPES = ("topic", "broker", "cluster")


class RecordDecodeError(CorruptRecordError, DecodeError):
    """A metadata record could not be decoded (unknown type/version, wrong fields, bad bytes)."""


TopicName = Annotated[str, MaxLen(249)]  # Kafka's limit, which the controller enforces
BrokerEpoch = Offset  # a broker epoch is the metadata offset of its registration
Rack = Annotated[str, MaxLen(MAX_RACK_CHARS)]
PartitionIndex = Annotated[int, Range(0, I32_MAX)]
Replicas = tuple[NodeId, ...]
# A broker's Kafka listener as registered: (name, advertised host, port, security protocol),
# e.g. ("SASL_SSL", "kafka1", 9094, "SASL_SSL"). Bounds: Kafka's listener names are short
# identifiers, a host is a DNS name (255) and the protocol one of four names.
MAX_BROKER_LISTENERS = 64
BrokerListener = tuple[
    Annotated[str, MaxLen(64)], Annotated[str, MaxLen(255)], Port, Annotated[str, MaxLen(16)]
]
BrokerListeners = Annotated[tuple[BrokerListener, ...], MaxLen(MAX_BROKER_LISTENERS)]


@dataclass(frozen=True, slots=True)
class Record:
    """Base of every metadata record; subclasses set TYPE_ID and VERSION."""

    __wire__: ClassVar[Array] = Array(header=("TYPE_ID", "VERSION"))
    TYPE_ID: ClassVar[int] = 0
    VERSION: ClassVar[int] = 0


@dataclass(frozen=True, slots=True)
class RegisterBroker(Record):
    """A broker (re-)registered; it starts fenced until it catches up with the metadata log."""

    TYPE_ID: ClassVar[int] = 1
    broker_id: NodeId
    incarnation_id: uuid.UUID
    broker_epoch: BrokerEpoch
    client_host: str
    client_port: Port
    internal_host: str
    internal_port: Port
    rack: Rack | None = None
    # Every client listener the broker advertises; empty (an older broker) means the one
    # PLAINTEXT endpoint client_host:client_port.
    listeners: Annotated[BrokerListeners, Added()] = ()


@dataclass(frozen=True, slots=True)
class FenceBroker(Record):
    """The broker may no longer lead or join ISRs (session expired or shutdown finished)."""

    TYPE_ID: ClassVar[int] = 2
    broker_id: NodeId
    broker_epoch: BrokerEpoch


@dataclass(frozen=True, slots=True)
class UnfenceBroker(Record):
    """The broker caught up with the metadata log and may lead partitions again."""

    TYPE_ID: ClassVar[int] = 3
    broker_id: NodeId
    broker_epoch: BrokerEpoch


@dataclass(frozen=True, slots=True)
class BrokerShutdownBegin(Record):
    """The broker asked for a controlled shutdown; it is no longer eligible as a leader."""

    TYPE_ID: ClassVar[int] = 4
    broker_id: NodeId
    broker_epoch: BrokerEpoch


@dataclass(frozen=True, slots=True)
class Topic(Record):
    """A topic was created; its partitions follow as Partition records."""

    TYPE_ID: ClassVar[int] = 5
    name: TopicName
    topic_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Partition(Record):
    """Full state of one partition (creation, CreatePartitions, snapshots)."""

    TYPE_ID: ClassVar[int] = 6
    topic_id: uuid.UUID
    partition: PartitionIndex
    replicas: Replicas
    isr: Replicas
    leader: NodeId
    leader_epoch: Epoch = 0
    partition_epoch: Epoch = 0
    # A reassignment in progress (KIP-455, Kafka's PartitionRecord.addingReplicas and
    # removingReplicas): `replicas` is then the target followed by the replicas leaving, and
    # these say which members are joining and which leave once every target is in the ISR.
    # Empty: no reassignment. Added fields, so a log written before them still replays.
    adding_replicas: Annotated[Replicas, Added()] = ()
    removing_replicas: Annotated[Replicas, Added()] = ()


@dataclass(frozen=True, slots=True)
class PartitionChange(Record):
    """A change to one partition; None means unchanged, leader -1 means no leader.

    Applying it bumps partition_epoch, and leader_epoch too when the leader changes (Kafka's
    rule: followers fence stale leaders by leader epoch, the controller fences stale
    AlterPartition requests by partition epoch).
    """

    TYPE_ID: ClassVar[int] = 7
    topic_id: uuid.UUID
    partition: PartitionIndex
    leader: NodeId | None = None
    isr: Replicas | None = None
    replicas: Replicas | None = None
    # The reassignment state (see Partition); None: unchanged, () clears it.
    adding_replicas: Annotated[Replicas | None, Added()] = None
    removing_replicas: Annotated[Replicas | None, Added()] = None


@dataclass(frozen=True, slots=True)
class RemoveTopic(Record):
    """The topic and its configs are gone."""

    TYPE_ID: ClassVar[int] = 8
    topic_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Config(Record):
    """Set (value is a string, as in Kafka) or delete (value None) one config key."""

    TYPE_ID: ClassVar[int] = 9
    resource_type: str
    resource_name: str
    key: str
    value: str | None


@dataclass(frozen=True, slots=True)
class ClientQuota(Record):
    """Set or remove (value None) one quota of an entity.

    The entity is a sorted tuple of (entity_type, name) pairs; name None is the default
    entity of that type, as in Kafka's DescribeClientQuotas.
    """

    TYPE_ID: ClassVar[int] = 10
    entity: tuple[tuple[str, str | None], ...]
    key: str
    value: float | None


@dataclass(frozen=True, slots=True)
class ProducerIds(Record):
    """A block of producer ids was handed out; next_producer_id is the first id not given."""

    TYPE_ID: ClassVar[int] = 11
    broker_id: NodeId
    broker_epoch: BrokerEpoch
    next_producer_id: Size


@dataclass(frozen=True, slots=True)
class LeaderChange(Record):
    """No-op written by a new Raft leader at the start of its epoch; names the controller."""

    TYPE_ID: ClassVar[int] = 12
    epoch: Epoch
    leader_id: NodeId


@dataclass(frozen=True, slots=True)
class FeatureLevel(Record):
    """A finalized feature level, e.g. ("metadata.version", 1)."""

    TYPE_ID: ClassVar[int] = 13
    name: str
    level: Annotated[int, Range(0, 2**15 - 1)]


# ---------------------------------------------------------------- ACLs and SCRAM (#14)
# Bounds of what an ACL or a SCRAM credential may hold. The controller refuses more with a
# Kafka error before it writes a record, and decoding refuses more again: a record past them
# is damage, never something a client managed to store.
# Group and transactional ids have no Kafka limit short of the protocol's 32767 bytes; 1024
# characters covers every real id (and topic names, capped at 249) and bounds memory.
MAX_ACL_RESOURCE_NAME_CHARS = 1024
MAX_ACL_PRINCIPAL_CHARS = 512  # "User:" + a user name of up to MAX_SCRAM_USER_NAME_CHARS, etc.
MAX_ACL_HOST_CHARS = 255  # a host name or an IPv4/IPv6 literal, or "*"
MAX_SCRAM_USER_NAME_CHARS = 255
# Kafka's ScramMechanism.minIterations/maxIterations.
MIN_SCRAM_ITERATIONS = 4096
MAX_SCRAM_ITERATIONS = 16384
# Clients generate 16-64 random bytes (Java's ScramFormatter about 26, librdkafka 64); fewer
# than 16 (128 bits, NIST SP 800-132) is a weak salt, more than 256 is not a salt.
MIN_SCRAM_SALT_BYTES = 16
MAX_SCRAM_SALT_BYTES = 256
# The digest size of each mechanism: a stored key, a server key and a salted password are
# exactly this long.
SCRAM_KEY_BYTES = {ScramMechanism.SCRAM_SHA_256: 32, ScramMechanism.SCRAM_SHA_512: 64}


def _contiguous(values: frozenset[int]) -> Range:
    """The Range of a set of enum codes, which must have no gap (else a Range would let a
    non-concrete code through)."""
    low, high = min(values), max(values)
    assert set(range(low, high + 1)) == set(values), f"codes {sorted(values)} have a gap"
    return Range(low, high)


AclResourceTypeCode = Annotated[int, _contiguous(frozenset(CONCRETE_RESOURCE_TYPES))]
AclPatternTypeCode = Annotated[int, _contiguous(frozenset(CONCRETE_PATTERN_TYPES))]
AclOperationCode = Annotated[int, _contiguous(frozenset(CONCRETE_OPERATIONS))]
AclPermissionCode = Annotated[int, _contiguous(frozenset(CONCRETE_PERMISSIONS))]
ScramMechanismCode = Annotated[int, _contiguous(frozenset(SCRAM_KEY_BYTES))]
ScramUserName = Annotated[str, MaxLen(MAX_SCRAM_USER_NAME_CHARS)]


@dataclass(frozen=True, slots=True)
class AccessControlEntry(Record):
    """An ACL was created (Kafka's AccessControlEntryRecord). The enum fields hold their Kafka
    codes, bounded at decode to the values a stored binding may have (no ANY, MATCH or
    UNKNOWN); `binding` gives the typed AclBinding."""

    TYPE_ID: ClassVar[int] = 14
    id: uuid.UUID
    resource_type: AclResourceTypeCode
    resource_name: Annotated[str, MaxLen(MAX_ACL_RESOURCE_NAME_CHARS)]
    pattern_type: AclPatternTypeCode
    principal: Annotated[str, MaxLen(MAX_ACL_PRINCIPAL_CHARS)]
    host: Annotated[str, MaxLen(MAX_ACL_HOST_CHARS)]
    operation: AclOperationCode
    permission: AclPermissionCode

    @classmethod
    def of(cls, acl_id: uuid.UUID, binding: AclBinding) -> AccessControlEntry:
        return cls(
            acl_id,
            int(binding.resource_type),
            binding.resource_name,
            int(binding.pattern_type),
            binding.principal,
            binding.host,
            int(binding.operation),
            int(binding.permission),
        )

    @property
    def binding(self) -> AclBinding:
        return AclBinding(
            ResourceType(self.resource_type),
            self.resource_name,
            PatternType(self.pattern_type),
            self.principal,
            self.host,
            AclOperation(self.operation),
            AclPermissionType(self.permission),
        )


@dataclass(frozen=True, slots=True)
class RemoveAccessControlEntry(Record):
    """The ACL with this id was deleted (Kafka's RemoveAccessControlEntryRecord)."""

    TYPE_ID: ClassVar[int] = 15
    id: uuid.UUID


@dataclass(frozen=True, slots=True)
class UserScramCredential(Record):
    """A user's SCRAM credential for one mechanism was set (Kafka's UserScramCredentialRecord):
    what RFC 5802 has the server keep, never the password."""

    TYPE_ID: ClassVar[int] = 16
    name: ScramUserName
    mechanism: ScramMechanismCode
    salt: Annotated[bytes, MaxLen(MAX_SCRAM_SALT_BYTES)]
    stored_key: Annotated[bytes, MaxLen(max(SCRAM_KEY_BYTES.values()))]
    server_key: Annotated[bytes, MaxLen(max(SCRAM_KEY_BYTES.values()))]
    iterations: Annotated[int, Range(MIN_SCRAM_ITERATIONS, MAX_SCRAM_ITERATIONS)]

    def __post_init__(self) -> None:
        # What the annotations cannot say: the key lengths depend on the mechanism. Raised
        # as a DecodeError, decoding reports it as a damaged record.
        want = SCRAM_KEY_BYTES[ScramMechanism(self.mechanism)]
        if len(self.stored_key) != want or len(self.server_key) != want:
            raise DecodeError(
                f"UserScramCredential keys of {len(self.stored_key)} and "
                f"{len(self.server_key)} bytes; {ScramMechanism(self.mechanism).sasl_name} "
                f"keys are {want} bytes"
            )
        if len(self.salt) < MIN_SCRAM_SALT_BYTES:
            raise DecodeError(
                f"UserScramCredential salt of {len(self.salt)} bytes, under {MIN_SCRAM_SALT_BYTES}"
            )

    @classmethod
    def of(cls, name: str, credential: ScramCredential) -> UserScramCredential:
        return cls(
            name,
            int(credential.mechanism),
            credential.salt,
            credential.stored_key,
            credential.server_key,
            credential.iterations,
        )

    @property
    def credential(self) -> ScramCredential:
        return ScramCredential(
            ScramMechanism(self.mechanism),
            self.salt,
            self.stored_key,
            self.server_key,
            self.iterations,
        )


@dataclass(frozen=True, slots=True)
class RemoveUserScramCredential(Record):
    """The user's credential for this mechanism was deleted."""

    TYPE_ID: ClassVar[int] = 17
    name: ScramUserName
    mechanism: ScramMechanismCode


@dataclass(frozen=True, slots=True)
class UnregisterBroker(Record):
    """The broker's registration was removed (Kafka's UnregisterBrokerRecord, written for the
    UnregisterBroker API). Partitions keep its id in their replica lists: those replicas are
    offline until a broker with that id registers again or they are reassigned away."""

    TYPE_ID: ClassVar[int] = 18
    broker_id: NodeId
    broker_epoch: BrokerEpoch


RECORD_TYPES: dict[tuple[int, int], type[Record]] = {
    (cls.TYPE_ID, cls.VERSION): cls
    for cls in (
        RegisterBroker,
        FenceBroker,
        UnfenceBroker,
        BrokerShutdownBegin,
        Topic,
        Partition,
        PartitionChange,
        RemoveTopic,
        Config,
        ClientQuota,
        ProducerIds,
        LeaderChange,
        FeatureLevel,
        AccessControlEntry,
        RemoveAccessControlEntry,
        UserScramCredential,
        RemoveUserScramCredential,
        UnregisterBroker,
    )
}


AnyRecord = (
    RegisterBroker
    | FenceBroker
    | UnfenceBroker
    | BrokerShutdownBegin
    | Topic
    | Partition
    | PartitionChange
    | RemoveTopic
    | Config
    | ClientQuota
    | ProducerIds
    | LeaderChange
    | FeatureLevel
    | AccessControlEntry
    | RemoveAccessControlEntry
    | UserScramCredential
    | RemoveUserScramCredential
    | UnregisterBroker
)
CODEC = Codec()


# One Raft entry of the metadata log: the encoded records of one controller result, which
# are applied together (docs/metadata.md).
EncodedRecord = Annotated[bytes, MaxLen(MAX_RECORD_BYTES)]
EntryRecords = tuple[EncodedRecord, ...]


def encode_record(record: Record) -> bytes:
    """Encode one record as msgpack ``[type_id, version, fields...]``."""
    return CODEC.encode(record, AnyRecord)


def decode_record(data: bytes) -> Record:
    """Decode bytes from encode_record; raises RecordDecodeError saying what is wrong."""
    if len(data) > MAX_RECORD_BYTES:
        raise RecordDecodeError(f"metadata record of {len(data)} bytes exceeds {MAX_RECORD_BYTES}")
    try:
        items = unpack(data)
    except DecodeError as exc:
        raise RecordDecodeError(f"metadata record is {exc}") from None
    if not isinstance(items, list) or len(items) < 2:
        raise RecordDecodeError(f"metadata record must be [type_id, version, ...], got {items!r}")
    type_id, version = items[0], items[1]
    cls = RECORD_TYPES.get((type_id, version))
    if cls is None:
        known = sorted({t for t, _ in RECORD_TYPES})
        if type(type_id) is int and type_id in known:
            raise RecordDecodeError(
                f"unsupported version {version!r} of metadata record type {type_id} "
                f"({RECORD_TYPES[(type_id, 0)].__name__}); this node reads version 0"
            )
        raise RecordDecodeError(
            f"unknown metadata record type {type_id!r} version {version!r}; known types {known}"
        )
    try:
        record: Record = CODEC.from_wire(cls, items)
    except DecodeError as exc:
        raise RecordDecodeError(str(exc)) from None
    return record


def encode_entry(records: tuple[Record, ...] | list[Record]) -> bytes:
    """One Raft entry holding a controller result's records (applied atomically)."""
    return CODEC.encode(tuple(encode_record(rec) for rec in records), EntryRecords)


def decode_entry(data: bytes) -> list[Record]:
    """The records of one entry; a RecordDecodeError says which record (index) is bad."""
    try:
        items: EntryRecords = CODEC.decode(EntryRecords, data)
    except DecodeError as exc:
        raise RecordDecodeError(f"metadata entry is not a list of encoded records: {exc}") from None
    records = []
    for index, item in enumerate(items):
        try:
            records.append(decode_record(item))
        except RecordDecodeError as exc:
            raise RecordDecodeError(f"record {index} of {len(items)}: {exc.message}") from None
    return records
