"""Fetch benchmark: a raw-protocol consumer reading a caught-up topic from a real node, vs the
same segment bytes sent by raw os.sendfile to a socket sink, in the same run.

    python -m benchmarks.fetch [--size-mb 1024] [--partitions 4] [--rounds 2]

A one-node cluster (raftlog.testing.cluster, a real `raftlog node` process) gets a topic of
`--partitions` partitions, RF=1, filled to `--size-mb` with raw Produce requests (acks=1)
carrying one pre-built 1 MiB RecordBatch of 1 KiB records, sent through the project's client
connection (raftlog/client/connection.py) with several requests in flight; the broker assigns
offsets, so the same bytes can be sent again and again. Then, per round:

* fetch: as a Kafka consumer fetches from one broker, one Fetch request in flight naming
  every partition (partition_max_bytes 1 MiB each), the response parsed by kio and the record
  bytes discarded; each partition's next offset comes from its last batch header;
* fetch (diagnostic): the same requests on a second connection whose response frames are
  received with recv_into into one reused buffer instead of the client's FrameReader, which
  separates what the client's framing costs from what the broker costs;
* baseline: os.sendfile of the same byte ranges of the segment files, 1 MiB at a time, to a
  loopback socket whose far end a trio task drains and discards;

alternating in slices of 16 MiB per partition, so that load from other processes on a shared
machine hits both sides alike; and finally a confluent-kafka consumer (assign, from the
beginning) counts messages per second.
The last stdout line is one JSON object: {"fetch_mb_s", "baseline_mb_s", "ratio",
"socket_fetch_mb_s", "socket_ratio", "confluent_consumer_msgs_s"}.
"""

from __future__ import annotations

import argparse
import struct
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import trio
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

from benchmarks.common import console, emit_result, mb_per_s, socket_sink
from raftlog.client import open_connection
from raftlog.client.connection import BrokerConnection, ConnectionLimits
from raftlog.client.protocol import API_KEYS, build_request, decode_response, encode_request
from raftlog.constants import MIB
from raftlog.net.framing import frame
from raftlog.node import PARTITIONS_DIR
from raftlog.records import HEADER_SIZE_BYTES, Record, build_batch, parse_header
from raftlog.testing.cluster import ProcessCluster

TOPIC = "fetch-bench"
RECORD_VALUE_BYTES = 1024
FILL_BATCH_BYTES = 1 * MIB
FILL_IN_FLIGHT_REQUESTS = 8
FETCH_PARTITION_MAX_BYTES = 1 * MIB
SENDFILE_CHUNK_BYTES = 1 * MIB
SLICE_BYTES_PER_PARTITION = 16 * MIB
FETCH_API_KEY = API_KEYS["fetch"]
FRAME_SIZE = struct.Struct(">i")
RESPONSE_MAX_BYTES = 64 * MIB
CONFLUENT_POLL_BATCH = 10_000
CONFLUENT_DEADLINE_S = 300.0


