import uuid

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.codec import DecodeError
from raftlog.errors import CorruptRecordError
from raftlog.metadata import records as r
from raftlog.metadata.records import RecordDecodeError, decode_record, encode_record

# Each field's declared range (records.py): ids and epochs int32 with -1 for "none", offsets
# and broker epochs int64, ports 16 bits, partition indexes and producer ids never negative.
offsets = st.integers(min_value=-1, max_value=2**63 - 1)
small = st.integers(min_value=-1, max_value=2**31 - 1)
indexes = st.integers(min_value=0, max_value=2**31 - 1)
ports = st.integers(min_value=0, max_value=65535)
producer_ids = st.integers(min_value=0, max_value=2**63 - 1)
levels = st.integers(min_value=0, max_value=2**15 - 1)
UUID_WIRE = msgpack.ExtType(1, bytes(16))
text = st.text(max_size=30)
uuids = st.uuids()
int_tuples = st.lists(small, max_size=6).map(tuple)
entities = st.lists(
    st.tuples(st.sampled_from(["user", "client-id", "ip"]), st.none() | text), max_size=2
).map(tuple)
quota_values = st.none() | st.floats(allow_nan=False, allow_infinity=False)

RECORDS = st.one_of(
    st.builds(r.RegisterBroker, small, uuids, offsets, text, ports, text, ports, st.none() | text),
    st.builds(r.FenceBroker, small, offsets),
    st.builds(r.UnfenceBroker, small, offsets),
    st.builds(r.BrokerShutdownBegin, small, offsets),
    st.builds(r.Topic, text, uuids),
    st.builds(r.Partition, uuids, indexes, int_tuples, int_tuples, small, small, small),
    st.builds(
        r.PartitionChange,
        uuids,
        indexes,
        st.none() | small,
        st.none() | int_tuples,
        st.none() | int_tuples,
    ),
    st.builds(r.RemoveTopic, uuids),
    st.builds(r.Config, st.sampled_from(r.RESOURCE_TYPES), text, text, st.none() | text),
    st.builds(r.ClientQuota, entities, text, quota_values),
    st.builds(r.ProducerIds, small, offsets, producer_ids),
    st.builds(r.LeaderChange, small, small),
    st.builds(r.FeatureLevel, text, levels),
    # ACLs and SCRAM credentials: their own bounds are tested in tests/metadata/test_acls_records.py
    st.builds(
        r.AccessControlEntry,
        uuids,
        st.integers(2, 5),
        text.filter(bool),
        st.integers(3, 4),
        text,
        text,
        st.integers(2, 14),
        st.integers(2, 3),
    ),
    st.builds(r.RemoveAccessControlEntry, uuids),
    st.sampled_from([(1, 32), (2, 64)]).flatmap(
        lambda mechanism_size: st.builds(
            r.UserScramCredential,
            text,
            st.just(mechanism_size[0]),
            st.binary(min_size=16, max_size=64),
            st.binary(min_size=mechanism_size[1], max_size=mechanism_size[1]),
            st.binary(min_size=mechanism_size[1], max_size=mechanism_size[1]),
            st.integers(4096, 16384),
        )
    ),
    st.builds(r.RemoveUserScramCredential, text, st.sampled_from([1, 2])),
    st.builds(r.UnregisterBroker, small, offsets),
)


@settings(max_examples=300, deadline=None)
@given(RECORDS)
def test_every_record_round_trips(record):
    data = encode_record(record)
    assert isinstance(data, bytes)
    assert decode_record(data) == record


def test_every_record_type_is_covered_by_the_strategy():
    # A new record type must be added to RECORDS above or it escapes the round-trip test.
    assert {cls.__name__ for cls in r.RECORD_TYPES.values()} == {
        "RegisterBroker",
        "FenceBroker",
        "UnfenceBroker",
        "BrokerShutdownBegin",
        "Topic",
        "Partition",
        "PartitionChange",
        "RemoveTopic",
        "Config",
        "ClientQuota",
        "ProducerIds",
        "LeaderChange",
        "FeatureLevel",
        "AccessControlEntry",
        "RemoveAccessControlEntry",
        "UserScramCredential",
        "RemoveUserScramCredential",
        "UnregisterBroker",
    }


