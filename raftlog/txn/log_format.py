"""Records of the internal compacted topic `__transaction_state`, in Kafka's own format.

One record per transactional id and transition; the key is the transactional id, so
compaction keeps each id's newest state. Both halves start with an int16 version:
- key   = version int16 (0), TransactionLogKey v0 (transactional_id: string)
- value = version int16 (0 or 1), TransactionLogValue of that version, or null (a tombstone:
  the transactional id expired, replay forgets it).
Version 1 of the value is Kafka's first flexible version (compact strings and arrays, tagged
fields); it adds the tagged fields PreviousProducerId (0), NextProducerId (1) and
ClientTransactionVersion (2). raftlog writes version 0 unless one of them differs from its
default, so a record is exactly the bytes a Kafka broker without KIP-890 part 2 writes.

kio owns the byte layout: the entities below are declared the way kio's generated schema
classes are (Kafka keeps these schemas in its transaction-coordinator module, which kio does
not ship), and kio's entity reader and writer encode them. This module adds what kio leaves
to the caller: the version prefix, bounds on sizes and counts, refusing unknown versions and
trailing bytes, and the semantic range checks of every field.
"""

# No `from __future__ import annotations`: kio reads the entities' field types at runtime.
import enum
import io
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i8, i16, i32, i64

from raftlog.codec import I32_MAX, I64_MAX
from raftlog.constants import METADATA_TOPIC
from raftlog.errors import CorruptRecordError

# Re-exported: the transaction modules name them from here.
from raftlog.records import MAX_PRODUCER_EPOCH as MAX_PRODUCER_EPOCH
from raftlog.records import NO_PRODUCER_EPOCH as NO_PRODUCER_EPOCH
from raftlog.records import NO_PRODUCER_ID as NO_PRODUCER_ID

TRANSACTION_STATE_TOPIC = "__transaction_state"
# Partitions that never take part in a transaction nor hold a marker: the coordinator's own
# log and the metadata log (a control batch in either would be read by their loaders). The
# offsets topic may: transactional offset commits end with a marker there.
NO_MARKER_TOPICS = frozenset({TRANSACTION_STATE_TOPIC, METADATA_TOPIC})
KEY_VERSION = 0
VALUE_VERSIONS = (0, 1)
NO_TIMESTAMP = -1
# Kafka's transaction.version feature levels as ClientTransactionVersion stores them: 0 is
# the protocol of KIP-98 (with KIP-890 part 1); 2 is KIP-890 part 2, an epoch bump at every
# end of a transaction (EndTxn v5+, Produce v12+). Level 1 only gates broker-side features.
TV_0 = 0
TV_2 = 2
# Kafka's limit for a string of the protocol (int16 length).
MAX_TRANSACTIONAL_ID_BYTES = 2**15 - 1
# Bounds on what a record may hold. A transaction's partition set is bounded where it grows
# (TxnConfig.max_partitions_per_transaction); a record over these is damage, not data.
MAX_VALUE_BYTES = 16 * 1024 * 1024
MAX_PARTITIONS_PER_RECORD = 1_000_000

Record = tuple[bytes, bytes | None]
TopicPartition = tuple[str, int]

_VERSION = struct.Struct(">h")


class TxnLogRecordError(CorruptRecordError):
    """A `__transaction_state` key or value that does not decode; the message says why."""


class TransactionState(enum.IntEnum):
    """Kafka's TransactionState ids, as stored in TransactionLogValue.transaction_status."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name DescribeTransactions and ListTransactions use ("PrepareCommit")."""
        return _KAFKA_NAMES[self]


_KAFKA_NAMES = {
    TransactionState.EMPTY: "Empty",
    TransactionState.ONGOING: "Ongoing",
    TransactionState.PREPARE_COMMIT: "PrepareCommit",
    TransactionState.PREPARE_ABORT: "PrepareAbort",
    TransactionState.COMPLETE_COMMIT: "CompleteCommit",
    TransactionState.COMPLETE_ABORT: "CompleteAbort",
    TransactionState.DEAD: "Dead",
    TransactionState.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}


