"""Metadata records: the entries of `__cluster_metadata`, and their msgpack encoding.

Every record is a frozen dataclass with a type id and a version. On the wire a record is the
msgpack array ``[type_id, version, field0, field1, ...]`` with fields in declaration order;
topic ids (UUIDs) travel as a msgpack extension type so they never look like plain bytes.
Decoding checks the type/version pair and every field's type, so a record written by a newer
node or a damaged entry fails with a message that names the record, instead of building a
half-valid object that breaks the image later.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack

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
    "decode_record",
    "encode_record",
]

# msgpack extension code for a 16-byte UUID (topic ids, incarnation ids).
_UUID_EXT = 1
# A metadata record is small (the largest is a Partition with its replica lists); anything
# bigger is damage, and refusing it early bounds what a bad entry can make us allocate.
MAX_RECORD_BYTES = 1024 * 1024
RESOURCE_TYPES = ("topic", "broker", "cluster")
NO_LEADER = -1


class RecordDecodeError(CorruptRecordError):
    """A metadata record could not be decoded (unknown type/version, wrong fields, bad bytes)."""


@dataclass(frozen=True, slots=True)
class Record:
    """Base of every metadata record; subclasses set TYPE_ID and VERSION."""

    TYPE_ID: ClassVar[int] = 0
    VERSION: ClassVar[int] = 0


@dataclass(frozen=True, slots=True)
class RegisterBroker(Record):
    """A broker (re-)registered; it starts fenced until it catches up with the metadata log."""

    TYPE_ID: ClassVar[int] = 1
    broker_id: int
    incarnation_id: uuid.UUID
    broker_epoch: int
    client_host: str
    client_port: int
    internal_host: str
    internal_port: int
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class FenceBroker(Record):
    """The broker may no longer lead or join ISRs (session expired or shutdown finished)."""

    TYPE_ID: ClassVar[int] = 2
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class UnfenceBroker(Record):
    """The broker caught up with the metadata log and may lead partitions again."""

    TYPE_ID: ClassVar[int] = 3
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class BrokerShutdownBegin(Record):
    """The broker asked for a controlled shutdown; it is no longer eligible as a leader."""

    TYPE_ID: ClassVar[int] = 4
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class Topic(Record):
    """A topic was created; its partitions follow as Partition records."""

    TYPE_ID: ClassVar[int] = 5
    name: str
    topic_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Partition(Record):
    """Full state of one partition (creation, CreatePartitions, snapshots)."""

    TYPE_ID: ClassVar[int] = 6
    topic_id: uuid.UUID
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0


@dataclass(frozen=True, slots=True)
class PartitionChange(Record):
    """A change to one partition; None means unchanged, leader -1 means no leader.

    Applying it bumps partition_epoch, and leader_epoch too when the leader changes (Kafka's
    rule: followers fence stale leaders by leader epoch, the controller fences stale
    AlterPartition requests by partition epoch).
    """

    TYPE_ID: ClassVar[int] = 7
    topic_id: uuid.UUID
    partition: int
    leader: int | None = None
    isr: tuple[int, ...] | None = None
    replicas: tuple[int, ...] | None = None


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
    broker_id: int
    broker_epoch: int
    next_producer_id: int


@dataclass(frozen=True, slots=True)
class LeaderChange(Record):
    """No-op written by a new Raft leader at the start of its epoch; names the controller."""

    TYPE_ID: ClassVar[int] = 12
    epoch: int
    leader_id: int


@dataclass(frozen=True, slots=True)
class FeatureLevel(Record):
    """A finalized feature level, e.g. ("metadata.version", 1)."""

    TYPE_ID: ClassVar[int] = 13
    name: str
    level: int


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


# ------------------------------------------------------------------ field type checks
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_float(value: Any) -> bool:
    return isinstance(value, float | int) and not isinstance(value, bool) and math.isfinite(value)


def _is_int_tuple(value: Any) -> bool:
    return isinstance(value, tuple) and all(_is_int(v) for v in value)


def _is_entity(value: Any) -> bool:
    return isinstance(value, tuple) and all(
        isinstance(pair, tuple)
        and len(pair) == 2
        and isinstance(pair[0], str)
        and (pair[1] is None or isinstance(pair[1], str))
        for pair in value
    )


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


# Keyed by the annotation text (this module uses `from __future__ import annotations`).
_CHECKS: dict[str, Callable[[Any], bool]] = {
    "int": _is_int,
    "str": lambda v: isinstance(v, str),
    "str | None": _optional(lambda v: isinstance(v, str)),
    "uuid.UUID": lambda v: isinstance(v, uuid.UUID),
    "tuple[int, ...]": _is_int_tuple,
    "tuple[int, ...] | None": _optional(_is_int_tuple),
    "int | None": _optional(_is_int),
    "float | None": _optional(_is_float),
    "tuple[tuple[str, str | None], ...]": _is_entity,
}
_FIELDS: dict[type[Record], tuple[tuple[str, Callable[[Any], bool]], ...]] = {
    cls: tuple((f.name, _CHECKS[str(f.type)]) for f in dataclasses.fields(cls))
    for cls in RECORD_TYPES.values()
}


# ------------------------------------------------------------------ encode / decode
def _default(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return msgpack.ExtType(_UUID_EXT, value.bytes)
    raise TypeError(f"cannot encode {type(value).__name__} in a metadata record")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _UUID_EXT and len(data) == 16:
        return uuid.UUID(bytes=data)
    raise RecordDecodeError(f"unknown msgpack extension {code} ({len(data)} bytes)")


def encode_record(record: Record) -> bytes:
    """Encode one record as msgpack ``[type_id, version, fields...]``."""
    if type(record) not in _FIELDS:
        raise TypeError(f"{type(record).__name__} is not a metadata record type")
    values = [getattr(record, name) for name, _ in _FIELDS[type(record)]]
    return msgpack.packb([record.TYPE_ID, record.VERSION, *values], default=_default)


def decode_record(data: bytes) -> Record:
    """Decode bytes from encode_record; raises RecordDecodeError saying what is wrong."""
    if len(data) > MAX_RECORD_BYTES:
        raise RecordDecodeError(f"metadata record of {len(data)} bytes exceeds {MAX_RECORD_BYTES}")
    try:
        items = msgpack.unpackb(data, use_list=False, ext_hook=_ext_hook, strict_map_key=True)
    except RecordDecodeError:
        raise
    except Exception as exc:
        raise RecordDecodeError(f"metadata record is not valid msgpack: {exc}") from None
    if not isinstance(items, tuple) or len(items) < 2:
        raise RecordDecodeError(f"metadata record must be [type_id, version, ...], got {items!r}")
    type_id, version, values = items[0], items[1], items[2:]
    cls = RECORD_TYPES.get((type_id, version))
    if cls is None:
        known = sorted({t for t, _ in RECORD_TYPES})
        if _is_int(type_id) and type_id in known:
            raise RecordDecodeError(
                f"unsupported version {version!r} of metadata record type {type_id} "
                f"({RECORD_TYPES[(type_id, 0)].__name__}); this node reads version 0"
            )
        raise RecordDecodeError(
            f"unknown metadata record type {type_id!r} version {version!r}; known types {known}"
        )
    fields = _FIELDS[cls]
    if len(values) != len(fields):
        raise RecordDecodeError(
            f"{cls.__name__} v{version} has {len(fields)} fields, the record carries {len(values)}"
        )
    for (name, check), value in zip(fields, values, strict=True):
        if not check(value):
            raise RecordDecodeError(f"{cls.__name__}.{name} has an invalid value {value!r}")
    if cls is ClientQuota and values[2] is not None:
        values = (*values[:2], float(values[2]))  # msgpack may carry 1.0 as 1
    return cls(*values)
