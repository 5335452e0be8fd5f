"""Messages of the metadata-quorum Raft protocol (after KIP-595 / KIP-996 / KIP-630).

Every message is a frozen, slotted dataclass. ``to_wire()`` turns it into a plain list of ints,
bools, bytes, None and nested lists that msgpack encodes as is; ``message_from_wire()`` (or the
class's own ``from_wire()``) turns it back, checking the type tag and the field count. The
driver msgpack-encodes the wire form; nothing here uses pickle, and a malformed structure
raises ``MessageDecodeError`` rather than building a half-valid message.

Field conventions: offsets are exclusive ends unless the name says otherwise, ``epoch`` is
the sender's current epoch, ``leader_id`` is the leader the sender knows for that epoch
(None when it knows none), ``error`` is a Kafka error code (``ErrorCode`` values).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from raftlog.errors import ErrorCode, RaftlogError

__all__ = [
    "BeginQuorumEpoch",
    "BeginQuorumEpochResponse",
    "DivergingEpoch",
    "EndQuorumEpoch",
    "EndQuorumEpochResponse",
    "Entry",
    "Fetch",
    "FetchResponse",
    "FetchSnapshot",
    "FetchSnapshotResponse",
    "Message",
    "MessageDecodeError",
    "SnapshotId",
    "Vote",
    "VoteResponse",
    "message_from_wire",
]

ERROR_NONE = ErrorCode.none.value
ERROR_NOT_LEADER = ErrorCode.not_leader_or_follower.value
ERROR_FENCED_EPOCH = ErrorCode.fenced_leader_epoch.value
ERROR_SNAPSHOT_NOT_FOUND = ErrorCode.snapshot_not_found.value


class MessageDecodeError(RaftlogError):
    """A wire structure is not a valid Raft message (wrong tag, arity or field type)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One log entry: its offset, the epoch of the leader that wrote it, opaque payload."""

    offset: int
    epoch: int
    data: bytes

    def to_wire(self) -> list[Any]:
        return [self.offset, self.epoch, self.data]

    @classmethod
    def from_wire(cls, wire: Any) -> Entry:
        offset, epoch, data = _unpack(wire, 3, "Entry")
        return cls(_int(offset), _int(epoch), _bytes(data))


@dataclass(frozen=True, slots=True)
class DivergingEpoch:
    """The leader's end offset for the largest epoch <= the follower's last fetched epoch."""

    epoch: int
    end_offset: int

    def to_wire(self) -> list[Any]:
        return [self.epoch, self.end_offset]

    @classmethod
    def from_wire(cls, wire: Any) -> DivergingEpoch:
        epoch, end_offset = _unpack(wire, 2, "DivergingEpoch")
        return cls(_int(epoch), _int(end_offset))


@dataclass(frozen=True, slots=True)
class SnapshotId:
    """A snapshot covers every entry below end_offset; epoch is that of entry end_offset-1."""

    end_offset: int
    epoch: int

    def to_wire(self) -> list[Any]:
        return [self.end_offset, self.epoch]

    @classmethod
    def from_wire(cls, wire: Any) -> SnapshotId:
        end_offset, epoch = _unpack(wire, 2, "SnapshotId")
        return cls(_int(end_offset), _int(epoch))


# Nested types a field may hold; used by the generic encoder/decoder below.
_NESTED: dict[str, Any] = {
    "diverging_epoch": DivergingEpoch,
    "snapshot_id": SnapshotId,
}


class Message:
    """Base of every protocol message: generic wire codec over the dataclass fields."""

    __slots__ = ()
    TAG: ClassVar[int]

    def to_wire(self) -> list[Any]:
        out: list[Any] = [self.TAG]
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "entries":
                value = [e.to_wire() for e in value]
            elif f.name == "preferred_successors":
                value = list(value)
            elif value is not None and f.name in _NESTED:
                value = value.to_wire()
            out.append(value)
        return out

    @classmethod
    def from_wire(cls, wire: Any) -> Any:
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        values = _unpack(wire, len(fields) + 1, cls.__name__)
        if values[0] != cls.TAG:
            raise MessageDecodeError(f"{cls.__name__}: tag {values[0]!r} != {cls.TAG}")
        kwargs: dict[str, Any] = {}
        for f, value in zip(fields, values[1:], strict=True):
            kwargs[f.name] = _decode_field(cls.__name__, f.name, f.type, value)
        return cls(**kwargs)


def _decode_field(owner: str, name: str, type_name: Any, value: Any) -> Any:
    if name == "entries":
        if not isinstance(value, list | tuple):
            raise MessageDecodeError(f"{owner}.entries: expected a list, got {value!r}")
        return tuple(Entry.from_wire(e) for e in value)
    if name == "preferred_successors":
        if not isinstance(value, list | tuple):
            raise MessageDecodeError(f"{owner}.{name}: expected a list, got {value!r}")
        return tuple(_int(v) for v in value)
    if name in _NESTED:
        return None if value is None else _NESTED[name].from_wire(value)
    type_text = str(type_name)
    optional = "None" in type_text
    if value is None:
        if optional:
            return None
        raise MessageDecodeError(f"{owner}.{name}: None is not allowed")
    if type_text.startswith("bool"):
        if not isinstance(value, bool):
            raise MessageDecodeError(f"{owner}.{name}: expected bool, got {value!r}")
        return value
    if type_text.startswith("bytes"):
        return _bytes(value)
    return _int(value)


def _unpack(wire: Any, arity: int, what: str) -> list[Any]:
    if not isinstance(wire, list | tuple) or len(wire) != arity:
        raise MessageDecodeError(f"{what}: expected a list of {arity} items, got {wire!r:.200}")
    return list(wire)


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise MessageDecodeError(f"expected int, got {value!r:.100}")
    return value


def _bytes(value: Any) -> bytes:
    if not isinstance(value, bytes | bytearray):
        raise MessageDecodeError(f"expected bytes, got {type(value).__name__}")
    return bytes(value)


@dataclass(frozen=True, slots=True)
class Vote(Message):
    """(Pre-)vote request. For a pre-vote candidate_epoch is the epoch it *would* use."""

    TAG: ClassVar[int] = 1
    pre_vote: bool
    candidate_id: int
    candidate_epoch: int
    last_offset: int  # the candidate's log end offset (exclusive)
    last_epoch: int  # epoch of the candidate's last entry (or snapshot)


@dataclass(frozen=True, slots=True)
class VoteResponse(Message):
    TAG: ClassVar[int] = 2
    pre_vote: bool
    epoch: int
    leader_id: int | None
    vote_granted: bool
    error: int = ERROR_NONE


@dataclass(frozen=True, slots=True)
class BeginQuorumEpoch(Message):
    """Sent by a new leader so voters learn it without waiting for their timeouts."""

    TAG: ClassVar[int] = 3
    epoch: int
    leader_id: int


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochResponse(Message):
    TAG: ClassVar[int] = 4
    epoch: int
    leader_id: int | None
    error: int = ERROR_NONE


@dataclass(frozen=True, slots=True)
class EndQuorumEpoch(Message):
    """Graceful resignation: successors, most caught up first, should start elections now."""

    TAG: ClassVar[int] = 5
    epoch: int
    leader_id: int
    preferred_successors: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class EndQuorumEpochResponse(Message):
    TAG: ClassVar[int] = 6
    epoch: int
    leader_id: int | None
    error: int = ERROR_NONE


@dataclass(frozen=True, slots=True)
class Fetch(Message):
    """Pull request; fetch_offset is also the acknowledgement of everything below it."""

    TAG: ClassVar[int] = 7
    replica_id: int
    epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    max_wait_ms: int


@dataclass(frozen=True, slots=True)
class FetchResponse(Message):
    """At most one of entries / diverging_epoch / snapshot_id is meaningful per response.

    fetch_offset and last_fetched_epoch echo the request so that a duplicated or reordered
    response is only acted on by a follower whose log still ends where the request said.
    """

    TAG: ClassVar[int] = 8
    epoch: int
    leader_id: int | None
    fetch_offset: int
    last_fetched_epoch: int
    high_watermark: int
    entries: tuple[Entry, ...] = ()
    diverging_epoch: DivergingEpoch | None = None
    snapshot_id: SnapshotId | None = None
    error: int = ERROR_NONE


@dataclass(frozen=True, slots=True)
class FetchSnapshot(Message):
    TAG: ClassVar[int] = 9
    replica_id: int
    epoch: int
    snapshot_id: SnapshotId
    position: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class FetchSnapshotResponse(Message):
    """One chunk of the snapshot: data[position:position+len(chunk)] of a size-byte blob."""

    TAG: ClassVar[int] = 10
    epoch: int
    leader_id: int | None
    snapshot_id: SnapshotId | None
    position: int
    chunk: bytes
    size: int
    error: int = ERROR_NONE


_BY_TAG: dict[int, type[Message]] = {
    cls.TAG: cls
    for cls in (
        Vote,
        VoteResponse,
        BeginQuorumEpoch,
        BeginQuorumEpochResponse,
        EndQuorumEpoch,
        EndQuorumEpochResponse,
        Fetch,
        FetchResponse,
        FetchSnapshot,
        FetchSnapshotResponse,
    )
}


def message_from_wire(wire: Any) -> Message:
    """Decode any message from its wire form (the first item is the type tag)."""
    if not isinstance(wire, list | tuple) or not wire:
        raise MessageDecodeError(f"message: expected a non-empty list, got {wire!r:.200}")
    cls = _BY_TAG.get(wire[0]) if isinstance(wire[0], int) else None
    if cls is None:
        raise MessageDecodeError(f"message: unknown tag {wire[0]!r}")
    message: Message = cls.from_wire(wire)
    return message
