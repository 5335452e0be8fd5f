"""Records of the internal compacted topic `__consumer_offsets`.

Three record kinds share the topic, told apart by the first element of the key:
- offset commit:   key [1, group_id, topic, partition]  value {"v": 1, offset fields...}
- group metadata:  key [2, group_id]                    value {"v": 1, group fields...}
- consumer group:  key [3, group_id]                    value {"v": 1, KIP-848 group...}
  (declared in consumer_format.py)
A value of None is a tombstone: compaction eventually drops the key, replay deletes it.

Transactional offset commits (KIP-98) are offset records in a transactional batch of the
committing producer; they count only once that producer's COMMIT marker follows them on the
partition, and never after an ABORT. Replay therefore sees the log as entries: plain records,
TxnRecord (a record of a transactional batch) and TxnEnd (a COMMIT/ABORT marker).

Keys are msgpack arrays of plain strings and ints, which msgpack encodes deterministically, so
equal keys are equal bytes — what log compaction compares. Key kinds 1 and 2 mirror Kafka's own
key versions (0/1 offsets, 2 group metadata). Values are msgpack maps with a version so fields
can be added later; a reader refuses versions it does not know instead of guessing. Keys and
values are declared through raftlog.codec, which checks every field at decode.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from raftlog.codec import Array, Codec, DecodeError, Int32, Map
from raftlog.errors import CorruptRecordError
from raftlog.groups import consumer_format as cf

OFFSET_KEY_KIND = 1
GROUP_KEY_KIND = 2
OFFSET_VALUE_VERSION = 1
GROUP_VALUE_VERSION = 1

Record = tuple[bytes, bytes | None]
CODEC = Codec()


@dataclass(frozen=True)
class TxnRecord:
    """A record of a transactional batch written by `producer_id` (pending until its marker)."""

    producer_id: int
    key: bytes
    value: bytes | None


@dataclass(frozen=True)
class TxnEnd:
    """The COMMIT (commit=True) or ABORT marker of `producer_id`'s transaction."""

    producer_id: int
    commit: bool


# One entry of an offsets partition's log, in log order.
LogEntry = Record | TxnRecord | TxnEnd


class OffsetsRecordError(CorruptRecordError, DecodeError):
    """A `__consumer_offsets` key or value that does not decode; the message says which."""


@dataclass(frozen=True)
class OffsetKey:
    __wire__: ClassVar[Array] = Array(header=("KIND",))
    KIND: ClassVar[int] = OFFSET_KEY_KIND
    group_id: str
    topic: str
    partition: Int32


@dataclass(frozen=True)
class GroupKey:
    __wire__: ClassVar[Array] = Array(header=("KIND",))
    KIND: ClassVar[int] = GROUP_KEY_KIND
    group_id: str


@dataclass(frozen=True)
class CommittedOffset:
    __wire__: ClassVar[Map] = Map(header=(("v", "VERSION"),))
    VERSION: ClassVar[int] = OFFSET_VALUE_VERSION
    offset: int
    leader_epoch: Int32  # -1 when the client did not send one
    metadata: str
    commit_time_ms: int  # wall-clock time of the commit, for retention


@dataclass(frozen=True)
class MemberMetadataValue:
    __wire__: ClassVar[Map] = Map()
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: Int32
    rebalance_timeout_ms: Int32
    # Only the selected protocol's subscription is stored, as Kafka does: it is all a
    # reloaded group needs to describe itself and to answer a rejoin with the same metadata.
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupMetadataValue:
    __wire__: ClassVar[Map] = Map(header=(("v", "VERSION"),))
    VERSION: ClassVar[int] = GROUP_VALUE_VERSION
    protocol_type: str | None
    generation_id: Int32
    protocol_name: str | None
    leader_id: str | None
    state_time_ms: int
    members: tuple[MemberMetadataValue, ...]


# ------------------------------------------------------------------------------ encode
def offset_key(group_id: str, topic: str, partition: int) -> bytes:
    return CODEC.encode(OffsetKey(group_id, topic, partition))


def group_key(group_id: str) -> bytes:
    return CODEC.encode(GroupKey(group_id))


def offset_commit_record(key: OffsetKey, value: CommittedOffset) -> Record:
    return CODEC.encode(key), CODEC.encode(value)


def offset_tombstone(key: OffsetKey) -> Record:
    return CODEC.encode(key), None


def group_metadata_record(group_id: str, value: GroupMetadataValue) -> Record:
    return group_key(group_id), CODEC.encode(value)


def group_tombstone(group_id: str) -> Record:
    return group_key(group_id), None


