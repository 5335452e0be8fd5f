"""Driver-side planning: which partitions, and [start, end) of each, from ListOffsets.

Planning happens once. The end of every range is at most the high watermark observed here
(ListOffsets "latest" answers the HW, not the log end), so the records a read returns are
committed: no leader change can take them back. Under kafka.isolation.level=read_committed
ListOffsets is asked at that level, so "latest" is the last stable offset (as Kafka's
consumer endOffsets) and no range reaches into a transaction still open. Executors then read
exactly these ranges.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from raftlog.client import Cluster, ClusterLimits, ConnectionLimits, open_cluster
from raftlog.client.admin import list_offset
from raftlog.client.protocol import IsolationLevel
from raftlog.errors import ErrorCode, RemoteError, exception_leaves
from raftlog.spark.options import EARLIEST, LATEST, OptionError, ReadOptions
from raftlog.spark.ranges import OffsetRange, split_ranges

log = logging.getLogger("raftlog.spark")
T = TypeVar("T")

# ListOffsets requests in flight at once while planning (one request per partition and spec).
PLAN_MAX_CONCURRENT_REQUESTS = 16


class DataLossError(RemoteError, RuntimeError):
    """Records a read asked for are gone (retention deleted them) and failOnDataLoss=true."""


@dataclass(frozen=True)
class PartitionOffsets:
    """What ListOffsets said about one partition at planning time."""

    topic: str
    partition: int
    log_start_offset: int
    # Where a read of the query's isolation level ends: the high watermark, or under
    # read_committed the last stable offset.
    end_offset: int


def run_blocking(async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """trio.run for Spark's plain-Python workers, raising what the work raised.

    An error inside open_cluster() leaves its nursery wrapped in an ExceptionGroup; a user
    should see the DataLossError or KafkaError itself, so a group of one is unwrapped.
    """
    try:
        return trio.run(async_fn, *args)
    except BaseExceptionGroup as group:
        leaves = exception_leaves(group)
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def cluster_limits(options: ReadOptions) -> ClusterLimits:
    """Retry bounds for reads: enough retries to ride out a leader election."""
    return ClusterLimits(
        max_retries=options.max_retries,
        retry_backoff_ms=50,
        retry_backoff_max_ms=1_000,
        connection=ConnectionLimits(request_timeout_ms=options.request_timeout_ms),
    )


def data_loss_message(topic: str, partition: int, wanted: int, log_start_offset: int) -> str:
    return (
        f"{topic}-{partition}: offsets {wanted}..{log_start_offset - 1} are no longer in the "
        f"log (log start offset is {log_start_offset}; retention or a deletion removed them). "
        f"Set failOnDataLoss=false to skip the missing records and read from the log start."
    )


def selected_partitions(cluster: Cluster, options: ReadOptions) -> list[tuple[str, int]]:
    """The (topic, partition) pairs the subscription names, from the cluster's metadata."""
    if options.assign:
        for topic, partition in options.assign:
            cluster.partition(topic, partition)  # raises for an unknown topic or partition
        return list(options.assign)
    pairs: list[tuple[str, int]] = []
    for name, info in sorted(cluster.topics.items()):
        if info.error != ErrorCode.none or info.is_internal or not options.matches(name):
            continue
        pairs.extend((name, p.partition) for p in info.partitions)
    missing = [t for t in options.subscribe if t not in cluster.topics]
    if missing:
        # Spark's Kafka source reads nothing from a topic that does not exist; say so.
        log.warning("subscribed topics do not exist (nothing read from them): %s", missing)
    return pairs


async def _list_offsets(
    cluster: Cluster,
    pairs: list[tuple[str, int]],
    spec: str | int,
    isolation_level: IsolationLevel,
) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    limiter = trio.CapacityLimiter(PLAN_MAX_CONCURRENT_REQUESTS)

    async def one(topic: str, partition: int) -> None:
        async with limiter:
            found = await list_offset(cluster, topic, partition, spec, isolation_level)
            out[(topic, partition)] = found.offset

    async with trio.open_nursery() as nursery:
        for topic, partition in pairs:
            nursery.start_soon(one, topic, partition)
    return out


async def partition_offsets(
    cluster: Cluster, pairs: list[tuple[str, int]], isolation_level: IsolationLevel
) -> dict[tuple[str, int], PartitionOffsets]:
    """Log start offset and end (HW, or LSO under read_committed) of each partition
    (ListOffsets earliest and latest at the isolation level)."""
    earliest = await _list_offsets(cluster, pairs, "earliest", isolation_level)
    latest = await _list_offsets(cluster, pairs, "latest", isolation_level)
    return {key: PartitionOffsets(key[0], key[1], earliest[key], latest[key]) for key in pairs}


