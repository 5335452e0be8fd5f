from __future__ import annotations

import struct

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.errors import CorruptRecordError
from raftlog.records import (
    HEADER_SIZE_BYTES,
    Compression,
    Record,
    TimestampType,
    build_batch,
    compute_crc,
    iter_all_records,
    iter_batches,
    iter_records,
    make_attributes,
    parse_header,
    set_offset_and_epoch,
    stamp_log_append_time,
    validate_batch,
)

blobs = st.one_of(st.none(), st.binary(max_size=64))
records_strategy = st.lists(
    st.builds(
        Record,
        timestamp_ms=st.integers(0, 2**40),
        key=blobs,
        value=blobs,
        headers=st.lists(st.tuples(st.text(max_size=8), blobs), max_size=3).map(tuple),
    ),
    min_size=1,
    max_size=20,
)


@settings(max_examples=60, deadline=None)
@given(
    records=records_strategy, codec=st.sampled_from(list(Compression)), base=st.integers(0, 2**40)
)
def test_build_then_parse_round_trips(records: list[Record], codec: Compression, base: int) -> None:
    data = build_batch(
        records, base, compression=codec, producer_id=7, producer_epoch=2, base_sequence=5
    )
    header = validate_batch(data)
    assert header.base_offset == base
    assert header.record_count == len(records)
    assert header.last_offset == base + len(records) - 1
    assert header.compression == codec
    assert header.max_timestamp_ms == max(r.timestamp_ms for r in records)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 5)
    decoded = list(iter_records(data))
    assert [(r.key, r.value, r.timestamp_ms, r.headers) for r in decoded] == [
        (r.key, r.value, r.timestamp_ms, r.headers) for r in records
    ]
    assert [r.offset for r in decoded] == list(range(base, base + len(records)))


@pytest.mark.parametrize("codec", list(Compression))
def test_every_codec_compresses_and_reads_back(codec: Compression) -> None:
    value = b"abcdefgh" * 10_000  # > one 32 KiB xerial block
    data = build_batch([Record(key=b"k", value=value, timestamp_ms=1)], compression=codec)
    assert validate_batch(data).compression == codec
    if codec != Compression.NONE:
        assert len(data) < len(value)
    assert next(iter_records(data)).value == value


def test_raw_snappy_from_librdkafka_is_accepted() -> None:
    plain = build_batch([Record(key=b"k", value=b"v" * 100, timestamp_ms=9)])
    body = bytes(cramjam.snappy.compress_raw(plain[HEADER_SIZE_BYTES:]))
    header = parse_header(plain)
    data = bytearray(plain[:HEADER_SIZE_BYTES] + body)
    struct.pack_into(">i", data, 8, len(data) - 12)
    struct.pack_into(">h", data, 21, make_attributes(Compression.SNAPPY))
    struct.pack_into(">I", data, 17, compute_crc(data, 0, len(data)))
    assert validate_batch(data).record_count == header.record_count
    assert next(iter_records(data)).value == b"v" * 100


@pytest.mark.parametrize("compression_type", [0, 1])  # none, gzip: codecs kafka-python has here
def test_batch_from_stock_kafka_python_builder_parses(compression_type: int) -> None:
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression_type,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i in range(10):
        builder.append(i, timestamp=1000 + i, key=b"k%d" % i, value=b"v" * i, headers=[("h", b"x")])
    data = bytes(builder.build())
    header = validate_batch(data)  # CRC checks
    assert header.record_count == 10
    records = list(iter_records(data))
    assert records[3] == Record(3, 1003, b"k3", b"vvv", (("h", b"x"),))
    # and the stock client reads what we build
    ours = DefaultRecordBatch(build_batch(records, compression=Compression(compression_type)))
    assert ours.validate_crc()
    assert [(r.offset, r.key, r.value) for r in ours] == [
        (r.offset, r.key, r.value) for r in records
    ]


def test_offset_and_epoch_rewrite_keeps_crc_valid() -> None:
    data = bytearray(build_batch([Record(value=b"x", timestamp_ms=1)] * 3))
    set_offset_and_epoch(data, 0, 12345, 7)
    header = validate_batch(data)
    assert (header.base_offset, header.partition_leader_epoch) == (12345, 7)
    assert [r.offset for r in iter_records(data)] == [12345, 12346, 12347]


def test_every_flipped_bit_in_crc_range_is_detected() -> None:
    data = build_batch([Record(key=b"key", value=b"value" * 3, timestamp_ms=1)])
    for byte in range(17, len(data)):
        for bit in (0, 7):
            bad = bytearray(data)
            bad[byte] ^= 1 << bit
            with pytest.raises(CorruptRecordError):
                validate_batch(bad)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.__setitem__(16, 1), "magic 1"),
        (lambda d: struct.pack_into(">i", d, 8, 10), "impossible batchLength"),
        (lambda d: struct.pack_into(">i", d, 8, 10_000), "incomplete batch"),
        (lambda d: d.__setitem__(len(d) - 1, d[-1] ^ 1), "fails CRC32C"),
    ],
)
def test_validation_errors_say_what_is_wrong(mutate, message: str) -> None:
    data = bytearray(build_batch([Record(value=b"x", timestamp_ms=1)]))
    mutate(data)
    with pytest.raises(CorruptRecordError, match=message):
        validate_batch(data)


