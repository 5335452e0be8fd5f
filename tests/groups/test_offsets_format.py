import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlog.errors import CorruptRecordError
from raftlog.groups import offsets_format as fmt

names = st.text(max_size=20)
ints = st.integers(-(2**63), 2**63 - 1)
offsets = st.builds(fmt.CommittedOffset, ints, st.integers(-1, 2**31 - 1), names, ints)
members = st.builds(
    fmt.MemberMetadataValue,
    names,
    st.none() | names,
    names,
    names,
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**31 - 1),
    st.binary(max_size=50),
    st.binary(max_size=50),
)
groups = st.builds(
    fmt.GroupMetadataValue,
    st.none() | names,
    st.integers(0, 2**31 - 1),
    st.none() | names,
    st.none() | names,
    ints,
    st.lists(members, max_size=4).map(tuple),
)


@given(names, names, st.integers(0, 2**31 - 1), offsets)
def test_offset_commit_round_trip(group: str, topic: str, partition: int, value) -> None:
    key = fmt.OffsetKey(group, topic, partition)
    key_bytes, value_bytes = fmt.offset_commit_record(key, value)
    assert fmt.decode_key(key_bytes) == key
    assert value_bytes is not None
    assert fmt.decode_offset_value(value_bytes) == value
    # The compaction key does not depend on the value.
    assert fmt.offset_tombstone(key) == (key_bytes, None)


@given(names, groups)
def test_group_metadata_round_trip(group_id: str, value) -> None:
    key_bytes, value_bytes = fmt.group_metadata_record(group_id, value)
    assert fmt.decode_key(key_bytes) == fmt.GroupKey(group_id)
    assert value_bytes is not None
    assert fmt.decode_group_value(value_bytes) == value


def test_offset_and_group_keys_never_collide() -> None:
    assert fmt.group_key("g") != fmt.offset_key("g", "", 0)


def test_replay_last_value_wins_and_tombstones_delete() -> None:
    k1 = fmt.OffsetKey("g", "t", 0)
    k2 = fmt.OffsetKey("g", "t", 1)
    v = [fmt.CommittedOffset(i, -1, "", 0) for i in range(3)]
    gv = fmt.GroupMetadataValue("consumer", 3, "range", None, 0, ())
    records = [
        fmt.offset_commit_record(k1, v[0]),
        fmt.offset_commit_record(k2, v[1]),
        fmt.group_metadata_record("g", gv),
        fmt.offset_commit_record(k1, v[2]),
        fmt.offset_tombstone(k2),
        fmt.group_metadata_record("h", gv),
        fmt.group_tombstone("h"),
    ]
    replayed = fmt.replay(records)
    assert replayed.offsets == {k1: v[2]}
    assert replayed.groups == {"g": gv}


@pytest.mark.parametrize(
    "key",
    [
        b"\xc1",  # never-used msgpack byte
        msgpack.packb([9, "g"]),  # unknown key kind
        msgpack.packb([1, "g", "t"]),  # offset key missing the partition
        msgpack.packb([1, "g", "t", "0"]),  # partition of the wrong type
        msgpack.packb({"k": 1}),
    ],
)
def test_bad_keys_are_refused(key: bytes) -> None:
    with pytest.raises(CorruptRecordError):
        fmt.decode_key(key)


def test_unknown_value_version_is_refused() -> None:
    good = fmt.offset_commit_record(fmt.OffsetKey("g", "t", 0), fmt.CommittedOffset(1, -1, "", 0))[
        1
    ]
    assert good is not None
    body = msgpack.unpackb(good)
    body["v"] = 99
    with pytest.raises(CorruptRecordError, match="version"):
        fmt.decode_offset_value(msgpack.packb(body))
    del body["v"]
    body["v"] = 1
    body["offset"] = "x"
    with pytest.raises(CorruptRecordError, match="offset"):
        fmt.decode_offset_value(msgpack.packb(body))
