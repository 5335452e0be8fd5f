"""The leader's batch validation (raftlog/batch_validation.py), attacked with batches whose
CRC is correct but whose contents lie: each kind is refused with Kafka's error code, and
fuzzed record bytes under a recomputed CRC never crash the validator nor get a batch through
whose records do not decode."""

from __future__ import annotations

import gzip
import struct
import tracemalloc

import cramjam
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from raftlog.batch_validation import (
    MAX_RECORD_ERRORS,
    InvalidRecordError,
    validate_client_batches,
)
from raftlog.compression import compress
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import (
    HEADER_SIZE_BYTES,
    HEADER_STRUCT,
    Compression,
    Record,
    build_batch,
    build_txn_marker,
    compute_crc,
    iter_records,
    make_attributes,
)

MAX_MESSAGE_BYTES = 1024 * 1024 + 12  # Kafka's default max.message.bytes
REFUSED_CODES = {ErrorCode.corrupt_message, ErrorCode.invalid_record, ErrorCode.message_too_large}


# ------------------------------------------------------------------------- forging tools


def varint(value: int) -> bytes:
    """Kafka's zigzag varint, written independently of raftlog.records."""
    v = (value << 1) ^ (value >> 63)
    out = bytearray()
    while v & ~0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def record(
    offset_delta: int,
    key: bytes | None = b"k",
    value: bytes | None = b"v",
    headers: list[tuple[bytes | None, bytes | None]] | None = None,
    *,
    header_count: int | None = None,
    length_adjust: int = 0,
    extra: bytes = b"",
    timestamp_delta: int = 0,
) -> bytes:
    """One record's bytes, any field of which may be made to lie."""

    def blob(b: bytes | None) -> bytes:
        return varint(-1) if b is None else varint(len(b)) + b

    headers = headers or []
    body = b"\x00" + varint(timestamp_delta) + varint(offset_delta) + blob(key) + blob(value)
    body += varint(len(headers) if header_count is None else header_count)
    for hkey, hvalue in headers:
        body += blob(hkey) + blob(hvalue)
    body += extra
    return varint(len(body) + length_adjust) + body


def forge(
    body: bytes,
    count: int,
    *,
    last_offset_delta: int | None = None,
    attributes: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    base_timestamp_ms: int = 1_700_000_000_000,
) -> bytes:
    """A batch around `body` with whatever header the caller wants and a correct CRC."""
    size = HEADER_SIZE_BYTES + len(body)
    out = bytearray(size)
    HEADER_STRUCT.pack_into(
        out,
        0,
        0,
        size - 12,
        -1,
        2,
        0,
        attributes,
        count - 1 if last_offset_delta is None else last_offset_delta,
        base_timestamp_ms,
        base_timestamp_ms,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )
    out[HEADER_SIZE_BYTES:] = body
    struct.pack_into(">I", out, 17, compute_crc(out, 0, size))
    return bytes(out)


def three_records() -> bytes:
    return record(0) + record(1) + record(2)


def compressed(codec: Compression, body: bytes) -> tuple[bytes, int]:
    return compress(codec, body), make_attributes(codec)


def refused_code(batch: bytes, **kwargs: object) -> ErrorCode:
    with pytest.raises(KafkaError) as info:
        validate_client_batches(batch, max_message_bytes=MAX_MESSAGE_BYTES, **kwargs)  # type: ignore[arg-type]
    return info.value.code


def kafka_python_batch(compression: int = 0, count: int = 5) -> bytes:
    builder = DefaultRecordBatchBuilder(2, compression, False, -1, -1, -1, 1 << 20)
    for i in range(count):
        builder.append(i, 1_700_000_000_000 + i, b"k%d" % i, b"v" * i, [("h", b"x")])
    return bytes(builder.build())


# ------------------------------------------------------------------------- what must pass

