"""The `raftlog` Spark sink against three real node processes and real local Spark.

Batch: rows with keys, headers and explicit partitions are written in per-task transactions
committed by the driver, then read back by the raftlog source and by confluent-kafka under
read_committed: both see exactly the rows written. Bad schemas and overwrite fail at planning
with the sink's message. Streaming: a raftlog -> raftlog query whose last micro-batch is
replayed after a restart (its commit-log entry removed, as when the driver dies between the
sink's commit and Spark's) leaves every input exactly once in the output topic.

`make test` runs the batch round trip and the short streaming replay (about a minute with
Spark warm); the rest are `slow`: refusals through Spark, a failed job, 100k rows, a stream
whose driver is killed twice and whose sink partition leader is killed once, fencing.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from raftlog.client import Consumer, IsolationLevel, open_cluster
from raftlog.client.admin import list_offset
from raftlog.client.transactional import ProducerFenced, TransactionalProducer
from raftlog.records import Record
from raftlog.testing.cluster import ProcessCluster
from tests.spark.conftest import create_topic, partition_replicas, produce

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
SINK_SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("value", BinaryType()),
        StructField("partition", IntegerType()),
        StructField("headers", HEADERS),
    ]
)
WAIT_S = 90


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    running = ProcessCluster(tmp_path_factory.mktemp("spark-write"), 3)
    running.start()
    try:
        request.getfixturevalue("spark")
        running.wait_ready()
        warm_up_transactions(running.bootstrap_servers)
        yield running
    finally:
        running.stop()


def warm_up_transactions(bootstrap: str) -> None:
    """One InitProducerId, so __transaction_state exists before the first timed write."""

    async def run() -> None:
        async with open_cluster(bootstrap) as cluster:
            await TransactionalProducer(cluster, "warm-up").init()

    trio.run(run)


def sink_rows(count: int, partitions: int) -> list[tuple]:
    """Keys, binary values, explicit partitions on every third row, headers on some."""
    rows = []
    for i in range(count):
        key = None if i % 5 == 0 else f"k{i}"
        partition = i % partitions if i % 3 == 0 else None
        headers = [("h", f"{i}".encode()), ("empty", None)] if i % 4 == 0 else []
        rows.append((key, f"value-{i}".encode(), partition, headers))
    return rows


def read_raftlog(spark, bootstrap: str, topic: str) -> list[tuple]:
    rows = (
        spark.read.format("raftlog")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .option("kafka.isolation.level", "read_committed")
        .load()
        .collect()
    )
    return sorted(
        (
            r["partition"],
            r["offset"],
            None if r["key"] is None else bytes(r["key"]),
            bytes(r["value"]),
            tuple(
                (h["key"], None if h["value"] is None else bytes(h["value"])) for h in r["headers"]
            ),
        )
        for r in rows
    )


def read_confluent(bootstrap: str, topic: str, partitions: int, expected: int) -> list[tuple]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{topic}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[tuple] = []
    try:
        import time

        deadline = time.monotonic() + WAIT_S
        while len(out) < expected and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None or message.error():
                continue
            out.append(
                (
                    message.partition(),
                    message.offset(),
                    message.key(),
                    message.value(),
                    tuple(message.headers() or ()),
                )
            )
    finally:
        consumer.close()
    return sorted(out)


def test_batch_write_round_trip(spark, cluster):
    topic, partitions, count = "sink-batch", 3, 600
    create_topic(cluster.bootstrap_servers, topic, partitions)
    rows = sink_rows(count, partitions)
    df = spark.createDataFrame(rows, SINK_SCHEMA).repartition(4)
    (
        df.write.format("raftlog")
        .mode("append")
        .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
        .option("topic", topic)
        .option("kafka.compression.type", "lz4")
        .save()
    )
    by_raftlog = read_raftlog(spark, cluster.bootstrap_servers, topic)
    by_confluent = read_confluent(cluster.bootstrap_servers, topic, partitions, count)
    assert by_raftlog == by_confluent
    # Every row once, in the partition it asked for (explicit ones exactly there).
    written = collections.Counter(
        (key.encode() if key else None, value, tuple(headers)) for key, value, _, headers in rows
    )
    assert collections.Counter((k, v, h) for _, _, k, v, h in by_raftlog) == written
    wanted_partition = {value: p for _, value, p, _ in rows if p is not None}
    for partition, _, _, value, _ in by_raftlog:
        assert wanted_partition.get(value, partition) == partition
    # Offsets are dense apart from the transaction markers (one per task per partition).
    assert len(by_raftlog) == count


@pytest.mark.slow
@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (StructType([StructField("key", StringType())]), "needs a column named value"),
        (StructType([StructField("value", LongType())]), "column value must be binary or string"),
        (
            StructType([StructField("value", StringType()), StructField("partition", LongType())]),
            "column partition must be int",
        ),
        (
            StructType([StructField("value", StringType()), StructField("headers", StringType())]),
            "column headers must be array<struct<key:string,value:binary>>",
        ),
    ],
)
def test_bad_schemas_are_refused_at_planning(spark, cluster, schema, message):
    df = spark.createDataFrame([], schema)
    with pytest.raises(Exception, match=message):
        (
            df.write.format("raftlog")
            .mode("append")
            .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
            .option("topic", "anything")
            .save()
        )


@pytest.mark.slow
def test_overwrite_and_missing_topic_are_refused(spark, cluster):
    df = spark.createDataFrame([("v",)], "value string")
    writer = df.write.format("raftlog").option("kafka.bootstrap.servers", cluster.bootstrap_servers)
    with pytest.raises(Exception, match="cannot overwrite: a log is append-only"):
        writer.mode("overwrite").option("topic", "t").save()
    with pytest.raises(Exception, match="needs a topic column"):
        df.write.format("raftlog").mode("append").option(
            "kafka.bootstrap.servers", cluster.bootstrap_servers
        ).save()


def committed_values(bootstrap: str, topic: str, partitions: int) -> collections.Counter:
    """Values a read_committed reader sees in topic now (the project client: cheaper than a
    Spark job for polling)."""

    async def run() -> collections.Counter:
        async with open_cluster(bootstrap) as cluster:
            consumer = Consumer(cluster, isolation_level=IsolationLevel.READ_COMMITTED)
            values: collections.Counter = collections.Counter()
            for partition in range(partitions):
                for record in await consumer.fetch_range(topic, partition, 0):
                    values[record.value] += 1
            return values

    return trio.run(run)


def _start_stream(spark, bootstrap: str, source: str, sink: str, checkpoint: Path):
    return (
        spark.readStream.format("raftlog")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "100")
        .load()
        .selectExpr("key", "value")
        .writeStream.format("raftlog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def _produce_range(bootstrap: str, topic: str, start: int, stop: int, partitions: int) -> None:
    batches = [
        (p, [Record(key=f"k{i}".encode(), value=f"in-{i}".encode())
             for i in range(start, stop) if i % partitions == p])
        for p in range(partitions)
    ]  # fmt: skip
    produce(bootstrap, topic, [(p, records) for p, records in batches if records])


def test_streaming_replay_leaves_no_duplicates(spark, cluster, tmp_path):
    bootstrap = cluster.bootstrap_servers
    source, sink = "stream-in", "stream-out"
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, sink, 2)
    _produce_range(bootstrap, source, 0, 300, 2)
    checkpoint = tmp_path / "checkpoint"

    query = _start_stream(spark, bootstrap, source, sink, checkpoint)
    try:
        cluster.wait_for(
            lambda: sum(committed_values(bootstrap, sink, 2).values()) >= 300,
            "the first 300 inputs in the output topic",
            WAIT_S,
        )
    finally:
        query.stop()
    # As if the driver died after the sink committed its last micro-batch but before Spark
    # wrote that batch to its commit log: the restarted query runs the batch again.
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)

    query = _start_stream(spark, bootstrap, source, sink, checkpoint)
    try:
        _produce_range(bootstrap, source, 300, 400, 2)
        cluster.wait_for(
            lambda: sum(committed_values(bootstrap, sink, 2).values()) >= 400,
            "all 400 inputs in the output topic",
            WAIT_S,
        )
        cluster.wait_for(
            lambda: (commits / str(last)).exists(), "the replayed batch committed", WAIT_S
        )
    finally:
        query.stop()
    values = committed_values(bootstrap, sink, 2)
    assert values == collections.Counter(f"in-{i}".encode() for i in range(400))


@pytest.mark.slow
def test_failed_job_leaves_nothing_visible(spark, cluster):
    """One task names a partition the topic does not have: it fails and aborts its own
    transaction, the driver aborts the others, and no transaction is left hanging (the last
    stable offset reaches the high watermark long before the transaction timeout)."""
    bootstrap = cluster.bootstrap_servers
    topic, partitions = "sink-failed", 3
    create_topic(bootstrap, topic, partitions)
    rows = [(f"k{i}", f"v{i}".encode(), 99 if i == 399 else i % partitions, []) for i in range(400)]
    df = spark.createDataFrame(rows, SINK_SCHEMA).coalesce(2)
    with pytest.raises(Exception, match="row partition 99 does not exist"):
        # Small batches: the failing task has produced (and must abort) rows before row 399.
        df.write.format("raftlog").mode("append").option(
            "kafka.bootstrap.servers", bootstrap
        ).option("topic", topic).option("kafka.batch.size", "200").save()

    async def stable() -> bool:
        async with open_cluster(bootstrap) as cluster_client:
            for p in range(partitions):
                hw = await list_offset(cluster_client, topic, p, "latest")
                lso = await list_offset(
                    cluster_client, topic, p, "latest", IsolationLevel.READ_COMMITTED
                )
                if lso.offset != hw.offset:
                    return False
        return True

    cluster.wait_for(lambda: trio.run(stable), "every transaction of the job ended", 30)
    assert committed_values(bootstrap, topic, partitions) == collections.Counter()


@pytest.mark.slow
def test_batch_write_of_100k_rows(spark, cluster):
    topic, partitions, count = "sink-100k", 6, 100_000
    create_topic(cluster.bootstrap_servers, topic, partitions)
    rows = sink_rows(count, partitions)
    df = spark.createDataFrame(rows, SINK_SCHEMA).repartition(4)
    df.write.format("raftlog").mode("append").option(
        "kafka.bootstrap.servers", cluster.bootstrap_servers
    ).option("topic", topic).save()
    by_raftlog = read_raftlog(spark, cluster.bootstrap_servers, topic)
    by_confluent = read_confluent(cluster.bootstrap_servers, topic, partitions, count)
    assert len(by_raftlog) == count
    assert by_raftlog == by_confluent


@pytest.mark.slow
def test_a_newer_producer_fences_the_older(cluster):
    bootstrap = cluster.bootstrap_servers
    create_topic(bootstrap, "fenced", 1)

    async def run() -> None:
        async with open_cluster(bootstrap) as cluster_client:
            old = TransactionalProducer(cluster_client, "fencing-test")
            await old.init()
            old.begin()
            await old.send("fenced", 0, [Record(value=b"zombie")])
            new = TransactionalProducer(cluster_client, "fencing-test")
            await new.init()  # aborts the old instance's open transaction
            with pytest.raises(ProducerFenced):
                await old.send("fenced", 0, [Record(value=b"late")])
            new.begin()
            await new.send("fenced", 0, [Record(value=b"fresh")])
            await new.commit()

    trio.run(run)
    assert committed_values(bootstrap, "fenced", 1) == collections.Counter({b"fresh": 1})


def _start_driver(bootstrap: str, source: str, sink: str, checkpoint: Path, log: Path):
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.spark.stream_driver", bootstrap, source, sink,
             str(checkpoint)],
            stdout=out, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[2],
        )  # fmt: skip


@pytest.mark.slow
def test_stream_survives_driver_kills_and_a_leader_kill(cluster, tmp_path):
    bootstrap = cluster.bootstrap_servers
    source, sink, partitions, total = "kill-in", "kill-out", 3, 6_000
    create_topic(bootstrap, source, partitions)
    create_topic(bootstrap, sink, partitions)
    _produce_range(bootstrap, source, 0, total // 2, partitions)
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "driver.log"

    def written() -> int:
        return sum(committed_values(bootstrap, sink, partitions).values())

    seen = 0
    for kill in range(2):
        driver = _start_driver(bootstrap, source, sink, checkpoint, log)
        try:
            # Kill mid-stream: once this run has committed something new.
            cluster.wait_for(
                lambda floor=seen: written() > floor, f"progress before kill {kill}", WAIT_S * 2
            )
        finally:
            driver.send_signal(signal.SIGKILL)
            driver.wait()
        seen = written()
        if kill == 0:
            _produce_range(bootstrap, source, total // 2, total, partitions)
    leader, _ = partition_replicas(bootstrap, sink, 0)
    driver = _start_driver(bootstrap, source, sink, checkpoint, log)
    try:
        cluster.wait_for(lambda: written() > seen, "progress after restart", WAIT_S * 2)
        cluster.kill(leader)
        cluster.wait_for(lambda: written() >= total, "every input in the sink", WAIT_S * 3)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        cluster.start(leader)
        cluster.wait_ready()  # the next test of the module wants three live brokers
    values = committed_values(bootstrap, sink, partitions)
    assert values == collections.Counter(f"in-{i}".encode() for i in range(total)), log.read_text()[
        -3000:
    ]


@pytest.mark.slow
def test_write_with_a_node_down_and_refused_with_two_down(spark, cluster):
    """RF 3, min ISR 2: one node down, the write succeeds; two down, the job fails with the
    broker's error and, once the nodes are back, nothing of it is visible and nothing hangs."""
    topic, partitions = "sink-degraded", 3
    cluster.wait_ready()
    create_topic(cluster.bootstrap_servers, topic, partitions, configs={"min.insync.replicas": "2"})
    rows = sink_rows(300, partitions)
    df = spark.createDataFrame(rows, SINK_SCHEMA).repartition(2)

    def write(bootstrap: str) -> None:
        writer = df.write.format("raftlog").mode("append").option("topic", topic)
        writer = writer.option("kafka.bootstrap.servers", bootstrap)
        writer = writer.option("kafka.delivery.timeout.ms", "15000")
        writer.option("kafka.max.block.ms", "15000").option(
            "kafka.transaction.timeout.ms", "10000"
        ).save()

    first, second = 3, 2
    try:
        cluster.kill(first)
        write(cluster.live_bootstrap_servers())
        expected = collections.Counter(value for _, value, _, _ in rows)
        assert committed_values(cluster.live_bootstrap_servers(), topic, partitions) == expected
        cluster.kill(second)
        with pytest.raises(Exception) as failure:
            write(cluster.live_bootstrap_servers())
        print("two nodes down:", str(failure.value)[:2000])
    finally:
        cluster.start(first)
        cluster.start(second)
    cluster.wait_ready()

    async def stable() -> bool:
        async with open_cluster(cluster.bootstrap_servers) as client:
            for p in range(partitions):
                hw = await list_offset(client, topic, p, "latest")
                lso = await list_offset(client, topic, p, "latest", IsolationLevel.READ_COMMITTED)
                if lso.offset != hw.offset:
                    return False
        return True

    cluster.wait_for(lambda: trio.run(stable), "the failed job's transactions ended", WAIT_S)
    assert committed_values(cluster.bootstrap_servers, topic, partitions) == expected
