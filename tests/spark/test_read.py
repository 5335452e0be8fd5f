"""The `raftlog` Spark source against a real three-node cluster and real local Spark.

One cluster and one SparkSession serve the whole module. Its timings keep a paused follower
in the ISR for a minute (session and lag timeouts), so the HW provably stalls while acks=1
records sit on the leader; retention runs every 200 ms so a deleted segment shows quickly.
"""

from __future__ import annotations

import json
import signal
import time

import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from raftlog.client import ACKS_LEADER
from raftlog.records import Record
from raftlog.spark.options import parse_options
from raftlog.spark.planner import DataLossError
from raftlog.spark.ranges import OffsetRange
from raftlog.spark.reader import read_range
from raftlog.spark.source import source_schema
from raftlog.testing.cluster import ProcessCluster
from tests.spark.conftest import (
    create_topic,
    list_offset,
    partition_replicas,
    produce,
)

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

TOPIC = "events"
PARTITIONS = 6
BATCHES_PER_PARTITION = 4
RECORDS_PER_BATCH = 100
RECORDS_PER_PARTITION = BATCHES_PER_PARTITION * RECORDS_PER_BATCH
# CreateTime of the record at offset i of every partition: BASE + i seconds.
BASE_TIMESTAMP_MS = 1_700_000_000_000
SCHEMA = to_arrow_schema(source_schema(False), timezone="UTC")


