"""The `__consumer_offsets` record of a KIP-848 group: one compact record per group.

Kafka writes a KIP-848 group as several record kinds (ConsumerGroupMetadata,
ConsumerGroupMemberMetadata, ConsumerGroupTargetAssignmentMember,
ConsumerGroupCurrentMemberAssignment, ...). raftlog writes their equivalent as one value
per group under key [3, group_id]: the group and assignment epochs, the partition counts the
target was computed from, and per member its subscription, epochs, reconciliation state,
assigned and pending-revocation partitions and target; the topics each regex subscription
matched when last resolved (fields added later, absent in older values: no regex). A replay
(last value wins, a tombstone deletes) rebuilds the group; sessions and revocation deadlines
restart at load time, as for classic groups. The value is rewritten whenever a heartbeat,
leave or timeout changed the group, and answered only once it is replicated.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, ClassVar

from raftlog.codec import I32_MAX, Array, Map, MaxLen, Range
from raftlog.groups.consumer_group import ConsumerGroup, ConsumerMember, MemberState
from raftlog.groups.messages import TopicPartition
from raftlog.groups.settings import GroupConfig
from raftlog.groups.topic_regex import MAX_REGEX_CHARS, MAX_REGEX_MATCHED_TOPICS

CONSUMER_GROUP_KEY_KIND = 3
CONSUMER_GROUP_VALUE_VERSION = 1

Epoch = Annotated[int, Range(-2, I32_MAX)]
Partition = Annotated[int, Range(0, I32_MAX)]
PositiveMs = Annotated[int, Range(1, I32_MAX)]


@dataclass(frozen=True)
class ConsumerGroupKey:
    __wire__: ClassVar[Array] = Array(header=("KIND",))
    KIND: ClassVar[int] = CONSUMER_GROUP_KEY_KIND
    group_id: str


@dataclass(frozen=True)
class TopicPartitionsValue:
    __wire__: ClassVar[Map] = Map()
    topic: Annotated[str, MaxLen(249)]
    partitions: Annotated[tuple[Partition, ...], MaxLen(1_000_000)]


@dataclass(frozen=True)
class TopicCountValue:
    __wire__: ClassVar[Map] = Map()
    topic: Annotated[str, MaxLen(249)]
    partitions: Annotated[int, Range(0, I32_MAX)]


@dataclass(frozen=True)
class ConsumerMemberValue:
    __wire__: ClassVar[Map] = Map()
    member_id: Annotated[str, MaxLen(255)]
    instance_id: Annotated[str, MaxLen(255)] | None
    rack_id: Annotated[str, MaxLen(255)] | None
    client_id: str
    client_host: str
    subscribed_topics: Annotated[tuple[Annotated[str, MaxLen(249)], ...], MaxLen(10_000)]
    server_assignor: Annotated[str, MaxLen(64)] | None
    rebalance_timeout_ms: PositiveMs
    member_epoch: Epoch
    previous_member_epoch: Epoch
    state: Annotated[str, MaxLen(32)]
    assigned: tuple[TopicPartitionsValue, ...]
    pending_revocation: tuple[TopicPartitionsValue, ...]
    target: tuple[TopicPartitionsValue, ...]
    left_static: bool
    subscribed_regex: Annotated[str, MaxLen(MAX_REGEX_CHARS)] | None = None


@dataclass(frozen=True)
class ResolvedRegexValue:
    __wire__: ClassVar[Map] = Map()
    regex: Annotated[str, MaxLen(MAX_REGEX_CHARS)]
    topics: Annotated[tuple[Annotated[str, MaxLen(249)], ...], MaxLen(MAX_REGEX_MATCHED_TOPICS)]


@dataclass(frozen=True)
class ConsumerGroupValue:
    __wire__: ClassVar[Map] = Map(header=(("v", "VERSION"),))
    VERSION: ClassVar[int] = CONSUMER_GROUP_VALUE_VERSION
    group_epoch: Annotated[int, Range(0, I32_MAX)]
    assignment_epoch: Annotated[int, Range(0, I32_MAX)]
    subscribed_partitions: tuple[TopicCountValue, ...]
    members: Annotated[tuple[ConsumerMemberValue, ...], MaxLen(100_000)]
    resolved_regexes: Annotated[tuple[ResolvedRegexValue, ...], MaxLen(100_000)] = ()


def _tps(tps: Iterable[TopicPartition]) -> tuple[TopicPartitionsValue, ...]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(tps):
        by_topic.setdefault(topic, []).append(partition)
    return tuple(TopicPartitionsValue(t, tuple(ps)) for t, ps in by_topic.items())


def _from_tps(values: Iterable[TopicPartitionsValue]) -> frozenset[TopicPartition]:
    return frozenset((v.topic, p) for v in values for p in v.partitions)


def group_to_value(group: ConsumerGroup) -> ConsumerGroupValue:
    return ConsumerGroupValue(
        group_epoch=group.group_epoch,
        assignment_epoch=group.assignment_epoch,
        subscribed_partitions=tuple(
            TopicCountValue(t, count) for t, count in sorted(group.subscribed_partitions.items())
        ),
        members=tuple(
            ConsumerMemberValue(
                member_id=m.member_id,
                instance_id=m.instance_id,
                rack_id=m.rack_id,
                client_id=m.client_id,
                client_host=m.client_host,
                subscribed_topics=m.subscribed_topics,
                server_assignor=m.server_assignor,
                rebalance_timeout_ms=m.rebalance_timeout_ms,
                member_epoch=m.member_epoch,
                previous_member_epoch=m.previous_member_epoch,
                state=m.state.value,
                assigned=_tps(m.assigned),
                pending_revocation=_tps(m.pending_revocation),
                target=_tps(group.target.get(m.member_id, frozenset())),
                left_static=m.left_static,
                subscribed_regex=m.subscribed_regex,
            )
            for m in group.members.values()
        ),
        resolved_regexes=tuple(
            ResolvedRegexValue(regex, tuple(sorted(topics)))
            for regex, topics in sorted(group.resolved_regexes.items())
        ),
    )


def group_from_value(
    group_id: str, value: ConsumerGroupValue, config: GroupConfig, now_ms: int
) -> ConsumerGroup:
    """The group a replay found; every member's session (and a pending revocation's
    deadline) restarts at `now_ms`. Raises ValueError on an inconsistent value."""
    group = ConsumerGroup(
        group_id,
        config,
        group_epoch=value.group_epoch,
        assignment_epoch=value.assignment_epoch,
        subscribed_partitions={v.topic: v.partitions for v in value.subscribed_partitions},
        resolved_regexes={v.regex: frozenset(v.topics) for v in value.resolved_regexes},
    )
    for mv in value.members:
        state = MemberState(mv.state)  # replay checked it (check_value)
        member = ConsumerMember(
            member_id=mv.member_id,
            instance_id=mv.instance_id,
            rack_id=mv.rack_id,
            client_id=mv.client_id,
            client_host=mv.client_host,
            subscribed_topics=tuple(mv.subscribed_topics),
            server_assignor=mv.server_assignor,
            rebalance_timeout_ms=mv.rebalance_timeout_ms,
            session_deadline_ms=now_ms + config.group_consumer_session_timeout_ms,
            member_epoch=mv.member_epoch,
            previous_member_epoch=mv.previous_member_epoch,
            state=state,
            assigned=_from_tps(mv.assigned),
            pending_revocation=_from_tps(mv.pending_revocation),
            revocation_deadline_ms=now_ms + mv.rebalance_timeout_ms
            if state is MemberState.UNREVOKED_PARTITIONS
            else None,
            left_static=mv.left_static,
            subscribed_regex=mv.subscribed_regex,
        )
        group.members[mv.member_id] = member
        group.target[mv.member_id] = _from_tps(mv.target)
    try:
        group.check_invariants()
    except AssertionError as exc:
        raise ValueError(f"consumer group {group_id!r} does not hold together: {exc}") from None
    return group


_STATES = frozenset(s.value for s in MemberState)


def check_value(value: ConsumerGroupValue) -> str | None:
    """What is wrong with a decoded value that its declaration cannot say, or None."""
    if value.assignment_epoch > value.group_epoch:
        return f"assignment epoch {value.assignment_epoch} > group epoch {value.group_epoch}"
    for m in value.members:
        if m.state not in _STATES:
            return f"member {m.member_id!r} has an unknown state {m.state!r}"
    return None
