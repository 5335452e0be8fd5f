"""The source's pure parts: option parsing, range splitting, stream caps, column decoding.

No Spark and no cluster here; these run in milliseconds. Property tests use hypothesis
(which prints the falsifying example and its seed on failure).
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlog.records import Compression, Record, TimestampType, build_batch
from raftlog.spark.options import OptionError, parse_options
from raftlog.spark.ranges import OffsetRange, split_ranges
from raftlog.spark.reader import Columns, add_records, to_record_batch

BASE = {"bootstrap.servers": "127.0.0.1:9092"}


def test_options_defaults_and_aliases():
    options = parse_options({"kafka.bootstrap.servers": "h:1", "subscribe": "a, b"})
    assert options.bootstrap_servers == "h:1"
    assert options.subscribe == ("a", "b")
    assert (options.starting_offsets, options.ending_offsets) == ("earliest", "latest")
    assert options.fail_on_data_loss and not options.include_headers
    assert parse_options({**BASE, "subscribe": "a"}, streaming=True).starting_offsets == "latest"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "exactly one of subscribe, subscribePattern, assign"),
        ({"subscribe": "a", "assign": '{"a": [0]}'}, "got subscribe, assign"),
        ({"subscribePattern": "("}, "not a valid regex"),
        ({"assign": '{"a": "0"}'}, "needs a list of partition numbers"),
        ({"subscribe": "a", "startingOffsets": "latest"}, "not valid for batch"),
        ({"subscribe": "a", "endingOffsets": "earliest"}, "not valid for batch"),
        ({"subscribe": "a", "startingOffsets": '{"a": {"0": -1}}'}, "uses -1 \\(latest\\)"),
        ({"subscribe": "a", "endingOffsets": "{nope"}, "neither earliest/latest nor JSON"),
        ({"subscribe": "a", "minPartitions": "0"}, "minPartitions must be >= 1"),
        ({"subscribe": "a", "failOnDataLoss": "maybe"}, "true or false"),
        ({"subscribe": "a", "startingOffsetsByTimestampStrategy": "x"}, "error or latest"),
    ],
)
def test_bad_options_name_the_option(extra, message):
    with pytest.raises(OptionError, match=message):
        parse_options({**BASE, **extra})


def test_streaming_refuses_batch_only_options():
    for extra in ({"endingOffsets": "latest"}, {"startingTimestamp": "5"}):
        with pytest.raises(OptionError, match=r"streaming|batch queries only"):
            parse_options({**BASE, "subscribe": "a", **extra}, streaming=True)


def test_bootstrap_is_required():
    with pytest.raises(OptionError, match=r"bootstrap\.servers"):
        parse_options({"subscribe": "a"})


def test_offset_json_and_assign_parse():
    options = parse_options(
        {
            **BASE,
            "assign": json.dumps({"t": [1, 0, 1]}),
            "startingOffsets": json.dumps({"t": {"0": 5, "1": -2}}),
            "endingOffsets": json.dumps({"t": {"0": -1, "1": 9}}),
        }
    )
    assert options.assign == (("t", 0), ("t", 1))
    assert options.starting_offsets == {"t": {0: 5, 1: -2}}
    assert options.ending_offsets == {"t": {0: -1, 1: 9}}
    assert options.matches("t") and not options.matches("u")
    pattern = parse_options({**BASE, "subscribePattern": "ev.*"})
    assert pattern.matches("events") and not pattern.matches("__consumer_offsets")


ranges_strategy = st.lists(
    st.builds(
        lambda t, p, s, n: OffsetRange(t, p, s, s + n),
        st.sampled_from(["a", "b"]),
        st.integers(0, 5),
        st.integers(0, 1000),
        st.integers(0, 5000),
    ),
    max_size=8,
    unique_by=lambda r: (r.topic, r.partition),
)


@given(
    ranges_strategy,
    st.one_of(st.none(), st.integers(1, 64)),
    st.one_of(st.none(), st.integers(1, 3000)),
)
def test_splits_cover_each_range_exactly(ranges, min_partitions, max_records):
    splits = split_ranges(
        ranges, min_partitions=min_partitions, max_records_per_partition=max_records
    )
    covered: dict[tuple[str, int], list[int]] = {}
    for split in splits:
        assert split.size > 0
        if max_records is not None:
            assert split.size <= max_records
        covered.setdefault((split.topic, split.partition), []).extend(range(split.start, split.end))
    for r in ranges:
        assert covered.get((r.topic, r.partition), []) == list(range(r.start, r.end))
    nonempty = [r for r in ranges if r.size > 0]
    if min_partitions is not None and max_records is None and nonempty:
        assert len(splits) >= min(len(nonempty), min_partitions) or len(splits) == sum(
            r.size for r in nonempty
        )


def test_min_partitions_divides_in_proportion():
    ranges = [OffsetRange("t", 0, 0, 900), OffsetRange("t", 1, 0, 100)]
    splits = split_ranges(ranges, min_partitions=10)
    assert [s.partition for s in splits].count(0) == 9
    assert [s.partition for s in splits].count(1) == 1
    assert split_ranges(ranges, min_partitions=2) == ranges  # already enough ranges


def test_stream_cap_shares_rows_and_always_moves():
    from raftlog.spark.source import cap_offsets

    begin = {("t", 0): 0, ("t", 1): 10}
    ends = {("t", 0): 300, ("t", 1): 110, ("t", 2): 0}
    capped = cap_offsets(begin, ends, 40)
    assert capped == {("t", 0): 30, ("t", 1): 20, ("t", 2): 0}
    assert sum(capped[k] - begin.get(k, 0) for k in capped) == 40
    assert cap_offsets(begin, ends, 1) == {("t", 0): 1, ("t", 1): 10, ("t", 2): 0}
    assert cap_offsets(begin, ends, 10_000) == ends


def _schema(include_headers: bool) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    from raftlog.spark.source import source_schema

    return to_arrow_schema(source_schema(include_headers), timezone="UTC")


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.ZSTD])
def test_columns_keep_exactly_the_range(compression):
    records = [
        Record(
            offset_delta,
            1_000 + offset_delta,
            None if offset_delta % 2 else b"k",
            b"v%d" % offset_delta,
            (("h", b"x"),) if offset_delta == 3 else (),
        )
        for offset_delta in range(10)
    ]
    batch = bytearray(build_batch(records, compression=compression))
    # Two copies of the batch at base offsets 0 and 10, then half of a third (a cut tail).
    data = bytes(batch)
    second = bytearray(batch)
    second[0:8] = (10).to_bytes(8, "big")
    data += bytes(second) + bytes(second[: len(second) // 2])
    columns = Columns(headers=[])
    assert add_records(columns, data, 3, 15) == 20
    assert columns.offsets == list(range(3, 15))
    assert columns.keys[0] is None and columns.keys[1] == b"k"
    assert columns.headers[0] == [{"key": "h", "value": b"x"}]
    batch_out = to_record_batch(columns, "t", 4, _schema(True))
    assert batch_out.schema.equals(_schema(True))
    assert batch_out.column("partition").to_pylist() == [4] * 12
    assert batch_out.column("timestamp").to_pylist()[0].timestamp() == 1.003
    assert batch_out.column("timestampType").to_pylist() == [int(TimestampType.CREATE_TIME)] * 12
    plain = to_record_batch(Columns(), "t", 0, _schema(False))
    assert plain.num_rows == 0 and plain.schema.equals(_schema(False))


def test_run_blocking_raises_the_error_itself_not_a_group():
    import trio

    from raftlog.spark.planner import DataLossError, run_blocking

    async def fails_in_nursery() -> None:
        async with trio.open_nursery():
            raise DataLossError("gone")

    with pytest.raises(DataLossError, match="gone"):
        run_blocking(fails_in_nursery)


def test_a_chunk_takes_no_batch_once_its_records_fill_it(monkeypatch: pytest.MonkeyPatch):
    """Highly compressed batches cannot expand a chunk without bound: once its records hold
    the decode budget the chunk stops at a batch boundary and the next chunk starts there
    (the first batch of a chunk is always taken, so a read moves on)."""
    monkeypatch.setattr("raftlog.spark.reader.DECODED_READ_MAX_BYTES", 3 * 1024 * 1024)
    one = build_batch([Record(value=bytes(1024 * 1024))], compression=Compression.ZSTD, now_ms=1)
    data = b""
    for offset in range(20):
        batch = bytearray(one)
        batch[0:8] = offset.to_bytes(8, "big")
        data += bytes(batch)
    assert len(data) < 1024 * 1024 // 10  # twenty MiB of values in a few KiB
    columns = Columns()
    assert add_records(columns, data, 0, 20) == 3
    assert columns.offsets == [0, 1, 2] and columns.full
    # The next chunk starts there and always takes at least its first batch.
    fresh = Columns()
    monkeypatch.setattr("raftlog.spark.reader.DECODED_READ_MAX_BYTES", 1)
    assert add_records(fresh, data, 3, 20) == 4 and fresh.offsets == [3]
