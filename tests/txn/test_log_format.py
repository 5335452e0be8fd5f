"""`__transaction_state` records: Kafka's bytes, round trips, tombstones and hostile input."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlog.txn import log_format as fmt
from raftlog.txn.log_format import TransactionLogValue, TransactionState, TxnLogRecordError

S = TransactionState


def value(**overrides: object) -> TransactionLogValue:
    fields: dict[str, object] = {
        "producer_id": 5,
        "producer_epoch": 1,
        "transaction_timeout_ms": 60_000,
        "state": S.ONGOING,
        "partitions": (("a", 0), ("a", 2), ("b", 1)),
        "last_update_timestamp_ms": 10,
        "start_timestamp_ms": 9,
    }
    fields.update(overrides)
    return TransactionLogValue(**fields)  # type: ignore[arg-type]


def kafka_string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def test_key_is_kafkas_version_0():
    assert fmt.encode_key("tx-1") == b"\x00\x00" + kafka_string("tx-1")
    assert fmt.decode_key(fmt.encode_key("tx-1")) == "tx-1"


def test_value_v0_is_kafkas_layout():
    expected = (
        struct.pack(">hqhib", 0, 5, 1, 60_000, 1)
        + struct.pack(">i", 2)  # two topics
        + kafka_string("a")
        + struct.pack(">iii", 2, 0, 2)
        + kafka_string("b")
        + struct.pack(">ii", 1, 1)
        + struct.pack(">qq", 10, 9)
    )
    assert fmt.encode_value(value()) == expected
    assert fmt.decode_value(expected) == value()


def test_empty_transaction_stores_null_partitions():
    empty = value(state=S.EMPTY, partitions=(), start_timestamp_ms=-1)
    encoded = fmt.encode_value(empty)
    assert encoded == struct.pack(">hqhib", 0, 5, 1, 60_000, 0) + struct.pack(">iqq", -1, 10, -1)
    assert fmt.decode_value(encoded) == empty


def test_complete_transaction_stores_an_empty_list():
    done = value(state=S.COMPLETE_COMMIT, partitions=())
    assert fmt.encode_value(done)[17:21] == struct.pack(">i", 0)
    assert fmt.decode_value(fmt.encode_value(done)) == done


def test_value_v1_is_flexible_with_tagged_fields():
    v1 = value(partitions=(("t", 0), ("t", 3)), previous_producer_id=3)
    expected = (
        struct.pack(">hqhib", 1, 5, 1, 60_000, 1)
        + b"\x02"  # compact array of one topic
        + b"\x02t"  # compact string
        + b"\x03"
        + struct.pack(">ii", 0, 3)
        + b"\x00"  # the topic entry's tagged fields
        + struct.pack(">qq", 10, 9)
        + b"\x01\x00\x08"  # one tagged field: tag 0, 8 bytes
        + struct.pack(">q", 3)
    )
    assert fmt.encode_value(v1) == expected
    assert fmt.decode_value(expected) == v1


def test_v1_without_tags_reads_defaults_and_v0_refuses_v1_fields():
    plain = value()
    assert fmt.decode_value(fmt.encode_value(plain, version=1)) == plain
    with pytest.raises(ValueError, match="version 0"):
        fmt.encode_value(value(next_producer_id=7), version=0)
    all_tags = value(previous_producer_id=1, next_producer_id=2, client_transaction_version=2)
    assert fmt.decode_value(fmt.encode_value(all_tags)) == all_tags


def test_unknown_tagged_fields_are_refused():
    # kio reads only the tags it is told of: a tag from a newer schema is refused by name
    # (the partition stays unloaded) rather than dropped on the next write.
    encoded = fmt.encode_value(value(), version=1)
    with_unknown = encoded[:-1] + b"\x01\x09\x02\xab\xcd"
    with pytest.raises(TxnLogRecordError, match="tag"):
        fmt.decode_value(with_unknown)


def test_tombstone_and_replay():
    records = [
        fmt.record("a", value()),
        fmt.record("b", value(producer_id=6)),
        fmt.record("a", value(state=S.PREPARE_COMMIT)),
        fmt.record("b", None),
        fmt.record("c", value(state=S.DEAD, partitions=())),
    ]
    assert records[3] == (fmt.encode_key("b"), None)
    assert fmt.decode_value(None) is None
    assert fmt.replay(records) == {"a": value(state=S.PREPARE_COMMIT)}


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"producer_id": -1}, "producer id"),
        ({"producer_epoch": 2**15}, "epoch"),
        ({"producer_epoch": -1}, "epoch"),
        ({"transaction_timeout_ms": 0}, "timeout"),
        ({"partitions": (("b", 0), ("a", 0))}, "sorted"),
        ({"partitions": (("a", -1),)}, "partition"),
        ({"partitions": (("", 0),)}, "topic"),
        ({"state": S.EMPTY}, "Empty"),
        ({"state": S.PREPARE_EPOCH_FENCE}, "never stored"),
        ({"start_timestamp_ms": -2}, "start_timestamp_ms"),
    ],
)
def test_encode_range_checks(overrides, problem):
    with pytest.raises(ValueError, match=problem):
        fmt.encode_value(value(**overrides))


def test_encode_key_range_checks():
    with pytest.raises(ValueError):
        fmt.encode_key("")
    with pytest.raises(ValueError):
        fmt.encode_key("x" * 2**15)


GOOD = fmt.encode_value(value())


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "no version"),
        (b"\x00", "no version"),
        (b"\x00\x02" + GOOD[2:], "unknown version 2"),
        (b"\xff\xff" + GOOD[2:], "unknown version -1"),
        (GOOD[:-1], "does not decode"),
        (GOOD + b"\x00", "1 bytes after"),
        (GOOD[:16] + b"\x09" + GOOD[17:], "unknown status 9"),
        (GOOD[:17] + struct.pack(">i", 2**31 - 1) + GOOD[21:], "does not decode"),
        (GOOD[:2] + struct.pack(">q", -5) + GOOD[10:], "producer id"),
        (struct.pack(">h", 0) + b"\x00" * (fmt.MAX_VALUE_BYTES), "bytes"),
    ],
)
def test_hostile_values_are_refused(data, problem):
    with pytest.raises(TxnLogRecordError, match=problem):
        fmt.decode_value(data)


def test_duplicate_topics_and_partitions_are_refused():
    twice = (
        struct.pack(">hqhib", 0, 5, 1, 60_000, 1)
        + struct.pack(">i", 2)
        + kafka_string("a")
        + struct.pack(">ii", 1, 0)
        + kafka_string("a")
        + struct.pack(">ii", 1, 1)
        + struct.pack(">qq", 10, 9)
    )
    with pytest.raises(TxnLogRecordError, match="twice"):
        fmt.decode_value(twice)
    repeated = (
        struct.pack(">hqhib", 0, 5, 1, 60_000, 1)
        + struct.pack(">i", 1)
        + kafka_string("a")
        + struct.pack(">iii", 2, 0, 0)
        + struct.pack(">qq", 10, 9)
    )
    with pytest.raises(TxnLogRecordError, match="twice"):
        fmt.decode_value(repeated)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00\x01" + kafka_string("x"),
        b"\x00\x00" + kafka_string(""),
        b"\x00\x00\x00\x05ab",
        b"\x00\x00" + kafka_string("x") + b"!",
        b"\x00\x00\x00\x02\xff\xfe",
    ],
)
def test_hostile_keys_are_refused(data):
    with pytest.raises(TxnLogRecordError):
        fmt.decode_key(data)


def test_replay_refuses_a_record_without_key():
    with pytest.raises(TxnLogRecordError):
        fmt.replay([(None, GOOD)])  # type: ignore[list-item]


partitions = st.lists(
    st.tuples(st.text(min_size=1, max_size=20), st.integers(0, 2**31 - 1)), max_size=20
).map(lambda ps: tuple(sorted(set(ps))))


@st.composite
def values(draw: st.DrawFn) -> TransactionLogValue:
    state = draw(st.sampled_from([s for s in S if s is not S.PREPARE_EPOCH_FENCE]))
    return TransactionLogValue(
        producer_id=draw(st.integers(0, 2**63 - 1)),
        producer_epoch=draw(st.integers(0, 2**15 - 1)),
        transaction_timeout_ms=draw(st.integers(1, 2**31 - 1)),
        state=state,
        partitions=() if state is S.EMPTY else draw(partitions),
        last_update_timestamp_ms=draw(st.integers(-1, 2**63 - 1)),
        start_timestamp_ms=draw(st.integers(-1, 2**63 - 1)),
        previous_producer_id=draw(st.integers(-1, 2**63 - 1)),
        next_producer_id=draw(st.integers(-1, 2**63 - 1)),
        client_transaction_version=draw(st.integers(0, 2**15 - 1)),
    )


@given(values(), st.sampled_from([None, 1]))
def test_round_trip(v, version):
    assert fmt.decode_value(fmt.encode_value(v, version)) == v


@given(st.text(min_size=1, max_size=200))
def test_key_round_trip(transactional_id):
    assert fmt.decode_key(fmt.encode_key(transactional_id)) == transactional_id


@given(st.binary(max_size=200))
def test_random_bytes_decode_or_refuse(data):
    for decode in (fmt.decode_value, fmt.decode_key):
        try:
            decode(data)
        except TxnLogRecordError:
            pass


@given(values(), st.data())
def test_corrupted_values_decode_or_refuse(v, data):
    encoded = bytearray(fmt.encode_value(v))
    index = data.draw(st.integers(0, len(encoded) - 1))
    encoded[index] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(encoded)))
    for candidate in (bytes(encoded), bytes(encoded[:cut])):
        try:
            decoded = fmt.decode_value(candidate)
        except TxnLogRecordError:
            continue
        assert decoded is not None and decoded.check() is None