# ------------------------------------------------------------------------------ kio entities
@dataclass(frozen=True, slots=True, kw_only=True)
class _KeyV0:
    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    transactional_id: str = field(metadata={"kafka_type": "string"})


@dataclass(frozen=True, slots=True, kw_only=True)
class _PartitionsV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    topic: str = field(metadata={"kafka_type": "string"})
    partition_ids: tuple[i32, ...] = field(metadata={"kafka_type": "int32"}, default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class _ValueV0:
    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    producer_id: i64 = field(metadata={"kafka_type": "int64"})
    producer_epoch: i16 = field(metadata={"kafka_type": "int16"})
    transaction_timeout_ms: i32 = field(metadata={"kafka_type": "int32"})
    transaction_status: i8 = field(metadata={"kafka_type": "int8"})
    transaction_partitions: tuple[_PartitionsV0, ...] | None
    transaction_last_update_timestamp_ms: i64 = field(metadata={"kafka_type": "int64"})
    transaction_start_timestamp_ms: i64 = field(metadata={"kafka_type": "int64"})


@dataclass(frozen=True, slots=True, kw_only=True)
class _PartitionsV1:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = True
    topic: str = field(metadata={"kafka_type": "string"})
    partition_ids: tuple[i32, ...] = field(metadata={"kafka_type": "int32"}, default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class _ValueV1:
    __type__: ClassVar = EntityType.data
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = True
    producer_id: i64 = field(metadata={"kafka_type": "int64"})
    previous_producer_id: i64 = field(
        metadata={"kafka_type": "int64", "tag": 0}, default=i64(NO_PRODUCER_ID)
    )
    next_producer_id: i64 = field(
        metadata={"kafka_type": "int64", "tag": 1}, default=i64(NO_PRODUCER_ID)
    )
    producer_epoch: i16 = field(metadata={"kafka_type": "int16"})
    transaction_timeout_ms: i32 = field(metadata={"kafka_type": "int32"})
    transaction_status: i8 = field(metadata={"kafka_type": "int8"})
    transaction_partitions: tuple[_PartitionsV1, ...] | None
    transaction_last_update_timestamp_ms: i64 = field(metadata={"kafka_type": "int64"})
    transaction_start_timestamp_ms: i64 = field(metadata={"kafka_type": "int64"})
    client_transaction_version: i16 = field(
        metadata={"kafka_type": "int16", "tag": 2}, default=i16(0)
    )


# ------------------------------------------------------------------------------ the model
@dataclass(frozen=True)
class TransactionLogValue:
    """One transactional id's stored state (Kafka's TransactionLogValue, any version).

    `partitions` is a sorted tuple of (topic, partition); Kafka stores them grouped by topic.
    """

    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    state: TransactionState
    partitions: tuple[TopicPartition, ...]
    last_update_timestamp_ms: int
    start_timestamp_ms: int
    previous_producer_id: int = NO_PRODUCER_ID
    next_producer_id: int = NO_PRODUCER_ID
    client_transaction_version: int = 0

    def check(self) -> str | None:
        """Why the fields are out of range or inconsistent (None: they are not)."""
        if not 0 <= self.producer_id <= I64_MAX:
            return f"producer id {self.producer_id} out of range"
        for name in ("previous_producer_id", "next_producer_id"):
            value = getattr(self, name)
            if not NO_PRODUCER_ID <= value <= I64_MAX:
                return f"{name} {value} out of range"
        if not 0 <= self.producer_epoch <= MAX_PRODUCER_EPOCH:
            return f"producer epoch {self.producer_epoch} out of range"
        if not 0 < self.transaction_timeout_ms <= I32_MAX:
            return f"transaction timeout {self.transaction_timeout_ms} ms out of range"
        if not 0 <= self.client_transaction_version < 2**15:
            return f"client transaction version {self.client_transaction_version} out of range"
        for name in ("last_update_timestamp_ms", "start_timestamp_ms"):
            value = getattr(self, name)
            if not NO_TIMESTAMP <= value <= I64_MAX:
                return f"{name} {value} out of range"
        if len(self.partitions) > MAX_PARTITIONS_PER_RECORD:
            return f"{len(self.partitions)} partitions"
        if list(self.partitions) != sorted(set(self.partitions)):
            return "partitions are not sorted and unique"
        for topic, partition in self.partitions:
            if not topic or len(topic.encode()) >= 2**15:
                return f"topic name of {len(topic.encode())} bytes"
            if not 0 <= partition <= I32_MAX:
                return f"partition {partition} of {topic!r} out of range"
        if self.state is TransactionState.EMPTY and self.partitions:
            return "an Empty transaction holds partitions"
        if self.state is TransactionState.PREPARE_EPOCH_FENCE:
            return "PrepareEpochFence is never stored"
        return None

    @property
    def needs_v1(self) -> bool:
        """Whether a tagged field of version 1 differs from its default."""
        return (
            self.previous_producer_id != NO_PRODUCER_ID
            or self.next_producer_id != NO_PRODUCER_ID
            or self.client_transaction_version != 0
        )


# ------------------------------------------------------------------------------ encode
def encode_key(transactional_id: str) -> bytes:
    _check_transactional_id(transactional_id)
    return _encode(KEY_VERSION, _KeyV0(transactional_id=transactional_id))


def encode_value(value: TransactionLogValue, version: int | None = None) -> bytes:
    """The value's bytes, in `version` (default: 0 unless a version 1 field is set)."""
    problem = value.check()
    if problem is not None:
        raise ValueError(f"transaction log value: {problem}")
    if version is None:
        version = 1 if value.needs_v1 else 0
    if version == 0:
        if value.needs_v1:
            raise ValueError("version 0 cannot hold previous/next producer id or client version")
        return _encode(0, _ValueV0(**_common_fields(value, _PartitionsV0)))
    if version == 1:
        return _encode(
            1,
            _ValueV1(
                **_common_fields(value, _PartitionsV1),
                previous_producer_id=i64(value.previous_producer_id),
                next_producer_id=i64(value.next_producer_id),
                client_transaction_version=i16(value.client_transaction_version),
            ),
        )
    raise ValueError(f"unknown transaction log value version {version}")


def record(transactional_id: str, value: TransactionLogValue | None) -> Record:
    """The (key, value) record of one transition; `value` None is the tombstone."""
    return encode_key(transactional_id), None if value is None else encode_value(value)


def _common_fields(value: TransactionLogValue, partitions_cls: Any) -> dict[str, Any]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in value.partitions:
        by_topic.setdefault(topic, []).append(partition)
    # Kafka writes null for an Empty transaction's partitions, a (possibly empty) list else.
    partitions = (
        None
        if value.state is TransactionState.EMPTY
        else tuple(
            partitions_cls(topic=topic, partition_ids=tuple(i32(p) for p in ids))
            for topic, ids in by_topic.items()
        )
    )
    return {
        "producer_id": i64(value.producer_id),
        "producer_epoch": i16(value.producer_epoch),
        "transaction_timeout_ms": i32(value.transaction_timeout_ms),
        "transaction_status": i8(value.state),
        "transaction_partitions": partitions,
        "transaction_last_update_timestamp_ms": i64(value.last_update_timestamp_ms),
        "transaction_start_timestamp_ms": i64(value.start_timestamp_ms),
    }


def _encode(version: int, entity: Any) -> bytes:
    buffer = io.BytesIO()
    buffer.write(_VERSION.pack(version))
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def _check_transactional_id(transactional_id: str) -> None:
    size = len(transactional_id.encode())
    if not 0 < size <= MAX_TRANSACTIONAL_ID_BYTES:
        raise ValueError(f"transactional id of {size} bytes")


# ------------------------------------------------------------------------------ decode
def _decode_entity(data: bytes, cls: Any, what: str) -> Any:
    try:
        entity, size = entity_reader(cls)(data, _VERSION.size)
    except Exception as exc:  # kio raises several types for truncated or malformed input
        raise TxnLogRecordError(f"{what} does not decode: {exc}") from None
    trailing = len(data) - _VERSION.size - size
    if trailing:
        raise TxnLogRecordError(f"{what} has {trailing} bytes after its fields")
    return entity


def _version_of(data: bytes, what: str) -> int:
    if len(data) < _VERSION.size:
        raise TxnLogRecordError(f"{what} of {len(data)} bytes has no version")
    (version,) = _VERSION.unpack_from(data)
    return int(version)


def decode_key(data: bytes | bytearray | memoryview) -> str:
    """The transactional id of a record key."""
    data = bytes(data)
    if len(data) > 2 + 2 + MAX_TRANSACTIONAL_ID_BYTES:
        raise TxnLogRecordError(f"transaction log key of {len(data)} bytes")
    version = _version_of(data, "transaction log key")
    if version != KEY_VERSION:
        raise TxnLogRecordError(f"transaction log key has unknown version {version}")
    key = _decode_entity(data, _KeyV0, "transaction log key")
    transactional_id: str = key.transactional_id
    if not transactional_id:
        raise TxnLogRecordError("transaction log key has an empty transactional id")
    return transactional_id


def decode_value(data: bytes | bytearray | memoryview | None) -> TransactionLogValue | None:
    """The stored state of a record value; None for a tombstone."""
    if data is None:
        return None
    data = bytes(data)
    if len(data) > MAX_VALUE_BYTES:
        raise TxnLogRecordError(f"transaction log value of {len(data)} bytes")
    version = _version_of(data, "transaction log value")
    if version not in VALUE_VERSIONS:
        raise TxnLogRecordError(f"transaction log value has unknown version {version}")
    cls = _ValueV0 if version == 0 else _ValueV1
    raw = _decode_entity(data, cls, f"transaction log value v{version}")
    try:
        state = TransactionState(raw.transaction_status)
    except ValueError:
        raise TxnLogRecordError(
            f"transaction log value has unknown status {raw.transaction_status}"
        ) from None
    partitions: list[TopicPartition] = []
    topics: set[str] = set()
    for entry in raw.transaction_partitions or ():
        if entry.topic in topics:
            raise TxnLogRecordError(f"transaction log value names topic {entry.topic!r} twice")
        topics.add(entry.topic)
        partitions.extend((entry.topic, int(p)) for p in entry.partition_ids)
    if len(set(partitions)) != len(partitions):
        raise TxnLogRecordError("transaction log value names a partition twice")
    value = TransactionLogValue(
        producer_id=raw.producer_id,
        producer_epoch=raw.producer_epoch,
        transaction_timeout_ms=raw.transaction_timeout_ms,
        state=state,
        partitions=tuple(sorted(partitions)),
        last_update_timestamp_ms=raw.transaction_last_update_timestamp_ms,
        start_timestamp_ms=raw.transaction_start_timestamp_ms,
        previous_producer_id=getattr(raw, "previous_producer_id", NO_PRODUCER_ID),
        next_producer_id=getattr(raw, "next_producer_id", NO_PRODUCER_ID),
        client_transaction_version=getattr(raw, "client_transaction_version", 0),
    )
    problem = value.check()
    if problem is not None:
        raise TxnLogRecordError(f"transaction log value: {problem}")
    return value


def decode_records(
    records: Iterable[Record],
) -> Iterator[tuple[str, TransactionLogValue | None]]:
    """(transactional id, value) of each record in turn; None for a tombstone or a Dead
    value (either deletes the id). Raises TxnLogRecordError on the first record that does
    not decode."""
    for key_bytes, value_bytes in records:
        if key_bytes is None:
            raise TxnLogRecordError("transaction log record without a key")
        transactional_id = decode_key(key_bytes)
        value = decode_value(value_bytes)
        if value is not None and value.state is TransactionState.DEAD:
            value = None
        yield transactional_id, value


def replay(records: Iterable[Record]) -> dict[str, TransactionLogValue]:
    """Fold records in log order: the last value of a key wins, a tombstone deletes it.

    Compaction preserves exactly this, so a compacted partition replays to the same states.
    Raises TxnLogRecordError on the first record that does not decode.
    """
    states: dict[str, TransactionLogValue] = {}
    for transactional_id, value in decode_records(records):
        if value is None:
            states.pop(transactional_id, None)
        else:
            states[transactional_id] = value
    return states
