"""Records of the internal compacted topic `__consumer_offsets`.

Two record kinds share the topic, told apart by the first element of the key:
- offset commit:   key [1, group_id, topic, partition]  value {"v": 1, offset fields...}
- group metadata:  key [2, group_id]                    value {"v": 1, group fields...}
A value of None is a tombstone: compaction eventually drops the key, replay deletes it.

Keys are msgpack arrays of plain strings and ints, which msgpack encodes deterministically, so
equal keys are equal bytes — what log compaction compares. Key kinds 1 and 2 mirror Kafka's own
key versions (0/1 offsets, 2 group metadata). Values are msgpack maps with a version so fields
can be added later; a reader refuses versions it does not know instead of guessing. Keys and
values are declared through raftlog.codec, which checks every field at decode.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from raftlog.codec import Array, Codec, DecodeError, Int32, Map
from raftlog.errors import CorruptRecordError

OFFSET_KEY_KIND = 1
GROUP_KEY_KIND = 2
OFFSET_VALUE_VERSION = 1
GROUP_VALUE_VERSION = 1

Record = tuple[bytes, bytes | None]
CODEC = Codec()


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


def decode_key(data: bytes) -> OffsetKey | GroupKey:
    key: OffsetKey | GroupKey = _decode(OffsetKey | GroupKey, data, "offsets key")
    return key


def decode_offset_value(data: bytes) -> CommittedOffset:
    value: CommittedOffset = _decode(CommittedOffset, data, "offset commit value")
    return value


def decode_group_value(data: bytes) -> GroupMetadataValue:
    value: GroupMetadataValue = _decode(GroupMetadataValue, data, "group metadata value")
    return value


@dataclass
class ReplayedPartition:
    """The live state of one offsets partition after replaying its records in log order."""

    offsets: dict[OffsetKey, CommittedOffset]
    groups: dict[str, GroupMetadataValue]


def replay(records: Iterable[Record]) -> ReplayedPartition:
    """Fold records in log order: the last value of a key wins, a tombstone deletes it.

    This is exactly what compaction preserves, so replaying a compacted partition gives the
    same result as replaying the full history.
    """
    offsets: dict[OffsetKey, CommittedOffset] = {}
    groups: dict[str, GroupMetadataValue] = {}
    for key_bytes, value_bytes in records:
        key = decode_key(key_bytes)
        if isinstance(key, OffsetKey):
            if value_bytes is None:
                offsets.pop(key, None)
            else:
                offsets[key] = decode_offset_value(value_bytes)
        elif value_bytes is None:
            groups.pop(key.group_id, None)
        else:
            groups[key.group_id] = decode_group_value(value_bytes)
    return ReplayedPartition(offsets=offsets, groups=groups)