def test_iter_batches_rejects_trailing_garbage() -> None:
    one = build_batch([Record(value=b"x", timestamp_ms=1)])
    assert len(list(iter_batches(one + one))) == 2
    with pytest.raises(CorruptRecordError, match=f"at byte {len(one)}"):
        list(iter_batches(one + b"\x00" * 20))


def test_attributes_helpers() -> None:
    data = build_batch(
        [Record(value=b"x", timestamp_ms=5)],
        compression=Compression.ZSTD,
        timestamp_type=TimestampType.LOG_APPEND_TIME,
        is_transactional=True,
        is_control=True,
        producer_id=1,
        producer_epoch=0,
    )
    header = parse_header(data)
    assert header.compression == Compression.ZSTD
    assert header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert header.is_transactional and header.is_control
    assert next(iter_all_records(data)).timestamp_ms == 5


# ------------------------------------------------------------ LogAppendTime stamping (KIP-32)
APPEND_MS = 1_700_000_000_123


def _record_bytes(data: bytes) -> bytes:
    return data[HEADER_SIZE_BYTES:]


@pytest.mark.parametrize("codec", list(Compression))
def test_stamping_changes_only_the_type_bit_max_timestamp_and_crc(codec: Compression) -> None:
    records = [Record(key=b"k%d" % i, value=b"v" * 50, timestamp_ms=1_000 + i) for i in range(4)]
    data = build_batch(
        records,
        17,
        compression=codec,
        producer_id=42,
        producer_epoch=3,
        base_sequence=9,
        partition_leader_epoch=5,
        is_transactional=True,
    )
    before = validate_batch(data)
    stamped = stamp_log_append_time(data, APPEND_MS)
    after = validate_batch(stamped)  # the new CRC is valid
    assert after.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert after.max_timestamp_ms == APPEND_MS
    assert after.crc == compute_crc(stamped, 0, len(stamped)) != before.crc
    assert after.attributes == before.attributes | 0x08
    # Everything else in the header, idempotent-producer fields included, is as it was.
    unchanged = ("crc", "attributes", "max_timestamp_ms")
    assert {k: v for k, v in after._asdict().items() if k not in unchanged} == {
        k: v for k, v in before._asdict().items() if k not in unchanged
    }
    assert after.compression == codec and after.is_transactional
    # Records are never re-encoded (compressed payloads included): same bytes after the header.
    assert _record_bytes(stamped) == _record_bytes(data)
    assert len(stamped) == len(data)
    # Readers take the append time as every record's timestamp; the rest reads as written.
    decoded = list(iter_records(stamped))
    assert [r.timestamp_ms for r in decoded] == [APPEND_MS] * 4
    assert [(r.offset, r.key, r.value) for r in decoded] == [
        (17 + i, r.key, r.value) for i, r in enumerate(records)
    ]


def test_stamping_is_idempotent_and_restamps_every_batch() -> None:
    one = build_batch([Record(value=b"a", timestamp_ms=1)], producer_id=1, producer_epoch=0)
    two = build_batch([Record(value=b"b", timestamp_ms=2)] * 2, base_sequence=-1)
    stamped = stamp_log_append_time(one + two, APPEND_MS)
    assert stamp_log_append_time(stamped, APPEND_MS) == stamped
    headers = [h for _, h in iter_batches(stamped)]
    assert [(h.timestamp_type, h.max_timestamp_ms) for h in headers] == [
        (TimestampType.LOG_APPEND_TIME, APPEND_MS)
    ] * 2
    later = stamp_log_append_time(stamped, APPEND_MS + 5)
    assert [h.max_timestamp_ms for _, h in iter_batches(later)] == [APPEND_MS + 5] * 2


def test_stamping_refuses_a_corrupt_batch_instead_of_re_signing_it() -> None:
    data = bytearray(build_batch([Record(value=b"x" * 10, timestamp_ms=1)]))
    data[-1] ^= 1
    with pytest.raises(CorruptRecordError, match="fails CRC32C"):
        stamp_log_append_time(data, APPEND_MS)


def test_stock_kafka_python_reads_a_stamped_batch_as_log_append_time() -> None:
    from kafka.record.default_records import DefaultRecordBatch

    data = build_batch(
        [Record(value=b"x", timestamp_ms=1_000_000)] * 2, compression=Compression.GZIP
    )
    ours = DefaultRecordBatch(stamp_log_append_time(data, APPEND_MS))
    assert ours.validate_crc()
    assert ours.timestamp_type == 1
    assert [r.timestamp for r in ours] == [APPEND_MS, APPEND_MS]