VALID = {
    "one record, null key and value": build_batch([Record(key=None, value=None)]),
    "headers with a null value and an empty key": build_batch(
        [Record(key=b"k", value=b"v", headers=(("", None), ("h", b"x" * 200)))]
    ),
    "300 records (two-byte offset deltas)": build_batch(
        [Record(value=b"x" * 10) for _ in range(300)]
    ),
    "a 20 KB value (three-byte length varints)": build_batch([Record(value=b"y" * 20_000)]),
    "timestamps out of order (negative deltas)": build_batch(
        [Record(value=b"a", timestamp_ms=10**12), Record(value=b"b", timestamp_ms=5)]
    ),
    "idempotent producer": build_batch(
        [Record(value=b"a")], producer_id=5, producer_epoch=0, base_sequence=0
    ),
    "transactional producer": build_batch(
        [Record(value=b"a")],
        producer_id=5,
        producer_epoch=3,
        base_sequence=7,
        is_transactional=True,
    ),
    # Sarama leaves the sequence at 0 without a producer id; Kafka takes it.
    "no producer id, sequence 0": forge(record(0), 1, base_sequence=0),
    "two batches": build_batch([Record(value=b"a")]) + build_batch([Record(value=b"b")]),
    "kafka-python, uncompressed": kafka_python_batch(0),
    "kafka-python, gzip": kafka_python_batch(1),
    "raw snappy (librdkafka)": forge(
        bytes(cramjam.snappy.compress_raw(three_records())),
        3,
        attributes=make_attributes(Compression.SNAPPY),
    ),
    **{
        f"{codec.name.lower()}": build_batch(
            [Record(key=b"k%d" % i, value=b"v" * 100) for i in range(50)], compression=codec
        )
        for codec in (Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD)
    },
}


@pytest.mark.parametrize("what", sorted(VALID))
def test_valid_batches_pass_and_their_headers_come_back(what: str) -> None:
    batch = VALID[what]
    headers = validate_client_batches(batch, max_message_bytes=MAX_MESSAGE_BYTES)
    assert headers[0][0] == 0
    assert sum(h.size_bytes for _, h in headers) == len(batch)


def test_a_compacted_topic_takes_records_with_keys() -> None:
    batch = build_batch([Record(key=b"k", value=None)])
    validate_client_batches(batch, max_message_bytes=MAX_MESSAGE_BYTES, require_keys=True)


# ------------------------------------------------------------------------- what must not

GZIP, ZSTD, LZ4, SNAPPY = (
    make_attributes(c)
    for c in (Compression.GZIP, Compression.ZSTD, Compression.LZ4, Compression.SNAPPY)
)
INVALID = ErrorCode.invalid_record
CORRUPT = ErrorCode.corrupt_message
TOO_LARGE = ErrorCode.message_too_large

