"""Limits and timings of the transaction coordinator, with Kafka's names and defaults.

The routing rule (which `__transaction_state` partition owns a transactional id) is Kafka's:
`Utils.abs(transactionalId.hashCode()) % transaction.state.log.num.partitions`, the same hash
the group coordinator uses for group ids.
"""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.codec import I32_MAX
from raftlog.groups.hashing import java_string_hashcode, kafka_abs


@dataclass(frozen=True)
class TxnConfig:
    # transaction.state.log.num.partitions: fixes the transactional id -> coordinator map.
    transaction_state_log_num_partitions: int = 50
    # offsets.topic.num.partitions: AddOffsetsToTxn adds the group's offsets partition.
    offsets_topic_num_partitions: int = 6
    # transaction.max.timeout.ms: the longest transaction.timeout.ms a producer may ask for,
    # so a stuck transaction cannot hold back the LSO (and read_committed readers) for long.
    transaction_max_timeout_ms: int = 900_000
    # transactional.id.expiration.ms: an idle transactional id is forgotten after this.
    transactional_id_expiration_ms: int = 604_800_000
    # transaction.abort.timed.out.transaction.cleanup.interval.ms: how often timed-out
    # transactions are looked for (so a transaction ends at most this long after its timeout).
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    # transaction.remove.expired.transaction.cleanup.interval.ms
    transaction_remove_expired_transaction_cleanup_interval_ms: int = 3_600_000
    # Wait before writing markers (or a completion record) again after a retriable failure.
    transaction_marker_retry_backoff_ms: int = 100
    # Kafka leaves both unbounded; bounds keep one client from eating a coordinator's memory.
    # New transactional ids past the first are refused (COORDINATOR_NOT_AVAILABLE); a
    # transaction may name at most the second number of partitions (INVALID_REQUEST).
    max_transactional_ids: int = 100_000
    max_partitions_per_transaction: int = 10_000

    def __post_init__(self) -> None:
        for name in (
            "transaction_state_log_num_partitions",
            "offsets_topic_num_partitions",
            "transaction_max_timeout_ms",
            "transactional_id_expiration_ms",
            "transaction_abort_timed_out_transaction_cleanup_interval_ms",
            "transaction_remove_expired_transaction_cleanup_interval_ms",
            "max_transactional_ids",
            "max_partitions_per_transaction",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.transaction_max_timeout_ms > I32_MAX:
            raise ValueError("transaction_max_timeout_ms must fit an int32")
        if self.transaction_marker_retry_backoff_ms < 0:
            raise ValueError("transaction_marker_retry_backoff_ms must be >= 0")

    def partition_for(self, transactional_id: str) -> int:
        return partition_for_transactional_id(
            transactional_id, self.transaction_state_log_num_partitions
        )


def partition_for_transactional_id(transactional_id: str, num_partitions: int) -> int:
    """The `__transaction_state` partition that stores `transactional_id`, as Kafka computes."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    return kafka_abs(java_string_hashcode(transactional_id)) % num_partitions
