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
        codec = _codec(type(self))
        if codec.plain:
            return [self.TAG, *[getattr(self, name) for name in codec.names]]
        out: list[Any] = [self.TAG]
        for name, kind in zip(codec.names, codec.kinds, strict=True):
            value = getattr(self, name)
            if kind == "entries":
                value = [e.to_wire() for e in value]
            elif kind == "ints":
                value = list(value)
            elif kind in _NESTED and value is not None:
                value = value.to_wire()
            out.append(value)
        return out

    @classmethod
    def from_wire(cls, wire: Any) -> Any:
        codec = _codec(cls)
        values = _unpack(wire, len(codec.names) + 1, cls.__name__)
        if values[0] != cls.TAG:
            raise MessageDecodeError(f"{cls.__name__}: tag {values[0]!r} != {cls.TAG}")
        try:
            args = [dec(v) for dec, v in zip(codec.decoders, values[1:], strict=True)]
        except MessageDecodeError as exc:
            raise MessageDecodeError(f"{cls.__name__}: {exc}") from None
        return cls(*args)


@dataclass(frozen=True, slots=True)
class _Codec:
    names: tuple[str, ...]
    kinds: tuple[str, ...]
    decoders: tuple[Any, ...]
    plain: bool  # every field goes on the wire as is (ints, bools, bytes, None)


_CODECS: dict[type, _Codec] = {}


def _codec(cls: type) -> _Codec:
    """Per-class field names, wire kinds and decoders, computed once (the codec's hot path)."""
    codec = _CODECS.get(cls)
    if codec is None:
        names, kinds = [], []
        for f in dataclasses.fields(cls):
            type_text = str(f.type)
            if f.name == "entries":
                kind = "entries"
            elif f.name == "preferred_successors":
                kind = "ints"
            elif f.name in _NESTED:
                kind = f.name
            elif type_text.startswith("bool"):
                kind = "bool"
            elif type_text.startswith("bytes"):
                kind = "bytes"
            else:
                kind = "opt_int" if "None" in type_text else "int"
            names.append(f.name)
            kinds.append(kind)
        decoders = tuple(_DECODERS[k] if k in _DECODERS else _nested_decoder(k) for k in kinds)
        plain = all(k in ("int", "opt_int", "bool", "bytes") for k in kinds)
        codec = _CODECS[cls] = _Codec(tuple(names), tuple(kinds), decoders, plain)
    return codec


def _nested_decoder(kind: str) -> Any:
    nested = _NESTED[kind]
    return lambda v: None if v is None else nested.from_wire(v)


def _opt_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise MessageDecodeError(f"expected bool, got {value!r:.100}")
    return value


def _list(value: Any) -> list[Any] | tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise MessageDecodeError(f"expected a list, got {value!r:.100}")
    return value


_DECODERS: dict[str, Any] = {
    "int": lambda v: v if type(v) is int else _int(v),
    "opt_int": _opt_int,
    "bool": _bool,
    "bytes": lambda v: v if type(v) is bytes else _bytes(v),
    "entries": lambda v: tuple(Entry.from_wire(e) for e in _list(v)),
    "ints": lambda v: tuple(_int(i) for i in _list(v)),
}


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
    # The latest read_sequence this replica got from the leader: a fetch carrying the number
    # of a read_index() call was sent after that call (the leader's ReadIndex confirmation).
    read_sequence: int = 0


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
    read_sequence: int = 0  # the leader's count of read_index() calls in this epoch


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