REFUSED: dict[str, tuple[bytes, ErrorCode]] = {
    # The reproduction: the log end offset jumped by the header's claim.
    "recordCount 1,000,000 holding 3 records": (forge(three_records(), 1_000_000), INVALID),
    "recordCount 2^31-1 holding 3 records": (forge(three_records(), 2**31 - 1), INVALID),
    "recordCount 1 holding 3 records": (forge(three_records(), 1), INVALID),
    "recordCount 5 holding 3 records": (forge(three_records(), 5), INVALID),
    "recordCount 0": (forge(b"", 0), CORRUPT),
    "recordCount -1": (forge(three_records(), -1, last_offset_delta=2), CORRUPT),
    "lastOffsetDelta disagrees with recordCount": (
        forge(three_records(), 3, last_offset_delta=999_999),
        INVALID,
    ),
    "offset deltas 0, 2, 1": (forge(record(0) + record(2) + record(1), 3), INVALID),
    "offset deltas 5, 6, 7": (forge(record(5) + record(6) + record(7), 3), INVALID),
    "random bytes as records": (forge(bytes(range(7, 250)), 3), INVALID),
    "all 0xff as records": (forge(b"\xff" * 64, 3), INVALID),
    "a record longer than the batch": (forge(record(0, length_adjust=500), 1), INVALID),
    "a record shorter than its fields": (forge(record(0, length_adjust=-2), 1), INVALID),
    "record attributes 0x80 (kafka-python reads a varint there)": (
        forge(varint(7) + b"\x80\x01" + b"\x00" * 5, 1),
        INVALID,
    ),
    "a negative record length": (forge(varint(-5) + b"\x00" * 10, 1), INVALID),
    "bytes after the last record": (forge(three_records() + b"\x00\x00", 3), INVALID),
    "bytes inside a record after its headers": (forge(record(0, extra=b"zz"), 1), INVALID),
    "key length -2": (
        forge(varint(7) + b"\x00\x00\x00" + varint(-2) + b"\x00\x00\x00", 1),
        INVALID,
    ),
    "key running past the batch": (
        forge(varint(8) + b"\x00\x00\x00" + varint(1000) + b"k\x00\x00\x00", 1),
        INVALID,
    ),
    "null header key": (forge(record(0, headers=[(None, b"x")]), 1), INVALID),
    "a header key that is not UTF-8": (forge(record(0, headers=[(b"\xc3\x28", b"x")]), 1), INVALID),
    "negative header count": (forge(record(0, header_count=-3), 1), INVALID),
    "header count 2^31-1": (forge(record(0, header_count=2**31 - 1), 1), INVALID),
    "a varint of 11 bytes": (forge(b"\x0e\x00" + b"\xff" * 10 + b"\x01", 1), INVALID),
    "a 5-byte varint wider than 32 bits": (
        forge(b"\x0e\x00\x00\xff\xff\xff\xff\x7f\x00\x00\x00\x00\x00\x00", 1),
        INVALID,
    ),
    "undecodable gzip": (forge(b"\x1f\x8b" + b"garbage" * 10, 3, attributes=GZIP), CORRUPT),
    "undecodable zstd": (forge(b"\x28\xb5\x2f\xfd" + b"garbage" * 10, 3, attributes=ZSTD), CORRUPT),
    "undecodable lz4": (forge(b"garbage" * 10, 3, attributes=LZ4), CORRUPT),
    "undecodable snappy": (forge(b"\x0agarbage", 3, attributes=SNAPPY), CORRUPT),
    "truncated gzip": (
        forge(gzip.compress(three_records())[:-6], 3, attributes=GZIP),
        CORRUPT,
    ),
    "gzip of random record bytes": (
        forge(gzip.compress(bytes(range(7, 250))), 3, attributes=GZIP),
        INVALID,
    ),
    "zstd holding a count mismatch": (
        forge(bytes(cramjam.zstd.compress(three_records())), 1_000_000, attributes=ZSTD),
        INVALID,
    ),
    "compression codec 6": (forge(three_records(), 3, attributes=6), CORRUPT),
    "control batch from a client": (
        forge(three_records(), 3, attributes=make_attributes(is_control=True)),
        INVALID,
    ),
    # Only a partition leader writes markers, for the transaction coordinator.
    "a well-formed COMMIT marker from a client": (
        build_txn_marker(producer_id=9, producer_epoch=0, coordinator_epoch=0, commit=True),
        INVALID,
    ),
    "producer id -7": (forge(three_records(), 3, producer_id=-7), INVALID),
    "producer id without an epoch": (
        forge(three_records(), 3, producer_id=9, producer_epoch=-1, base_sequence=0),
        INVALID,
    ),
    "producer id without a sequence": (
        forge(three_records(), 3, producer_id=9, producer_epoch=0, base_sequence=-1),
        INVALID,
    ),
    "transactional without a producer id": (
        forge(three_records(), 3, attributes=make_attributes(is_transactional=True)),
        INVALID,
    ),
    "good CRC, record byte flipped before the CRC was computed": (
        forge(record(0)[:-1] + b"\x05", 1),
        INVALID,
    ),
    "bad CRC": (build_batch([Record(value=b"abc")])[:-1] + b"d", CORRUPT),
    "a good batch, then a bad one": (
        build_batch([Record(value=b"a")]) + forge(three_records(), 1_000_000),
        INVALID,
    ),
}


