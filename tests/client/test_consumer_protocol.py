"""Sans-IO parts of the group member: the consumer protocol bytes, Kafka's range assignor,
and what a heartbeat answer makes the member do."""

from __future__ import annotations

import io
import struct

import pytest
from kio.schema.consumer_protocol_assignment.v3.data import (
    ConsumerProtocolAssignment as AssignmentV3,
)
from kio.schema.consumer_protocol_assignment.v3.data import TopicPartition as AssignedV3
from kio.schema.consumer_protocol_subscription.v3.data import (
    ConsumerProtocolSubscription as SubscriptionV3,
)
from kio.schema.consumer_protocol_subscription.v3.data import TopicPartition as OwnedV3
from kio.schema.types import TopicName
from kio.serial import entity_writer
from kio.static.primitive import i32

from raftlog.client.consumer_protocol import (
    ConsumerProtocolError,
    GroupMemberMetadata,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    range_assign,
)
from raftlog.client.group_member import (
    MemberConfig,
    Outcome,
    commit_allowed_after,
    heartbeat_outcome,
)
from raftlog.client.groups import described_assignment
from raftlog.errors import ErrorCode
from tests.cli.group_handlers import encode_assignment as hand_encoded_assignment


def member(member_id: str, *topics: str, instance: str | None = None) -> GroupMemberMetadata:
    return GroupMemberMetadata(member_id, instance, Subscription(topics))


# ------------------------------------------------------------------------------ encoding
def test_subscription_v0_bytes_are_kafkas_layout() -> None:
    data = encode_subscription(Subscription(("orders", "clicks")))
    # int16 version 0, array of 2 strings, null user data.
    assert data == (
        struct.pack(">hi", 0, 2)
        + struct.pack(">h", 6)
        + b"orders"
        + struct.pack(">h", 6)
        + b"clicks"
        + struct.pack(">i", -1)
    )
    assert decode_subscription(data) == Subscription(("orders", "clicks"))


def test_assignment_matches_the_hand_encoding_and_the_describe_decoder() -> None:
    pairs = [("orders", 2), ("orders", 0), ("clicks", 1)]
    data = encode_assignment(pairs)
    # Topics by name, partitions ascending: the same bytes the test coordinator hand-encodes.
    assert data == hand_encoded_assignment([("clicks", 1), ("orders", 0), ("orders", 2)])
    assert decode_assignment(data) == frozenset(pairs)
    assert described_assignment(data) == tuple(sorted(pairs))
    assert described_assignment(None) == described_assignment(b"\x00") == ()
    assert described_assignment(data[:-3]) == ()
    assert decode_assignment(b"") == frozenset()
    assert decode_assignment(encode_assignment([])) == frozenset()


def _v3(entity: SubscriptionV3 | AssignmentV3) -> bytes:
    buffer = io.BytesIO()
    buffer.write(struct.pack(">h", 3))
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def test_newer_versions_from_other_clients_are_read() -> None:
    """A Java consumer writes subscription v3 (owned partitions, generation, rack)."""
    subscription = SubscriptionV3(
        topics=("orders",),
        user_data=b"u",
        owned_partitions=(OwnedV3(topic=TopicName("orders"), partitions=(i32(0), i32(1))),),
        generation_id=i32(7),
        rack_id="r1",
    )
    assert decode_subscription(_v3(subscription)) == Subscription(("orders",), b"u")
    assignment = AssignmentV3(
        assigned_partitions=(AssignedV3(topic=TopicName("orders"), partitions=(i32(3),)),),
        user_data=None,
    )
    assert decode_assignment(_v3(assignment)) == frozenset({("orders", 3)})
    # A version beyond what kio models is read as the newest one (fields are only appended).
    future = struct.pack(">h", 9) + _v3(assignment)[2:] + b"\x00\x01trailing"
    assert decode_assignment(future) == frozenset({("orders", 3)})


@pytest.mark.parametrize(
    "data",
    [b"\x00", struct.pack(">hi", 0, 3), struct.pack(">hih", 0, 1, 40) + b"short", b"\xff\xff"],
)
def test_bad_bytes_raise_a_clear_error(data: bytes) -> None:
    with pytest.raises(ConsumerProtocolError):
        decode_subscription(data)
    with pytest.raises(ConsumerProtocolError):
        decode_assignment(data)


