"""What the sans-IO GroupCoordinator asks its driver to do: replies to deliver by token and
appends to `__consumer_offsets` to perform (then report back with on_append_done)."""

from __future__ import annotations

from dataclasses import dataclass, field

from raftlog.errors import ErrorCode
from raftlog.groups.group import Token
from raftlog.groups.offsets_format import Record

# How append failures surface to clients (Kafka's GroupMetadataManager mapping): retriable
# ones become "find the coordinator / retry", a lost leadership becomes NOT_COORDINATOR.
_APPEND_ERROR_MAP = {
    ErrorCode.unknown_topic_or_partition: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas_after_append: ErrorCode.coordinator_not_available,
    ErrorCode.request_timed_out: ErrorCode.coordinator_not_available,
    ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator,
    ErrorCode.kafka_storage_error: ErrorCode.not_coordinator,
    ErrorCode.message_too_large: ErrorCode.invalid_commit_offset_size,
    ErrorCode.record_list_too_large: ErrorCode.invalid_commit_offset_size,
    ErrorCode.invalid_fetch_size: ErrorCode.invalid_commit_offset_size,
}


def map_append_error(code: ErrorCode) -> ErrorCode:
    return _APPEND_ERROR_MAP.get(code, code)


@dataclass(frozen=True)
class TxnProducer:
    """Whose transaction an append belongs to: the records go in a transactional batch of
    this producer id and epoch (the transactional id lets the log verify, KIP-890, that the
    offsets partition is in the producer's ongoing transaction)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True)
class Append:
    """Append `records` to `__consumer_offsets` partition `partition` with acks=all, then call
    GroupCoordinator.on_append_done(append_id, error_code, now_ms). With `txn`, the records
    are one transactional batch of that producer, never batched with anyone else's."""

    append_id: int
    partition: int
    records: list[Record]
    txn: TxnProducer | None = None


@dataclass
class Effects:
    replies: list[tuple[Token, object]] = field(default_factory=list)
    appends: list[Append] = field(default_factory=list)