@pytest.mark.parametrize("what", sorted(REFUSED))
def test_lying_batches_are_refused_with_kafkas_code(what: str) -> None:
    batch, code = REFUSED[what]
    assert refused_code(batch) == code


def test_a_compacted_topic_refuses_a_record_without_a_key() -> None:
    batch = build_batch([Record(key=b"k", value=b"1"), Record(key=None, value=b"2")])
    assert refused_code(batch, require_keys=True) == INVALID


def test_every_keyless_record_is_named_to_the_producer_up_to_a_bound() -> None:
    """KIP-467: the refusal names each record without a key by its index in the batch, so
    the producer fails just those with INVALID_RECORD (librdkafka's 0011)."""
    records = [Record(key=None if i % 10 == 0 else b"k", value=b"v") for i in range(100)]
    with pytest.raises(InvalidRecordError) as info:
        validate_client_batches(
            build_batch(records), max_message_bytes=MAX_MESSAGE_BYTES, require_keys=True
        )
    assert [index for index, _ in info.value.record_errors] == list(range(0, 100, 10))
    assert all("without key" in why for _, why in info.value.record_errors)
    many = build_batch([Record(key=None, value=b"") for _ in range(MAX_RECORD_ERRORS + 5)])
    with pytest.raises(InvalidRecordError) as info:
        validate_client_batches(many, max_message_bytes=MAX_MESSAGE_BYTES, require_keys=True)
    assert len(info.value.record_errors) == MAX_RECORD_ERRORS
    assert f"{MAX_RECORD_ERRORS + 5} of its" in info.value.message


def test_a_timestamp_outside_int64_is_refused() -> None:
    """baseTimestamp + timestampDelta must be an int64: a record past it would stop every
    reader that rebuilds the batch (the cleaner) on every replica."""
    top = 2**63 - 1
    overflowing = [
        forge(record(0) + record(1, timestamp_delta=2**62), 2, base_timestamp_ms=2**62),
        forge(record(0, timestamp_delta=-(2**62) - 1), 1, base_timestamp_ms=-(2**62)),
        forge(three_records(), 3, base_timestamp_ms=top),  # a one-byte delta could carry it
    ]
    for batch in overflowing:
        with pytest.raises(KafkaError) as info:
            validate_client_batches(batch, max_message_bytes=MAX_MESSAGE_BYTES)
        assert info.value.code == ErrorCode.invalid_record
    at_the_edge = forge(record(0, timestamp_delta=2**62 - 1), 1, base_timestamp_ms=2**62)
    validate_client_batches(at_the_edge, max_message_bytes=MAX_MESSAGE_BYTES)
    (last,) = iter_records(at_the_edge)
    assert last.timestamp_ms == top


