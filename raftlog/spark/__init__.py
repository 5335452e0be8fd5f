"""Spark Python Data Source `raftlog`: read committed records as a DataFrame.

    from raftlog.spark import register
    register(spark)
    spark.read.format("raftlog").option("bootstrap.servers", ...).option("subscribe", ...)

Importing this package imports pyspark and pyarrow (`pip install raftlog[spark]`). The pure
parts (options, ranges, planning) live in submodules that do not need pyspark.
"""

from raftlog.spark.options import OptionError, ReadOptions, parse_options
from raftlog.spark.planner import DataLossError, plan
from raftlog.spark.ranges import OffsetRange, split_ranges
from raftlog.spark.source import (
    FORMAT_NAME,
    RaftlogDataSource,
    RaftlogStreamReader,
    register,
    source_schema,
)

__all__ = [
    "FORMAT_NAME",
    "DataLossError",
    "OffsetRange",
    "OptionError",
    "RaftlogDataSource",
    "RaftlogStreamReader",
    "ReadOptions",
    "parse_options",
    "plan",
    "register",
    "source_schema",
    "split_ranges",
]
