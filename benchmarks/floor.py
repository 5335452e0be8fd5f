"""The floor for `benchmarks.replication`: the least a Kafka produce server in Python on trio
can do, run in its own process so it gets a core as a node does.

    python -m benchmarks.floor --port 29092 --dir /tmp/floor [--partitions 6]
                               [--flush-policy always|interval]

It speaks just enough of the protocol for a stock producer (confluent-kafka): ApiVersions,
Metadata (itself the only broker; every topic asked for has `--partitions` partitions) and
Produce. A Produce's record-batch bytes are appended as they came to one file per partition,
and answered after the same group commit the broker's flusher runs (raftlog.storage.flusher):
one round at a time, every file asked for in that round fdatasynced concurrently in worker
threads, every caller that asked while a round ran covered by the next one. What it leaves
out is what the broker adds on top: batch validation and CRC checks, offset and epoch
assignment in the batch, indexes, replication state, quotas, authorization, metrics. So
node MB/s / floor MB/s tells how close the broker is to what this machine allows.

The request and response bytes are kio's (raftlog.net.kafka.codec) and frames are read with
the broker's own FrameReader, so the two servers pay the same parsing and framing costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import struct
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from raftlog.config import NodeConfig
from raftlog.constants import NO_AUTHORIZED_OPERATIONS
from raftlog.errors import ErrorCode
from raftlog.net.framing import FrameError, FrameReader
from raftlog.net.kafka import codec
from raftlog.net.kafka.apis import VERSION_TABLE, ApiKey

log = logging.getLogger("benchmarks.floor")

NODE_ID = 1
CLUSTER_ID = "benchmark-floor"
_NODE_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(NodeConfig)}
# The node's own defaults, so both servers read and queue requests under the same limits.
MAX_INFLIGHT_REQUESTS = int(_NODE_DEFAULTS["max_inflight_requests_per_connection"])
MAX_FRAME_BYTES = int(_NODE_DEFAULTS["socket_request_max_bytes"])
FLUSH_INTERVAL_MS = int(_NODE_DEFAULTS["flush_interval_ms"])
# ApiVersions advertises the broker's own table: librdkafka enables protocol features from
# combinations (record batch v2 needs Produce 3 *and* Fetch 4), so the same table makes it
# send the same Produce frames. Only three of those APIs are served; any other request closes
# its connection, which a producer never sends.
ADVERTISED_APIS: dict[int, tuple[int, int]] = {
    int(key): (lo, hi) for key, (lo, hi, _) in VERSION_TABLE.items()
}
_SERVED = (ApiKey.API_VERSIONS, ApiKey.METADATA, ApiKey.PRODUCE)
SERVED_APIS: dict[int, tuple[int, int]] = {int(key): ADVERTISED_APIS[key] for key in _SERVED}
MAX_PARTITIONS = 10_000
# RecordBatch v2 header: batchLength (int32) at byte 8, lastOffsetDelta (int32) at byte 23.
_BATCH_LENGTH = struct.Struct(">i")
_LAST_OFFSET_DELTA = struct.Struct(">i")
BATCH_LENGTH_AT = 8
LAST_OFFSET_DELTA_AT = 23
BATCH_OVERHEAD_BYTES = 12  # baseOffset + batchLength, not counted in batchLength
MIN_BATCH_LENGTH_BYTES = 49  # a v2 batch header without records, after batchLength


class BadBatches(ValueError):
    """Record bytes that do not split into whole v2 batches."""


def count_offsets(records: bytes) -> int:
    """How many offsets the batches in `records` take (sum of lastOffsetDelta + 1).

    Only the two fields that answer needs are read; the broker's full validation is exactly
    what the floor leaves out."""
    pos, offsets, total = 0, 0, len(records)
    while pos < total:
        if total - pos < BATCH_OVERHEAD_BYTES + MIN_BATCH_LENGTH_BYTES:
            raise BadBatches(f"{total - pos} trailing bytes are not a batch")
        (length,) = _BATCH_LENGTH.unpack_from(records, pos + BATCH_LENGTH_AT)
        if length < MIN_BATCH_LENGTH_BYTES or pos + BATCH_OVERHEAD_BYTES + length > total:
            raise BadBatches(f"batch at byte {pos} claims {length} bytes")
        (delta,) = _LAST_OFFSET_DELTA.unpack_from(records, pos + LAST_OFFSET_DELTA_AT)
        if delta < 0:
            raise BadBatches(f"batch at byte {pos} has lastOffsetDelta {delta}")
        offsets += delta + 1
        pos += BATCH_OVERHEAD_BYTES + length
    return offsets


@dataclass(eq=False)
class PartitionFile:
    """One partition's append-only file and how much of it is written and fsynced."""

    path: Path
    fd: int
    next_offset: int = 0
    written_bytes: int = 0
    flushed_bytes: int = 0

    @classmethod
    def open(cls, path: Path) -> PartitionFile:
        return cls(path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))

    def append(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]
        self.written_bytes += len(data)


