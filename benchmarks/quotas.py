"""Client-quota benchmark: a producer under producer_byte_rate against its quota, and an
unthrottled producer's throughput with and without the throttled one beside it.

    python -m benchmarks.quotas [--seconds 10] [--quota-mib-s 1]

Three real node processes (raftlog.testing.cluster), one RF=3 single-partition topic,
confluent-kafka producers with acks=1 sending 1000-byte values as fast as they can. Phases:
unthrottled alone, both together, unthrottled alone again (the two solo runs are averaged so
drift on a shared machine hits both sides alike).

The last stdout line is one JSON object:
{"quota_bytes_s", "achieved_bytes_s", "ratio", "unthrottled_ratio", ...} where
ratio = achieved / quota (target 0.9-1.1) and unthrottled_ratio = the unthrottled client's
throughput beside the throttled one / alone (target >= 0.8).

The load helpers here are shared with tests/integration/test_quotas_processes.py.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from benchmarks.common import console, emit_result
from raftlog.constants import MIB

VALUE_BYTES = 1000
# Small batches keep one request's bytes far below a second of a 1 MiB/s quota, so the
# overshoot of the last request before a window closes stays in the noise.
PRODUCER_BATCH_BYTES = 64 * 1024
# How often the single client loop feeds and polls every client.
LOOP_PAUSE_S = 0.001


def produce_for(
    bootstrap: str,
    topic: str,
    offered_bytes_s: Mapping[str, float | None],
    seconds: float,
) -> dict[str, float]:
    """Run one confluent-kafka producer per client id for `seconds`; offered rate None means
    as fast as it can. Returns acknowledged bytes/s per client id (acks inside the window)."""
    from confluent_kafka import Producer

    producers = {
        client_id: Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": client_id,
                "acks": "1",
                "linger.ms": 5,
                "batch.size": PRODUCER_BATCH_BYTES,
                "queue.buffering.max.kbytes": 4096,
            }
        )
        for client_id in offered_bytes_s
    }
    acked_bytes = dict.fromkeys(offered_bytes_s, 0)
    sent_bytes = dict.fromkeys(offered_bytes_s, 0)
    value = b"q" * VALUE_BYTES

    def on_delivery(client_id: str) -> Any:
        def callback(error: Any, message: Any) -> None:
            if error is None:
                acked_bytes[client_id] += len(message.value())

        return callback

    callbacks = {client_id: on_delivery(client_id) for client_id in offered_bytes_s}
    started = time.monotonic()
    deadline = started + seconds
    while (now := time.monotonic()) < deadline:
        for client_id, producer in producers.items():
            offered = offered_bytes_s[client_id]
            budget = None if offered is None else offered * (now - started) - sent_bytes[client_id]
            for _ in range(500):
                if budget is not None and budget < VALUE_BYTES:
                    break
                try:
                    producer.produce(topic, value, callback=callbacks[client_id])
                except BufferError:
                    break  # the client's queue is full: it is being held back
                sent_bytes[client_id] += VALUE_BYTES
                if budget is not None:
                    budget -= VALUE_BYTES
            producer.poll(0)
        time.sleep(LOOP_PAUSE_S)
    in_window = dict(acked_bytes)
    for producer in producers.values():
        producer.flush(30)
    return {client_id: in_window[client_id] / seconds for client_id in offered_bytes_s}


def consume_for(
    bootstrap: str, topic: str, client_ids: Sequence[str], seconds: float
) -> dict[str, float]:
    """Read partition 0 of `topic` from the start with one confluent-kafka consumer per client
    id, as fast as each can, for `seconds`; returns consumed value bytes/s per client id."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumers = {}
    for client_id in client_ids:
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": client_id,
                "group.id": f"quota-bench-{client_id}",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        consumers[client_id] = consumer
    consumed_bytes = dict.fromkeys(client_ids, 0)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            for client_id, consumer in consumers.items():
                for message in consumer.consume(num_messages=1000, timeout=0.001):
                    if message.error() is None:
                        consumed_bytes[client_id] += len(message.value() or b"")
    finally:
        for consumer in consumers.values():
            consumer.close()
    return {client_id: consumed_bytes[client_id] / seconds for client_id in client_ids}


def alter_quotas(bootstrap: str, alterations: Sequence[tuple[Any, Mapping[str, object]]]) -> None:
    """AlterClientQuotas through the project client; raises on any per-entity error."""
    from raftlog.client.admin import Admin
    from raftlog.client.cluster import open_cluster
    from raftlog.errors import ErrorCode

    async def run() -> None:
        async with open_cluster(bootstrap, client_id="quota-admin") as cluster:
            results = await Admin(cluster).alter_client_quotas(alterations)
        failed = {str(entity): r for entity, r in results.items() if r.error != ErrorCode.none}
        if failed:
            raise RuntimeError(f"AlterClientQuotas failed: {failed}")

    trio.run(run)


def create_topic(bootstrap: str, topic: str, replication_factor: int = 3) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, replication_factor)]).values():
        future.result(30)


def run(seconds: float, quota_bytes_s: int) -> dict[str, Any]:
    from raftlog.quotas import QuotaEntity
    from raftlog.testing.cluster import ProcessCluster

    with (
        tempfile.TemporaryDirectory(prefix="raftlog-quota-bench-") as root,
        ProcessCluster(Path(root) / "cluster", 3) as cluster,
    ):
        bootstrap = cluster.bootstrap_servers
        create_topic(bootstrap, "quota-bench")
        alter_quotas(
            bootstrap, [(QuotaEntity.client("throttled"), {"producer_byte_rate": quota_bytes_s})]
        )
        console.print(f"[bold]quota[/] {quota_bytes_s / MIB:.2f} MiB/s on client id 'throttled'")
        alone_before = produce_for(bootstrap, "quota-bench", {"free-1": None}, seconds)["free-1"]
        console.print(f"unthrottled alone: {alone_before / MIB:.2f} MiB/s")
        both = produce_for(bootstrap, "quota-bench", {"throttled": None, "free-2": None}, seconds)
        console.print(
            f"together: throttled {both['throttled'] / MIB:.3f} MiB/s, "
            f"unthrottled {both['free-2'] / MIB:.2f} MiB/s"
        )
        alone_after = produce_for(bootstrap, "quota-bench", {"free-3": None}, seconds)["free-3"]
        console.print(f"unthrottled alone again: {alone_after / MIB:.2f} MiB/s")
    alone = (alone_before + alone_after) / 2
    return {
        "quota_bytes_s": quota_bytes_s,
        "achieved_bytes_s": round(both["throttled"]),
        "ratio": round(both["throttled"] / quota_bytes_s, 3),
        "unthrottled_ratio": round(both["free-2"] / alone, 3) if alone else 0.0,
        "unthrottled_alone_bytes_s": round(alone),
        "unthrottled_with_throttled_bytes_s": round(both["free-2"]),
        "seconds": seconds,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--quota-mib-s", type=float, default=1.0)
    args = parser.parse_args(argv)
    emit_result(run(args.seconds, int(args.quota_mib_s * MIB)))


if __name__ == "__main__":
    main()
