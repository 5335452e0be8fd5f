"""Wire round trips of the Raft messages (msgpack-able structures, no pickle)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlog.codec import DecodeError
from raftlog.metadata.raft.messages import (
    BeginQuorumEpoch,
    BeginQuorumEpochResponse,
    DivergingEpoch,
    EndQuorumEpoch,
    EndQuorumEpochResponse,
    Entry,
    Fetch,
    FetchResponse,
    FetchSnapshot,
    FetchSnapshotResponse,
    SnapshotId,
    Vote,
    VoteResponse,
    message_from_wire,
)


def message_strategy(ints: st.SearchStrategy[int]) -> st.SearchStrategy[object]:
    """Any protocol message whose integer fields come from `ints`."""
    opt_ints = st.none() | ints
    entries = st.builds(Entry, ints, ints, st.binary(max_size=64))
    snapshot_ids = st.builds(SnapshotId, ints, ints)
    return st.one_of(
        st.builds(Vote, st.booleans(), ints, ints, ints, ints),
        st.builds(VoteResponse, st.booleans(), ints, opt_ints, st.booleans(), ints),
        st.builds(BeginQuorumEpoch, ints, ints),
        st.builds(BeginQuorumEpochResponse, ints, opt_ints, ints),
        st.builds(EndQuorumEpoch, ints, ints, st.lists(ints, max_size=5).map(tuple)),
        st.builds(EndQuorumEpochResponse, ints, opt_ints, ints),
        st.builds(Fetch, ints, ints, ints, ints, ints, ints),
        st.builds(
            FetchResponse,
            ints,
            opt_ints,
            ints,
            ints,
            ints,
            st.lists(entries, max_size=4).map(tuple),
            st.none() | st.builds(DivergingEpoch, ints, ints),
            st.none() | snapshot_ids,
            ints,
            ints,
        ),
        st.builds(FetchSnapshot, ints, ints, snapshot_ids, ints, ints),
        st.builds(
            FetchSnapshotResponse,
            ints,
            opt_ints,
            st.none() | snapshot_ids,
            ints,
            st.binary(max_size=64),
            ints,
            ints,
        ),
    )


# Within every field's declared range (error codes are int16); the bounds have their own test.
messages = message_strategy(st.integers(min_value=0, max_value=2**15 - 1))


@given(messages)
def test_round_trip_through_msgpack(message: object) -> None:
    wire = msgpack.unpackb(msgpack.packb(message.to_wire()))  # type: ignore[attr-defined]
    assert message_from_wire(wire) == message
    assert type(message).from_wire(wire) == message


@pytest.mark.parametrize(
    "wire",
    [
        [],
        [99],
        "fetch",
        [1, True, 1, 2, 3],  # Vote with a field missing
        [1, "yes", 1, 2, 3, 4],  # pre_vote must be a bool
        [7, 1, 1, 0, 0, None],  # Fetch.max_wait_ms may not be None
        [8, 1, 1, 0, 0, 0, [[1, 2]], None, None, 0],  # entry with two fields
        [10, 1, 1, None, 0, "text", 4, 0],  # chunk must be bytes
    ],
)
def test_malformed_wire_is_rejected(wire: object) -> None:
    with pytest.raises(DecodeError):
        message_from_wire(wire)


def test_wrong_tag_for_class() -> None:
    with pytest.raises(DecodeError):
        Fetch.from_wire([*BeginQuorumEpoch(1, 2).to_wire(), 0, 0, 0])


def test_declared_bounds_hold_at_both_ends() -> None:
    widest = FetchResponse(2**31 - 1, 2**31 - 1, 2**63 - 1, -1, 2**63 - 1, error=-(2**15))
    assert message_from_wire(widest.to_wire()) == widest
    for wire in (
        [7, 1, -2, 0, 0, 0, 0],  # negative epoch
        [7, 1, 1, -2, 0, 0, 0],  # negative fetch offset
        [7, 1, 2**31, 0, 0, 0, 0],  # epoch above int32
        [7, 1, 1, 2**63, 0, 0, 0],  # offset above int64
        [7, 1, 1, 0, 0, -1, 0],  # negative max_wait_ms
        [2, False, 1, None, True, 2**15],  # error code above int16
    ):
        with pytest.raises(DecodeError, match="outside"):
            message_from_wire(wire)