def _record(partition: int, offset: int) -> Record:
    headers = (("p", str(partition).encode()), ("i", None)) if offset % 7 == 0 else ()
    return Record(
        timestamp_ms=BASE_TIMESTAMP_MS + offset * 1000,
        key=None if offset % 5 == 0 else f"k{partition}-{offset}".encode(),
        value=f"v{partition}-{offset}".encode() * 3,
        headers=headers,
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    overrides = {
        "broker_session_timeout_ms": 60_000,
        "replica_lag_time_max_ms": 60_000,
        "log_retention_check_interval_ms": 200,
    }
    running = ProcessCluster(tmp_path_factory.mktemp("spark-read"), 3, overrides)
    running.start()
    try:
        # The nodes boot in their own processes while Spark's JVM starts: seconds saved.
        request.getfixturevalue("spark")
        running.wait_ready()
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def produced(cluster):
    """Topic `events`: 6 partitions x 400 acknowledged records; {(partition, offset): Record}."""
    create_topic(cluster.bootstrap_servers, TOPIC, PARTITIONS)
    batches = []
    for b in range(BATCHES_PER_PARTITION):
        for p in range(PARTITIONS):
            first = b * RECORDS_PER_BATCH
            batches.append((p, [_record(p, first + i) for i in range(RECORDS_PER_BATCH)]))
    offsets = produce(cluster.bootstrap_servers, TOPIC, batches)
    assert offsets == [b * RECORDS_PER_BATCH for b in range(BATCHES_PER_PARTITION)
                       for _ in range(PARTITIONS)]  # fmt: skip
    return {(p, o): _record(p, o) for p in range(PARTITIONS) for o in range(RECORDS_PER_PARTITION)}


def _reader(spark, bootstrap, **options):
    reader = spark.read.format("raftlog").option("bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader


def _rows(df):
    return {(r["partition"], r["offset"]): r for r in df.collect()}


def test_count_and_content_equal_what_was_acknowledged(spark, cluster, produced):
    df = _reader(spark, cluster.bootstrap_servers, subscribe=TOPIC).load()
    assert df.columns == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType"
    ]  # fmt: skip
    assert df.count() == len(produced)
    per_partition = {r["partition"]: r["count"] for r in df.groupBy("partition").count().collect()}
    assert per_partition == dict.fromkeys(range(PARTITIONS), RECORDS_PER_PARTITION)
    rows = _rows(df)
    assert rows.keys() == produced.keys()
    for (p, o), record in produced.items():
        row = rows[(p, o)]
        assert (row["topic"], row["timestampType"]) == (TOPIC, 0)
        assert row["key"] == record.key and row["value"] == record.value
        assert int(row["timestamp"].timestamp() * 1000) == record.timestamp_ms


def test_ranges_by_offsets(spark, cluster, produced):
    starting = {TOPIC: {"0": 10, "1": -2, "2": 399, "3": 0, "4": 250, "5": 400}}
    ending = {TOPIC: {"0": 20, "1": 5, "2": -1, "3": 0, "4": 10_000, "5": -1}}
    df = _reader(
        spark,
        cluster.bootstrap_servers,
        subscribe=TOPIC,
        startingOffsets=json.dumps(starting),
        endingOffsets=json.dumps(ending),
    ).load()
    # An end past the HW is cut at the HW: only committed records, never an error.
    expected = {(0, o) for o in range(10, 20)} | {(1, o) for o in range(5)} | {(2, 399)}
    expected |= {(4, o) for o in range(250, RECORDS_PER_PARTITION)}
    assert set(_rows(df)) == expected


def test_ranges_by_timestamp_and_assign(spark, cluster, produced):
    df = _reader(
        spark,
        cluster.bootstrap_servers,
        assign=json.dumps({TOPIC: [1, 4]}),
        startingTimestamp=str(BASE_TIMESTAMP_MS + 100 * 1000),
        endingTimestamp=str(BASE_TIMESTAMP_MS + 150 * 1000 - 1),
    ).load()
    rows = _rows(df)
    assert set(rows) == {(p, o) for p in (1, 4) for o in range(100, 150)}
    assert all(rows[k]["value"] == produced[k].value for k in rows)


def test_min_partitions_and_max_records_split_ranges(spark, cluster, produced):
    df = _reader(spark, cluster.bootstrap_servers, subscribe=TOPIC, minPartitions="12").load()
    assert df.rdd.getNumPartitions() == 12
    capped = _reader(
        spark, cluster.bootstrap_servers, subscribePattern="ev.*", maxRecordsPerPartition="150"
    ).load()
    # 400 records per partition in splits of at most 150: three splits each.
    assert capped.rdd.getNumPartitions() == 3 * PARTITIONS
    offsets = [
        (r["partition"], r["offset"]) for r in capped.select("partition", "offset").collect()
    ]
    assert sorted(offsets) == sorted(produced)


def test_include_headers(spark, cluster, produced):
    df = _reader(
        spark,
        cluster.bootstrap_servers,
        assign=json.dumps({TOPIC: [3]}),
        endingOffsets=json.dumps({TOPIC: {"3": 50}}),
        includeHeaders="true",
    ).load()
    assert df.columns[-1] == "headers"
    rows = _rows(df)
    assert set(rows) == {(3, o) for o in range(50)}
    for key, row in rows.items():
        got = tuple((h["key"], h["value"]) for h in row["headers"])
        assert got == produced[key].headers


def test_batch_refuses_latest_start(spark, cluster, produced):
    with pytest.raises(Exception, match="startingOffsets=latest is not valid for batch"):
        _reader(
            spark, cluster.bootstrap_servers, subscribe=TOPIC, startingOffsets="latest"
        ).load().count()


def test_fail_on_data_loss_after_retention(spark, cluster):
    topic = "retained"
    # Small segments and records an hour old: every closed segment is past retention.
    create_topic(
        cluster.bootstrap_servers,
        topic,
        1,
        configs={"segment.bytes": "2048", "retention.ms": "60000"},
    )
    old_ms = int(time.time() * 1000) - 3_600_000
    batches = [(0, [Record(timestamp_ms=old_ms, value=b"r" * 100) for _ in range(10)])] * 12
    produce(cluster.bootstrap_servers, topic, batches)
    log_start = cluster.wait_for(
        lambda: list_offset(cluster.bootstrap_servers, topic, 0, "earliest"),
        "retention to delete the first segment",
        timeout_s=30,
    )
    high_watermark = list_offset(cluster.bootstrap_servers, topic, 0, "latest")
    assert 0 < log_start < high_watermark == 120
    from_zero = json.dumps({topic: {"0": 0}})
    with pytest.raises(Exception, match="no longer in the log"):
        _reader(
            spark, cluster.bootstrap_servers, subscribe=topic, startingOffsets=from_zero
        ).load().count()
    df = _reader(
        spark,
        cluster.bootstrap_servers,
        subscribe=topic,
        startingOffsets=from_zero,
        failOnDataLoss="false",
    ).load()
    offsets = sorted(r["offset"] for r in df.select("offset").collect())
    # Retention may have moved on since log_start was read; what is returned is contiguous.
    assert offsets == list(range(offsets[0], high_watermark)) and offsets[0] >= log_start

    # Retention after planning: the executor's fetch finds the range gone (out of range).
    planned = OffsetRange(topic, 0, 0, high_watermark)
    strict = parse_options({"bootstrap.servers": cluster.bootstrap_servers, "subscribe": topic})
    with pytest.raises(DataLossError, match="no longer in the log"):
        list(read_range(strict, planned, SCHEMA))
    lenient = parse_options(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "subscribe": topic,
            "failOnDataLoss": "false",
        }
    )
    read = [o for b in read_range(lenient, planned, SCHEMA) for o in b.column("offset").to_pylist()]
    assert read == list(range(read[0], high_watermark)) and read[0] >= log_start