def _bar(unit: str = "bytes") -> Progress:
    if unit == "bytes":
        counts: tuple[Any, ...] = (DownloadColumn(), TransferSpeedColumn())
    else:
        counts = (MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(TextColumn("{task.description}"), BarColumn(), *counts, console=console)


def make_fill_batch() -> tuple[bytes, int]:
    """One RecordBatch v2 of ~1 MiB: 1 KiB values, keys that spread nothing (partition is
    chosen by the request). Returns (batch bytes, record count)."""
    count = FILL_BATCH_BYTES // (RECORD_VALUE_BYTES + 32)
    value = bytes(range(256)) * (RECORD_VALUE_BYTES // 256)
    records = [Record(key=b"key-%08d" % i, value=value) for i in range(count)]
    return build_batch(records, now_ms=int(time.time() * 1000)), count


def _address(cluster: ProcessCluster) -> tuple[str, int]:
    host, port = cluster.nodes[1].client_address.rsplit(":", 1)
    return host, int(port)


async def create_topic(connection: BrokerConnection, partitions: int) -> None:
    response = await connection.call(
        "create_topics",
        {
            "topics": [
                {
                    "name": TOPIC,
                    "num_partitions": partitions,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [],
                }
            ],
            "timeout": 30_000,
            "validate_only": False,
        },
    )
    (topic,) = response.topics
    if int(topic.error_code) != 0:
        raise RuntimeError(f"create_topics failed: {topic.error_code!r} {topic.error_message}")


async def fill(connection: BrokerConnection, partitions: int, size_bytes: int) -> int:
    """Produce the pre-built batch round-robin over the partitions until size_bytes are
    acknowledged; returns the number of records written."""
    batch, per_batch = make_fill_batch()
    batches = max(partitions, -(-size_bytes // len(batch)))
    next_batch = 0
    records = 0
    with _bar() as bar:
        task = bar.add_task("fill (produce acks=1)", total=batches * len(batch))

        async def producer() -> None:
            nonlocal next_batch, records
            while next_batch < batches:
                partition = next_batch % partitions
                next_batch += 1
                payload = build_request(
                    "produce",
                    connection.version("produce"),
                    {
                        "transactional_id": None,
                        "acks": 1,
                        "timeout": 30_000,
                        "topic_data": [
                            {
                                "name": TOPIC,
                                "partition_data": [{"index": partition, "records": batch}],
                            }
                        ],
                    },
                )
                response = await connection.request(payload)
                (answer,) = response.responses[0].partition_responses
                if int(answer.error_code) != 0:
                    raise RuntimeError(f"produce to {TOPIC}-{partition}: {answer.error_code!r}")
                records += per_batch
                bar.advance(task, len(batch))

        async with trio.open_nursery() as nursery:
            for _ in range(FILL_IN_FLIGHT_REQUESTS):
                nursery.start_soon(producer)
    return records


async def end_offsets(connection: BrokerConnection, partitions: int) -> list[int]:
    response = await connection.call(
        "list_offsets",
        {
            "replica_id": -1,
            "isolation_level": 0,
            "topics": [
                {
                    "name": TOPIC,
                    "partitions": [
                        {"partition_index": p, "timestamp": -1, "current_leader_epoch": -1}
                        for p in range(partitions)
                    ],
                }
            ],
        },
    )
    by_index = {int(p.partition_index): int(p.offset) for p in response.topics[0].partitions}
    return [by_index[p] for p in range(partitions)]


@dataclass
class Cursor:
    """One partition's progress in a round: the fetch side leads, the baseline then sends
    exactly the bytes the fetch side received, from the segment files."""

    partition: int
    end_offset: int
    files: list[tuple[Path, int]]  # segment files in offset order, with their sizes
    offset: int = 0
    fetched_bytes: int = 0
    sent_bytes: int = 0


def _fetch_values(cursors: list[Cursor]) -> dict[str, Any]:
    return {
        "replica_id": -1,
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": RESPONSE_MAX_BYTES,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "rack_id": "",
        "forgotten_topics_data": [],
        "topics": [
            {
                "topic": TOPIC,
                "partitions": [
                    {
                        "partition": cursor.partition,
                        "fetch_offset": cursor.offset,
                        "partition_max_bytes": FETCH_PARTITION_MAX_BYTES,
                        "current_leader_epoch": -1,
                        "log_start_offset": -1,
                        "last_fetched_epoch": -1,
                    }
                    for cursor in cursors
                ],
            }
        ],
    }


def next_offset_after(records: bytes, offset: int) -> int:
    """The offset after the last whole batch in `records` (headers only, nothing decoded)."""
    position = 0
    view = memoryview(records)
    while position + HEADER_SIZE_BYTES <= len(view):
        header = parse_header(view, position)
        if position + header.size_bytes > len(view):
            break  # a partial batch at the end of the response
        offset = header.next_offset
        position += header.size_bytes
    return offset


class FetchCaller(Protocol):
    """A BrokerConnection, or the benchmark's plain-socket SocketFetcher."""

    async def call(self, api: str, values: dict[str, Any]) -> Any: ...


async def fetch_slice(
    connection: FetchCaller, cursors: list[Cursor], target_bytes: int, advance: Any
) -> int:
    """Fetch, as a Kafka consumer does from one broker (one request in flight naming every
    partition that still needs data), until each partition has received target_bytes of its
    log or reached its end; returns record bytes received."""
    received = 0
    while True:
        wanted = [c for c in cursors if c.fetched_bytes < target_bytes and c.offset < c.end_offset]
        if not wanted:
            return received
        response = await connection.call("fetch", _fetch_values(wanted))
        by_partition = {c.partition: c for c in wanted}
        for data in response.responses[0].partitions:
            cursor = by_partition[int(data.partition_index)]
            where = f"{TOPIC}-{cursor.partition}@{cursor.offset}"
            if int(data.error_code) != 0:
                raise RuntimeError(f"fetch {where}: {data.error_code!r}")
            records = data.records or b""
            new_offset = next_offset_after(records, cursor.offset)
            if new_offset <= cursor.offset:
                raise RuntimeError(f"fetch {where} made no progress")
            cursor.offset = new_offset
            cursor.fetched_bytes += len(records)
            received += len(records)
            advance(len(records))


class SocketFetcher:
    """Diagnostic twin of BrokerConnection.call for Fetch: the same kio encoding and decoding,
    but each response frame is received with recv_into into one reused buffer instead of
    through FrameReader. The gap between the two shows what the client's framing costs, as
    opposed to the broker."""

    def __init__(self, sock: trio.socket.SocketType, version: int) -> None:
        self._sock = sock
        self._version = version
        self._buffer = bytearray(RESPONSE_MAX_BYTES + MIB)
        self._correlation_id = 0

    async def _receive_exactly(self, view: memoryview) -> None:
        received = 0
        while received < len(view):
            count = await self._sock.recv_into(view[received:])
            if count == 0:
                raise ConnectionError("the node closed the connection")
            received += count

    async def call(self, api: str, values: dict[str, Any]) -> Any:
        self._correlation_id += 1
        payload = build_request(api, self._version, values)
        request = encode_request(payload, self._correlation_id, "fetch-bench-socket")
        await self._sock.send(frame(request))
        view = memoryview(self._buffer)
        await self._receive_exactly(view[:4])
        (size,) = FRAME_SIZE.unpack_from(view, 0)
        await self._receive_exactly(view[:size])
        return decode_response(bytes(view[:size]), FETCH_API_KEY, self._version)


async def baseline_slice(cursors: list[Cursor], sink: Any, advance: Any) -> int:
    """os.sendfile of the byte ranges the last fetch slice received, 1 MiB at a time."""
    sent = 0
    for cursor in cursors:
        file_start = 0
        for path, size in cursor.files:
            lo = max(cursor.sent_bytes, file_start)
            hi = min(cursor.fetched_bytes, file_start + size)
            if lo < hi:
                with path.open("rb") as file:
                    position = lo - file_start
                    while position < hi - file_start:
                        count = min(SENDFILE_CHUNK_BYTES, hi - file_start - position)
                        sent += await sink.sendfile(file.fileno(), position, count)
                        position += count
                        advance(count)
            file_start += size
        cursor.sent_bytes = cursor.fetched_bytes
    return sent


def segment_files(cluster: ProcessCluster, partition: int) -> list[tuple[Path, int]]:
    directory = cluster.nodes[1].config.data_path / PARTITIONS_DIR / f"{TOPIC}-{partition}"
    files = [(path, path.stat().st_size) for path in sorted(directory.glob("*.log"))]
    if not files:
        raise RuntimeError(f"no segment files in {directory}")
    return files


async def measure(
    cluster: ProcessCluster, partitions: int, size_bytes: int, rounds: int
) -> dict[str, float]:
    host, port = _address(cluster)
    limits = ConnectionLimits(max_frame_bytes=RESPONSE_MAX_BYTES + MIB, max_in_flight_requests=16)
    async with open_connection(host, port, client_id="fetch-bench", limits=limits) as connection:
        await create_topic(connection, partitions)
        started = time.monotonic()
        records = await fill(connection, partitions, size_bytes)
        fill_s = time.monotonic() - started
        ends = await end_offsets(connection, partitions)
        if sum(ends) != records:
            raise RuntimeError(f"end offsets {ends} do not add up to {records} records")
        files = [segment_files(cluster, p) for p in range(partitions)]
        partition_bytes = [sum(size for _, size in f) for f in files]
        topic_bytes = sum(partition_bytes)
        console.print(
            f"filled {topic_bytes / MIB:.0f} MiB ({records} records, {partitions} partitions) "
            f"in {fill_s:.1f}s: {mb_per_s(topic_bytes, fill_s)} MB/s produced"
        )
        fetch_bytes = baseline_bytes = socket_bytes = 0
        fetch_s = baseline_s = socket_s = 0.0
        sock = trio.socket.socket()
        await sock.connect((host, port))
        fetcher = SocketFetcher(sock, connection.version("fetch"))
        async with socket_sink() as sink:
            with _bar() as bar:
                fetch_task = bar.add_task("fetch (client connection)", total=rounds * topic_bytes)
                socket_task = bar.add_task("fetch (recv_into socket)", total=rounds * topic_bytes)
                raw_task = bar.add_task("raw sendfile", total=rounds * topic_bytes)
                for _ in range(rounds):
                    cursors = [Cursor(p, ends[p], files[p]) for p in range(partitions)]
                    twins = [Cursor(p, ends[p], files[p]) for p in range(partitions)]
                    # Alternate in slices so that load from other processes on this shared
                    # machine hits every side alike.
                    target = 0
                    while target < max(partition_bytes):
                        target += SLICE_BYTES_PER_PARTITION
                        started = time.monotonic()
                        fetch_bytes += await fetch_slice(
                            connection, cursors, target, partial(bar.advance, fetch_task)
                        )
                        fetch_s += time.monotonic() - started
                        started = time.monotonic()
                        socket_bytes += await fetch_slice(
                            fetcher, twins, target, partial(bar.advance, socket_task)
                        )
                        socket_s += time.monotonic() - started
                        started = time.monotonic()
                        baseline_bytes += await baseline_slice(
                            cursors, sink, partial(bar.advance, raw_task)
                        )
                        baseline_s += time.monotonic() - started
                    if [c.fetched_bytes for c in cursors] != partition_bytes:
                        raise RuntimeError(
                            f"fetched {[c.fetched_bytes for c in cursors]} bytes per partition, "
                            f"the segment files hold {partition_bytes}"
                        )
        sock.close()
    fetch_mb_s = mb_per_s(fetch_bytes, fetch_s)
    baseline_mb_s = mb_per_s(baseline_bytes, baseline_s)
    socket_mb_s = mb_per_s(socket_bytes, socket_s)
    return {
        "fetch_mb_s": fetch_mb_s,
        "baseline_mb_s": baseline_mb_s,
        "ratio": round(fetch_mb_s / baseline_mb_s, 3) if baseline_mb_s else 0.0,
        "socket_fetch_mb_s": socket_mb_s,
        "socket_ratio": round(socket_mb_s / baseline_mb_s, 3) if baseline_mb_s else 0.0,
        "records": records,
    }


def confluent_consume(cluster: ProcessCluster, partitions: int, records: int) -> float:
    """Messages per second of a confluent-kafka consumer reading the whole topic once."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": "fetch-bench",
            "enable.auto.commit": False,
            "fetch.max.bytes": RESPONSE_MAX_BYTES,
            "max.partition.fetch.bytes": FETCH_PARTITION_MAX_BYTES,
        }
    )
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(partitions)])
    count = 0
    deadline = time.monotonic() + CONFLUENT_DEADLINE_S
    try:
        with _bar("messages") as bar:
            task = bar.add_task("confluent-kafka consumer (messages)", total=records)
            started = None
            while count < records and time.monotonic() < deadline:
                messages = consumer.consume(CONFLUENT_POLL_BATCH, timeout=1.0)
                if started is None and messages:
                    started = time.monotonic()
                good = sum(1 for m in messages if not m.error())
                count += good
                bar.advance(task, good)
            elapsed = time.monotonic() - (started or time.monotonic())
    finally:
        consumer.close()
    if count < records:
        raise RuntimeError(f"confluent consumer read {count} of {records} records")
    return round(count / elapsed, 1) if elapsed > 0 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="topic size to fill (MiB)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the topic")
    parser.add_argument("--rounds", type=int, default=2, help="fetch/baseline alternations")
    parser.add_argument("--dir", type=Path, default=None, help="where the node keeps data")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="raftlog-fetch-bench-", dir=args.dir) as tmp,
        ProcessCluster(Path(tmp) / "c", 1) as cluster,
    ):
        result = trio.run(measure, cluster, args.partitions, args.size_mb * MIB, args.rounds)
        records = int(result.pop("records"))
        result["confluent_consumer_msgs_s"] = confluent_consume(cluster, args.partitions, records)
    console.print(
        f"fetch {result['fetch_mb_s']} MB/s vs raw sendfile {result['baseline_mb_s']} MB/s "
        f"(ratio {result['ratio']}; recv_into socket {result['socket_fetch_mb_s']} MB/s, "
        f"ratio {result['socket_ratio']}); confluent-kafka consumer "
        f"{result['confluent_consumer_msgs_s']} msgs/s"
    )
    emit_result(result)


if __name__ == "__main__":
    main()
