"""The sink's pure parts: option parsing and the schema check (no Spark session, no cluster)."""

from __future__ import annotations

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from raftlog.records import Compression
from raftlog.spark.options import OptionError
from raftlog.spark.sink import SchemaError, check_schema
from raftlog.spark.write_options import DEFAULT_BATCH_SIZE_BYTES, parse_write_options

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "topic": "t"}
HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


def test_defaults_and_kafka_names():
    options = parse_write_options(BASE)
    assert (options.bootstrap_servers, options.topic) == ("127.0.0.1:9092", "t")
    assert options.batch_size_bytes == DEFAULT_BATCH_SIZE_BYTES
    assert options.commit_topic == "t"
    tuned = parse_write_options(
        {
            "bootstrap.servers": "h:1",
            "kafka.compression.type": "ZSTD",
            "kafka.batch.size": "65536",
            "kafka.linger.ms": "5",
            "kafka.acks": "-1",
            "kafka.transaction.timeout.ms": "60000",
            "kafka.security.protocol": "PLAINTEXT",
        }
    )
    assert tuned.compression == Compression.ZSTD
    assert (tuned.batch_size_bytes, tuned.linger_ms, tuned.topic) == (65536, 5, None)
    assert tuned.transaction_timeout_ms == 60000


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"kafka.bootstrap.servers": ""}, "bootstrap.servers"),
        ({"kafka.acks": "1"}, "kafka.acks must be all"),
        ({"kafka.enable.idempotence": "false"}, "enable.idempotence must be true"),
        ({"kafka.compression.type": "brotli"}, "compression.type must be one of"),
        ({"kafka.batch.size": "0"}, r"kafka.batch.size must be in \[1,"),
        ({"kafka.batch.size": "big"}, "must be an integer"),
        ({"kafka.max.request.size": "5"}, "kafka.max.request.size is not supported"),
        ({"kafka.ssl.bogus": "x"}, "kafka.ssl.bogus is not supported"),
        ({"topic": " "}, "topic is empty"),
    ],
)
def test_bad_options_name_the_option(extra, message):
    with pytest.raises(OptionError, match=message):
        parse_write_options({**BASE, **extra})


def test_streaming_needs_a_commit_topic():
    no_topic = {"kafka.bootstrap.servers": "h:1"}
    parse_write_options(no_topic)  # batch writes may take the topic from the column
    with pytest.raises(OptionError, match="needs option commitTopic"):
        parse_write_options(no_topic, streaming=True)
    assert parse_write_options({**no_topic, "commitTopic": "c"}, streaming=True).commit_topic == "c"


def _schema(*fields: tuple[str, object]) -> StructType:
    return StructType([StructField(name, kind) for name, kind in fields])  # type: ignore[arg-type]


def test_schema_check():
    with_topic = parse_write_options(BASE)
    without_topic = parse_write_options({"kafka.bootstrap.servers": "h:1"})
    good = _schema(
        ("key", StringType()),
        ("value", BinaryType()),
        ("topic", StringType()),
        ("partition", IntegerType()),
        ("headers", HEADERS),
        ("ignored", LongType()),
    )
    check_schema(good, without_topic)
    check_schema(_schema(("value", StringType())), with_topic)
    cases = [
        (_schema(("key", StringType())), with_topic, "needs a column named value"),
        (_schema(("value", LongType())), with_topic, "column value must be binary or string"),
        (_schema(("value", StringType()), ("key", IntegerType())), with_topic, "column key"),
        (_schema(("value", StringType()), ("partition", LongType())), with_topic, "partition"),
        (_schema(("value", StringType()), ("topic", BinaryType())), with_topic, "column topic"),
        (_schema(("value", StringType()), ("headers", StringType())), with_topic, "headers"),
        (_schema(("value", StringType())), without_topic, "needs a topic column"),
        (_schema(("Value", StringType())), with_topic, "must be spelled value"),
    ]
    for schema, options, message in cases:
        with pytest.raises(SchemaError, match=message):
            check_schema(schema, options)
