"""What the transaction coordinator asks its driver to do, and how the driver's answers
are read: Effects (replies, appends to `__transaction_state`, marker writes), and which
append and marker errors mean what (Kafka's TransactionStateManager and
TransactionMarkerChannelManager rules)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from raftlog.errors import ErrorCode
from raftlog.txn.log_format import Record, TopicPartition

# Identifies a caller waiting for a reply; chosen by the driver.
Token = Hashable

# How a failed append of `__transaction_state` surfaces (Kafka's TransactionStateManager).
_APPEND_ERROR_MAP = {
    ErrorCode.unknown_topic_or_partition: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas_after_append: ErrorCode.coordinator_not_available,
    ErrorCode.request_timed_out: ErrorCode.coordinator_not_available,
    ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator,
    ErrorCode.kafka_storage_error: ErrorCode.not_coordinator,
    ErrorCode.message_too_large: ErrorCode.unknown_server_error,
    ErrorCode.record_list_too_large: ErrorCode.unknown_server_error,
}

# Marker answers after which the partition counts as done without a marker (Kafka: its
# log cannot hold one; nothing it holds waits for it).
MARKER_NOT_NEEDED = frozenset({ErrorCode.unsupported_for_message_format})
# A newer coordinator or producer epoch is on the partition: this coordinator is stale and
# stops; the one that loaded the partition since finishes the transaction (Kafka's rule).
MARKER_STALE = frozenset(
    {ErrorCode.transaction_coordinator_fenced, ErrorCode.invalid_producer_epoch}
)


def map_append_error(code: ErrorCode) -> ErrorCode:
    return _APPEND_ERROR_MAP.get(code, code)


@dataclass(frozen=True)
class Append:
    """Append `records` to `__transaction_state` partition `partition` with acks=all, then
    call TxnCoordinator.on_append_done(append_id, error_code, now_ms)."""

    append_id: int
    partition: int
    records: tuple[Record, ...]


@dataclass(frozen=True)
class WriteMarkers:
    """Write one COMMIT/ABORT marker to each of `partitions` (WriteTxnMarkers), then call
    TxnCoordinator.on_markers_done(marker_id, {partition: error_code}, now_ms)."""

    marker_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    commit: bool
    partitions: tuple[TopicPartition, ...]


@dataclass
class Effects:
    replies: list[tuple[Token, object]] = field(default_factory=list)
    appends: list[Append] = field(default_factory=list)
    markers: list[WriteMarkers] = field(default_factory=list)

    def extend(self, other: Effects) -> None:
        self.replies.extend(other.replies)
        self.appends.extend(other.appends)
        self.markers.extend(other.markers)
