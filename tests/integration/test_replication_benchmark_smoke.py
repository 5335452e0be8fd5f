"""Smoke run of `python -m benchmarks.replication` with tiny durations (three real nodes, one
node, the floor server; last stdout line one JSON object), and the floor server on its own
against a stock producer."""

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from confluent_kafka import Producer

from benchmarks.floor import BadBatches, count_offsets
from benchmarks.loadgen import produce_load
from benchmarks.replication import floor_server
from raftlog.records import Record, build_batch

REPO = Path(__file__).resolve().parents[2]
SMOKE_TIMEOUT_S = 300
MB_S_FIELDS = (
    "acks_all_rf3_mb_s",
    "acks1_rf3_mb_s",
    "acks1_rf1_mb_s",
    "single_node_acks1_rf1_mb_s",
    "floor_mb_s",
)
RATIO_FIELDS = ("ratio", "ack_wait_ratio", "replica_efficiency", "floor_ratio")
LATENCY_FIELDS = ("p50_ms_at_half_load", "p99_ms_at_half_load", "p999_ms_at_half_load")


# Three nodes, one node and the floor start in turn (about 30 s): `make test-all` runs it;
# the floor and the load generator are checked in `make test` below.
@pytest.mark.slow
@pytest.mark.cluster
def test_replication_benchmark_prints_json_last(tmp_path):
    plot = tmp_path / "latency.png"
    command = [
        sys.executable,
        "-m",
        "benchmarks.replication",
        "--seconds",
        "0.5",
        "--partitions",
        "2",
        "--dir",
        str(tmp_path / "bench"),
        "--plot",
        str(plot),
    ]
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for name in MB_S_FIELDS:
        assert isinstance(result[name], float) and result[name] > 0, (name, result)
    for name in RATIO_FIELDS:
        assert isinstance(result[name], float) and result[name] > 0, (name, result)
    assert result["ratio"] == pytest.approx(
        result["acks_all_rf3_mb_s"] / result["acks1_rf1_mb_s"], rel=0.02
    )
    assert result["ack_wait_ratio"] == pytest.approx(
        result["acks_all_rf3_mb_s"] / result["acks1_rf3_mb_s"], rel=0.02
    )
    assert result["replica_efficiency"] == pytest.approx(
        3 * result["acks_all_rf3_mb_s"] / result["acks1_rf1_mb_s"], rel=0.02
    )
    assert result["floor_ratio"] == pytest.approx(
        result["single_node_acks1_rf1_mb_s"] / result["floor_mb_s"], rel=0.02
    )
    p50, p99, p999 = (result[name] for name in LATENCY_FIELDS)
    assert all(isinstance(v, float) for v in (p50, p99, p999)), result
    assert 0 < p50 <= p99 <= p999, result
    assert result["latency_samples"] > 0
    assert isinstance(result["cpu_s_per_gib"], float) and result["cpu_s_per_gib"] > 0, result
    assert result["delivery_errors"] == 0, result
    assert result["plot"] == str(plot) and plot.stat().st_size > 0


def test_count_offsets_reads_batch_headers():
    one = build_batch([Record(value=b"a"), Record(value=b"b"), Record(value=b"c")])
    two = build_batch([Record(value=b"d")])
    assert count_offsets(one + two) == 4
    with pytest.raises(BadBatches):
        count_offsets(one[:-1])
    with pytest.raises(BadBatches):
        count_offsets(one + b"\x00" * 5)


def test_floor_server_appends_what_a_stock_producer_sends(tmp_path):
    with floor_server(tmp_path / "floor", 2, "always") as (bootstrap, _process):
        producer = Producer(
            {"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 0, "batch.num.messages": 1}
        )
        delivered: list[tuple[int, int]] = []

        def on_delivery(error, message):
            assert error is None, error
            delivered.append((message.partition(), message.offset()))

        values = [b"floor-record-%d" % i for i in range(5)]
        for value in values:
            producer.produce("floor-topic", value=value, partition=1, on_delivery=on_delivery)
        assert producer.flush(10) == 0
    assert delivered == [(1, i) for i in range(5)]
    stored = (tmp_path / "floor" / "data" / "floor-topic-1.log").read_bytes()
    assert count_offsets(stored) == 5
    for value in values:
        assert value in stored


def test_load_generator_produces_whole_batches(tmp_path):
    """benchmarks.loadgen against the floor: every acknowledged byte is in the partitions'
    files as whole 1 KiB-record batches."""
    with floor_server(tmp_path / "floor", 2, "always") as (bootstrap, _process):
        load = trio.run(
            functools.partial(
                produce_load, bootstrap, "load", acks=1, seconds=0.3, records_per_batch=8
            )
        )
    assert load.errors == 0 and load.requests > 0
    assert load.acked_bytes == load.requests * 2 * 8 * 1024  # both partitions in each request
    stored = sum(
        count_offsets((tmp_path / "floor" / "data" / f"load-{p}.log").read_bytes()) for p in (0, 1)
    )
    assert stored * 1024 == load.acked_bytes


@pytest.mark.cluster
def test_a_settled_acks1_load_ends_with_every_acked_record_replicated(cluster):
    """An acks=1 turn of the replication benchmark ends only once its records are on every
    in-sync replica, so the next turn does not pay for its followers' backlog: the partitions'
    high watermarks then cover every acknowledged record."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from raftlog.client import open_cluster
    from raftlog.client.admin import list_offset

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    topic = NewTopic("settle", 2, 3, config={"min.insync.replicas": "2"})
    admin.create_topics([topic])["settle"].result(30)
    # Both leaders take writes before the load starts (a broker learns of its leadership a
    # moment after the controller has decided it).
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    for partition in (0, 1):
        producer.produce("settle", value=b"first", partition=partition)
    assert producer.flush(30) == 0

    async def high_watermarks() -> list[int]:
        async with open_cluster(cluster.bootstrap_servers) as client:
            return [(await list_offset(client, "settle", p, "latest")).offset for p in (0, 1)]

    before = sum(trio.run(high_watermarks))
    load = trio.run(
        functools.partial(
            produce_load,
            cluster.bootstrap_servers,
            "settle",
            acks=1,
            seconds=1.0,
            records_per_batch=64,
            settle=True,
        )
    )
    assert load.errors == 0 and load.requests > 0
    assert (sum(trio.run(high_watermarks)) - before) * 1024 == load.acked_bytes