def test_a_batch_above_max_message_bytes_is_refused_before_it_is_walked() -> None:
    batch = build_batch([Record(value=b"x" * 5000)])
    with pytest.raises(KafkaError) as info:
        validate_client_batches(batch, max_message_bytes=4096)
    assert info.value.code == TOO_LARGE


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.ZSTD, Compression.LZ4])
def test_a_decompression_bomb_is_refused_within_the_limit(codec: Compression) -> None:
    """64 MiB of records compressed into a small batch: refused as too large, and the
    validator never holds more than about max.message.bytes of decompressed output."""
    limit = 1024 * 1024
    payload = record(0, value=b"\x00" * (64 * 1024 * 1024))
    bomb = forge(compress(codec, payload), 1, attributes=make_attributes(codec))
    assert len(bomb) < limit
    tracemalloc.start()
    try:
        with pytest.raises(KafkaError) as info:
            validate_client_batches(bomb, max_message_bytes=limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.code == TOO_LARGE
    assert peak < 3 * limit, f"peak {peak} bytes while decompressing"


def test_a_snappy_bomb_is_refused_from_its_declared_length() -> None:
    limit = 256 * 1024
    payload = record(0, value=b"\x00" * (4 * 1024 * 1024))
    raw = forge(bytes(cramjam.snappy.compress_raw(payload)), 1, attributes=SNAPPY)
    xerial = forge(compress(Compression.SNAPPY, payload), 1, attributes=SNAPPY)
    for bomb in (raw, xerial):
        with pytest.raises(KafkaError) as info:
            validate_client_batches(bomb, max_message_bytes=limit)
        assert info.value.code == TOO_LARGE


def test_records_just_under_the_limit_decompress() -> None:
    """The bounded buffer grows from its first guess: a highly compressible batch whose
    records are just below the limit passes."""
    limit = 1024 * 1024
    payload = record(0, value=b"\x00" * (limit - 32))
    for codec in (Compression.GZIP, Compression.ZSTD, Compression.LZ4):
        batch = forge(compress(codec, payload), 1, attributes=make_attributes(codec))
        validate_client_batches(batch, max_message_bytes=limit)


# ------------------------------------------------------------------------- fuzzing

record_strategy = st.builds(
    Record,
    key=st.none() | st.binary(max_size=20),
    value=st.none() | st.binary(max_size=200),
    headers=st.lists(
        st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=10)), max_size=3
    ).map(tuple),
    timestamp_ms=st.integers(0, 2**40),
)
CODECS = [Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4]


def assert_verdict_is_sound(batch: bytes) -> None:
    """Refused with one of the three codes, or accepted and then readable by raftlog's own
    reader and by kafka-python's, record for record."""
    try:
        headers = validate_client_batches(batch, max_message_bytes=MAX_MESSAGE_BYTES)
    except KafkaError as exc:
        assert exc.code in REFUSED_CODES, exc
        return
    for pos, header in headers:
        decoded = list(iter_records(batch, pos))
        assert len(decoded) == header.record_count
        assert [r.offset for r in decoded] == list(range(header.record_count))
        if header.compression in (Compression.NONE, Compression.GZIP):
            theirs = list(DefaultRecordBatch(batch[pos : pos + header.size_bytes]))
            assert [(r.key, r.value) for r in theirs] == [(r.key, r.value) for r in decoded]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.binary(max_size=300),
    count=st.integers(1, 12) | st.integers(-(2**31) + 1, 2**31 - 1),
    codec=st.sampled_from(CODECS),
)
def test_random_record_bytes_under_a_good_crc(body: bytes, count: int, codec: Compression) -> None:
    payload, attributes = compressed(codec, body)
    assert_verdict_is_sound(forge(payload, count, attributes=attributes))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(record_strategy, min_size=1, max_size=6),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
    cut=st.integers(0, 8),
    count_change=st.sampled_from([0, 0, 0, 1, -1, 1_000_000]),
    codec=st.sampled_from(CODECS),
)
def test_mutated_records_under_a_recomputed_crc(
    records: list[Record], flips: list[tuple[int, int]], cut: int, count_change: int, codec
) -> None:
    body = bytearray(build_batch(records, now_ms=0)[HEADER_SIZE_BYTES:])
    for index, byte in flips:
        body[index % len(body)] = byte
    if cut:
        del body[-cut:]
    payload, attributes = compressed(codec, bytes(body))
    assert_verdict_is_sound(forge(payload, len(records) + count_change, attributes=attributes))


@settings(max_examples=200, deadline=None)
@given(records=st.lists(record_strategy, min_size=1, max_size=6), codec=st.sampled_from(CODECS))
def test_every_batch_build_batch_makes_passes(records: list[Record], codec: Compression) -> None:
    validate_client_batches(
        build_batch(records, compression=codec, now_ms=0), max_message_bytes=MAX_MESSAGE_BYTES
    )
