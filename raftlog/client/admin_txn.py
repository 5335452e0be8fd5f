"""Admin operations on transactions (KIP-664): list, describe, describe producers, abort.

What Kafka's Admin does, over the Kafka protocol only:
- list_transactions: ListTransactions to every broker (each answers for the
  __transaction_state partitions it coordinates), merged;
- describe_transactions: FindCoordinator (key type 1) per transactional id, then
  DescribeTransactions to that coordinator;
- describe_producers: DescribeProducers to each partition's leader (its producer state:
  epochs, coordinator epochs, the start offset of an open transaction);
- abort_transaction: WriteTxnMarkers v1 with an ABORT marker for one producer, sent to the
  partition's leader, as Admin.abortTransaction does for a hanging transaction (one its
  coordinator no longer knows). The broker checks the producer and coordinator epochs; the
  principal needs CLUSTER_ACTION on the cluster, since markers are otherwise only written by
  transaction coordinators.

The transaction APIs are negotiated here, per connection, from the versions the broker
announced (as raftlog.client.groups does), so the shared client table does not have to
know them. Per-item errors (one transactional id of several) come back as ErrorCode values;
whole-request failures raise KafkaError. Leadership and coordinator moves are retried a
bounded number of times.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import trio

from raftlog.client.cluster import RETRIABLE_CODES, Cluster, raise_for
from raftlog.client.connection import (
    BrokerConnection,
    UnsupportedVersion,
    call_negotiated,
    negotiated_version,
)
from raftlog.client.coordinator import (
    COORDINATOR_RETRIABLE,
    TRANSACTION_KEY_TYPE,
    find_coordinator,
    with_coordinator,
)
from raftlog.client.groups import COORDINATOR_BACKOFF_MS, GROUP_RETRIES, MAX_COORDINATOR_RETRIES
from raftlog.client.protocol import error_of
from raftlog.codec import I32_MAX, I64_MAX
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import MAX_COORDINATOR_EPOCH, MAX_PRODUCER_EPOCH

# api name -> (min, max) version this module speaks. ListTransactions v2 filters by a
# regular expression (KIP-1152) and WriteTxnMarkers v2 carries KIP-890's transaction version;
# neither is needed to list or abort.
TXN_ADMIN_API_VERSIONS: dict[str, tuple[int, int]] = {
    "list_transactions": (0, 1),
    "describe_transactions": (0, 0),
    "describe_producers": (0, 0),
    "write_txn_markers": (1, 1),
}
# Kafka's transaction states (TransactionState.stateName), what ListTransactions filters by.
TRANSACTION_STATES = (
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
    "PrepareEpochFence",
)
MAX_PRODUCER_ID = I64_MAX
MAX_PARTITION = I32_MAX
# Operator requests name few items; a bound keeps one call from fanning out unboundedly.
MAX_IDS_PER_CALL = 10_000
MAX_PARTITIONS_PER_CALL = 1_000
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_ONE_MS = datetime.timedelta(milliseconds=1)


@dataclass(frozen=True)
class TransactionListing:
    """One transactional id as ListTransactions tells it (Kafka's TransactionListing)."""

    transactional_id: str
    producer_id: int
    state: str
    coordinator_id: int  # the broker that answered: the id's coordinator


@dataclass(frozen=True)
class TransactionDescription:
    """DescribeTransactions' answer for one id (Kafka's TransactionDescription); every field
    but the error is meaningless unless error is NONE."""

    transactional_id: str
    error: ErrorCode
    coordinator_id: int = -1
    state: str = ""
    producer_id: int = -1
    producer_epoch: int = -1
    transaction_timeout_ms: int = -1
    # Wall-clock ms the current (or, once complete, the last) transaction began; None when
    # the coordinator sent -1 (an id that has not begun one).
    transaction_start_time_ms: int | None = None
    topic_partitions: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class ProducerState:
    """One active producer of a partition (Kafka's ProducerState)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp_ms: int
    # The epoch of the coordinator that last wrote a marker for it; None: none yet.
    coordinator_epoch: int | None
    # Where its open transaction began on this partition; None: no open transaction.
    current_transaction_start_offset: int | None


@dataclass(frozen=True)
class PartitionProducers:
    topic: str
    partition: int
    error: ErrorCode
    message: str | None = None
    producers: tuple[ProducerState, ...] = ()


@dataclass(frozen=True)
class AbortTransactionSpec:
    """What abort_transaction writes an ABORT marker for (Kafka's AbortTransactionSpec)."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int

    def validate(self) -> None:
        """ValueError naming the first field out of Kafka's range."""
        if not self.topic:
            raise ValueError("topic is empty")
        checks = (
            ("partition", self.partition, MAX_PARTITION),
            ("producer id", self.producer_id, MAX_PRODUCER_ID),
            ("producer epoch", self.producer_epoch, MAX_PRODUCER_EPOCH),
            ("coordinator epoch", self.coordinator_epoch, MAX_COORDINATOR_EPOCH),
        )
        for name, value, top in checks:
            if not 0 <= value <= top:
                raise ValueError(f"{name} must be in [0, {top}], got {value}")


async def call(connection: BrokerConnection, api: str, values: dict[str, Any]) -> Any:
    return await call_negotiated(connection, api, values, TXN_ADMIN_API_VERSIONS)


def _ms(value: Any) -> int:
    """A kio duration or int as whole milliseconds."""
    if isinstance(value, datetime.timedelta):
        return int(value / _ONE_MS)
    return int(value)


def _wall_ms(value: Any) -> int | None:
    """A kio wall-clock time (int64 ms on the wire) as ms since the epoch; -1 is None."""
    ms = _ms(value - EPOCH) if isinstance(value, datetime.datetime) else int(value)
    return None if ms < 0 else ms


def _optional(value: Any) -> int | None:
    """Kafka's -1 for "none" as None."""
    number = int(value)
    return None if number < 0 else number


def _check_count(what: str, count: int, limit: int) -> None:
    if count > limit:
        raise ValueError(f"{count} {what} in one call; at most {limit}")


class TransactionAdmin:
    """Transaction listing, description and aborting over a Cluster."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    # ------------------------------------------------------------------ coordinators
    async def find_coordinator(self, transactional_id: str) -> tuple[int, tuple[str, int]]:
        """FindCoordinator once (key type 1): the coordinator's node id and address
        (KafkaError if the answer is an error, e.g. COORDINATOR_NOT_AVAILABLE)."""
        return await find_coordinator(self.cluster, transactional_id, TRANSACTION_KEY_TYPE)

    # ------------------------------------------------------------------ list
    async def list_transactions(
        self,
        *,
        states: Sequence[str] = (),
        producer_ids: Sequence[int] = (),
        duration_ms: int = -1,
    ) -> list[TransactionListing]:
        """Transactions of every broker, sorted by transactional id; filtered by state
        names (Kafka's: Ongoing, CompleteCommit, ...), producer ids, and (duration_ms >= 0)
        to those open for longer than duration_ms (KIP-994, ListTransactions v1)."""
        unknown = [s for s in states if s not in TRANSACTION_STATES]
        if unknown:
            raise ValueError(
                f"unknown transaction state {unknown[0]!r} (one of {', '.join(TRANSACTION_STATES)})"
            )
        if any(not 0 <= p <= MAX_PRODUCER_ID for p in producer_ids):
            raise ValueError(f"producer ids must be in [0, {MAX_PRODUCER_ID}]")
        _check_count("producer ids", len(producer_ids), MAX_IDS_PER_CALL)
        if duration_ms < -1:
            raise ValueError(f"duration_ms must be >= 0 (or -1: any), got {duration_ms}")
        values = {
            "state_filters": list(states),
            "producer_id_filters": list(producer_ids),
            "duration_filter": duration_ms,
        }
        await self.cluster.refresh_metadata([])
        found: dict[int, list[TransactionListing]] = {}

        async def one(node_id: int) -> None:
            found[node_id] = await self._list_from(node_id, values, duration_ms)

        async with trio.open_nursery() as nursery:
            for node_id in sorted(self.cluster.brokers):
                nursery.start_soon(one, node_id)
        merged = [listing for node_id in sorted(found) for listing in found[node_id]]
        return sorted(merged, key=lambda t: (t.transactional_id, t.coordinator_id))

    async def _list_from(
        self, node_id: int, values: dict[str, Any], duration_ms: int
    ) -> list[TransactionListing]:
        attempt = 0
        while True:
            connection = await self.cluster.broker(node_id)
            if (
                duration_ms >= 0
                and negotiated_version(connection, "list_transactions", TXN_ADMIN_API_VERSIONS) < 1
            ):
                raise UnsupportedVersion(
                    f"broker {node_id} cannot filter transactions by duration (ListTransactions v1)"
                )
            response = await call(connection, "list_transactions", values)
            code = error_of(response.error_code)
            # A coordinator still loading its partitions: Kafka's admin retries that broker.
            if code in COORDINATOR_RETRIABLE and attempt < MAX_COORDINATOR_RETRIES:
                attempt += 1
                # A back-off between attempts, not a wait for state.
                await trio.sleep(COORDINATOR_BACKOFF_MS * attempt / 1000)
                continue
            raise_for(code, f"list_transactions on broker {node_id}")
            return [
                TransactionListing(
                    transactional_id=str(t.transactional_id),
                    producer_id=int(t.producer_id),
                    state=str(t.transaction_state),
                    coordinator_id=node_id,
                )
                for t in response.transaction_states
            ]

    # ------------------------------------------------------------------ describe
    async def describe_transactions(
        self, transactional_ids: Sequence[str]
    ) -> dict[str, TransactionDescription]:
        """Each id's state at its coordinator; an id the coordinator does not know has
        error TRANSACTIONAL_ID_NOT_FOUND."""
        _check_count("transactional ids", len(transactional_ids), MAX_IDS_PER_CALL)
        out: dict[str, TransactionDescription] = {}
        for transactional_id in dict.fromkeys(transactional_ids):
            if not transactional_id:
                raise ValueError("a transactional id is empty")
            out[transactional_id] = await self._describe_one(transactional_id)
        return out

    async def _describe_one(self, transactional_id: str) -> TransactionDescription:
        async def operation(node_id: int, connection: BrokerConnection) -> TransactionDescription:
            response = await call(
                connection, "describe_transactions", {"transactional_ids": [transactional_id]}
            )
            states = list(response.transaction_states)
            if len(states) != 1 or states[0].transactional_id != transactional_id:
                raise KafkaError(
                    ErrorCode.unknown_server_error,
                    f"describe_transactions {transactional_id}: answered for "
                    f"{[s.transactional_id for s in states]}",
                )
            state = states[0]
            error = error_of(state.error_code)
            if error in COORDINATOR_RETRIABLE:
                raise KafkaError(error, f"describe_transactions {transactional_id}")
            if error != ErrorCode.none:
                return TransactionDescription(transactional_id, error, node_id)
            return TransactionDescription(
                transactional_id=transactional_id,
                error=error,
                coordinator_id=node_id,
                state=str(state.transaction_state),
                producer_id=int(state.producer_id),
                producer_epoch=int(state.producer_epoch),
                transaction_timeout_ms=_ms(state.transaction_timeout),
                transaction_start_time_ms=_wall_ms(state.transaction_start_time),
                topic_partitions=tuple(
                    sorted((str(t.topic), int(p)) for t in state.topics for p in t.partitions)
                ),
            )

        return await with_coordinator(
            self.cluster, transactional_id, TRANSACTION_KEY_TYPE, operation, GROUP_RETRIES
        )

    # ------------------------------------------------------------------ producers
    async def describe_producers(
        self, partitions: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], PartitionProducers]:
        """Active producers of each partition, from its leader. A partition that does not
        exist or may not be read has that error in its result."""
        _check_count("partitions", len(partitions), MAX_PARTITIONS_PER_CALL)
        out: dict[tuple[str, int], PartitionProducers] = {}
        for topic, partition in dict.fromkeys(partitions):
            if not 0 <= partition <= MAX_PARTITION:
                raise ValueError(f"partition must be in [0, {MAX_PARTITION}], got {partition}")
            out[(topic, partition)] = await self._producers_of(topic, partition)
        return out

    async def _producers_of(self, topic: str, partition: int) -> PartitionProducers:
        async def attempt() -> PartitionProducers:
            connection, _ = await self.cluster.leader(topic, partition)
            response = await call(
                connection,
                "describe_producers",
                {"topics": [{"name": topic, "partition_indexes": [partition]}]},
            )
            answers = [(t, p) for t in response.topics for p in t.partitions if t.name == topic]
            if len(answers) != 1 or int(answers[0][1].partition_index) != partition:
                raise KafkaError(
                    ErrorCode.unknown_server_error,
                    f"describe_producers {topic}-{partition}: {len(answers)} answers",
                )
            answer = answers[0][1]
            error = error_of(answer.error_code)
            if error in RETRIABLE_CODES:
                raise KafkaError(error, f"describe_producers {topic}-{partition}")
            return PartitionProducers(
                topic,
                partition,
                error,
                answer.error_message,
                tuple(
                    ProducerState(
                        producer_id=int(p.producer_id),
                        producer_epoch=int(p.producer_epoch),
                        last_sequence=int(p.last_sequence),
                        last_timestamp_ms=int(p.last_timestamp),
                        coordinator_epoch=_optional(p.coordinator_epoch),
                        current_transaction_start_offset=_optional(p.current_txn_start_offset),
                    )
                    for p in answer.active_producers
                ),
            )

        try:
            return await self.cluster.retrying(attempt, refresh_topics=[topic])
        except KafkaError as exc:
            if exc.code in RETRIABLE_CODES:
                raise
            # Unknown topic or partition (found in the metadata), refused, ...: this
            # partition's answer, not the whole call's.
            return PartitionProducers(topic, partition, exc.code, exc.message or None)

    async def open_transaction_at(
        self, topic: str, partition: int, start_offset: int
    ) -> AbortTransactionSpec | None:
        """The abort spec of the producer whose open transaction on topic-partition began at
        start_offset (kafka-transactions.sh abort --start-offset), or None when no open
        transaction starts there. Raises KafkaError when the partition cannot be described."""
        if start_offset < 0:
            raise ValueError(f"start offset must be >= 0, got {start_offset}")
        described = (await self.describe_producers([(topic, partition)]))[(topic, partition)]
        raise_for(described.error, f"describe_producers {topic}-{partition}", described.message)
        for producer in described.producers:
            if producer.current_transaction_start_offset == start_offset:
                return AbortTransactionSpec(
                    topic,
                    partition,
                    producer.producer_id,
                    producer.producer_epoch,
                    # Kafka's tool: a producer no coordinator has written a marker for yet
                    # is aborted at coordinator epoch 0.
                    producer.coordinator_epoch or 0,
                )
        return None

    # ------------------------------------------------------------------ abort
    async def abort_transaction(self, spec: AbortTransactionSpec) -> None:
        """Write an ABORT marker for spec's producer on its partition (WriteTxnMarkers v1 to
        the leader). Raises ValueError for a field out of range before anything is sent, and
        KafkaError with the broker's answer otherwise (e.g. TRANSACTION_COORDINATOR_FENCED
        when a newer coordinator epoch already wrote a marker for the producer)."""
        spec.validate()
        values = {
            "markers": [
                {
                    "producer_id": spec.producer_id,
                    "producer_epoch": spec.producer_epoch,
                    "transaction_result": False,  # ABORT
                    "topics": [{"name": spec.topic, "partition_indexes": [spec.partition]}],
                    "coordinator_epoch": spec.coordinator_epoch,
                }
            ]
        }
        where = f"abort_transaction {spec.topic}-{spec.partition} producer {spec.producer_id}"

        async def attempt() -> None:
            connection, _ = await self.cluster.leader(spec.topic, spec.partition)
            response = await call(connection, "write_txn_markers", values)
            codes = [
                error_of(p.error_code)
                for marker in response.markers
                for t in marker.topics
                if t.name == spec.topic
                for p in t.partitions
                if int(p.partition_index) == spec.partition
            ]
            if len(codes) != 1:
                raise KafkaError(ErrorCode.unknown_server_error, f"{where}: {len(codes)} answers")
            raise_for(codes[0], where)

        await self.cluster.retrying(attempt, refresh_topics=[spec.topic])


__all__ = [
    "TRANSACTION_STATES",
    "AbortTransactionSpec",
    "PartitionProducers",
    "ProducerState",
    "TransactionAdmin",
    "TransactionDescription",
    "TransactionListing",
]
