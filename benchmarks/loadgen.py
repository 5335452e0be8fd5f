"""A produce load generator that costs its machine little: the same Produce requests a busy
librdkafka producer sends, built once and sent again and again.

Under load librdkafka sends each broker Produce requests carrying one full batch per partition
it leads, up to five requests in flight per connection. `produce_load` does the same with
batches built once (record batch v2, `records_per_batch` records of `record_bytes`, no key,
no compression, no producer id, so the broker takes every copy as new records), so the
client's CPU per byte is a small fraction of a `produce()` call per record. A benchmark
whose client shares the machine's cores with the servers then measures the servers.

With `settle`, the run ends only once every acknowledged record is below its partition's high
watermark, that is, held by every in-sync replica: an acks=1 producer is answered before its
followers have the records, and its run then takes as long as the replication it caused (a
load that outruns the followers would otherwise leave the next measurement to pay for it).

    python -m benchmarks.loadgen BOOTSTRAP TOPIC [--acks all] [--seconds 5] [--settle]

prints {"acked_bytes", "seconds", "mb_s", "requests", "errors"} as its last line.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from typing import Any

import trio

from benchmarks.common import emit_result, mb_per_s
from raftlog.client import open_cluster
from raftlog.client.admin import list_offset
from raftlog.client.cluster import Cluster
from raftlog.client.connection import BrokerConnection
from raftlog.client.protocol import build_request
from raftlog.errors import ErrorCode
from raftlog.records import Record, build_batch

# librdkafka's max.in.flight.requests.per.connection under idempotence, and the
# benchmarks' producer setting.
IN_FLIGHT_PER_BROKER = 5
RECORDS_PER_BATCH = 256  # 256 KiB batches of 1 KiB records: the benchmarks' batch.size
REQUEST_TIMEOUT_MS = 30_000
# How often a settling run asks for the high watermarks, and for how long at most.
SETTLE_POLL_S = 0.005
SETTLE_TIMEOUT_S = 120.0
ACKS = {"all": -1, "1": 1}


@dataclass
class LoadResult:
    acked_bytes: int = 0
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0

    @property
    def mb_s(self) -> float:
        return mb_per_s(self.acked_bytes, self.seconds)


def one_batch(record_bytes: int, records_per_batch: int) -> bytes:
    value = os.urandom(record_bytes)
    return build_batch(
        [Record(key=None, value=value) for _ in range(records_per_batch)],
        base_offset=0,
    )


async def produce_load(
    bootstrap: str,
    topic: str,
    *,
    acks: int,
    seconds: float,
    record_bytes: int = 1024,
    records_per_batch: int = RECORDS_PER_BATCH,
    in_flight: int = IN_FLIGHT_PER_BROKER,
    settle: bool = False,
) -> LoadResult:
    """Stream Produce requests to every partition of `topic` for `seconds`: each broker gets
    `in_flight` requests at a time, each carrying one batch for every partition it leads;
    bytes are counted when a partition answers NONE. With `settle`, `seconds` of the result
    runs until every acknowledged record is replicated (see the module docstring)."""
    batch = one_batch(record_bytes, records_per_batch)
    batch_bytes = record_bytes * records_per_batch
    result = LoadResult()
    async with open_cluster(bootstrap, client_id="raftlog-loadgen") as cluster:
        await cluster.refresh_metadata([topic])
        by_leader: dict[int, list[int]] = {}
        known = cluster.topics.get(topic)
        if known is None or known.error != ErrorCode.none or not known.partitions:
            code = known.error.name if known is not None else "UNKNOWN_TOPIC_OR_PARTITION"
            raise RuntimeError(f"topic {topic!r} cannot take load: {code}")
        for info in known.partitions:
            by_leader.setdefault(info.leader_id, []).append(info.partition)
        if -1 in by_leader:
            raise RuntimeError(f"{topic}: partitions {by_leader[-1]} have no leader")
        started = time.monotonic()
        deadline = started + seconds
        # The offset after the last acknowledged record, per partition.
        acked_end: dict[int, int] = {}

        async def sender(connection: BrokerConnection, payload: Any) -> None:
            while time.monotonic() < deadline:
                response = await connection.request(payload, timeout_ms=REQUEST_TIMEOUT_MS)
                result.requests += 1
                for topic_response in response.responses:
                    for p in topic_response.partition_responses:
                        if p.error_code == ErrorCode.none:
                            result.acked_bytes += batch_bytes
                            end = p.base_offset + records_per_batch
                            acked_end[p.index] = max(acked_end.get(p.index, 0), end)
                        else:
                            result.errors += 1

        async with trio.open_nursery() as nursery:
            for leader, partitions in by_leader.items():
                connection = await cluster.broker(leader)
                payload = build_request(
                    "produce",
                    connection.version("produce"),
                    {
                        "transactional_id": None,
                        "acks": acks,
                        "timeout": REQUEST_TIMEOUT_MS,
                        "topic_data": [
                            {
                                "name": topic,
                                "partition_data": [
                                    {"index": p, "records": batch} for p in partitions
                                ],
                            }
                        ],
                    },
                )
                for _ in range(in_flight):
                    nursery.start_soon(sender, connection, payload)
        if settle:
            await _until_replicated(cluster, topic, acked_end)
        result.seconds = time.monotonic() - started
    return result


async def _until_replicated(cluster: Cluster, topic: str, acked_end: dict[int, int]) -> None:
    """Return once each partition's high watermark has reached `acked_end`."""
    left = dict(acked_end)
    with trio.fail_after(SETTLE_TIMEOUT_S):
        while left:
            for partition, end in list(left.items()):
                listed = await list_offset(cluster, topic, partition, "latest")
                if listed.offset >= end:
                    del left[partition]
            if left:
                await trio.sleep(SETTLE_POLL_S)  # the next look at the high watermarks


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("--acks", choices=sorted(ACKS), default="all")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument(
        "--settle", action="store_true", help="end once every acked record is replicated"
    )
    args = parser.parse_args()
    if not 0 < args.seconds <= 3600 or not 1 <= args.record_bytes <= 1024 * 1024:
        parser.error("--seconds must be in (0, 3600] and --record-bytes in 1..1048576")
    result = trio.run(
        lambda: produce_load(
            args.bootstrap,
            args.topic,
            acks=ACKS[args.acks],
            seconds=args.seconds,
            record_bytes=args.record_bytes,
            settle=args.settle,
        )
    )
    emit_result(
        {
            "acked_bytes": result.acked_bytes,
            "seconds": round(result.seconds, 3),
            "mb_s": result.mb_s,
            "requests": result.requests,
            "errors": result.errors,
        }
    )


if __name__ == "__main__":
    main()
