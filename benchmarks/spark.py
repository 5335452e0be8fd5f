"""Spark source and sink benchmark against a real three-node cluster.

Read side: `df.count()` and `groupBy(partition).count()` through the `raftlog` format (Spark
local[2]) vs the project client reading and decoding the same ranges in one process.
Write side: `df.write.format("raftlog")` of `--write-records` keyed rows (Spark local[2], one
transaction per task, committed by the driver) vs the project's TransactionalProducer
producing the same rows (same keys, values, partitions and batch size) from one process in
one transaction.

    python -m benchmarks.spark [--records 1000000] [--write-records 1000000]
                               [--record-bytes 100] [--partitions 6]

The last stdout line is one JSON object:
{"spark_records_s", "client_records_s", "ratio", "spark_count_s", "spark_group_s",
 "client_s", "records", "spark_write_records_s", "client_write_records_s", "write_ratio",
 "spark_write_s", "client_write_s", "write_records"}; ratio = spark_records_s /
client_records_s and write_ratio = spark_write_records_s / client_write_records_s (targets
>= 0.5). Spark's JVM and Python worker start-up are excluded: a warm-up count and a small
warm-up write run first, and the client side reads the same (page-cached) data.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from benchmarks.common import console, emit_result, progress
from raftlog.client import Admin, Consumer, NewTopic, Producer, open_cluster
from raftlog.client.producer import partition_for_key
from raftlog.client.transactional import TransactionalProducer
from raftlog.records import Record
from raftlog.spark.write_options import DEFAULT_BATCH_SIZE_BYTES
from raftlog.testing.cluster import ProcessCluster

TOPIC = "bench"
RECORDS_PER_BATCH = 2_000
FETCH_MAX_BYTES = 8 * 1024 * 1024
# Producers in flight at once (one per partition is plenty on two cores).
PRODUCE_CONCURRENCY = 6
ESTIMATED_PRODUCE_RECORDS_S = 50_000
SPARK_WRITE_TOPIC = "bench-write-spark"
CLIENT_WRITE_TOPIC = "bench-write-client"
WARM_UP_WRITE_RECORDS = 2_000
# The sink's own estimate of a record's bytes beyond key and value (raftlog.spark.writer).
RECORD_OVERHEAD_BYTES = 16


async def load(bootstrap: str, records: int, record_bytes: int, partitions: int, bar: Any) -> None:
    """Create the topic and produce `records` records of `record_bytes` values, acks=all."""
    async with open_cluster(bootstrap) as cluster:
        result = await Admin(cluster).create_topics([NewTopic(TOPIC, partitions, 3)])
        console.log(f"create topic: {result[TOPIC].error.name}")
        producer = Producer(cluster)
        value = os.urandom(record_bytes)
        per_partition = records // partitions
        limiter = trio.CapacityLimiter(PRODUCE_CONCURRENCY)

        async def fill(partition: int) -> None:
            count = per_partition + (1 if partition < records % partitions else 0)
            sent = 0
            while sent < count:
                size = min(RECORDS_PER_BATCH, count - sent)
                batch = [Record(key=b"%08d" % (sent + i), value=value) for i in range(size)]
                async with limiter:
                    await producer.produce(TOPIC, batch, partition=partition)
                sent += size
                bar.tick()

        async with trio.open_nursery() as nursery:
            for partition in range(partitions):
                nursery.start_soon(fill, partition)


async def client_read(bootstrap: str, partitions: int) -> tuple[int, float]:
    """The baseline: the project client reads and decodes every partition up to its HW."""
    async with open_cluster(bootstrap) as cluster:
        admin = Admin(cluster)
        ends = [(await admin.list_offsets(TOPIC, p, "latest")).offset for p in range(partitions)]
        consumer = Consumer(cluster, max_bytes=FETCH_MAX_BYTES)
        started = time.perf_counter()
        total = 0
        for partition, end in enumerate(ends):
            total += len(await consumer.fetch_range(TOPIC, partition, 0, end))
        return total, time.perf_counter() - started


def write_key(index: int) -> bytes:
    """The key of row `index` on both write sides (Spark builds it with lpad)."""
    return b"%012d" % index


async def create_write_topics(bootstrap: str, partitions: int) -> None:
    async with open_cluster(bootstrap) as cluster:
        topics = [NewTopic(t, partitions, 3) for t in (SPARK_WRITE_TOPIC, CLIENT_WRITE_TOPIC)]
        result = await Admin(cluster).create_topics(topics)
        console.log(f"create write topics: {[r.error.name for r in result.values()]}")


async def client_write(bootstrap: str, records: int, value: bytes, partitions: int) -> float:
    """The write baseline: one process, one transaction, the rows Spark writes, batched per
    partition at the sink's batch size, partitions sent concurrently as the sink sends."""
    async with open_cluster(bootstrap) as cluster:
        producer = TransactionalProducer(cluster, "bench-client-write")
        await producer.init()
        started = time.perf_counter()
        producer.begin()
        per_batch = max(1, DEFAULT_BATCH_SIZE_BYTES // (12 + len(value) + RECORD_OVERHEAD_BYTES))
        buffers: dict[int, list[Record]] = {p: [] for p in range(partitions)}
        limiter = trio.CapacityLimiter(PRODUCE_CONCURRENCY)

        async def send(partition: int, batch: list[Record]) -> None:
            async with limiter:
                await producer.send(CLIENT_WRITE_TOPIC, partition, batch)

        for index in range(records):
            key = write_key(index)
            partition = partition_for_key(key, partitions)
            buffers[partition].append(Record(key=key, value=value))
            if len(buffers[partition]) >= per_batch:
                full = [(p, b) for p, b in buffers.items() if b]
                buffers = {p: [] for p in range(partitions)}
                await producer.add_partitions([(CLIENT_WRITE_TOPIC, p) for p, _ in full])
                async with trio.open_nursery() as nursery:
                    for p, batch in full:
                        nursery.start_soon(send, p, batch)
        async with trio.open_nursery() as nursery:
            for p, batch in buffers.items():
                if batch:
                    nursery.start_soon(send, p, batch)
        await producer.commit()
        return time.perf_counter() - started


def spark_write(spark: Any, bootstrap: str, records: int, value: bytes) -> float:
    df = spark.range(0, records, numPartitions=2).selectExpr(
        "cast(lpad(cast(id as string), 12, '0') as binary) as key",
        f"unhex('{value.hex()}') as value",
    )
    writer = (
        df.write.format("raftlog")
        .mode("append")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", SPARK_WRITE_TOPIC)
    )
    _, seconds = timed(writer.save)
    return seconds


def spark_session() -> Any:
    # Spark's Python workers must import raftlog: they run this interpreter.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from raftlog.spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("raftlog-spark-bench")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def timed(action: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    value = action()
    return value, time.perf_counter() - started


def run(
    records: int, write_records: int, record_bytes: int, partitions: int, root: Path
) -> dict[str, Any]:
    value = os.urandom(record_bytes)
    with ProcessCluster(root / "cluster", 3) as cluster:
        bootstrap = cluster.bootstrap_servers
        # The bar is time-based (benchmarks.common): the estimate only sets its length.
        with progress(f"produce {records} records", records / ESTIMATED_PRODUCE_RECORDS_S) as bar:
            trio.run(load, bootstrap, records, record_bytes, partitions, bar)
        trio.run(create_write_topics, bootstrap, partitions)
        spark = spark_session()
        try:
            df = (
                spark.read.format("raftlog")
                .option("bootstrap.servers", bootstrap)
                .option("subscribe", TOPIC)
                .option("fetchMaxBytes", str(FETCH_MAX_BYTES))
                .load()
            )
            warm, warm_s = timed(df.count)
            console.log(f"warm-up count {warm} in {warm_s:.2f} s")
            counted, count_s = timed(df.count)
            groups, group_s = timed(lambda: df.groupBy("partition").count().collect())
            warm_write_s = spark_write(spark, bootstrap, WARM_UP_WRITE_RECORDS, value)
            console.log(f"warm-up write of {WARM_UP_WRITE_RECORDS} rows in {warm_write_s:.2f} s")
            spark_write_s = spark_write(spark, bootstrap, write_records, value)
            written = (
                spark.read.format("raftlog")
                .option("bootstrap.servers", bootstrap)
                .option("subscribe", SPARK_WRITE_TOPIC)
                .option("kafka.isolation.level", "read_committed")
                .load()
                .count()
            )
        finally:
            spark.stop()
        client_records, client_s = trio.run(client_read, bootstrap, partitions)
        client_write_s = trio.run(client_write, bootstrap, write_records, value, partitions)
    expected = write_records + WARM_UP_WRITE_RECORDS
    if written != expected:
        raise SystemExit(f"spark wrote {written} committed rows, expected {expected}")
    grouped = sum(int(row["count"]) for row in groups)
    if not counted == grouped == client_records == records:
        raise SystemExit(
            f"record counts disagree: count {counted}, groupBy {grouped}, "
            f"client {client_records}, produced {records}"
        )
    spark_records_s = records / ((count_s + group_s) / 2)
    client_records_s = records / client_s
    console.log(f"spark count {count_s:.2f} s, groupBy {group_s:.2f} s; client {client_s:.2f} s")
    console.log(f"spark write {spark_write_s:.2f} s; client write {client_write_s:.2f} s")
    spark_write_records_s = write_records / spark_write_s
    client_write_records_s = write_records / client_write_s
    return {
        "spark_records_s": round(spark_records_s),
        "client_records_s": round(client_records_s),
        "ratio": round(spark_records_s / client_records_s, 3),
        "spark_count_s": round(count_s, 3),
        "spark_group_s": round(group_s, 3),
        "client_s": round(client_s, 3),
        "records": records,
        "spark_write_records_s": round(spark_write_records_s),
        "client_write_records_s": round(client_write_records_s),
        "write_ratio": round(spark_write_records_s / client_write_records_s, 3),
        "spark_write_s": round(spark_write_s, 3),
        "client_write_s": round(client_write_s, 3),
        "write_records": write_records,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--write-records", type=int, default=1_000_000)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raftlog-spark-bench-") as tmp:
        result = run(
            args.records, args.write_records, args.record_bytes, args.partitions, Path(tmp)
        )
    emit_result(result)


if __name__ == "__main__":
    main()
