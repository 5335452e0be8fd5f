"""Spark source benchmark: `df.count()` and `groupBy(partition).count()` through the `raftlog`
format (Spark local[2]) vs the project client reading and decoding the same ranges in one
process, against a real three-node cluster.

    python -m benchmarks.spark [--records 1000000] [--record-bytes 100] [--partitions 6]

The last stdout line is one JSON object:
{"spark_records_s", "client_records_s", "ratio", "spark_count_s", "spark_group_s",
 "client_s", "records"}; ratio = spark_records_s / client_records_s (target >= 0.5).
Spark's JVM and Python worker start-up are excluded: one warm-up count runs first, and the
client side reads the same (page-cached) data.
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
from raftlog.records import Record
from raftlog.testing.cluster import ProcessCluster

TOPIC = "bench"
RECORDS_PER_BATCH = 2_000
FETCH_MAX_BYTES = 8 * 1024 * 1024
# Producers in flight at once (one per partition is plenty on two cores).
PRODUCE_CONCURRENCY = 6
ESTIMATED_PRODUCE_RECORDS_S = 50_000


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


def run(records: int, record_bytes: int, partitions: int, root: Path) -> dict[str, Any]:
    with ProcessCluster(root / "cluster", 3) as cluster:
        bootstrap = cluster.bootstrap_servers
        # The bar is time-based (benchmarks.common): the estimate only sets its length.
        with progress(f"produce {records} records", records / ESTIMATED_PRODUCE_RECORDS_S) as bar:
            trio.run(load, bootstrap, records, record_bytes, partitions, bar)
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
        finally:
            spark.stop()
        client_records, client_s = trio.run(client_read, bootstrap, partitions)
    grouped = sum(int(row["count"]) for row in groups)
    if not counted == grouped == client_records == records:
        raise SystemExit(
            f"record counts disagree: count {counted}, groupBy {grouped}, "
            f"client {client_records}, produced {records}"
        )
    spark_records_s = records / ((count_s + group_s) / 2)
    client_records_s = records / client_s
    console.log(f"spark count {count_s:.2f} s, groupBy {group_s:.2f} s; client {client_s:.2f} s")
    return {
        "spark_records_s": round(spark_records_s),
        "client_records_s": round(client_records_s),
        "ratio": round(spark_records_s / client_records_s, 3),
        "spark_count_s": round(count_s, 3),
        "spark_group_s": round(group_s, 3),
        "client_s": round(client_s, 3),
        "records": records,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raftlog-spark-bench-") as tmp:
        result = run(args.records, args.record_bytes, args.partitions, Path(tmp))
    emit_result(result)


if __name__ == "__main__":
    main()
