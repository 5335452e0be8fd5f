"""Transaction markers (Kafka's COMMIT/ABORT control batches): build, parse, range checks."""

from __future__ import annotations

import struct

import pytest

from raftlog.errors import CorruptRecordError
from raftlog.records import (
    ControlType,
    Record,
    build_batch,
    build_txn_marker,
    iter_records,
    parse_header,
    parse_txn_marker,
    validate_batch,
)


@pytest.mark.parametrize("commit", [True, False])
def test_marker_round_trips_with_kafkas_layout(commit: bool) -> None:
    data = build_txn_marker(
        producer_id=77, producer_epoch=3, coordinator_epoch=9, commit=commit, timestamp_ms=5
    )
    header = validate_batch(data)
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (77, 3, -1)
    assert header.record_count == 1
    (record,) = iter_records(data)
    # Kafka's bytes: key = version 0, type; value = version 0, coordinator epoch.
    assert record.key == struct.pack(">hh", 0, 1 if commit else 0)
    assert record.value == struct.pack(">hi", 0, 9)
    marker = parse_txn_marker(data)
    assert marker is not None
    assert marker.commit is commit
    assert marker.control_type == (ControlType.COMMIT if commit else ControlType.ABORT)
    assert (marker.producer_id, marker.producer_epoch, marker.coordinator_epoch) == (77, 3, 9)


def _control(key: bytes | None, value: bytes | None, *, transactional: bool = True) -> bytes:
    return build_batch(
        [Record(key=key, value=value, timestamp_ms=1)],
        producer_id=5,
        producer_epoch=1,
        is_transactional=transactional,
        is_control=True,
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_control(b"\x00", struct.pack(">hi", 0, 1)), "key of 1 bytes"),
        (_control(None, struct.pack(">hi", 0, 1)), "key of 0 bytes"),
        (_control(struct.pack(">hh", -1, 1), struct.pack(">hi", 0, 1)), "negative version"),
        (_control(struct.pack(">hh", 0, 1), b"\x00\x00"), "value of 2 bytes"),
        (_control(struct.pack(">hh", 0, 0), struct.pack(">hi", 0, -4)), "coordinator epoch -4"),
        (
            _control(struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 1), transactional=False),
            "not transactional",
        ),
        (build_batch([Record(value=b"x", timestamp_ms=1)]), "not a control batch"),
    ],
)
def test_malformed_markers_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(CorruptRecordError, match=message):
        parse_txn_marker(data)


def test_two_records_in_a_control_batch_are_refused() -> None:
    key, value = struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 1)
    data = build_batch(
        [Record(key=key, value=value, timestamp_ms=1)] * 2,
        producer_id=5,
        producer_epoch=1,
        is_transactional=True,
        is_control=True,
    )
    with pytest.raises(CorruptRecordError, match="2 records"):
        parse_txn_marker(data)


def test_other_control_types_and_newer_versions() -> None:
    # KRaft's LEADER_CHANGE (type 2) is a control batch but no transaction marker.
    assert parse_txn_marker(_control(struct.pack(">hh", 0, 2), b"")) is None
    # Kafka reads a newer key/value version as version 0 (later versions only append).
    newer = _control(struct.pack(">hh", 1, 0) + b"xx", struct.pack(">hi", 1, 4) + b"yy")
    marker = parse_txn_marker(newer)
    assert marker is not None and not marker.commit and marker.coordinator_epoch == 4


@pytest.mark.parametrize(
    "kwargs",
    [
        {"producer_id": -1},
        {"producer_epoch": -1},
        {"producer_epoch": 2**15},
        {"coordinator_epoch": -1},
        {"coordinator_epoch": 2**31},
    ],
)
def test_builder_range_checks(kwargs: dict[str, int]) -> None:
    args = {"producer_id": 1, "producer_epoch": 0, "coordinator_epoch": 0, **kwargs}
    with pytest.raises(ValueError):
        build_txn_marker(commit=True, **args)


def test_marker_header_is_at_the_given_offset() -> None:
    data = build_txn_marker(
        producer_id=1, producer_epoch=0, coordinator_epoch=0, commit=True, base_offset=42
    )
    assert parse_header(data).base_offset == 42