class GroupCommit:
    """The broker flusher's policy on plain files: `flush` callers share fsync rounds."""

    def __init__(self, flush_policy: str) -> None:
        self.flush_policy = flush_policy
        self.fsync_rounds = 0
        self._files: dict[int, PartitionFile] = {}  # every file, for the interval tick
        self._requested: dict[int, PartitionFile] = {}
        self._wakeup = trio.Event()
        self._round_done = trio.Event()

    def register(self, file: PartitionFile) -> None:
        self._files[id(file)] = file

    async def flush(self, targets: list[tuple[PartitionFile, int]]) -> None:
        """Return once each file is fsynced up to its byte target; at once under 'interval'."""
        if self.flush_policy == "interval":
            return
        while True:
            pending = [f for f, target in targets if f.flushed_bytes < target]
            if not pending:
                return
            for f in pending:
                self._requested[id(f)] = f
            self._wakeup.set()
            await self._round_done.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        tick_s = FLUSH_INTERVAL_MS / 1000 if self.flush_policy == "interval" else math.inf
        task_status.started()
        while True:
            with trio.move_on_after(tick_s):
                await self._wakeup.wait()
            self._wakeup = trio.Event()
            chosen = dict(self._requested)
            self._requested.clear()
            if self.flush_policy == "interval":
                chosen = {k: f for k, f in self._files.items() if f.flushed_bytes < f.written_bytes}
            if chosen:
                await self._round(list(chosen.values()))
            done, self._round_done = self._round_done, trio.Event()
            done.set()

    async def _round(self, files: list[PartitionFile]) -> None:
        targets = [(f, f.written_bytes) for f in files]
        # One worker thread per file, as the broker: the filesystem merges concurrent
        # fdatasyncs into one journal commit.
        async with trio.open_nursery() as nursery:
            for f, _ in targets:
                nursery.start_soon(trio.to_thread.run_sync, os.fdatasync, f.fd)
        for f, target in targets:
            f.flushed_bytes = max(f.flushed_bytes, target)
        self.fsync_rounds += 1


