"""A transactional (and so idempotent, acks=all) producer (KIP-98), over the Kafka protocol.

One TransactionalProducer speaks for one transactional id:

    producer = TransactionalProducer(cluster, "my-app-0")
    await producer.init()                      # InitProducerId: fences older instances
    producer.begin()
    await producer.send("events", 0, records)  # AddPartitionsToTxn once per partition
    await producer.send_offsets("group", {("events", 0): 42})  # optional, KIP-98 offsets
    await producer.commit()                    # EndTxn(commit); or abort()

Batches carry the producer id, epoch and a per-partition sequence, so a retried produce
whose first attempt landed is recognised by the leader (DUPLICATE_SEQUENCE_NUMBER, taken as
success) and never written twice. Requests are sent one at a time per partition, in order,
which is what keeps sequences gap-free.

A transaction can also be ended by another process that knows its (transactional id,
producer id, epoch): `end_transaction`. The coordinator keys transactions by those, not by
connection; the Spark sink lets its driver commit what its tasks wrote that way.

Errors: PRODUCER_FENCED / INVALID_PRODUCER_EPOCH (a newer instance called init) and
TRANSACTIONAL_ID_AUTHORIZATION_FAILED raise ProducerFenced, which is fatal for this instance.
CONCURRENT_TRANSACTIONS (the previous transaction of the id is still completing) and the
coordinator-moved errors are retried a bounded number of times with a back-off.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from raftlog.client.cluster import RETRIABLE_CODES, Cluster, raise_for
from raftlog.client.connection import (
    BrokerConnection,
    ConnectionClosed,
    RequestTimeout,
    call_negotiated,
)
from raftlog.client.coordinator import (
    COORDINATOR_RETRIABLE,
    GROUP_KEY_TYPE,
    TRANSACTION_KEY_TYPE,
    CoordinatorRetries,
    with_coordinator,
)
from raftlog.client.protocol import error_of
from raftlog.codec import I32_MAX
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import Compression, Record, build_batch

T = TypeVar("T")

# api -> (min, max) version this module speaks: part 1 of KIP-890 at most (the server's
# EndTxn v5 and AddPartitionsToTxn v4+ are for transaction version 2 and brokers).
# FindCoordinator: coordinator.py.
TXN_PRODUCER_API_VERSIONS: dict[str, tuple[int, int]] = {
    "init_producer_id": (1, 4),
    "add_partitions_to_txn": (0, 3),
    "add_offsets_to_txn": (0, 3),
    "txn_offset_commit": (0, 3),
    "end_txn": (0, 4),
    "produce": (3, 9),
    # v7: require_stable (KIP-447); v8+ batches groups.
    "offset_fetch": (7, 7),
}
ACKS_ALL = -1
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
# Kafka's bounds on the whole of an operation, retries included: a produce (from first send
# to acknowledgement) and a coordinator call (init, add, end).
DEFAULT_DELIVERY_TIMEOUT_MS = 120_000
DEFAULT_MAX_BLOCK_MS = 60_000
# Coordinator and "try again" errors: bounded retries with a growing back-off. The bound
# covers a coordinator failover (an election plus replay of __transaction_state).
MAX_TXN_RETRIES = 40
TXN_BACKOFF_MS = 50
TXN_BACKOFF_MAX_MS = 1_000
MAX_SEQUENCE = I32_MAX

# Coordinator calls retry, besides a coordinator that moved or loads, a transaction still
# completing, a timed out request (or connection), a partition leader that cannot yet verify
# the transaction with its coordinator, and offsets held by a completing transaction.
TXN_RETRIES = CoordinatorRetries(
    retriable_codes=COORDINATOR_RETRIABLE
    | {
        ErrorCode.concurrent_transactions,
        ErrorCode.request_timed_out,
        ErrorCode.not_enough_replicas,
        ErrorCode.unstable_offset_commit,
    },
    transport_errors=(ConnectionClosed, RequestTimeout, OSError),
    max_retries=MAX_TXN_RETRIES,
    backoff_ms=TXN_BACKOFF_MS,
    backoff_max_ms=TXN_BACKOFF_MAX_MS,
)
PRODUCE_RETRIABLE = RETRIABLE_CODES | {
    ErrorCode.not_enough_replicas,
    ErrorCode.not_enough_replicas_after_append,
    ErrorCode.request_timed_out,
    ErrorCode.unknown_topic_or_partition,
}
FENCING_CODES = frozenset(
    {
        ErrorCode.producer_fenced,
        ErrorCode.invalid_producer_epoch,
        ErrorCode.transactional_id_authorization_failed,
        ErrorCode.transaction_coordinator_fenced,
    }
)


class ProducerFenced(KafkaError):
    """A newer producer with the same transactional id exists (or this one may not use the
    id): nothing more can be sent by this instance; its open transaction will be aborted."""


@dataclass(frozen=True)
class TransactionHandle:
    """What another process needs to end a transaction: plain data, picklable."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