def test_type_ids_are_unique():
    ids = [cls.TYPE_ID for cls in r.RECORD_TYPES.values()]
    assert len(ids) == len(set(ids))


def test_integer_quota_value_decodes_as_float():
    data = msgpack.packb([r.ClientQuota.TYPE_ID, 0, [["user", "a"]], "producer_byte_rate", 5])
    assert decode_record(data) == r.ClientQuota((("user", "a"),), "producer_byte_rate", 5.0)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ([99, 0, 1], "unknown metadata record type 99"),
        ([r.Topic.TYPE_ID, 7, "t", 1], "unsupported version 7 of metadata record type 5 (Topic)"),
        ([r.FenceBroker.TYPE_ID, 0, 1], "FenceBroker has 4 items on the wire, got 3"),
        ([r.FenceBroker.TYPE_ID, 0, "1", 2], "FenceBroker.broker_id has an invalid value"),
        ([r.FenceBroker.TYPE_ID, 0, True, 2], "FenceBroker.broker_id has an invalid value"),
        ([r.FenceBroker.TYPE_ID, 0, -2, 2], "FenceBroker.broker_id has an invalid value"),
        ([r.Topic.TYPE_ID, 0, "t", b"x" * 16], "Topic.topic_id has an invalid value"),
        ([r.Topic.TYPE_ID, 0, "t" * 250, None], "Topic.name has an invalid value"),
        ([r.PartitionChange.TYPE_ID, 0], "PartitionChange has 9 items on the wire"),
        ([r.PartitionChange.TYPE_ID, 0, None, -1, None, None, None], "PartitionChange.topic_id"),
        ([r.ProducerIds.TYPE_ID, 0, 1, 1, -5], "ProducerIds.next_producer_id"),
        ([r.FeatureLevel.TYPE_ID, 0, "metadata.version", 2**40], "FeatureLevel.level"),
        (
            [
                r.RegisterBroker.TYPE_ID,
                0,
                1,
                msgpack.ExtType(1, bytes(16)),
                1,
                "h",
                70000,
                "h",
                1,
                None,
            ],
            "RegisterBroker.client_port",
        ),
        ({"type": 1}, "must be [type_id, version, ...]"),
        ([1], "must be [type_id, version, ...]"),
    ],
)
def test_bad_records_are_refused_with_a_clear_error(payload, message):
    with pytest.raises(RecordDecodeError) as info:
        decode_record(msgpack.packb(payload))
    assert message in str(info.value)


def test_garbage_bytes_and_unknown_extension_are_refused():
    with pytest.raises(RecordDecodeError, match="not valid msgpack"):
        decode_record(b"\xc1\xc1")
    with pytest.raises(RecordDecodeError, match="not valid msgpack"):
        decode_record(encode_record(r.FenceBroker(1, 2))[:-1])
    ext = msgpack.packb([r.RemoveTopic.TYPE_ID, 0, msgpack.ExtType(9, b"x")])
    with pytest.raises(RecordDecodeError, match=r"RemoveTopic.topic_id .*code=9"):
        decode_record(ext)


def test_a_bad_record_is_a_decode_error_and_a_corrupt_record():
    with pytest.raises(DecodeError):
        decode_record(b"\xc1")
    with pytest.raises(CorruptRecordError):
        decode_record(b"\xc1")


def test_oversized_record_is_refused_before_parsing():
    with pytest.raises(RecordDecodeError, match="exceeds"):
        decode_record(b"\x00" * (r.MAX_RECORD_BYTES + 1))


def test_encode_refuses_non_records():
    with pytest.raises(TypeError):
        encode_record(uuid.uuid4())  # type: ignore[arg-type]
