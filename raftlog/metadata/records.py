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
from raftlog.errors import CorruptRecordError

__all__ = [
    "RECORD_TYPES",
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
    "RemoveTopic",
    "Topic",
    "UnfenceBroker",
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
PartitionIndex = Annotated[int, Range(0, 2**31 - 1)]
Replicas = tuple[NodeId, ...]


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
    rack: str | None = None


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