def _raise(code: Any, what: str, message: str | None = None) -> None:
    error = error_of(code)
    if error in FENCING_CODES:
        raise ProducerFenced(error, f"{what}: {message}" if message else what)
    raise_for(error, what, message)


async def _bounded(what: str, limit_ms: int, operation: Callable[[], Awaitable[T]]) -> T:
    """operation, failing with REQUEST_TIMED_OUT once limit_ms have passed (retries
    included), so an unavailable cluster fails a write instead of stalling it."""
    try:
        with trio.fail_after(limit_ms / 1000):
            return await operation()
    except trio.TooSlowError:
        raise KafkaError(
            ErrorCode.request_timed_out,
            f"{what}: no success within {limit_ms} ms (the cluster kept answering with "
            f"retriable errors or not at all)",
        ) from None


async def _retry_coordinator(
    what: str,
    cluster: Cluster,
    key: str,
    key_type: int,
    operation: Callable[[BrokerConnection], Awaitable[T]],
    max_block_ms: int = DEFAULT_MAX_BLOCK_MS,
) -> T:
    """operation(connection to the key's coordinator), retried (TXN_RETRIES) within
    max_block_ms. ProducerFenced is never retried: its codes are not retriable."""

    async def attempt(_node_id: int, connection: BrokerConnection) -> T:
        return await operation(connection)

    return await _bounded(
        what, max_block_ms, lambda: with_coordinator(cluster, key, key_type, attempt, TXN_RETRIES)
    )


async def end_transaction(
    cluster: Cluster,
    handle: TransactionHandle,
    *,
    commit: bool,
    max_block_ms: int = DEFAULT_MAX_BLOCK_MS,
) -> None:
    """EndTxn for a transaction begun elsewhere (its data must already be acknowledged)."""

    async def attempt(connection: BrokerConnection) -> None:
        response = await call_negotiated(
            connection,
            "end_txn",
            {
                "transactional_id": handle.transactional_id,
                "producer_id": handle.producer_id,
                "producer_epoch": handle.producer_epoch,
                "committed": commit,
            },
            TXN_PRODUCER_API_VERSIONS,
        )
        _raise(response.error_code, f"end_txn {handle.transactional_id} commit={commit}")

    await _retry_coordinator(
        f"end_txn {handle.transactional_id}",
        cluster,
        handle.transactional_id,
        TRANSACTION_KEY_TYPE,
        attempt,
        max_block_ms,
    )