@dataclass
class FloorServer:
    directory: Path
    partitions: int
    host: str
    port: int
    flush_policy: str = "always"
    files: dict[tuple[str, int], PartitionFile] = field(default_factory=dict)
    topics_seen: dict[str, None] = field(default_factory=dict)  # insertion-ordered set

    def __post_init__(self) -> None:
        self.commit = GroupCommit(self.flush_policy)

    def file(self, topic: str, partition: int) -> PartitionFile:
        key = (topic, partition)
        found = self.files.get(key)
        if found is None:
            found = PartitionFile.open(self.directory / f"{topic}-{partition}.log")
            self.files[key] = found
            self.commit.register(found)
        return found

    # ------------------------------------------------------------------ answers
    def api_versions(self, version: int, error: ErrorCode = ErrorCode.none) -> dict[str, Any]:
        return {
            "error_code": error,
            "api_keys": [
                {"api_key": key, "min_version": lo, "max_version": hi}
                for key, (lo, hi) in sorted(ADVERTISED_APIS.items())
            ],
            "throttle_time": 0,
        }

    def metadata(self, request: Any, version: int) -> dict[str, Any]:
        asked = request.topics
        if asked is None or (version == 0 and not asked):
            names = list(self.topics_seen)
        else:
            names = [t.name for t in asked if getattr(t, "name", None)]
        self.topics_seen.update(dict.fromkeys(names))
        topics = [
            {
                "error_code": ErrorCode.none,
                "name": name,
                "topic_id": uuid.uuid5(uuid.NAMESPACE_URL, f"floor/{name}"),
                "is_internal": False,
                "partitions": [
                    {
                        "error_code": ErrorCode.none,
                        "partition_index": i,
                        "leader_id": NODE_ID,
                        "leader_epoch": 0,
                        "replica_nodes": [NODE_ID],
                        "isr_nodes": [NODE_ID],
                        "offline_replicas": [],
                    }
                    for i in range(self.partitions)
                ],
                "topic_authorized_operations": NO_AUTHORIZED_OPERATIONS,
            }
            for name in names
        ]
        return {
            "throttle_time": 0,
            "brokers": [{"node_id": NODE_ID, "host": self.host, "port": self.port, "rack": None}],
            "cluster_id": CLUSTER_ID,
            "controller_id": NODE_ID,
            "topics": topics,
            "cluster_authorized_operations": NO_AUTHORIZED_OPERATIONS,
        }

    async def produce(self, request: Any) -> dict[str, Any] | None:
        answers: dict[str, list[dict[str, Any]]] = {}
        targets: list[tuple[PartitionFile, int]] = []
        for topic in request.topic_data:
            for p in topic.partition_data:
                error, base_offset = ErrorCode.none, -1
                if not 0 <= p.index < self.partitions:
                    error = ErrorCode.unknown_topic_or_partition
                elif not p.records:
                    error = ErrorCode.corrupt_message
                else:
                    records = bytes(p.records)
                    try:
                        offsets = count_offsets(records)
                    except BadBatches as exc:
                        log.warning("%s-%d: %s", topic.name, p.index, exc)
                        error = ErrorCode.corrupt_message
                    else:
                        f = self.file(topic.name, p.index)
                        f.append(records)
                        base_offset, f.next_offset = f.next_offset, f.next_offset + offsets
                        targets.append((f, f.written_bytes))
                answers.setdefault(topic.name, []).append(
                    {
                        "index": p.index,
                        "error_code": error,
                        "base_offset": base_offset,
                        "log_append_time": -1,
                        "log_start_offset": 0,
                        "record_errors": [],
                        "error_message": None,
                    }
                )
        if request.acks == 0:
            return None
        await self.commit.flush(targets)
        return {
            "responses": [
                {"name": name, "partition_responses": parts} for name, parts in answers.items()
            ],
            "throttle_time": 0,
        }

    # ------------------------------------------------------------------ connections
    async def serve_connection(self, stream: trio.SocketStream) -> None:
        reader = FrameReader(stream, MAX_FRAME_BYTES)
        send_slots, receive_slots = trio.open_memory_channel[Any](MAX_INFLIGHT_REQUESTS)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write_responses, stream, receive_slots)
                while True:
                    try:
                        frame = await reader.read_frame()
                    except (FrameError, trio.BrokenResourceError) as exc:
                        log.info("closing a connection: %s", exc)
                        break
                    if frame is None:
                        break
                    try:
                        slot = self._dispatch(frame, nursery)
                    except (codec.MalformedRequest, _Unserved) as exc:
                        log.warning("closing a connection: %s", exc)
                        break
                    await send_slots.send(slot)
                nursery.cancel_scope.cancel()
        finally:
            await trio.aclose_forcefully(stream)

    def _dispatch(self, frame: bytes, nursery: trio.Nursery) -> _Slot:
        api_key, version = codec.peek_api(frame)
        served = SERVED_APIS.get(api_key)
        if served is None or not served[0] <= version <= served[1]:
            header = codec.parse_header_only(frame)
            if api_key != ApiKey.API_VERSIONS:
                raise _Unserved(f"{codec.api_name(api_key)} v{version} is not served")
            # As the broker: a too-new ApiVersions gets v0 with UNSUPPORTED_VERSION and the
            # table, and the client retries with a version listed there.
            slot = _Slot(header.correlation_id)
            slot.finish(api_key, 0, self.api_versions(0, ErrorCode.unsupported_version))
            return slot
        header, body = codec.parse_request(frame, api_key, version)
        slot = _Slot(header.correlation_id)
        if api_key == ApiKey.PRODUCE:
            nursery.start_soon(self._answer_produce, slot, version, body)
        elif api_key == ApiKey.METADATA:
            slot.finish(api_key, version, self.metadata(body, version))
        else:
            slot.finish(api_key, version, self.api_versions(version))
        return slot

    async def _answer_produce(self, slot: _Slot, version: int, body: Any) -> None:
        slot.finish(ApiKey.PRODUCE, version, await self.produce(body))

    async def _write_responses(
        self, stream: trio.SocketStream, receive_slots: trio.MemoryReceiveChannel[_Slot]
    ) -> None:
        try:
            async for slot in receive_slots:
                await slot.done.wait()
                if slot.response is not None:
                    await stream.send_all(slot.response)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.info("cannot write a response: %s", exc)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.commit.run)
            listeners = await trio.open_tcp_listeners(self.port, host=self.host)
            nursery.start_soon(trio.serve_listeners, self.serve_connection, listeners)
            task_status.started()


class _Unserved(Exception):
    """A request the floor does not serve: the connection is closed, as the broker does."""


class _Slot:
    """One request's place in the connection's response order."""

    def __init__(self, correlation_id: int) -> None:
        self.correlation_id = correlation_id
        self.done = trio.Event()
        self.response: bytes | None = None  # None: nothing to send (acks=0)

    def finish(self, api_key: int, version: int, values: dict[str, Any] | None) -> None:
        if values is not None:
            response = codec.build(codec.response_class(api_key, version), values)
            segments = codec.encode_response(response, self.correlation_id)
            # No response here carries a RecordSet, so every segment is plain bytes.
            assert all(isinstance(s, bytes) for s in segments), segments
            self.response = codec.frame_header(segments) + b"".join(segments)  # type: ignore[arg-type]
        self.done.set()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True, help="where partition files go")
    parser.add_argument("--partitions", type=int, default=6, help="partitions of every topic")
    parser.add_argument("--flush-policy", choices=("always", "interval"), default="always")
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port {args.port} is not a TCP port")
    if not 0 < args.partitions <= MAX_PARTITIONS:
        parser.error(f"--partitions must be in 1..{MAX_PARTITIONS}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args.dir.mkdir(parents=True, exist_ok=True)
    server = FloorServer(args.dir, args.partitions, args.host, args.port, args.flush_policy)
    try:
        trio.run(server.serve)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
