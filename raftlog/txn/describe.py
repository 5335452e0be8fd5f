"""What DescribeTransactions and ListTransactions answer, from a coordinator's state. Pure."""

from __future__ import annotations

from collections.abc import Iterable

from raftlog.errors import ErrorCode
from raftlog.txn.log_format import TransactionState
from raftlog.txn.messages import DescribedTransaction, ListedTransaction, ListTransactionsResult
from raftlog.txn.state import TransactionMetadata

_BY_KAFKA_NAME = {state.kafka_name: state for state in TransactionState}


def describe(txn: TransactionMetadata) -> DescribedTransaction:
    """One DescribeTransactions entry. In a Prepare state the partitions are those still owed
    a marker (Kafka's rule); the start time is -1 when no transaction is open."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(txn.partitions):
        by_topic.setdefault(topic, []).append(partition)
    return DescribedTransaction(
        transactional_id=txn.transactional_id,
        error_code=ErrorCode.none,
        state=txn.state.kafka_name,
        transaction_timeout_ms=txn.transaction_timeout_ms,
        transaction_start_time_ms=txn.start_timestamp_ms,
        producer_id=txn.producer_id,
        producer_epoch=txn.producer_epoch,
        topics=tuple((topic, tuple(ids)) for topic, ids in by_topic.items()),
    )


def list_transactions(
    transactions: Iterable[TransactionMetadata],
    *,
    state_filters: Iterable[str] = (),
    producer_id_filters: Iterable[int] = (),
    duration_filter_ms: int = -1,
    now_ms: int = 0,
    loading: bool = False,
) -> ListTransactionsResult:
    """ListTransactions over the transactions of the partitions a broker coordinates.

    Filters as Kafka's: states by their Kafka name (unknown names are returned in
    unknown_state_filters and match nothing), producer ids, and (v1, KIP-994) only
    transactions running for at least `duration_filter_ms` (-1: no filter). Empty filters
    match everything. `loading`: some partition is still loading (the answer is
    COORDINATOR_LOAD_IN_PROGRESS with what is known, as Kafka answers).
    """
    wanted_states: set[TransactionState] = set()
    unknown: list[str] = []
    states = list(state_filters)
    for name in states:
        state = _BY_KAFKA_NAME.get(name)
        if state is None:
            unknown.append(name)
        else:
            wanted_states.add(state)
    producer_ids = set(producer_id_filters)
    listed = []
    for txn in transactions:
        if states and txn.state not in wanted_states:
            continue
        if producer_ids and txn.producer_id not in producer_ids:
            continue
        if duration_filter_ms >= 0 and (
            txn.start_timestamp_ms < 0 or now_ms - txn.start_timestamp_ms < duration_filter_ms
        ):
            continue
        listed.append(
            ListedTransaction(txn.transactional_id, txn.producer_id, txn.state.kafka_name)
        )
    listed.sort(key=lambda t: t.transactional_id)
    code = ErrorCode.coordinator_load_in_progress if loading else ErrorCode.none
    return ListTransactionsResult(code, tuple(listed), tuple(unknown))