def _specific(spec: dict[str, dict[int, int]], key: tuple[str, int], name: str) -> int:
    topic, partition = key
    try:
        return spec[topic][partition]
    except KeyError:
        # Spark requires every partition of the subscription in a specific-offsets JSON.
        raise OptionError(
            f"option {name} gives no offset for {topic}-{partition}; "
            f"name every partition (-2 earliest, -1 latest)"
        ) from None


async def plan_offsets(
    cluster: Cluster, options: ReadOptions
) -> tuple[list[OffsetRange], dict[tuple[str, int], PartitionOffsets]]:
    """Unsplit committed ranges per partition, and the offsets they were planned from."""
    pairs = selected_partitions(cluster, options)
    level = options.isolation_level
    known = await partition_offsets(cluster, pairs, level)
    starts: dict[tuple[str, int], int] = {}
    ends: dict[tuple[str, int], int] = {}
    if options.starting_timestamp_ms is not None:
        by_time = await _list_offsets(cluster, pairs, options.starting_timestamp_ms, level)
        for key, offset in by_time.items():
            if offset < 0 and options.starting_timestamp_strategy == "error":
                raise OptionError(
                    f"{key[0]}-{key[1]} has no record with timestamp >= startingTimestamp "
                    f"{options.starting_timestamp_ms}; set "
                    f"startingOffsetsByTimestampStrategy=latest to start at the end instead"
                )
            starts[key] = known[key].end_offset if offset < 0 else offset
    if options.ending_timestamp_ms is not None:
        by_time = await _list_offsets(cluster, pairs, options.ending_timestamp_ms, level)
        # No record at or after the end timestamp: everything committed is before it.
        ends = {k: known[k].end_offset if o < 0 else o for k, o in by_time.items()}
    ranges: list[OffsetRange] = []
    for key in pairs:
        offsets = known[key]
        start = starts.get(key)
        if start is None:
            start = _resolve(options.starting_offsets, key, offsets, "startingOffsets")
        end = ends.get(key)
        if end is None:
            end = _resolve(options.ending_offsets, key, offsets, "endingOffsets")
        # Committed data only: never past the HW (LSO) seen now, whatever was asked for.
        end = min(end, offsets.end_offset)
        if start < offsets.log_start_offset:
            if options.fail_on_data_loss:
                raise DataLossError(
                    data_loss_message(key[0], key[1], start, offsets.log_start_offset)
                )
            log.warning(
                "skipping lost records: %s",
                data_loss_message(key[0], key[1], start, offsets.log_start_offset),
            )
            start = offsets.log_start_offset
        if start > end:
            if start > offsets.end_offset:
                bound = (
                    "last stable offset"
                    if level is IsolationLevel.READ_COMMITTED
                    else "high watermark"
                )
                raise OptionError(
                    f"{key[0]}-{key[1]}: starting offset {start} is past the {bound} "
                    f"{offsets.end_offset}"
                )
            raise OptionError(
                f"{key[0]}-{key[1]}: starting offset {start} is after ending offset {end}"
            )
        ranges.append(OffsetRange(key[0], key[1], start, end))
    return ranges, known


def _resolve(
    spec: str | dict[str, dict[int, int]],
    key: tuple[str, int],
    offsets: PartitionOffsets,
    name: str,
) -> int:
    offset = {"earliest": EARLIEST, "latest": LATEST}[spec] if isinstance(spec, str) else None
    if offset is None:
        assert isinstance(spec, dict)
        offset = _specific(spec, key, name)
    if offset == EARLIEST:
        return offsets.log_start_offset
    if offset == LATEST:
        return offsets.end_offset
    return offset


async def plan_async(options: ReadOptions) -> list[OffsetRange]:
    """The splits of a batch read (see the module docstring)."""
    async with open_cluster(
        options.bootstrap_servers,
        client_id="raftlog-spark",
        limits=cluster_limits(options),
        security=options.security,
    ) as cluster:
        ranges, _ = await plan_offsets(cluster, options)
    return split_ranges(
        ranges,
        min_partitions=options.min_partitions,
        max_records_per_partition=options.max_records_per_partition,
    )


def plan(options: ReadOptions) -> list[OffsetRange]:
    """Blocking plan_async, for Spark's planner (plain Python, no event loop running)."""
    return run_blocking(plan_async, options)


async def end_offsets_async(options: ReadOptions) -> dict[tuple[str, int], PartitionOffsets]:
    """Log start and end (HW, or LSO under read_committed) of every subscribed partition
    now (streaming's latest offsets)."""
    async with open_cluster(
        options.bootstrap_servers,
        client_id="raftlog-spark",
        limits=cluster_limits(options),
        security=options.security,
    ) as cluster:
        pairs = selected_partitions(cluster, options)
        return await partition_offsets(cluster, pairs, options.isolation_level)


def end_offsets(options: ReadOptions) -> dict[tuple[str, int], PartitionOffsets]:
    return run_blocking(end_offsets_async, options)