# ------------------------------------------------------------------------------ decode
def _decode(tp: Any, data: bytes, what: str) -> Any:
    try:
        return CODEC.decode(tp, data)
    except DecodeError as exc:
        raise OffsetsRecordError(f"{what}: {exc}") from None


def decode_key(data: bytes) -> OffsetKey | GroupKey | cf.ConsumerGroupKey:
    key: OffsetKey | GroupKey | cf.ConsumerGroupKey = _decode(
        OffsetKey | GroupKey | cf.ConsumerGroupKey, data, "offsets key"
    )
    return key


def consumer_group_key(group_id: str) -> bytes:
    return CODEC.encode(cf.ConsumerGroupKey(group_id))


def consumer_group_record(group_id: str, value: cf.ConsumerGroupValue) -> Record:
    return consumer_group_key(group_id), CODEC.encode(value)


def consumer_group_tombstone(group_id: str) -> Record:
    return consumer_group_key(group_id), None


def decode_consumer_group_value(data: bytes) -> cf.ConsumerGroupValue:
    value: cf.ConsumerGroupValue = _decode(cf.ConsumerGroupValue, data, "consumer group value")
    problem = cf.check_value(value)
    if problem is not None:
        raise OffsetsRecordError(f"consumer group value: {problem}")
    return value


def decode_offset_value(data: bytes) -> CommittedOffset:
    value: CommittedOffset = _decode(CommittedOffset, data, "offset commit value")
    return value


def decode_group_value(data: bytes) -> GroupMetadataValue:
    value: GroupMetadataValue = _decode(GroupMetadataValue, data, "group metadata value")
    return value


@dataclass
class ReplayedPartition:
    """The live state of one offsets partition after replaying its records in log order.

    positions: where each committed offset was written (its entry's index), so a
    transaction's offsets never replace a later plain commit of the same partition.
    pending: transactional offsets whose producer's marker has not been replayed yet, by
    producer id: key -> (offset, position).
    """

    offsets: dict[OffsetKey, CommittedOffset]
    groups: dict[str, GroupMetadataValue]
    positions: dict[OffsetKey, int] = field(default_factory=dict)
    consumer_groups: dict[str, cf.ConsumerGroupValue] = field(default_factory=dict)
    pending: dict[int, dict[OffsetKey, tuple[CommittedOffset, int]]] = field(default_factory=dict)
    entries: int = 0  # how many entries were replayed (positions are below it)


def replay(entries: Iterable[LogEntry]) -> ReplayedPartition:
    """Fold entries in log order: the last value of a key wins, a tombstone deletes it, a
    transaction's offsets count from its COMMIT marker on (at the position they were
    written) and never after an ABORT.

    This is exactly what compaction preserves, so replaying a compacted partition gives the
    same result as replaying the full history.
    """
    out = ReplayedPartition(offsets={}, groups={})
    for position, entry in enumerate(entries):
        out.entries = position + 1
        if isinstance(entry, TxnEnd):
            finished = out.pending.pop(entry.producer_id, {})
            if entry.commit:
                apply_committed(out.offsets, out.positions, finished)
            continue
        if isinstance(entry, TxnRecord):
            key = decode_key(entry.key)
            if not isinstance(key, OffsetKey) or entry.value is None:
                # The coordinator writes only offsets inside a transaction.
                raise OffsetsRecordError(
                    f"transactional record of producer {entry.producer_id} at entry "
                    f"{position} is not an offset commit"
                )
            value = decode_offset_value(entry.value)
            out.pending.setdefault(entry.producer_id, {})[key] = (value, position)
            continue
        key_bytes, value_bytes = entry
        key = decode_key(key_bytes)
        if isinstance(key, OffsetKey):
            if value_bytes is None:
                out.offsets.pop(key, None)
                out.positions.pop(key, None)
            else:
                out.offsets[key] = decode_offset_value(value_bytes)
                out.positions[key] = position
        elif isinstance(key, cf.ConsumerGroupKey):
            if value_bytes is None:
                out.consumer_groups.pop(key.group_id, None)
            else:
                out.consumer_groups[key.group_id] = decode_consumer_group_value(value_bytes)
        elif value_bytes is None:
            out.groups.pop(key.group_id, None)
        else:
            out.groups[key.group_id] = decode_group_value(value_bytes)
    return out


def apply_committed(
    offsets: dict[OffsetKey, CommittedOffset],
    positions: dict[OffsetKey, int],
    committed: dict[OffsetKey, tuple[CommittedOffset, int]],
) -> None:
    """A transaction's offsets take effect, each unless a later write of its key exists
    (a plain commit written after the transactional one, before the marker, wins: Kafka's
    order of appends, not of markers)."""
    for key, (value, position) in committed.items():
        if positions.get(key, -1) < position:
            offsets[key] = value
            positions[key] = position
