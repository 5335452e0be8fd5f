"""A read decodes a bounded amount: many small, highly compressed batches (each within the
limits produce enforces) cannot expand one fetch, or one Spark chunk, without bound.

The batches are real zstd batches of 1 MiB values of zeros, a few hundred bytes each on the
wire: what a producer allowed to write to a topic could send to exhaust its readers' memory.
"""

from __future__ import annotations

import pytest

from raftlog.client.consumer import (
    DECODED_HEADER_OVERHEAD_BYTES,
    DECODED_RECORD_OVERHEAD_BYTES,
    decode_records,
    decoded_size_bytes,
)
from raftlog.constants import MIB
from raftlog.records import Compression, Record, build_batch

VALUE_BYTES = MIB


def bombs(count: int, base_offset: int = 0) -> bytes:
    """`count` one-record zstd batches of a 1 MiB value, at consecutive offsets."""
    one = build_batch([Record(value=bytes(VALUE_BYTES))], compression=Compression.ZSTD, now_ms=1)
    out = bytearray()
    for i in range(count):
        batch = bytearray(one)
        batch[0:8] = (base_offset + i).to_bytes(8, "big")
        out += batch
    return bytes(out)


def test_a_bomb_batch_is_tiny_on_the_wire() -> None:
    assert len(bombs(1)) < VALUE_BYTES // 1000


def test_decoding_stops_at_the_batch_that_spends_the_budget() -> None:
    data = bombs(100, base_offset=50)
    decoded = decode_records(data, budget_bytes=3 * VALUE_BYTES)
    assert [r.offset for r in decoded.records] == [50, 51, 52]
    # The next read starts right after the last batch decoded, not after the response.
    assert decoded.next_offset == 53


def test_a_read_always_moves_on() -> None:
    decoded = decode_records(bombs(5, base_offset=7), budget_bytes=1)
    assert [r.offset for r in decoded.records] == [7]
    assert decoded.next_offset == 8


def test_the_default_budget_reads_ordinary_responses_whole() -> None:
    records = [Record(key=b"k%d" % i, value=b"v" * 100) for i in range(1000)]
    data = build_batch(records, compression=Compression.ZSTD, now_ms=1)
    decoded = decode_records(data)
    assert len(decoded.records) == 1000 and decoded.next_offset == 1000


def test_many_empty_headers_spend_the_budget_as_their_objects_would() -> None:
    """Headers are 4 bytes each on the wire but over 100 bytes each once decoded: a batch of
    nothing but empty headers must not pass for a few bytes."""
    headers = tuple(("", b"") for _ in range(10_000))
    one = build_batch([Record(headers=headers)], compression=Compression.ZSTD, now_ms=1)
    data = bytearray()
    for offset in range(50):
        batch = bytearray(one)
        batch[0:8] = offset.to_bytes(8, "big")
        data += batch
    decoded = decode_records(bytes(data), budget_bytes=3 * 10_000 * DECODED_HEADER_OVERHEAD_BYTES)
    assert decoded.next_offset == 3 and len(decoded.records) == 3


def test_empty_records_are_counted_by_what_they_hold_in_memory() -> None:
    empty = [Record(offset=i) for i in range(10)]
    assert decoded_size_bytes(empty) == 10 * DECODED_RECORD_OVERHEAD_BYTES
    with_headers = Record(key=b"ab", value=b"cde", headers=(("h", b"xy"), ("i", None)))
    assert decoded_size_bytes([with_headers]) == (
        DECODED_RECORD_OVERHEAD_BYTES + 2 + 3 + 2 * DECODED_HEADER_OVERHEAD_BYTES + 3 + 1
    )


@pytest.mark.parametrize("count", [0, 1])
def test_no_whole_batch_means_no_next_offset(count: int) -> None:
    data = bombs(count)
    assert decode_records(data[:-1] if data else b"").next_offset == -1