# ------------------------------------------------------------------------------ range
def test_range_splits_each_topic_in_contiguous_ranges_extra_to_the_first() -> None:
    # Kafka's RangeAssignorTest.testTwoConsumersTwoTopicsSixPartitions and friends.
    plan = range_assign([member("c1", "t1", "t2"), member("c0", "t1", "t2")], {"t1": 3, "t2": 3})
    assert plan == {
        "c0": frozenset({("t1", 0), ("t1", 1), ("t2", 0), ("t2", 1)}),
        "c1": frozenset({("t1", 2), ("t2", 2)}),
    }
    plan = range_assign([member(f"m{i}", "t") for i in range(3)], {"t": 4})
    assert plan == {
        "m0": frozenset({("t", 0), ("t", 1)}),
        "m1": frozenset({("t", 2)}),
        "m2": frozenset({("t", 3)}),
    }


def test_range_more_members_than_partitions_and_unknown_topics() -> None:
    plan = range_assign([member("a", "t"), member("b", "t"), member("c", "gone")], {"t": 1})
    assert plan == {"a": frozenset({("t", 0)}), "b": frozenset(), "c": frozenset()}
    assert range_assign([], {"t": 4}) == {}


def test_range_only_subscribers_share_a_topic() -> None:
    plan = range_assign([member("a", "t1"), member("b", "t1", "t2")], {"t1": 2, "t2": 2})
    assert plan == {
        "a": frozenset({("t1", 0)}),
        "b": frozenset({("t1", 1), ("t2", 0), ("t2", 1)}),
    }


def test_range_orders_static_members_by_instance_id_first() -> None:
    members = [
        member("m-a", "t"),
        member("m-z", "t", instance="i-2"),
        member("m-b", "t", instance="i-1"),
    ]
    plan = range_assign(members, {"t": 3})
    assert plan == {
        "m-b": frozenset({("t", 0)}),
        "m-z": frozenset({("t", 1)}),
        "m-a": frozenset({("t", 2)}),
    }


def test_range_covers_every_partition_exactly_once() -> None:
    for members in range(1, 7):
        for partitions in range(0, 13):
            plan = range_assign([member(f"m{i}", "t") for i in range(members)], {"t": partitions})
            assigned = [tp for tps in plan.values() for tp in tps]
            assert sorted(assigned) == [("t", p) for p in range(partitions)]
            sizes = sorted(len(tps) for tps in plan.values())
            assert sizes[-1] - sizes[0] <= 1


def test_range_refuses_duplicate_member_ids() -> None:
    with pytest.raises(ValueError, match="unique"):
        range_assign([member("a", "t"), member("a", "t")], {"t": 2})


# ------------------------------------------------------------------------------ outcomes
@pytest.mark.parametrize(
    ("code", "outcome", "commit_first"),
    [
        (ErrorCode.none, Outcome.OK, True),
        (ErrorCode.rebalance_in_progress, Outcome.REJOIN, True),
        (ErrorCode.not_coordinator, Outcome.FIND_COORDINATOR, True),
        (ErrorCode.coordinator_not_available, Outcome.FIND_COORDINATOR, True),
        (ErrorCode.coordinator_load_in_progress, Outcome.FIND_COORDINATOR, True),
        (ErrorCode.illegal_generation, Outcome.STALE_GENERATION, False),
        (ErrorCode.unknown_member_id, Outcome.UNKNOWN_MEMBER, False),
        (ErrorCode.fenced_instance_id, Outcome.FATAL, False),
        (ErrorCode.group_authorization_failed, Outcome.FATAL, False),
    ],
)
def test_heartbeat_answers(code: ErrorCode, outcome: Outcome, commit_first: bool) -> None:
    assert heartbeat_outcome(code) is outcome
    if outcome is not Outcome.OK:
        assert commit_allowed_after(outcome) is commit_first


def test_member_config_is_validated() -> None:
    with pytest.raises(ValueError, match="below"):
        MemberConfig(session_timeout_ms=6_000, heartbeat_interval_ms=6_000)
    with pytest.raises(ValueError, match="max_join_attempts"):
        MemberConfig(max_join_attempts=0)
    with pytest.raises(ValueError, match="retry_backoff"):
        MemberConfig(retry_backoff_ms=500, retry_backoff_max_ms=100)
