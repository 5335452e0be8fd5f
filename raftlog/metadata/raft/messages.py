"""Messages of the metadata-quorum Raft protocol (after KIP-595 / KIP-996 / KIP-630).

Every message is a frozen, slotted dataclass whose annotations are its wire schema
(raftlog.codec): on the wire a message is ``[TAG, field0, field1, ...]``, nested values are
lists of their fields. ``to_wire()`` gives that plain list, which the driver msgpack-encodes;
``message_from_wire()`` (or the class's own ``from_wire()``) checks every field's type and range
and raises ``DecodeError`` rather than building a half-valid message.

Field conventions: offsets are exclusive ends unless the name says otherwise, ``epoch`` is
the sender's current epoch, ``leader_id`` is the leader the sender knows for that epoch
(None when it knows none), ``error`` is a Kafka error code (``ErrorCode`` values).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Self

from raftlog.codec import Added, Array, Codec, Epoch, Int16, MaxLen, NodeId, Offset, Port, Size
from raftlog.epochs import DivergingEpoch
from raftlog.errors import ErrorCode

__all__ = [
    "AnyMessage",
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
    "RaftCast",
    "SnapshotId",
    "Vote",
    "VoteResponse",
    "message_from_wire",
]

ERROR_NONE = ErrorCode.none.value
ERROR_NOT_LEADER = ErrorCode.not_leader_or_follower.value
ERROR_FENCED_EPOCH = ErrorCode.fenced_leader_epoch.value
ERROR_SNAPSHOT_NOT_FOUND = ErrorCode.snapshot_not_found.value

CODEC = Codec()


@dataclass(frozen=True, slots=True)
class Entry:
    """One log entry: its offset, the epoch of the leader that wrote it, opaque payload."""

    __wire__: ClassVar[Array] = Array()
    offset: Offset
    epoch: Epoch
    data: bytes


@dataclass(frozen=True, slots=True)
class SnapshotId:
    """A snapshot covers every entry below end_offset; epoch is that of entry end_offset-1."""

    __wire__: ClassVar[Array] = Array()
    end_offset: Offset
    epoch: Epoch


class Message:
    """Base of every protocol message: ``[TAG, fields...]`` through the shared codec."""

    __slots__ = ()
    __wire__: ClassVar[Array] = Array(header=("TAG",))
    TAG: ClassVar[int]

    def to_wire(self) -> list[Any]:
        wire: list[Any] = CODEC.to_wire(self)
        return wire

    @classmethod
    def from_wire(cls, wire: Any) -> Self:
        return CODEC.from_wire(cls, wire)


@dataclass(frozen=True, slots=True)
class Vote(Message):
    """(Pre-)vote request. For a pre-vote candidate_epoch is the epoch it *would* use."""

    TAG: ClassVar[int] = 1
    pre_vote: bool
    candidate_id: NodeId
    candidate_epoch: Epoch
    last_offset: Offset  # the candidate's log end offset (exclusive)
    last_epoch: Epoch  # epoch of the candidate's last entry (or snapshot)


@dataclass(frozen=True, slots=True)
class VoteResponse(Message):
    TAG: ClassVar[int] = 2
    pre_vote: bool
    epoch: Epoch
    leader_id: NodeId | None
    vote_granted: bool
    error: Int16 = ERROR_NONE


@dataclass(frozen=True, slots=True)
class BeginQuorumEpoch(Message):
    """Sent by a new leader so voters learn it without waiting for their timeouts."""

    TAG: ClassVar[int] = 3
    epoch: Epoch
    leader_id: NodeId


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochResponse(Message):
    TAG: ClassVar[int] = 4
    epoch: Epoch
    leader_id: NodeId | None
    error: Int16 = ERROR_NONE


@dataclass(frozen=True, slots=True)
class EndQuorumEpoch(Message):
    """Graceful resignation: successors, most caught up first, should start elections now."""

    TAG: ClassVar[int] = 5
    epoch: Epoch
    leader_id: NodeId
    preferred_successors: tuple[NodeId, ...]


@dataclass(frozen=True, slots=True)
class EndQuorumEpochResponse(Message):
    TAG: ClassVar[int] = 6
    epoch: Epoch
    leader_id: NodeId | None
    error: Int16 = ERROR_NONE


@dataclass(frozen=True, slots=True)
class Fetch(Message):
    """Pull request; fetch_offset is also the acknowledgement of everything below it."""

    TAG: ClassVar[int] = 7
    replica_id: NodeId
    epoch: Epoch
    fetch_offset: Offset
    last_fetched_epoch: Epoch
    max_wait_ms: Size
    # The latest read_sequence this replica got from the leader: a fetch carrying the number
    # of a read_index() call was sent after that call (the leader's ReadIndex confirmation).
    read_sequence: Size = 0
    # KIP-853's ReplicaDirectoryId: the fetching replica's metadata log directory, so the
    # leader adds exactly the observer an AddRaftVoter names (None: not known).
    replica_directory_id: Annotated[uuid.UUID | None, Added()] = None


@dataclass(frozen=True, slots=True)
class FetchResponse(Message):
    """At most one of entries / diverging_epoch / snapshot_id is meaningful per response.

    fetch_offset and last_fetched_epoch echo the request so that a duplicated or reordered
    response is only acted on by a follower whose log still ends where the request said.
    """

    TAG: ClassVar[int] = 8
    epoch: Epoch
    leader_id: NodeId | None
    fetch_offset: Offset
    last_fetched_epoch: Epoch
    high_watermark: Offset
    entries: tuple[Entry, ...] = ()
    diverging_epoch: DivergingEpoch | None = None
    snapshot_id: SnapshotId | None = None
    error: Int16 = ERROR_NONE
    read_sequence: Size = 0  # the leader's count of read_index() calls in this epoch


@dataclass(frozen=True, slots=True)
class FetchSnapshot(Message):
    TAG: ClassVar[int] = 9
    replica_id: NodeId
    epoch: Epoch
    snapshot_id: SnapshotId
    position: Size
    max_bytes: Size


@dataclass(frozen=True, slots=True)
class FetchSnapshotResponse(Message):
    """One chunk of the snapshot: data[position:position+len(chunk)] of a size-byte blob."""

    TAG: ClassVar[int] = 10
    epoch: Epoch
    leader_id: NodeId | None
    snapshot_id: SnapshotId | None
    position: Size
    chunk: bytes
    size: Size
    error: Int16 = ERROR_NONE


AnyMessage = (
    Vote
    | VoteResponse
    | BeginQuorumEpoch
    | BeginQuorumEpochResponse
    | EndQuorumEpoch
    | EndQuorumEpochResponse
    | Fetch
    | FetchResponse
    | FetchSnapshot
    | FetchSnapshotResponse
)


@dataclass(frozen=True, slots=True)
class RaftCast:
    """The body of the "raft" RPC cast: a message and the internal address to answer at
    (the only way a leader learns a non-voter's address)."""

    __wire__: ClassVar[Array] = Array()
    message: AnyMessage
    reply_host: Annotated[str, MaxLen(255)]  # a DNS name has at most 253 characters
    reply_port: Port


def message_from_wire(wire: Any) -> Message:
    """Decode any message from its wire form (the first item is the type tag)."""
    message: Message = CODEC.from_wire(AnyMessage, wire)
    return message
