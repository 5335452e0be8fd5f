"""Shared fixtures for the Spark source tests: one local SparkSession for the whole run,
and small blocking helpers around the project's async client."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence

import pytest
import trio

from raftlog.client import ACKS_ALL, Admin, NewTopic, Producer, open_cluster
from raftlog.errors import ErrorCode
from raftlog.records import Record


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local[2] session (a JVM start costs seconds); the workers run this venv's python."""
    from pyspark.sql import SparkSession

    from raftlog.spark import register

    # Spark starts its Python workers (planning and reads) with $PYSPARK_PYTHON; they must
    # import raftlog, so they run this venv's interpreter (docs/spark.md says the same).
    previous = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("raftlog-spark-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    register(session)
    try:
        yield session
    finally:
        session.stop()
        if previous is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = previous


def create_topic(
    bootstrap: str, name: str, partitions: int, *, configs: dict[str, str] | None = None
) -> None:
    async def run() -> None:
        async with open_cluster(bootstrap) as cluster:
            result = await Admin(cluster).create_topics(
                [NewTopic(name, partitions, 3, configs=configs or {})]
            )
            assert result[name].error == ErrorCode.none, result

    trio.run(run)


def produce(
    bootstrap: str,
    topic: str,
    batches: Sequence[tuple[int, Sequence[Record]]],
    *,
    acks: int = ACKS_ALL,
) -> list[int]:
    """Send each (partition, records) as one batch; returns the acknowledged base offsets."""

    async def run() -> list[int]:
        async with open_cluster(bootstrap) as cluster:
            producer = Producer(cluster, acks=acks)
            return [
                (await producer.produce(topic, records, partition=partition)).base_offset
                for partition, records in batches
            ]

    return trio.run(run)


def list_offset(bootstrap: str, topic: str, partition: int, spec: str | int) -> int:
    async def run() -> int:
        async with open_cluster(bootstrap) as cluster:
            return (await Admin(cluster).list_offsets(topic, partition, spec)).offset

    return trio.run(run)


def partition_replicas(bootstrap: str, topic: str, partition: int) -> tuple[int, tuple[int, ...]]:
    """(leader id, replica ids) of topic-partition, from fresh metadata."""

    async def run() -> tuple[int, tuple[int, ...]]:
        async with open_cluster(bootstrap) as cluster:
            await cluster.refresh_metadata([topic])
            info = cluster.partition(topic, partition)
            return info.leader_id, info.replicas

    return trio.run(run)
