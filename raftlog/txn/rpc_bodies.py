"""The bodies of the transaction coordinator's two internal RPC methods:

- "txn.markers" (coordinator -> partition leader): write one COMMIT/ABORT marker on the
  partitions the receiver leads (Kafka's WriteTxnMarkers, one marker per call); answered with
  one error code per partition.
- "txn.verify" (partition leader -> coordinator): KIP-890 part 1, may this producer's
  transactional batch open a transaction on this partition (Kafka sends AddPartitionsToTxn
  with verify_only); answered with one error code. With `mode` ADD (KIP-890 part 2, for a
  Produce v12+ batch: a TV2 client sends no AddPartitionsToTxn for its data partitions) the
  coordinator adds the partition to the producer's transaction instead, and answers once
  the Ongoing record is replicated. A peer that does not know `mode` ignores it (a Map
  layout skips unknown keys) and only verifies, which refuses a partition not yet added.

Declared through raftlog.codec, so every field is type- and range-checked at decode: a peer
may be damaged or hostile, and a bad body is refused (DecodeError) before anything is written.
What an annotation cannot say (non-empty names, the UTF-8 length of a transactional id, no
partition twice) is checked in __post_init__ and raised as a DecodeError too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from raftlog.codec import I32_MAX, I64_MAX, Array, Codec, DecodeError, Map, MaxLen, Range, UnknownAs
from raftlog.errors import ErrorCode
from raftlog.txn.log_format import MAX_PRODUCER_EPOCH, MAX_TRANSACTIONAL_ID_BYTES, TopicPartition

TXN_MARKERS_METHOD = "txn.markers"
TXN_VERIFY_METHOD = "txn.verify"
# TxnVerifyRequest.mode: what the asking partition leader wants of the coordinator.
VERIFY_ONLY = 0  # KIP-890 part 1: is the partition in the ongoing transaction?
ADD_PARTITION = 1  # KIP-890 part 2: add it (a Produce v12+ batch)
# Kafka's longest topic name.
MAX_TOPIC_NAME_CHARS = 249
# Partitions one marker call may name (the leader's own bound on one marker is the same).
MAX_MARKER_PARTITIONS = 100_000

TopicName = Annotated[str, MaxLen(MAX_TOPIC_NAME_CHARS)]
PartitionIndex = Annotated[int, Range(0, I32_MAX)]
ProducerId = Annotated[int, Range(0, I64_MAX)]
ProducerEpoch = Annotated[int, Range(0, MAX_PRODUCER_EPOCH)]
# A coordinator epoch is the leader epoch of a `__transaction_state` partition (INT32).
CoordinatorEpoch = Annotated[int, Range(0, I32_MAX)]
TransactionalId = Annotated[str, MaxLen(MAX_TRANSACTIONAL_ID_BYTES)]
# An error code this node does not know (a newer peer's) reads as UNKNOWN_SERVER_ERROR.
PeerErrorCode = Annotated[ErrorCode, UnknownAs(ErrorCode.unknown_server_error)]

CODEC = Codec()


def _check_topic(topic: str) -> None:
    if not topic:
        raise DecodeError("an empty topic name")


@dataclass(frozen=True)
class MarkerPartition:
    __wire__: ClassVar[Array] = Array()
    topic: TopicName
    partition: PartitionIndex

    def __post_init__(self) -> None:
        _check_topic(self.topic)


@dataclass(frozen=True)
class TxnMarkersRequest:
    __wire__: ClassVar[Map] = Map()
    producer_id: ProducerId
    producer_epoch: ProducerEpoch
    coordinator_epoch: CoordinatorEpoch
    commit: bool
    partitions: Annotated[tuple[MarkerPartition, ...], MaxLen(MAX_MARKER_PARTITIONS)]

    def __post_init__(self) -> None:
        if len(set(self.partitions)) != len(self.partitions):
            raise DecodeError("a partition named twice in one marker")

    @property
    def topic_partitions(self) -> tuple[TopicPartition, ...]:
        return tuple((p.topic, p.partition) for p in self.partitions)


@dataclass(frozen=True)
class MarkerResult:
    __wire__: ClassVar[Array] = Array()
    topic: TopicName
    partition: PartitionIndex
    error: PeerErrorCode


@dataclass(frozen=True)
class TxnMarkersResponse:
    __wire__: ClassVar[Map] = Map()
    results: Annotated[tuple[MarkerResult, ...], MaxLen(MAX_MARKER_PARTITIONS)]


@dataclass(frozen=True)
class TxnVerifyRequest:
    __wire__: ClassVar[Map] = Map()
    transactional_id: TransactionalId
    producer_id: ProducerId
    producer_epoch: ProducerEpoch
    topic: TopicName
    partition: PartitionIndex
    mode: Annotated[int, Range(VERIFY_ONLY, ADD_PARTITION)] = VERIFY_ONLY

    def __post_init__(self) -> None:
        _check_topic(self.topic)
        size = len(self.transactional_id.encode())
        if not 0 < size <= MAX_TRANSACTIONAL_ID_BYTES:
            raise DecodeError(f"a transactional id of {size} bytes")


@dataclass(frozen=True)
class TxnVerifyResponse:
    __wire__: ClassVar[Map] = Map()
    error: PeerErrorCode


# ---------------------------------------------------------------- helpers
def markers_request(
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    commit: bool,
    partitions: tuple[TopicPartition, ...],
) -> Any:
    return CODEC.to_wire(
        TxnMarkersRequest(
            producer_id,
            producer_epoch,
            coordinator_epoch,
            commit,
            tuple(MarkerPartition(t, p) for t, p in partitions),
        )
    )


def decode_markers_request(body: Any) -> TxnMarkersRequest:
    return CODEC.from_wire(TxnMarkersRequest, body)


def markers_response(results: dict[TopicPartition, ErrorCode]) -> Any:
    return CODEC.to_wire(
        TxnMarkersResponse(tuple(MarkerResult(t, p, code) for (t, p), code in results.items()))
    )


def decode_markers_response(body: Any) -> dict[TopicPartition, ErrorCode]:
    response: TxnMarkersResponse = CODEC.from_wire(TxnMarkersResponse, body)
    return {(r.topic, r.partition): r.error for r in response.results}


def verify_request(
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    topic: str,
    partition: int,
    mode: int = VERIFY_ONLY,
) -> Any:
    return CODEC.to_wire(
        TxnVerifyRequest(transactional_id, producer_id, producer_epoch, topic, partition, mode)
    )


def decode_verify_request(body: Any) -> TxnVerifyRequest:
    return CODEC.from_wire(TxnVerifyRequest, body)


def verify_response(code: ErrorCode) -> Any:
    return CODEC.to_wire(TxnVerifyResponse(code))


def decode_verify_response(body: Any) -> ErrorCode:
    response: TxnVerifyResponse = CODEC.from_wire(TxnVerifyResponse, body)
    return response.error
