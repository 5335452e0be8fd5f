"""The consumer protocol inside JoinGroup/SyncGroup, and Kafka's "range" assignor. Pure.

A classic group's coordinator treats member metadata and assignments as opaque bytes; the
consumer protocol gives them their meaning: each member's JoinGroup metadata is a
ConsumerProtocolSubscription (the topics it wants), the leader's SyncGroup carries one
ConsumerProtocolAssignment per member. Both are an int16 version followed by the kio entity
of that version; kio owns the field layout.

Reading follows Kafka's rule for these two schemas: fields are only ever appended, so a
version newer than the newest kio models is read as that newest version and the rest is
ignored (a Java consumer writes subscription v3 today; kafka-python writes v0).

`range_assign` is Kafka's RangeAssignor: per topic, the members subscribed to it are sorted
(static members by group_instance_id first, then by member id) and each gets a contiguous
range of partitions, the first `partitions % members` getting one more.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kio.schema.consumer_protocol_assignment.v0.data import (
    ConsumerProtocolAssignment as AssignmentV0,
)
from kio.schema.consumer_protocol_assignment.v0.data import TopicPartition as AssignedV0
from kio.schema.consumer_protocol_assignment.v1.data import (
    ConsumerProtocolAssignment as AssignmentV1,
)
from kio.schema.consumer_protocol_assignment.v2.data import (
    ConsumerProtocolAssignment as AssignmentV2,
)
from kio.schema.consumer_protocol_assignment.v3.data import (
    ConsumerProtocolAssignment as AssignmentV3,
)
from kio.schema.consumer_protocol_subscription.v0.data import (
    ConsumerProtocolSubscription as SubscriptionV0,
)
from kio.schema.consumer_protocol_subscription.v1.data import (
    ConsumerProtocolSubscription as SubscriptionV1,
)
from kio.schema.consumer_protocol_subscription.v2.data import (
    ConsumerProtocolSubscription as SubscriptionV2,
)
from kio.schema.consumer_protocol_subscription.v3.data import (
    ConsumerProtocolSubscription as SubscriptionV3,
)
from kio.schema.types import TopicName
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32

from raftlog.errors import RemoteError

CONSUMER_PROTOCOL_TYPE = "consumer"
RANGE_ASSIGNOR = "range"
# What this client writes: v0 of both, the layout every client reads (the eager "range"
# protocol needs neither owned partitions nor generation nor rack).
SUBSCRIPTION_WRITE_VERSION = 0
ASSIGNMENT_WRITE_VERSION = 0
_SUBSCRIPTIONS: tuple[type[Any], ...] = (
    SubscriptionV0,
    SubscriptionV1,
    SubscriptionV2,
    SubscriptionV3,
)
_ASSIGNMENTS: tuple[type[Any], ...] = (AssignmentV0, AssignmentV1, AssignmentV2, AssignmentV3)
_VERSION = struct.Struct(">h")

TopicPartition = tuple[str, int]


class ConsumerProtocolError(RemoteError, ValueError):
    """Subscription or assignment bytes that do not decode; the message says which and why."""


@dataclass(frozen=True)
class Subscription:
    topics: tuple[str, ...]
    user_data: bytes | None = None


@dataclass(frozen=True)
class GroupMemberMetadata:
    """One JoinGroup member as the leader sees it."""

    member_id: str
    group_instance_id: str | None
    subscription: Subscription


def encode_subscription(subscription: Subscription) -> bytes:
    entity = SubscriptionV0(topics=tuple(subscription.topics), user_data=subscription.user_data)
    return _encode(SUBSCRIPTION_WRITE_VERSION, entity)


def decode_subscription(data: bytes) -> Subscription:
    entity = _decode(data, _SUBSCRIPTIONS, "subscription")
    return Subscription(tuple(entity.topics), entity.user_data)


def encode_assignment(
    partitions: Iterable[TopicPartition], user_data: bytes | None = None
) -> bytes:
    """A ConsumerProtocolAssignment: topics in name order, partitions ascending."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    entity = AssignmentV0(
        assigned_partitions=tuple(
            AssignedV0(
                topic=TopicName(topic), partitions=tuple(i32(p) for p in sorted(by_topic[topic]))
            )
            for topic in sorted(by_topic)
        ),
        user_data=user_data,
    )
    return _encode(ASSIGNMENT_WRITE_VERSION, entity)


def decode_assignment(data: bytes) -> frozenset[TopicPartition]:
    """The (topic, partition) pairs of an assignment; empty bytes are the empty assignment
    (what the coordinator hands a member the leader left out)."""
    if not data:
        return frozenset()
    entity = _decode(data, _ASSIGNMENTS, "assignment")
    return frozenset((t.topic, int(p)) for t in entity.assigned_partitions for p in t.partitions)


def range_assign(
    members: Sequence[GroupMemberMetadata], partitions_per_topic: Mapping[str, int]
) -> dict[str, frozenset[TopicPartition]]:
    """member id -> its partitions, by Kafka's RangeAssignor.

    Topics missing from partitions_per_topic (unknown to the leader's metadata) are assigned
    to nobody, as in Kafka; every member appears in the result, possibly with nothing.
    """
    out: dict[str, set[TopicPartition]] = {m.member_id: set() for m in members}
    if len(out) != len(members):
        raise ValueError("member ids must be unique")
    subscribers: dict[str, list[GroupMemberMetadata]] = {}
    for member in members:
        for topic in dict.fromkeys(member.subscription.topics):
            subscribers.setdefault(topic, []).append(member)
    for topic in sorted(subscribers):
        count = partitions_per_topic.get(topic)
        if count is None or count <= 0:
            continue
        ordered = sorted(subscribers[topic], key=_range_order)
        per_member, extra = divmod(count, len(ordered))
        for index, member in enumerate(ordered):
            start = per_member * index + min(index, extra)
            length = per_member + (1 if index < extra else 0)
            out[member.member_id].update((topic, p) for p in range(start, start + length))
    return {member_id: frozenset(assigned) for member_id, assigned in out.items()}


def _range_order(member: GroupMemberMetadata) -> tuple[int, str]:
    # Kafka's MemberInfo.compareTo: static members (by instance id) before dynamic ones.
    if member.group_instance_id is not None:
        return (0, member.group_instance_id)
    return (1, member.member_id)


def _encode(version: int, entity: Any) -> bytes:
    buffer = io.BytesIO()
    buffer.write(_VERSION.pack(version))
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def _decode(data: bytes, classes: tuple[type[Any], ...], what: str) -> Any:
    data = bytes(data)
    if len(data) < _VERSION.size:
        raise ConsumerProtocolError(f"{what} of {len(data)} bytes has no version")
    (version,) = _VERSION.unpack_from(data)
    if version < 0:
        raise ConsumerProtocolError(f"{what} has negative version {version}")
    cls = classes[min(version, len(classes) - 1)]
    try:
        entity, _ = entity_reader(cls)(data, _VERSION.size)
    except Exception as exc:  # kio raises several types for truncated or bad input
        raise ConsumerProtocolError(f"{what} v{version} does not decode: {exc}") from exc
    return entity


__all__ = [
    "CONSUMER_PROTOCOL_TYPE",
    "RANGE_ASSIGNOR",
    "ConsumerProtocolError",
    "GroupMemberMetadata",
    "Subscription",
    "TopicPartition",
    "decode_assignment",
    "decode_subscription",
    "encode_assignment",
    "encode_subscription",
    "range_assign",
]
