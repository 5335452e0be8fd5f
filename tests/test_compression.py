"""The one bounded decompressor (raftlog/compression.py), attacked with decompression bombs: a
batch that claims more than DECOMPRESSED_BATCH_MAX_BYTES of records is refused by every
reader without holding much more than that, and produce never takes one, whatever
max.message.bytes allows."""

from __future__ import annotations

import tracemalloc

import cramjam
import pytest

from raftlog.batch_validation import validate_client_batches
from raftlog.codec import I32_MAX
from raftlog.compression import (
    DECOMPRESSED_BATCH_MAX_BYTES,
    Compression,
    DecompressedTooLargeError,
    compress,
    decompress,
)
from raftlog.constants import MIB
from raftlog.errors import CorruptRecordError, ErrorCode, KafkaError
from raftlog.records import Record, build_batch, iter_records

CODECS = [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]


@pytest.mark.parametrize("codec", [Compression.NONE, *CODECS])
def test_round_trip_under_the_limit(codec: Compression) -> None:
    data = bytes(range(256)) * 1000
    assert bytes(decompress(codec, compress(codec, data), len(data))) == data
    # A first guess far above what is written: the buffer comes back trimmed.
    small = decompress(codec, compress(codec, b"x" * 10), MIB)
    assert bytes(small) == b"x" * 10 and len(small) == 10


@pytest.mark.parametrize("codec", [Compression.NONE, *CODECS])
def test_one_byte_over_the_limit_is_refused(codec: Compression) -> None:
    data = b"\x00" * (64 * 1024 + 1)
    with pytest.raises(DecompressedTooLargeError):
        decompress(codec, compress(codec, data), len(data) - 1)


def test_raw_snappy_is_refused_from_its_declared_length() -> None:
    """librdkafka's raw snappy declares the output length first: nothing is decompressed."""
    bomb = bytes(cramjam.snappy.compress_raw(b"\x00" * (8 * MIB)))
    tracemalloc.start()
    try:
        with pytest.raises(DecompressedTooLargeError):
            decompress(Compression.SNAPPY, bomb, MIB)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes < MIB


def test_xerial_snappy_is_bounded_as_a_whole_and_says_its_limit() -> None:
    """Many blocks each under the limit, together over it: refused before any output, and
    the message names the limit, not what was left of it."""
    data = b"\x00" * (200 * 1024)
    framed = compress(Compression.SNAPPY, data)  # 32 KiB blocks
    limit = 100 * 1024
    with pytest.raises(DecompressedTooLargeError, match=f"more than {limit} bytes"):
        decompress(Compression.SNAPPY, framed, limit)
    assert bytes(decompress(Compression.SNAPPY, framed, len(data))) == data


@pytest.mark.parametrize(
    "framed",
    [
        b"\x82SNAPPY\x00",  # the magic without its version fields
        b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00",  # a length cut short
        b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x09abc",  # overruns
        b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01\xff\xff\xff\xff",  # negative
    ],
)
def test_broken_xerial_framing_is_corrupt(framed: bytes) -> None:
    with pytest.raises(CorruptRecordError) as info:
        decompress(Compression.SNAPPY, framed, MIB)
    assert not isinstance(info.value, DecompressedTooLargeError)


@pytest.mark.parametrize("codec", CODECS)
def test_bytes_that_do_not_decompress_are_corrupt(codec: Compression) -> None:
    with pytest.raises(CorruptRecordError) as info:
        decompress(codec, b"\xff" * 64, MIB)
    assert not isinstance(info.value, DecompressedTooLargeError)


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """A CRC-correct batch of a few KiB whose one record decompresses to just over
    DECOMPRESSED_BATCH_MAX_BYTES (zstd of zeros)."""
    value = bytes(DECOMPRESSED_BATCH_MAX_BYTES)
    batch = build_batch(
        [Record(key=b"k", value=value, timestamp_ms=0)], compression=Compression.ZSTD
    )
    del value
    assert len(batch) < 64 * 1024
    return batch


def test_a_reader_refuses_a_bomb_without_holding_it(bomb: bytes) -> None:
    """What the cleaner, the coordinators' loaders, the consumer client and the Spark source
    read goes through iter_records: the bomb is a corrupt batch, and the reader never holds
    much more than the limit."""
    tracemalloc.start()
    try:
        with pytest.raises(DecompressedTooLargeError):
            list(iter_records(bomb))
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes < DECOMPRESSED_BATCH_MAX_BYTES + 32 * MIB


def test_produce_refuses_a_bomb_even_when_max_message_bytes_allows_it(bomb: bytes) -> None:
    """max.message.bytes may be set up to 2 GiB: produce still takes nothing a reader of the
    log would refuse."""
    with pytest.raises(KafkaError) as info:
        validate_client_batches(bomb, max_message_bytes=I32_MAX)
    assert info.value.code == ErrorCode.message_too_large