class TransactionalProducer:
    """See the module docstring. Not safe for concurrent send() to one partition."""

    def __init__(
        self,
        cluster: Cluster,
        transactional_id: str,
        *,
        transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
        compression: Compression = Compression.NONE,
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        delivery_timeout_ms: int = DEFAULT_DELIVERY_TIMEOUT_MS,
        max_block_ms: int = DEFAULT_MAX_BLOCK_MS,
    ) -> None:
        if not transactional_id:
            raise ValueError("a transactional id must not be empty")
        if not 1 <= transaction_timeout_ms <= I32_MAX:
            raise ValueError(
                f"transaction timeout must be a positive int32 ms, got {transaction_timeout_ms}"
            )
        self.cluster = cluster
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.compression = compression
        self.request_timeout_ms = request_timeout_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.max_block_ms = max_block_ms
        self.producer_id = -1
        self.producer_epoch = -1
        self._sequences: dict[tuple[str, int], int] = {}
        self._added: set[tuple[str, int]] = set()
        self._in_transaction = False

    @property
    def handle(self) -> TransactionHandle:
        if self.producer_id < 0:
            raise RuntimeError("init() first")
        return TransactionHandle(self.transactional_id, self.producer_id, self.producer_epoch)

    @property
    def partitions(self) -> frozenset[tuple[str, int]]:
        """The partitions the open transaction has added."""
        return frozenset(self._added)

    async def init(self) -> None:
        """InitProducerId: a new epoch for the id, which fences any older producer with it and
        aborts a transaction such a producer left open."""

        async def attempt(connection: BrokerConnection) -> None:
            response = await call_negotiated(
                connection,
                "init_producer_id",
                {
                    "transactional_id": self.transactional_id,
                    "transaction_timeout": self.transaction_timeout_ms,
                    "producer_id": -1,
                    "producer_epoch": -1,
                },
                TXN_PRODUCER_API_VERSIONS,
            )
            _raise(response.error_code, f"init_producer_id {self.transactional_id}")
            self.producer_id = int(response.producer_id)
            self.producer_epoch = int(response.producer_epoch)

        await self._retry_coordinator("init_producer_id", attempt)
        if not (self.producer_id >= 0 and self.producer_epoch >= 0):
            raise KafkaError(ErrorCode.unknown_server_error, "init_producer_id gave no id")
        self._sequences.clear()
        self._added.clear()
        self._in_transaction = False

    def begin(self) -> None:
        if self.producer_id < 0:
            raise RuntimeError("init() first")
        if self._in_transaction:
            raise RuntimeError("a transaction is already open")
        self._in_transaction = True
        self._added.clear()

    def _check_open(self) -> None:
        if not self._in_transaction:
            raise RuntimeError("begin() first")

    async def _retry_coordinator(
        self,
        what: str,
        operation: Callable[[BrokerConnection], Awaitable[T]],
        *,
        group_id: str | None = None,
    ) -> T:
        """operation with the transaction coordinator (the group's, given group_id)."""
        if group_id is None:
            key, key_type = self.transactional_id, TRANSACTION_KEY_TYPE
        else:
            key, key_type = group_id, GROUP_KEY_TYPE
        return await _retry_coordinator(
            what, self.cluster, key, key_type, operation, self.max_block_ms
        )

    async def add_partitions(self, partitions: Sequence[tuple[str, int]]) -> None:
        """AddPartitionsToTxn for those not yet in the transaction."""
        self._check_open()
        new = sorted(set(partitions) - self._added)
        if not new:
            return
        by_topic: dict[str, list[int]] = {}
        for topic, partition in new:
            by_topic.setdefault(topic, []).append(partition)

        async def attempt(connection: BrokerConnection) -> None:
            response = await call_negotiated(
                connection,
                "add_partitions_to_txn",
                {
                    "v3_and_below_transactional_id": self.transactional_id,
                    "v3_and_below_producer_id": self.producer_id,
                    "v3_and_below_producer_epoch": self.producer_epoch,
                    "v3_and_below_topics": [
                        {"name": t, "partitions": ps} for t, ps in sorted(by_topic.items())
                    ],
                },
                TXN_PRODUCER_API_VERSIONS,
            )
            results = getattr(response, "results_by_topic_v3_and_below", ())
            for topic in results:
                for result in topic.results_by_partition:
                    _raise(
                        result.partition_error_code,
                        f"add_partitions_to_txn {topic.name}-{result.partition_index}",
                    )

        await self._retry_coordinator("add_partitions_to_txn", attempt)
        self._added.update(new)

    async def send(self, topic: str, partition: int, records: Sequence[Record]) -> int:
        """Produce records as one transactional batch to topic-partition (adding it to the
        transaction first); returns the base offset once acks=all acknowledged it."""
        self._check_open()
        if not records:
            raise ValueError("send needs at least one record")
        await self.add_partitions([(topic, partition)])
        key = (topic, partition)
        sequence = self._sequences.get(key, 0)
        batch = build_batch(
            records,
            compression=self.compression,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            base_sequence=sequence,
            is_transactional=True,
        )
        base_offset = await _bounded(
            f"produce {topic}-{partition}",
            self.delivery_timeout_ms,
            lambda: self._produce(topic, partition, batch),
        )
        # Sequences wrap at int32 as Kafka's do.
        self._sequences[key] = (sequence + len(records)) & MAX_SEQUENCE
        return base_offset

    async def _produce(self, topic: str, partition: int, batch: bytes) -> int:
        attempt = 0
        while True:
            try:
                connection, _ = await self.cluster.leader(topic, partition)
                response = await call_negotiated(
                    connection,
                    "produce",
                    {
                        "transactional_id": self.transactional_id,
                        "acks": ACKS_ALL,
                        "timeout": self.request_timeout_ms,
                        "topic_data": [
                            {
                                "name": topic,
                                "partition_data": [{"index": partition, "records": batch}],
                            }
                        ],
                    },
                    TXN_PRODUCER_API_VERSIONS,
                )
                result = response.responses[0].partition_responses[0]
                code = error_of(result.error_code)
                if code == ErrorCode.duplicate_sequence_number:
                    return int(result.base_offset)  # an earlier attempt landed
                _raise(code, f"produce {topic}-{partition}", getattr(result, "error_message", None))
                return int(result.base_offset)
            except ProducerFenced:
                raise
            except KafkaError as exc:
                if exc.code not in PRODUCE_RETRIABLE or attempt >= MAX_TXN_RETRIES:
                    raise
            except (ConnectionClosed, RequestTimeout, OSError):
                if attempt >= MAX_TXN_RETRIES:
                    raise
            attempt += 1
            # A back-off between attempts, not a wait for state: the next attempt re-checks.
            await trio.sleep(min(TXN_BACKOFF_MS * 2**attempt, TXN_BACKOFF_MAX_MS) / 1000)
            try:
                await self.cluster.refresh_metadata([topic])
            except (KafkaError, ConnectionClosed, RequestTimeout, OSError):
                pass  # the next attempt finds out again

    async def send_offsets(
        self, group_id: str, offsets: Mapping[tuple[str, int], int], metadata: str = ""
    ) -> None:
        """AddOffsetsToTxn then TxnOffsetCommit as a standalone (generation -1) committer:
        the offsets become visible to OffsetFetch only if the transaction commits."""
        self._check_open()

        async def add(connection: BrokerConnection) -> None:
            response = await call_negotiated(
                connection,
                "add_offsets_to_txn",
                {
                    "transactional_id": self.transactional_id,
                    "producer_id": self.producer_id,
                    "producer_epoch": self.producer_epoch,
                    "group_id": group_id,
                },
                TXN_PRODUCER_API_VERSIONS,
            )
            _raise(response.error_code, f"add_offsets_to_txn {group_id}")

        await self._retry_coordinator("add_offsets_to_txn", add)
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append(
                {
                    "partition_index": partition,
                    "committed_offset": offset,
                    "committed_leader_epoch": -1,
                    "committed_metadata": metadata,
                }
            )

        async def commit(connection: BrokerConnection) -> None:
            response = await call_negotiated(
                connection,
                "txn_offset_commit",
                {
                    "transactional_id": self.transactional_id,
                    "group_id": group_id,
                    "producer_id": self.producer_id,
                    "producer_epoch": self.producer_epoch,
                    "generation_id": -1,
                    "member_id": "",
                    "group_instance_id": None,
                    "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()],
                },
                TXN_PRODUCER_API_VERSIONS,
            )
            for topic in response.topics:
                for result in topic.partitions:
                    _raise(
                        result.error_code,
                        f"txn_offset_commit {group_id} {topic.name}-{result.partition_index}",
                    )

        await self._retry_coordinator("txn_offset_commit", commit, group_id=group_id)

    async def commit(self) -> None:
        self._check_open()
        await end_transaction(
            self.cluster, self.handle, commit=True, max_block_ms=self.max_block_ms
        )
        self._in_transaction = False

    async def abort(self) -> None:
        """Abort the open transaction (nothing is sent if none is open)."""
        if not self._in_transaction:
            return
        await end_transaction(
            self.cluster, self.handle, commit=False, max_block_ms=self.max_block_ms
        )
        self._in_transaction = False


async def committed_offset(cluster: Cluster, group_id: str, topic: str, partition: int) -> int:
    """The group's committed offset of topic-partition (-1: none), read with require_stable:
    while a transaction holding offsets for it is completing, the coordinator answers
    UNSTABLE_OFFSET_COMMIT and the read is retried, so the answer is never a stale one."""

    async def attempt(connection: BrokerConnection) -> int:
        response = await call_negotiated(
            connection,
            "offset_fetch",
            {
                "group_id": group_id,
                "topics": [{"name": topic, "partition_indexes": [partition]}],
                "require_stable": True,
            },
            TXN_PRODUCER_API_VERSIONS,
        )
        raise_for(getattr(response, "error_code", 0), f"offset_fetch {group_id}")
        for t in response.topics:
            for p in t.partitions:
                if t.name == topic and int(p.partition_index) == partition:
                    raise_for(p.error_code, f"offset_fetch {group_id} {topic}-{partition}")
                    return int(p.committed_offset)
        return -1

    return await _retry_coordinator(
        f"offset_fetch {group_id}", cluster, group_id, GROUP_KEY_TYPE, attempt
    )
