"""Executor side of the sink: one Spark task's rows into one raftlog transaction.

A task (one `trio.run`) calls InitProducerId with its transactional id, which fences any
earlier attempt of the same task and aborts what that attempt left open, then sends its rows
as transactional batches (acks=all, idempotent sequences) and returns the transaction's
handle with it still open. The driver commits every task's transaction in the writer's
commit() (or aborts them in abort()), so a job that fails leaves nothing a read_committed
reader can see. A task that fails aborts its own transaction before it raises.

Streaming tasks also write, in the same transaction, their micro-batch id as a consumer-group
offset (group = the transactional id, partition 0 of the commit topic). A replayed batch's
task reads that offset (require_stable) right after fencing: if its batch is already
committed it writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import trio

from raftlog.client import TransactionAdmin, open_cluster
from raftlog.client.cluster import Cluster
from raftlog.client.producer import partition_for_key
from raftlog.client.transactional import (
    TransactionalProducer,
    TransactionHandle,
    committed_offset,
    end_transaction,
)
from raftlog.errors import ErrorCode, KafkaError, RemoteError
from raftlog.records import Record
from raftlog.spark.planner import run_blocking
from raftlog.spark.write_options import WriteOptions

log = logging.getLogger("raftlog.spark")

# Batches in flight at once from one task (one per partition at most: sequences are ordered
# per partition), and EndTxn requests in flight from the driver.
MAX_CONCURRENT_SENDS = 8
MAX_CONCURRENT_END_TXNS = 16
# Per record: Kafka's record overhead estimate (varints, attributes, deltas).
RECORD_OVERHEAD_BYTES = 16


class WriteError(RemoteError, RuntimeError):
    """A row cannot be written as asked (no such topic or partition, a null value)."""


@dataclass(frozen=True)
class StreamMarker:
    """Where a streaming task records its committed micro-batch id."""

    group_id: str
    topic: str
    batch_id: int


@dataclass(frozen=True)
class TaskResult:
    """What a task hands the driver: its open transaction (None: it wrote nothing)."""

    handle: TransactionHandle | None
    rows: int
    skipped_replay: bool = False


@dataclass
class _Buffer:
    records: list[Record] = field(default_factory=list)
    size_bytes: int = 0


def _text_or_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


class _TaskWriter:
    def __init__(self, options: WriteOptions, cluster: Cluster, producer: TransactionalProducer,
                 task_partition: int) -> None:  # fmt: skip
        self.options = options
        self.cluster = cluster
        self.producer = producer
        self.task_partition = task_partition
        self.buffers: dict[tuple[str, int], _Buffer] = {}
        self.partition_counts: dict[str, int] = {}
        self.sticky: dict[str, int] = {}
        self.rows = 0

    async def _partition_count(self, topic: str) -> int:
        count = self.partition_counts.get(topic)
        if count is None:
            await self.cluster.refresh_metadata([topic])
            info = self.cluster.topics.get(topic)
            if info is None or not info.partitions:
                code = info.error if info is not None else ErrorCode.unknown_topic_or_partition
                raise WriteError(f"cannot write to topic {topic!r}: {code.name}")
            count = len(info.partitions)
            self.partition_counts[topic] = count
        return count

    async def add_batch(self, batch: pa.RecordBatch) -> None:
        count = batch.num_rows
        none: list[Any] = [None] * count

        def column(name: str) -> list[Any]:
            index = batch.schema.get_field_index(name)
            if index < 0:
                return none
            array = batch.column(index)
            if name in ("key", "value") and pa.types.is_string(array.type):
                array = array.cast(pa.binary())  # UTF-8 bytes, as Spark's Kafka sink sends
            return array.to_pylist()

        values, keys, topics = column("value"), column("key"), column("topic")
        partitions, headers = column("partition"), column("headers")
        counts = self.partition_counts
        fixed_topic = self.options.topic
        for i in range(count):
            topic = fixed_topic or topics[i]
            if not topic:
                raise WriteError("a row has a null topic and the topic option is not set")
            value: bytes | None = values[i]
            key: bytes | None = keys[i]
            partition = partitions[i]
            partition_count = counts.get(topic) or await self._partition_count(topic)
            if partition is None:
                if key is not None:
                    partition = partition_for_key(key, partition_count)
                else:
                    partition = self.sticky.setdefault(topic, self.task_partition % partition_count)
            elif not 0 <= partition < partition_count:
                raise WriteError(
                    f"row partition {partition} does not exist: topic {topic!r} has "
                    f"{partition_count} partitions"
                )
            size_bytes = RECORD_OVERHEAD_BYTES + len(value or b"") + len(key or b"")
            if headers[i]:
                record_headers = tuple(
                    (str(h["key"]), _text_or_bytes(h["value"])) for h in headers[i]
                )
                size_bytes += sum(len(k) + len(v or b"") for k, v in record_headers)
                record = Record(key=key, value=value, headers=record_headers)
            else:
                record = Record(key=key, value=value)
            buffer = self.buffers.get((topic, partition))
            if buffer is None:
                buffer = self.buffers[(topic, partition)] = _Buffer()
            buffer.records.append(record)
            buffer.size_bytes += size_bytes
        self.rows += count
        full = [k for k, b in self.buffers.items() if b.size_bytes >= self.options.batch_size_bytes]
        if full:
            await self.flush(full)

    async def flush(self, keys: list[tuple[str, int]] | None = None) -> None:
        """Send the named buffers (all if None), different partitions concurrently."""
        chosen = list(self.buffers) if keys is None else keys
        # Add every partition in one AddPartitionsToTxn instead of one per send.
        await self.producer.add_partitions(chosen)
        limiter = trio.CapacityLimiter(MAX_CONCURRENT_SENDS)

        async def send(key: tuple[str, int]) -> None:
            async with limiter:
                buffer = self.buffers.pop(key)
                await self.producer.send(key[0], key[1], buffer.records)
            # Keyless rows move on to the next partition once a batch of theirs is full.
            topic, partition = key
            if self.sticky.get(topic) == partition:
                self.sticky[topic] = (partition + 1) % self.partition_counts[topic]

        async with trio.open_nursery() as nursery:
            for key in chosen:
                nursery.start_soon(send, key)


async def _write(
    options: WriteOptions,
    first: pa.RecordBatch,
    batches: Iterator[pa.RecordBatch],
    transactional_id: str,
    task_partition: int,
    marker: StreamMarker | None,
) -> TaskResult:
    async with open_cluster(
        options.bootstrap_servers, client_id="raftlog-spark-sink", security=options.security
    ) as cluster:
        producer = TransactionalProducer(
            cluster,
            transactional_id,
            transaction_timeout_ms=options.transaction_timeout_ms,
            compression=options.compression,
            request_timeout_ms=options.request_timeout_ms,
            delivery_timeout_ms=options.delivery_timeout_ms,
            max_block_ms=options.max_block_ms,
        )
        await producer.init()
        if marker is not None:
            done = await committed_offset(cluster, marker.group_id, marker.topic, 0)
            if done >= marker.batch_id:
                log.info(
                    "%s: micro-batch %d already committed (up to %d); skipping its replay",
                    transactional_id, marker.batch_id, done,
                )  # fmt: skip
                rows = first.num_rows + sum(b.num_rows for b in batches)
                return TaskResult(None, rows, skipped_replay=True)
        producer.begin()
        try:
            writer = _TaskWriter(options, cluster, producer, task_partition)
            await writer.add_batch(first)
            for batch in batches:
                await writer.add_batch(batch)
            await writer.flush()
            if marker is not None:
                await producer.send_offsets(
                    marker.group_id,
                    {(marker.topic, 0): marker.batch_id},
                    metadata=f"raftlog-spark micro-batch {marker.batch_id}",
                )
        except BaseException:
            with trio.CancelScope(shield=True):
                try:
                    await producer.abort()
                except (KafkaError, OSError) as exc:
                    # The coordinator aborts it at the timeout, or the task's retry fences it.
                    log.warning("%s: abort after a failed write failed: %s", transactional_id, exc)
            raise
        return TaskResult(producer.handle, writer.rows)


def write_task(
    options: WriteOptions,
    batches: Iterator[pa.RecordBatch],
    transactional_id: str,
    task_partition: int,
    marker: StreamMarker | None = None,
) -> TaskResult:
    """Write one task's rows in one transaction left open for the driver (blocking)."""
    for first in batches:
        if first.num_rows:
            return run_blocking(
                _write, options, first, batches, transactional_id, task_partition, marker
            )
    # No rows: nothing to fence or record (a replay of this task has no rows either).
    return TaskResult(None, 0)


