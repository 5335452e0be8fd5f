"""The replica.fetch RPC body: one request per follower broker, all its partitions of a leader.

Bodies are msgpack maps declared through raftlog.codec, decoded and checked here so a
malformed request from a peer becomes a DecodeError (the RPC layer answers with an error) and
never a half-applied fetch. Records travel as the leader's on-disk RecordBatch v2 bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from raftlog.codec import I32_MAX, Codec, Epoch, Map, MaxLen, NodeId, Offset, Range, Size, UnknownAs
from raftlog.epochs import DivergingEpoch
from raftlog.errors import ErrorCode

REPLICA_FETCH_METHOD = "replica.fetch"
# A follower hosts at most this many partitions of one leader in a single fetch; more is a
# malformed (or hostile) request, refused before any work is done.
MAX_PARTITIONS_PER_REPLICA_FETCH = 100_000

TopicName = Annotated[str, MaxLen(249)]
PartitionIndex = Annotated[int, Range(0, I32_MAX)]
CODEC = Codec()


@dataclass(frozen=True)
class ReplicaFetchPartition:
    __wire__: ClassVar[Map] = Map()
    topic: TopicName
    partition: PartitionIndex
    fetch_offset: Offset
    last_fetched_epoch: Epoch
    leader_epoch: Epoch
    # The HW the follower knows (-1: unknown). A leader whose HW is ahead answers at once
    # instead of parking, so followers learn HW advances without waiting for new data.
    high_watermark: Offset = -1


@dataclass(frozen=True)
class ReplicaFetchRequest:
    __wire__: ClassVar[Map] = Map()
    replica_id: NodeId
    max_wait_ms: Size
    min_bytes: Size
    partitions: Annotated[
        tuple[ReplicaFetchPartition, ...], MaxLen(MAX_PARTITIONS_PER_REPLICA_FETCH)
    ]


@dataclass(frozen=True)
class ReplicaFetchAnswer:
    __wire__: ClassVar[Map] = Map()
    topic: TopicName
    partition: PartitionIndex
    # A code this node does not know (a newer leader's) reads as UNKNOWN_SERVER_ERROR.
    error: Annotated[ErrorCode, UnknownAs(ErrorCode.unknown_server_error)]
    high_watermark: Offset
    log_start_offset: Offset
    diverging_epoch: DivergingEpoch | None = None
    records: bytes = b""


@dataclass(frozen=True)
class ReplicaFetchResponse:
    __wire__: ClassVar[Map] = Map()
    partitions: Annotated[tuple[ReplicaFetchAnswer, ...], MaxLen(MAX_PARTITIONS_PER_REPLICA_FETCH)]


def encode_request(request: ReplicaFetchRequest) -> dict[str, Any]:
    wire: dict[str, Any] = CODEC.to_wire(request)
    return wire


def decode_request(body: Any) -> ReplicaFetchRequest:
    return CODEC.from_wire(ReplicaFetchRequest, body)


def encode_response(answers: Sequence[ReplicaFetchAnswer]) -> dict[str, Any]:
    wire: dict[str, Any] = CODEC.to_wire(ReplicaFetchResponse(tuple(answers)))
    return wire


def decode_response(body: Any) -> list[ReplicaFetchAnswer]:
    return list(CODEC.from_wire(ReplicaFetchResponse, body).partitions)
