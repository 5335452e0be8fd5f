"""Records of the internal compacted topic `__consumer_offsets`.

Two record kinds share the topic, told apart by the first element of the key:
- offset commit:   key [1, group_id, topic, partition]  value {"v": 1, offset fields...}
- group metadata:  key [2, group_id]                    value {"v": 1, group fields...}
A value of None is a tombstone: compaction eventually drops the key, replay deletes it.

Keys are msgpack arrays of plain strings and ints, which msgpack encodes deterministically, so
equal keys are equal bytes — what log compaction compares. Key kinds 1 and 2 mirror Kafka's own
key versions (0/1 offsets, 2 group metadata). Values are msgpack maps with a version so fields
can be added later; a reader refuses versions it does not know instead of guessing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgpack

from raftlog.errors import CorruptRecordError

OFFSET_KEY_KIND = 1
GROUP_KEY_KIND = 2
OFFSET_VALUE_VERSION = 1
GROUP_VALUE_VERSION = 1

Record = tuple[bytes, bytes | None]


@dataclass(frozen=True)
class OffsetKey:
    group_id: str
    topic: str
    partition: int


@dataclass(frozen=True)
class GroupKey:
    group_id: str


@dataclass(frozen=True)
class CommittedOffset:
    offset: int
    leader_epoch: int  # -1 when the client did not send one
    metadata: str
    commit_time_ms: int  # wall-clock time of the commit, for retention


@dataclass(frozen=True)
class MemberMetadataValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    # Only the selected protocol's subscription is stored, as Kafka does: it is all a
    # reloaded group needs to describe itself and to answer a rejoin with the same metadata.
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupMetadataValue:
    protocol_type: str | None
    generation_id: int
    protocol_name: str | None
    leader_id: str | None
    state_time_ms: int
    members: tuple[MemberMetadataValue, ...]


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack(data: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
        raise CorruptRecordError(f"{what}: not valid msgpack: {exc}") from None


def _check(cond: bool, what: str, obj: Any) -> None:
    if not cond:
        raise CorruptRecordError(f"{what}: unexpected shape {obj!r:.200}")


# ------------------------------------------------------------------------------ encode
def offset_key(group_id: str, topic: str, partition: int) -> bytes:
    return _pack([OFFSET_KEY_KIND, group_id, topic, partition])


def group_key(group_id: str) -> bytes:
    return _pack([GROUP_KEY_KIND, group_id])


def offset_commit_record(key: OffsetKey, value: CommittedOffset) -> Record:
    return (
        offset_key(key.group_id, key.topic, key.partition),
        _pack(
            {
                "v": OFFSET_VALUE_VERSION,
                "offset": value.offset,
                "leader_epoch": value.leader_epoch,
                "metadata": value.metadata,
                "commit_time_ms": value.commit_time_ms,
            }
        ),
    )


def offset_tombstone(key: OffsetKey) -> Record:
    return (offset_key(key.group_id, key.topic, key.partition), None)


def group_metadata_record(group_id: str, value: GroupMetadataValue) -> Record:
    members = [
        {
            "member_id": m.member_id,
            "group_instance_id": m.group_instance_id,
            "client_id": m.client_id,
            "client_host": m.client_host,
            "session_timeout_ms": m.session_timeout_ms,
            "rebalance_timeout_ms": m.rebalance_timeout_ms,
            "subscription": m.subscription,
            "assignment": m.assignment,
        }
        for m in value.members
    ]
    body = {
        "v": GROUP_VALUE_VERSION,
        "protocol_type": value.protocol_type,
        "generation_id": value.generation_id,
        "protocol_name": value.protocol_name,
        "leader_id": value.leader_id,
        "state_time_ms": value.state_time_ms,
        "members": members,
    }
    return group_key(group_id), _pack(body)


def group_tombstone(group_id: str) -> Record:
    return group_key(group_id), None


# ------------------------------------------------------------------------------ decode
def decode_key(data: bytes) -> OffsetKey | GroupKey:
    obj = _unpack(data, "offsets key")
    _check(isinstance(obj, list) and len(obj) >= 2, "offsets key", obj)
    kind = obj[0]
    if kind == OFFSET_KEY_KIND:
        _check(len(obj) == 4, "offset key", obj)
        _, group_id, topic, partition = obj
        _check(
            isinstance(group_id, str) and isinstance(topic, str) and type(partition) is int,
            "offset key",
            obj,
        )
        return OffsetKey(group_id, topic, partition)
    if kind == GROUP_KEY_KIND:
        _check(len(obj) == 2 and isinstance(obj[1], str), "group key", obj)
        return GroupKey(obj[1])
    raise CorruptRecordError(f"offsets key: unknown key kind {kind!r}")


def _versioned_map(data: bytes, what: str, version: int) -> dict[str, Any]:
    obj = _unpack(data, what)
    _check(isinstance(obj, dict), what, obj)
    if obj.get("v") != version:
        raise CorruptRecordError(f"{what}: unsupported value version {obj.get('v')!r}")
    return obj


def _field(obj: dict[str, Any], name: str, types: type | tuple[type, ...], what: str) -> Any:
    value = obj.get(name)
    if not isinstance(value, types) or isinstance(value, bool):
        raise CorruptRecordError(f"{what}: field {name!r} has bad value {value!r:.100}")
    return value


def decode_offset_value(data: bytes) -> CommittedOffset:
    what = "offset commit value"
    obj = _versioned_map(data, what, OFFSET_VALUE_VERSION)
    return CommittedOffset(
        offset=_field(obj, "offset", int, what),
        leader_epoch=_field(obj, "leader_epoch", int, what),
        metadata=_field(obj, "metadata", str, what),
        commit_time_ms=_field(obj, "commit_time_ms", int, what),
    )


def decode_group_value(data: bytes) -> GroupMetadataValue:
    what = "group metadata value"
    obj = _versioned_map(data, what, GROUP_VALUE_VERSION)
    raw_members = _field(obj, "members", list, what)
    members = []
    for raw in raw_members:
        _check(isinstance(raw, dict), what, raw)
        members.append(
            MemberMetadataValue(
                member_id=_field(raw, "member_id", str, what),
                group_instance_id=_field(raw, "group_instance_id", (str, type(None)), what),
                client_id=_field(raw, "client_id", str, what),
                client_host=_field(raw, "client_host", str, what),
                session_timeout_ms=_field(raw, "session_timeout_ms", int, what),
                rebalance_timeout_ms=_field(raw, "rebalance_timeout_ms", int, what),
                subscription=_field(raw, "subscription", bytes, what),
                assignment=_field(raw, "assignment", bytes, what),
            )
        )
    optional_str = (str, type(None))
    return GroupMetadataValue(
        protocol_type=_field(obj, "protocol_type", optional_str, what),
        generation_id=_field(obj, "generation_id", int, what),
        protocol_name=_field(obj, "protocol_name", optional_str, what),
        leader_id=_field(obj, "leader_id", optional_str, what),
        state_time_ms=_field(obj, "state_time_ms", int, what),
        members=tuple(members),
    )


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