async def _end_all(options: WriteOptions, handles: list[TransactionHandle], commit: bool) -> None:
    async with open_cluster(
        options.bootstrap_servers, client_id="raftlog-spark-sink", security=options.security
    ) as cluster:
        limiter = trio.CapacityLimiter(MAX_CONCURRENT_END_TXNS)
        failures: list[str] = []

        async def end(handle: TransactionHandle) -> None:
            async with limiter:
                try:
                    await end_transaction(
                        cluster, handle, commit=commit, max_block_ms=options.max_block_ms
                    )
                except KafkaError as exc:
                    failures.append(f"{handle.transactional_id}: {exc}")

        async with trio.open_nursery() as nursery:
            for handle in handles:
                nursery.start_soon(end, handle)
        if failures:
            verb = "commit" if commit else "abort"
            raise WriteError(
                f"could not {verb} {len(failures)} of {len(handles)} task transactions "
                f"(first: {sorted(failures)[0]})"
            )


def end_transactions(
    options: WriteOptions, handles: list[TransactionHandle], *, commit: bool
) -> None:
    """EndTxn for every task's transaction, concurrently (blocking; on the driver)."""
    if handles:
        run_blocking(_end_all, options, handles, commit)


async def _fence_open(options: WriteOptions, id_prefix: str) -> list[str]:
    async with open_cluster(
        options.bootstrap_servers, client_id="raftlog-spark-sink", security=options.security
    ) as cluster:
        listed = await TransactionAdmin(cluster).list_transactions(states=["Ongoing"])
        ids = sorted(
            {t.transactional_id for t in listed if t.transactional_id.startswith(id_prefix)}
        )
        for transactional_id in ids:
            # A new epoch aborts the open transaction and fences whoever holds the old one.
            await TransactionalProducer(
                cluster,
                transactional_id,
                transaction_timeout_ms=options.transaction_timeout_ms,
                max_block_ms=options.max_block_ms,
            ).init()
        return ids


def fence_open_transactions(options: WriteOptions, id_prefix: str) -> list[str]:
    """Abort every still-open transaction whose id starts with id_prefix (a failed job's tasks
    that Spark cancelled before they reported): InitProducerId on each (blocking; driver)."""
    return run_blocking(_fence_open, options, id_prefix)
