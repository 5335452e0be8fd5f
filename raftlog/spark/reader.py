"""Executor side: read exactly [start, end) of one partition into pyarrow RecordBatches.

Executors run plain Python, so a split is read as a sequence of short `trio.run` calls, each
opening a client, doing up to `fetches_per_chunk` fetches from the partition leader, and
returning one RecordBatch of columns. Memory per split is bounded by one chunk: its fetched
bytes, and what they decode to (a chunk takes no batch once its records hold
DECODED_READ_MAX_BYTES, so compressed batches cannot expand it without bound). Every
chunk starts from fresh metadata, so a leader change between chunks simply re-routes; one
during a chunk is retried by the client (Cluster.retrying refreshes metadata).

Records never come from past the HW: the broker does not serve them, and the planned end is
at most the HW observed at planning. With kafka.isolation.level=read_committed the fetches
are read_committed: the planned end is at most the last stable offset, and aborted
transactions' records are left out as Kafka's consumer leaves them out. Control batches
(transaction markers) are never rows under either level.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from raftlog.client import open_cluster
from raftlog.client.cluster import raise_for
from raftlog.client.consumer import (
    DECODED_READ_MAX_BYTES,
    AbortedTxn,
    Consumer,
    decoded_size_bytes,
    iter_visible_batches,
    whole_batches,
)
from raftlog.client.protocol import IsolationLevel
from raftlog.errors import ErrorCode
from raftlog.records import iter_records
from raftlog.spark.options import ReadOptions
from raftlog.spark.planner import (
    DataLossError,
    cluster_limits,
    data_loss_message,
    run_blocking,
)
from raftlog.spark.ranges import OffsetRange

log = logging.getLogger("raftlog.spark")

# A batch bigger than the fetch size still arrives whole (KIP-74); should a broker cut one
# anyway, the next fetch asks for twice as much, up to this.
FETCH_MAX_BYTES_CEILING = 256 * 1024 * 1024
MICROS_PER_MS = 1000


@dataclass
class Columns:
    """Column lists of decoded records, appended to record by record."""

    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    timestamps_ms: list[int] = field(default_factory=list)
    timestamp_types: list[int] = field(default_factory=list)
    headers: list[list[dict[str, Any]]] | None = None
    # What the records decoded so far take in memory (client.consumer.decoded_size_bytes).
    decoded_bytes: int = 0

    @property
    def full(self) -> bool:
        """Whether the chunk holds DECODED_READ_MAX_BYTES: it takes no more batches."""
        return self.decoded_bytes >= DECODED_READ_MAX_BYTES

    def __len__(self) -> int:
        return len(self.offsets)


def add_records(
    columns: Columns,
    data: bytes,
    start: int,
    end: int,
    isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    aborted: tuple[AbortedTxn, ...] = (),
) -> int:
    """Decode the visible whole batches of data into columns, keeping start <= offset < end
    (control batches never; under read_committed no batch of an aborted transaction, by the
    fetch's aborted list).

    Returns the offset after the last batch seen (control and aborted batches included, so a
    read moves past them), or start when data holds no complete batch. Decoding stops after
    the batch that makes the columns `full` (the next read starts at the returned offset).
    """
    data = whole_batches(data)
    next_offset = start
    for pos, header, visible in iter_visible_batches(data, isolation_level, aborted):
        next_offset = max(next_offset, header.next_offset)
        if not visible or header.last_offset < start:
            if header.next_offset >= end:
                break
            continue
        timestamp_type = int(header.timestamp_type)
        records = [r for r in iter_records(data, pos) if start <= r.offset < end]
        columns.decoded_bytes += decoded_size_bytes(records)
        for record in records:
            columns.keys.append(record.key)
            columns.values.append(record.value)
            columns.offsets.append(record.offset)
            columns.timestamps_ms.append(record.timestamp_ms if record.timestamp_ms else 0)
            columns.timestamp_types.append(timestamp_type)
            if columns.headers is not None:
                columns.headers.append([{"key": k, "value": v} for k, v in record.headers])
        if header.next_offset >= end or columns.full:
            break
    return next_offset


def to_record_batch(
    columns: Columns, topic: str, partition: int, schema: pa.Schema
) -> pa.RecordBatch:
    """One RecordBatch in exactly Spark's Arrow form of the source schema."""
    count = len(columns)
    arrays: dict[str, pa.Array] = {
        "key": pa.array(columns.keys, pa.binary()),
        "value": pa.array(columns.values, pa.binary()),
        "topic": pa.array([topic] * count, pa.string()),
        "partition": pa.array([partition] * count, pa.int32()),
        "offset": pa.array(columns.offsets, pa.int64()),
        "timestamp": pa.array(
            [t * MICROS_PER_MS for t in columns.timestamps_ms], schema.field("timestamp").type
        ),
        "timestampType": pa.array(columns.timestamp_types, pa.int32()),
    }
    if columns.headers is not None:
        arrays["headers"] = pa.array(columns.headers, schema.field("headers").type)
    return pa.RecordBatch.from_arrays([arrays[name] for name in schema.names], schema=schema)


@dataclass
class Chunk:
    columns: Columns
    next_offset: int


async def read_chunk(options: ReadOptions, rng: OffsetRange, offset: int) -> Chunk:
    """Up to options.fetches_per_chunk fetches of rng from offset (see the module docstring)."""
    columns = Columns(headers=[] if options.include_headers else None)
    max_bytes = options.fetch_max_bytes
    async with open_cluster(
        options.bootstrap_servers,
        client_id="raftlog-spark",
        limits=cluster_limits(options),
        security=options.security,
    ) as cluster:
        consumer = Consumer(
            cluster,
            max_wait_ms=options.fetch_max_wait_ms,
            isolation_level=options.isolation_level,
        )
        for _ in range(options.fetches_per_chunk):
            if offset >= rng.end or columns.full:
                break
            raw = await consumer.fetch_raw(rng.topic, rng.partition, offset, max_bytes=max_bytes)
            if raw.error == ErrorCode.offset_out_of_range:
                if raw.log_start_offset < 0 or offset >= raw.log_start_offset:
                    raise_for(raw.error, f"fetch {rng.topic}-{rng.partition} at {offset}")
                # Retention ran between planning and this read.
                message = data_loss_message(rng.topic, rng.partition, offset, raw.log_start_offset)
                if options.fail_on_data_loss:
                    raise DataLossError(message)
                log.warning("skipping lost records: %s", message)
                offset = min(raw.log_start_offset, rng.end)
                continue
            next_offset = add_records(
                columns,
                raw.data,
                offset,
                rng.end,
                options.isolation_level,
                raw.aborted_transactions,
            )
            if next_offset == offset:
                if raw.data:  # only a cut batch came back: ask for more bytes
                    max_bytes = min(2 * max_bytes, FETCH_MAX_BYTES_CEILING)
                    continue
                # Nothing below the HW yet (a new leader still catching its HW up).
                break
            offset = next_offset
    return Chunk(columns, offset)


def read_range(
    options: ReadOptions, rng: OffsetRange, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """RecordBatches of every committed record in rng, in offset order (blocking)."""
    offset = rng.start
    last_progress_s = time.monotonic()
    while offset < rng.end:
        chunk = run_blocking(read_chunk, options, rng, offset)
        next_offset = chunk.next_offset
        batch = (
            to_record_batch(chunk.columns, rng.topic, rng.partition, schema)
            if len(chunk.columns)
            else None
        )
        # The chunk's Python objects go before the next chunk is read: one at a time.
        del chunk
        if batch is not None:
            yield batch
            del batch
        if next_offset > offset:
            offset = next_offset
            last_progress_s = time.monotonic()
        elif (time.monotonic() - last_progress_s) * 1000 > options.read_stall_timeout_ms:
            raise TimeoutError(
                f"{rng.topic}-{rng.partition}: no progress at offset {offset} for "
                f"{options.read_stall_timeout_ms} ms (planned end {rng.end}); "
                f"the high watermark did not reach the planned range"
            )
