"""Replication benchmark: acks=all to an RF=3 topic vs acks=1 to an RF=1 topic on three real
nodes, then the latency of acks=all produces at half the throughput just measured.

    python -m benchmarks.replication [--seconds 10] [--partitions 6]

Both topics have the same partition count and the producers the same settings (confluent-kafka,
1 KiB records); only acks and the replication factor differ, so `ratio` is the price of
replication (Kafka's own 2014 measurement: 0.51). The two sides alternate in slices so drift on a
shared machine hits both alike. The last stdout line is one JSON object:
{"acks_all_rf3_mb_s", "acks1_rf1_mb_s", "ratio", "p99_ms_at_half_load", ...}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.common import console, emit_result, mb_per_s, progress
from raftlog.constants import MIB
from raftlog.testing.cluster import ProcessCluster

RECORD_BYTES = 1024
SLICES = 2  # alternations of the two throughput sides
# The paced producer wakes this often (the producer's linger.ms: bursts between two wake-ups
# would share a batch anyway, and fewer wake-ups leave the nodes more of the shared CPU).
PACE_INTERVAL_MS = 5
REPLICATED = "bench-rf3"
UNREPLICATED = "bench-rf1"
# Loose ISR timing: a follower that falls behind for a moment under full load is not dropped
# (that would turn acks=all into acks=1-with-one-follower and flatter the ratio).
NODE_OVERRIDES: dict[str, Any] = {"replica_lag_time_max_ms": 10_000}
PRODUCER_SETTINGS: dict[str, Any] = {
    "linger.ms": 5,
    # The cap idempotent producers run with: under load, batches grow instead of requests.
    "max.in.flight.requests.per.connection": 5,
    "batch.size": 256 * 1024,
    "queue.buffering.max.kbytes": 64 * 1024,
    "compression.type": "none",
    "enable.idempotence": False,  # idempotence forces acks=all: the acks=1 side could not use it
    "message.timeout.ms": 60_000,
}


def create_topics(cluster: ProcessCluster, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    topics = [
        NewTopic(REPLICATED, partitions, 3, config={"min.insync.replicas": "2"}),
        NewTopic(UNREPLICATED, partitions, 1),
    ]
    for future in admin.create_topics(topics).values():
        future.result(30)

    def leaders_known() -> bool:
        described = cluster.describe()["topics"]
        return all(
            len(described.get(name, [])) == partitions
            and all(p["leader_id"] > 0 for p in described[name])
            for name in (REPLICATED, UNREPLICATED)
        )

    cluster.wait_for(leaders_known, "leaders for the benchmark topics")


def make_producer(cluster: ProcessCluster, acks: str) -> Producer:
    return Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "acks": acks, **PRODUCER_SETTINGS}
    )


class Tally:
    def __init__(self) -> None:
        self.acked_bytes = 0
        self.errors = 0
        self.latencies_s: list[float] = []

    def on_delivery(self, error: Any, message: Any) -> None:
        if error is not None:
            self.errors += 1
            return
        self.acked_bytes += len(message.value())
        latency = message.latency()
        if latency is not None:
            self.latencies_s.append(latency)


def blast(
    producer: Producer, topic: str, seconds: float, value: bytes, bar: Any
) -> tuple[int, float]:
    """Produce as fast as the client takes records for `seconds`; (acked bytes, elapsed s)."""
    tally = Tally()
    started = time.monotonic()
    deadline = started + seconds
    sent = 0
    while time.monotonic() < deadline:
        try:
            producer.produce(topic, value=value, on_delivery=tally.on_delivery)
            sent += 1
        except BufferError:
            producer.poll(0.001)
        if sent % 256 == 0:
            producer.poll(0)
            bar.tick()
    remaining = producer.flush(60)
    elapsed = time.monotonic() - started
    if remaining or tally.errors:
        console.print(f"[red]{topic}: {remaining} unsent, {tally.errors} failed[/red]")
    return tally.acked_bytes, elapsed


def paced(
    producer: Producer, topic: str, seconds: float, rate_bytes_s: float, value: bytes, bar: Any
) -> Tally:
    """Produce at `rate_bytes_s` in bursts every PACE_INTERVAL_MS; record latencies."""
    tally = Tally()
    started = time.monotonic()
    interval_s = PACE_INTERVAL_MS / 1000
    per_tick = rate_bytes_s * interval_s / len(value)
    owed = 0.0
    next_tick = started
    while next_tick < started + seconds:
        owed += per_tick
        while owed >= 1:
            producer.produce(topic, value=value, on_delivery=tally.on_delivery)
            owed -= 1
        producer.poll(0)
        bar.tick()
        next_tick += interval_s
        pause = next_tick - time.monotonic()
        if pause > 0:
            producer.poll(pause)  # serves delivery callbacks while it waits
    producer.flush(60)
    return tally


def percentile_ms(samples_s: list[float], fraction: float) -> float:
    if not samples_s:
        return float("nan")
    ordered = sorted(samples_s)
    index = min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))
    return round(ordered[index] * 1000, 2)


def run(seconds: float, partitions: int, root: Path, flush_policy: str) -> dict[str, Any]:
    value = os.urandom(RECORD_BYTES)
    overrides = {**NODE_OVERRIDES, "flush_policy": flush_policy}
    with ProcessCluster(root / "cluster", 3, overrides) as cluster:
        create_topics(cluster, partitions)
        replicated = make_producer(cluster, "all")
        unreplicated = make_producer(cluster, "1")
        # Warm up connections and metadata on both sides before anything is timed.
        blast(replicated, REPLICATED, 0.5, value, _NoBar())
        blast(unreplicated, UNREPLICATED, 0.5, value, _NoBar())
        totals = {REPLICATED: [0, 0.0], UNREPLICATED: [0, 0.0]}
        slice_s = seconds / SLICES
        with progress("throughput: acks=all RF=3 vs acks=1 RF=1", 2 * seconds) as bar:
            for _ in range(SLICES):
                for producer, topic in ((replicated, REPLICATED), (unreplicated, UNREPLICATED)):
                    acked, elapsed = blast(producer, topic, slice_s, value, bar)
                    totals[topic][0] += acked
                    totals[topic][1] += elapsed
        all_mb_s = mb_per_s(int(totals[REPLICATED][0]), totals[REPLICATED][1])
        one_mb_s = mb_per_s(int(totals[UNREPLICATED][0]), totals[UNREPLICATED][1])
        half_rate = totals[REPLICATED][0] / totals[REPLICATED][1] / 2
        with progress(f"latency: acks=all at {half_rate / MIB:.1f} MB/s", seconds / 2) as bar:
            tally = paced(replicated, REPLICATED, seconds / 2, half_rate, value, bar)
    latencies = tally.latencies_s
    return {
        "acks_all_rf3_mb_s": all_mb_s,
        "acks1_rf1_mb_s": one_mb_s,
        "ratio": round(all_mb_s / one_mb_s, 3) if one_mb_s else 0.0,
        "p99_ms_at_half_load": percentile_ms(latencies, 0.99),
        "p50_ms_at_half_load": percentile_ms(latencies, 0.50),
        "mean_ms_at_half_load": round(statistics.fmean(latencies) * 1000, 2) if latencies else None,
        "half_load_mb_s": round(half_rate / MIB, 2),
        "latency_samples": len(latencies),
        "seconds_per_side": seconds,
        "partitions": partitions,
        "record_bytes": RECORD_BYTES,
        "flush_policy": flush_policy,
    }


class _NoBar:
    def tick(self) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="produce time per side")
    parser.add_argument("--partitions", type=int, default=6, help="partitions per topic")
    parser.add_argument("--dir", type=Path, default=None, help="node data (default: tmp)")
    parser.add_argument(
        "--flush-policy",
        choices=("always", "interval"),
        default="always",
        help="the nodes' flush_policy: always (fsync before acks, the default) or interval "
        "(Kafka's default: trust replication)",
    )
    args = parser.parse_args()
    if args.dir is not None:
        result = run(args.seconds, args.partitions, args.dir, args.flush_policy)
    else:
        with tempfile.TemporaryDirectory(prefix="raftlog-bench-") as tmp:
            result = run(args.seconds, args.partitions, Path(tmp), args.flush_policy)
    emit_result(result)


if __name__ == "__main__":
    main()
