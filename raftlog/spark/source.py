"""The PySpark Python Data Source `raftlog`: batch and micro-batch streaming reads, and
writes (raftlog.spark.sink).

    from raftlog.spark import register
    register(spark)
    df = (spark.read.format("raftlog")
          .option("bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "events")
          .load())

Spark pickles the source, its readers and their InputPartitions (with cloudpickle) to ship
them to its Python workers; they hold only plain data (ReadOptions, OffsetRange), never a
connection. Planning (`partitions()`) runs once per query or micro-batch; `read()` runs on
executors and returns pyarrow RecordBatches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from raftlog.spark.options import ReadOptions, parse_options
from raftlog.spark.planner import end_offsets, plan
from raftlog.spark.ranges import OffsetRange, split_ranges
from raftlog.spark.reader import read_range
from raftlog.spark.sink import batch_writer, stream_writer

FORMAT_NAME = "raftlog"

HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


def source_schema(include_headers: bool) -> StructType:
    """Spark's Kafka source schema (headers only with includeHeaders=true)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE))
    return StructType(fields)


class RangePartition(InputPartition):
    """One Spark split: one offset range of one partition."""

    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(rng)
        self.rng = rng


def _read(options: ReadOptions, schema: StructType, partition: InputPartition) -> Iterator[Any]:
    assert isinstance(partition, RangePartition)
    # Spark checks each batch against its Arrow form of the schema, so build exactly that.
    arrow_schema: pa.Schema = to_arrow_schema(schema, timezone="UTC")
    yield from read_range(options, partition.rng, arrow_schema)


class RaftlogBatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        return [RangePartition(r) for r in plan(self.options)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.options, self.schema, partition)


def _offsets_dict(offsets: dict[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    # Spark stores stream offsets as JSON: string keys, integer values.
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def _offsets_from(value: dict[str, Any]) -> dict[tuple[str, int], int]:
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in value.items()
        for partition, offset in partitions.items()
    }


def cap_offsets(
    begin: dict[tuple[str, int], int], ends: dict[tuple[str, int], int], max_rows: int
) -> dict[tuple[str, int], int]:
    """Ends moved back so at most max_rows records are pending, shared in proportion to
    each partition's backlog (Spark's maxOffsetsPerTrigger), and at least one record moves."""
    pending = {k: e - begin.get(k, 0) for k, e in ends.items()}
    total = sum(pending.values())
    if total <= max_rows:
        return ends
    share = {k: p * max_rows // total for k, p in pending.items()}
    leftover = max_rows - sum(share.values())
    for k in sorted(share):  # integer division leaves a few records: hand them out in order
        extra = min(leftover, pending[k] - share[k])
        share[k] += extra
        leftover -= extra
    return {k: begin.get(k, 0) + share[k] for k in ends}


class RaftlogStreamReader(DataSourceStreamReader):
    """Micro-batches whose offsets are each partition's high watermark at planning (its last
    stable offset under read_committed)."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def initialOffset(self) -> dict[str, Any]:
        known = end_offsets(self.options)
        spec = self.options.starting_offsets
        starts: dict[tuple[str, int], int] = {}
        for key, offsets in known.items():
            if spec == "earliest":
                starts[key] = offsets.log_start_offset
            elif spec == "latest":
                starts[key] = offsets.end_offset
            else:
                assert isinstance(spec, dict)
                wanted = spec.get(key[0], {}).get(key[1], -1)
                starts[key] = {-2: offsets.log_start_offset, -1: offsets.end_offset}.get(
                    wanted, wanted
                )
        return _offsets_dict(starts)

    def getDefaultReadLimit(self) -> ReadLimit:
        cap = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if cap is None else ReadMaxRows(cap)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = _offsets_from(start)
        ends = {key: o.end_offset for key, o in end_offsets(self.options).items()}
        # Never move a partition backwards (its HW as seen by a new leader may lag briefly).
        ends = {k: max(e, begin.get(k, 0)) for k, e in ends.items()}
        if isinstance(limit, ReadMaxRows):
            ends = cap_offsets(begin, ends, limit.max_rows)
        return _offsets_dict(ends)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = _offsets_from(start)
        ranges = [
            # A partition new since the last batch starts at its beginning.
            OffsetRange(topic, partition, min(begin.get((topic, partition), 0), stop), stop)
            for (topic, partition), stop in _offsets_from(end).items()
        ]
        splits = split_ranges(
            ranges,
            min_partitions=self.options.min_partitions,
            max_records_per_partition=self.options.max_records_per_partition,
        )
        return [RangePartition(r) for r in splits]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.options, self.schema, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the log keeps records until retention, whatever Spark has read."""


class RaftlogDataSource(DataSource):
    """`spark.read.format("raftlog")`; see docs/spark.md for the options."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        include = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        return source_schema(include)

    def reader(self, schema: StructType) -> DataSourceReader:
        return RaftlogBatchReader(parse_options(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RaftlogStreamReader(parse_options(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """`df.write.format("raftlog").mode("append")`: see raftlog.spark.sink."""
        return batch_writer(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """`df.writeStream.format("raftlog")`: exactly-once micro-batches (raftlog.spark.sink)."""
        return stream_writer(dict(self.options), schema, overwrite)


def register(spark: Any) -> None:
    """Register the `raftlog` format with a SparkSession (changes nothing else)."""
    spark.dataSource.register(RaftlogDataSource)
