"""Shared builders for storage tests."""

from __future__ import annotations

from raftlog.records import Record, build_batch


def batch(
    count: int = 3,
    *,
    key_prefix: bytes = b"k",
    value_bytes: int = 20,
    ts_ms: int = 1000,
    keys: list[bytes] | None = None,
    values: list[bytes | None] | None = None,
) -> bytes:
    records = []
    for i in range(count):
        key = keys[i] if keys is not None else key_prefix + str(i).encode()
        value = values[i] if values is not None else bytes([65 + i % 26]) * value_bytes
        records.append(Record(key=key, value=value, timestamp_ms=ts_ms + i))
    return build_batch(records)