def test_acks_1_records_past_the_high_watermark_are_not_returned(spark, cluster):
    topic = "stalled"
    create_topic(cluster.bootstrap_servers, topic, 1)
    produce(cluster.bootstrap_servers, topic, [(0, [Record(value=b"c%d" % i) for i in range(50)])])
    leader, replicas = partition_replicas(cluster.bootstrap_servers, topic, 0)
    follower = next(r for r in replicas if r != leader)
    live = ",".join(cluster.nodes[n].client_address for n in replicas if n != follower)
    cluster.pause(follower)
    try:
        # The paused follower stays in the ISR (long lag and session timeouts): the HW stalls.
        produce(live, topic, [(0, [Record(value=b"u%d" % i) for i in range(30)])], acks=ACKS_LEADER)
        assert list_offset(live, topic, 0, "latest") == 50
        df = _reader(spark, live, subscribe=topic).load()
        rows = df.select("offset", "value").collect()
        assert sorted(r["offset"] for r in rows) == list(range(50))
        assert {bytes(r["value"]) for r in rows} == {b"c%d" % i for i in range(50)}
    finally:
        cluster.resume(follower)
    cluster.wait_for(
        lambda: list_offset(live, topic, 0, "latest") == 80, "the HW to cover the acks=1 records"
    )
    assert _reader(spark, cluster.bootstrap_servers, subscribe=topic).load().count() == 80


def test_streaming_micro_batches(spark, cluster, produced, tmp_path):
    topic = "stream"
    create_topic(cluster.bootstrap_servers, topic, 2)
    produce(cluster.bootstrap_servers, topic, [(p, [Record(value=b"a")] * 20) for p in (0, 1)])
    stream = (
        spark.readStream.format("raftlog")
        .option("bootstrap.servers", cluster.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    query = (
        stream.writeStream.format("memory")
        .queryName("raftlog_stream")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        query.processAllAvailable()
        assert spark.sql("select count(*) from raftlog_stream").first()[0] == 40
        produce(cluster.bootstrap_servers, topic, [(1, [Record(value=b"b")] * 5)])
        cluster.wait_for(
            lambda: (
                query.processAllAvailable()
                or spark.sql("select count(*) from raftlog_stream").first()[0] == 45
            ),
            "the next micro-batch to bring the new records",
            timeout_s=60,
        )
        rows = spark.sql("select partition, offset from raftlog_stream").collect()
        assert sorted((r[0], r[1]) for r in rows) == sorted(
            [(0, o) for o in range(20)] + [(1, o) for o in range(25)]
        )
    finally:
        query.stop()


def test_read_survives_a_leader_change_mid_read(cluster, produced):
    """Read a split chunk by chunk; after the first chunk the leader shuts down, the rest
    comes from the new leader, and every record arrives exactly once."""

    from raftlog.spark.options import parse_options
    from raftlog.spark.ranges import OffsetRange
    from raftlog.spark.reader import read_range

    partition = 2
    leader, _ = partition_replicas(cluster.bootstrap_servers, TOPIC, partition)
    options = parse_options(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "subscribe": TOPIC,
            "fetchMaxBytes": "1024",
            "fetchesPerChunk": "1",
        }
    )
    batches = read_range(options, OffsetRange(TOPIC, partition, 0, RECORDS_PER_PARTITION), SCHEMA)
    first = next(batches)
    assert 0 < first.num_rows < RECORDS_PER_PARTITION
    cluster.kill(leader, signal.SIGTERM)  # controlled shutdown: leadership moves at once
    rest = list(batches)
    new_leader, _ = partition_replicas(cluster.live_bootstrap_servers(), TOPIC, partition)
    assert new_leader not in (leader, -1)
    offsets = [o for b in [first, *rest] for o in b.column("offset").to_pylist()]
    values = [v for b in [first, *rest] for v in b.column("value").to_pylist()]
    assert offsets == list(range(RECORDS_PER_PARTITION))
    assert values == [produced[(partition, o)].value for o in offsets]
