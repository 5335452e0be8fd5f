"""One consumer-protocol group (KIP-848): epochs, target assignment, reconciliation. Sans-IO.

Three epochs order everything:
- the group epoch moves on every change of membership, subscriptions or the subscribed
  topics' partition counts;
- the assignment epoch is the group epoch the target assignment was computed at (an assignor
  of assignors.py runs whenever the group epoch is ahead of it);
- each member's epoch is the assignment epoch it has reconciled to.

Reconciliation (Kafka's CurrentAssignmentBuilder) walks a member towards its target:
1. partitions it holds that its target no longer has are revoked first: the member keeps
   its epoch and the rest of its partitions, and is UNREVOKED_PARTITIONS until a heartbeat
   lists owned partitions without any of them (the client's acknowledgement);
2. then it moves to the target epoch and gets the target partitions nobody else still
   holds (assigned or awaiting revocation); those still held elsewhere are UNRELEASED and
   handed over on a later heartbeat, once their previous owner has let go.
So a partition is never held by two members at once: the invariant check_invariants()
asserts and the property test drives.

Fencing (Kafka's throwIfMemberEpochIsInvalid): a heartbeat whose epoch is ahead of the
member's, or behind it other than the one-epoch lag of a lost response (with owned
partitions within the member's), is FENCED_MEMBER_EPOCH and changes nothing; an unknown
member id is UNKNOWN_MEMBER_ID. Both make the client rejoin with epoch 0, owning nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from raftlog.errors import ErrorCode
from raftlog.groups.assignors import ASSIGNORS, DEFAULT_ASSIGNOR
from raftlog.groups.messages import (
    ConsumerHeartbeatRequest,
    ConsumerHeartbeatResponse,
    DescribedConsumerGroup,
    DescribedConsumerMember,
    TopicPartition,
)
from raftlog.groups.settings import GroupConfig
from raftlog.groups.topic_regex import match_topics

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

_EMPTY: frozenset[TopicPartition] = frozenset()


class MemberState(enum.Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


@dataclass
class ConsumerMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topics: tuple[str, ...]
    server_assignor: str | None
    rebalance_timeout_ms: int
    session_deadline_ms: int
    member_epoch: int = JOIN_EPOCH
    previous_member_epoch: int = LEAVE_EPOCH
    state: MemberState = MemberState.STABLE
    assigned: frozenset[TopicPartition] = _EMPTY
    pending_revocation: frozenset[TopicPartition] = _EMPTY
    revocation_deadline_ms: int | None = None
    # A static member that left with epoch -2: its partitions stay reserved for its instance
    # id until its session expires.
    left_static: bool = False
    # KIP-848 regex subscription: the group resolves it (ConsumerGroup.resolved_regexes).
    subscribed_regex: str | None = None


@dataclass
class ConsumerGroup:
    group_id: str
    config: GroupConfig
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    target: dict[str, frozenset[TopicPartition]] = field(default_factory=dict)
    # Partition counts of the subscribed topics the target was computed from.
    subscribed_partitions: dict[str, int] = field(default_factory=dict)
    # Each regex members subscribe with -> the topics it matched when last resolved.
    resolved_regexes: dict[str, frozenset[str]] = field(default_factory=dict)
    # Each regex -> the topic names it was resolved against (not stored: a loaded group
    # resolves each anew on the first heartbeat of a member using it, with the same result
    # unless topics came or went).
    regex_topic_names: dict[str, Collection[str]] = field(default_factory=dict)
    # Changed since last stored (consumer_format.py): the coordinator writes it and clears it.
    dirty: bool = False

    # ------------------------------------------------------------------ views
    @property
    def state(self) -> str:
        if not self.members:
            return "Empty"
        if self.assignment_epoch != self.group_epoch:
            return "Assigning"
        for m in self.members.values():
            if m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE:
                return "Reconciling"
        return "Stable"

    @property
    def assignor_name(self) -> str:
        """The assignor members ask for most (ties: the configured order); else the default."""
        names = [m.server_assignor for m in self.members.values() if m.server_assignor]
        if not names:
            return self.config.group_consumer_assignors[0] or DEFAULT_ASSIGNOR
        order = list(self.config.group_consumer_assignors)
        return max(set(names), key=lambda n: (names.count(n), -order.index(n)))

    def member_topics(self, member: ConsumerMember) -> frozenset[str]:
        """What `member` subscribes to: its topic names and its regex's matches."""
        if not member.subscribed_regex:
            return frozenset(member.subscribed_topics)
        matched = self.resolved_regexes.get(member.subscribed_regex, frozenset())
        return matched.union(member.subscribed_topics)

    def subscribed_topics(self) -> set[str]:
        return {t for m in self.members.values() for t in self.member_topics(m)}

    def uses_regex(self) -> bool:
        return any(m.subscribed_regex for m in self.members.values())

    def resolve_regexes(
        self,
        topic_names: Collection[str] | None,
        may_describe: Callable[[str], bool] | None = None,
        regex: str | None = None,
    ) -> bool:
        """Resolve `regex` (the heartbeating member's) against `topic_names` (the cluster's
        non-internal topics; None: not known, resolve nothing) when it is new or those names
        changed since it was last resolved; forget regexes no member uses any more. True if
        a regex's matches changed, which moves the group epoch (Kafka re-resolves when
        topics are created or deleted).

        A regex is resolved only by a heartbeat of a member that uses it, and matches only
        the topics `may_describe` allows (None: all), asked only then: that member's ACLs
        (KAFKA-18813), never those of a member with another subscription. Members of one
        regex with different ACLs share its resolution, as in Kafka."""
        wanted = {m.subscribed_regex for m in self.members.values() if m.subscribed_regex}
        resolved = {r: topics for r, topics in self.resolved_regexes.items() if r in wanted}
        against = {r: names for r, names in self.regex_topic_names.items() if r in wanted}
        if regex in wanted and topic_names is not None:
            last = against.get(regex)
            if regex not in resolved or not (last is topic_names or last == topic_names):
                candidates = (
                    topic_names
                    if may_describe is None
                    else [name for name in topic_names if may_describe(name)]
                )
                resolved[regex] = match_topics(regex, candidates)
                against[regex] = topic_names
        self.regex_topic_names = against
        changed = any(
            resolved.get(r, frozenset()) != self.resolved_regexes.get(r, frozenset())
            for r in wanted
        )
        if resolved != self.resolved_regexes:
            self.resolved_regexes = resolved
            self.dirty = True
        return changed

    def describe(self) -> DescribedConsumerGroup:
        return DescribedConsumerGroup(
            group_id=self.group_id,
            error_code=ErrorCode.none,
            state=self.state,
            group_epoch=self.group_epoch,
            assignment_epoch=self.assignment_epoch,
            assignor_name=self.assignor_name,
            members=tuple(
                DescribedConsumerMember(
                    member_id=m.member_id,
                    instance_id=m.instance_id,
                    rack_id=m.rack_id,
                    member_epoch=m.member_epoch,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    subscribed_topic_names=m.subscribed_topics,
                    assignment=m.assigned,
                    target_assignment=self.target.get(m.member_id, _EMPTY),
                    subscribed_topic_regex=m.subscribed_regex,
                )
                for m in self.members.values()
            ),
        )

    # ------------------------------------------------------------------ heartbeat
    def heartbeat(
        self,
        req: ConsumerHeartbeatRequest,
        partition_counts: Mapping[str, int],
        now_ms: int,
        new_member_id: str,
        topic_names: Collection[str] | None = None,
        may_describe: Callable[[str], bool] | None = None,
    ) -> ConsumerHeartbeatResponse:
        """One ConsumerGroupHeartbeat. `partition_counts` has (at least) every topic the
        group and this request subscribe to that exists; `new_member_id` names a joining
        member that sent none (v0). `topic_names`, the cluster's non-internal topics, is
        given whenever the group or the request has a regex subscription (and
        `partition_counts` then covers them all): the member's regex is resolved against
        it, filtered by `may_describe` (resolve_regexes)."""
        if (
            req.server_assignor is not None
            and req.server_assignor not in self.config.group_consumer_assignors
        ):
            return ConsumerHeartbeatResponse(ErrorCode.unsupported_assignor, req.member_id or None)
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(req, partition_counts, now_ms)
        if req.member_epoch == JOIN_EPOCH:
            member_or_error = self._join(req, now_ms, new_member_id)
        else:
            member_or_error = self._current_member(req)
        if isinstance(member_or_error, ErrorCode):
            return ConsumerHeartbeatResponse(member_or_error, req.member_id or None)
        member = member_or_error
        before = self._fingerprint(member)
        joining = req.member_epoch == JOIN_EPOCH
        sent = (member.member_epoch, member.assigned)
        bump = self._update_member(member, req, now_ms)
        if self.resolve_regexes(topic_names, may_describe, member.subscribed_regex) or bump:
            self.group_epoch += 1
        self._refresh_target(partition_counts)
        self._reconcile(member, req.owned, now_ms)
        # As Kafka: the assignment goes back on a join, when it changed, and whenever the
        # member reported what it owns (so a lost response is repaired by the next one).
        changed = (member.member_epoch, member.assigned) != sent
        # A session refresh alone is not stored: sessions restart when a group is loaded.
        self.dirty |= self._fingerprint(member) != before
        return ConsumerHeartbeatResponse(
            ErrorCode.none,
            member.member_id,
            member.member_epoch,
            self.config.group_consumer_heartbeat_interval_ms,
            member.assigned if joining or changed or req.owned is not None else None,
        )

    def _fingerprint(self, member: ConsumerMember) -> tuple[object, ...]:
        """What a heartbeat of `member` can change of the stored group."""
        m = member
        return (
            self.group_epoch,
            self.assignment_epoch,
            len(self.members),
            self.members.get(m.member_id) is m,
            self.target.get(m.member_id),
            (m.member_id, m.instance_id, m.rack_id, m.client_id, m.client_host),
            (m.subscribed_topics, m.server_assignor, m.rebalance_timeout_ms, m.left_static),
            (m.subscribed_regex, tuple(sorted(self.resolved_regexes.items()))),
            (m.member_epoch, m.previous_member_epoch, m.state, m.assigned, m.pending_revocation),
        )

    def _leave(
        self, req: ConsumerHeartbeatRequest, partition_counts: Mapping[str, int], now_ms: int
    ) -> ConsumerHeartbeatResponse:
        member = self.members.get(req.member_id)
        if member is None:
            return ConsumerHeartbeatResponse(ErrorCode.unknown_member_id, req.member_id)
        if req.instance_id is not None and member.instance_id != req.instance_id:
            return ConsumerHeartbeatResponse(ErrorCode.fenced_instance_id, req.member_id)
        if req.member_epoch == STATIC_LEAVE_EPOCH and member.instance_id is not None:
            # Kept (partitions reserved) until the instance rejoins or its session ends.
            member.left_static = True
            self.dirty = True
            member.session_deadline_ms = now_ms + self.config.group_consumer_session_timeout_ms
            return ConsumerHeartbeatResponse(
                ErrorCode.none, req.member_id, STATIC_LEAVE_EPOCH, 0, None
            )
        self.remove_member(req.member_id, partition_counts)
        return ConsumerHeartbeatResponse(ErrorCode.none, req.member_id, LEAVE_EPOCH, 0, None)

    def _join(
        self, req: ConsumerHeartbeatRequest, now_ms: int, new_member_id: str
    ) -> ConsumerMember | ErrorCode:
        member_id = req.member_id or new_member_id
        if (
            req.subscribed_topic_names is None and req.subscribed_topic_regex is None
        ) or req.rebalance_timeout_ms <= 0:
            return ErrorCode.invalid_request  # a join states its subscription and timeout
        if req.instance_id is not None:
            previous = self._static_member(req.instance_id)
            if previous is not None and previous.member_id != member_id:
                if not previous.left_static:
                    return ErrorCode.unreleased_instance_id
                # The instance is back under a new member id: it takes over the old
                # member's epoch and partitions, no rebalance (KIP-345 carried over).
                del self.members[previous.member_id]
                self.target[member_id] = self.target.pop(previous.member_id, _EMPTY)
                previous.member_id = member_id
                previous.left_static = False
                self.members[member_id] = previous
                self.dirty = True
                return previous
        member = self.members.get(member_id)
        if member is not None:
            # Epoch 0 for a member past it is fenced as any stale epoch (Kafka does the same):
            # otherwise anyone knowing a member id could take its partitions by "rejoining".
            # A fenced member's session runs out and its next join starts afresh.
            if member.left_static:
                return ErrorCode.unknown_member_id
            return self._check_epoch(member, req)
        if len(self.members) >= self.config.group_max_size:
            return ErrorCode.group_max_size_reached
        member = ConsumerMember(
            member_id=member_id,
            instance_id=req.instance_id,
            rack_id=req.rack_id,
            client_id=req.client_id,
            client_host=req.client_host,
            subscribed_topics=(),
            server_assignor=None,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            session_deadline_ms=now_ms,
        )
        self.members[member_id] = member
        self.group_epoch += 1
        self.dirty = True
        return member

    def _static_member(self, instance_id: str) -> ConsumerMember | None:
        for m in self.members.values():
            if m.instance_id == instance_id:
                return m
        return None

    def _current_member(self, req: ConsumerHeartbeatRequest) -> ConsumerMember | ErrorCode:
        member = self.members.get(req.member_id)
        if member is None or member.left_static:
            return ErrorCode.unknown_member_id
        if req.instance_id is not None and req.instance_id != member.instance_id:
            return ErrorCode.fenced_instance_id
        return self._check_epoch(member, req)

    def _check_epoch(
        self, member: ConsumerMember, req: ConsumerHeartbeatRequest
    ) -> ConsumerMember | ErrorCode:
        if req.member_epoch > member.member_epoch:
            return ErrorCode.fenced_member_epoch
        if req.member_epoch < member.member_epoch:
            # The response that moved the member on may have been lost: the epoch before,
            # owning nothing it was not given, is the member catching up; anything else is a
            # zombie (or a forgery) and changes nothing.
            lagging = req.member_epoch == member.previous_member_epoch and (
                req.owned is not None and req.owned <= member.assigned
            )
            if not lagging:
                return ErrorCode.fenced_member_epoch
        return member

    def _update_member(
        self, member: ConsumerMember, req: ConsumerHeartbeatRequest, now_ms: int
    ) -> bool:
        """Apply the fields the request changed; True if the group epoch must move."""
        member.session_deadline_ms = now_ms + self.config.group_consumer_session_timeout_ms
        bump = False
        if req.subscribed_topic_names is not None:
            topics = tuple(sorted(set(req.subscribed_topic_names)))
            bump |= topics != member.subscribed_topics
            member.subscribed_topics = topics
        if req.subscribed_topic_regex is not None:
            regex = req.subscribed_topic_regex or None  # "" drops the regex
            bump |= regex != member.subscribed_regex
            member.subscribed_regex = regex
        if req.server_assignor is not None and req.server_assignor != member.server_assignor:
            member.server_assignor = req.server_assignor
            bump = True
        if req.rebalance_timeout_ms > 0:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        if req.client_id:
            member.client_id = req.client_id
        if req.client_host:
            member.client_host = req.client_host
        return bump

    # ------------------------------------------------------------------ assignment
    def _refresh_target(self, partition_counts: Mapping[str, int]) -> None:
        subscribed = {
            t: partition_counts[t] for t in self.subscribed_topics() if t in partition_counts
        }
        if subscribed != self.subscribed_partitions:
            self.subscribed_partitions = subscribed
            self.group_epoch += 1
        if self.assignment_epoch == self.group_epoch:
            return
        assignor = ASSIGNORS[self.assignor_name]
        active = {m.member_id: self.member_topics(m) for m in self.members.values()}
        self.target = assignor(active, subscribed, self.target)
        self.assignment_epoch = self.group_epoch

    def _reconcile(
        self,
        member: ConsumerMember,
        owned: frozenset[TopicPartition] | None,
        now_ms: int,
    ) -> None:
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            if owned is None or owned & member.pending_revocation:
                return  # not acknowledged yet
            member.pending_revocation = _EMPTY
            member.revocation_deadline_ms = None
            member.state = MemberState.STABLE
        if (
            member.state is MemberState.STABLE
            and member.member_epoch == self.assignment_epoch
            and member.assigned == self.target.get(member.member_id, _EMPTY)
        ):
            return
        target = self.target.get(member.member_id, _EMPTY)
        revoke = member.assigned - target
        if revoke:
            member.assigned &= target
            member.pending_revocation = revoke
            member.state = MemberState.UNREVOKED_PARTITIONS
            member.revocation_deadline_ms = now_ms + member.rebalance_timeout_ms
            return
        held = self._held_by_others(member.member_id)
        new = target - member.assigned
        free = frozenset(tp for tp in new if tp not in held)
        member.assigned |= free
        if member.member_epoch != self.assignment_epoch:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = self.assignment_epoch
        member.state = MemberState.UNRELEASED_PARTITIONS if new - free else MemberState.STABLE

    def _held_by_others(self, member_id: str) -> set[TopicPartition]:
        return {
            tp
            for m in self.members.values()
            if m.member_id != member_id
            for tp in m.assigned | m.pending_revocation
        }

    def remove_member(self, member_id: str, partition_counts: Mapping[str, int] | None) -> None:
        """Drop the member (left, session expired, revocation timed out): its partitions are
        free at once, the group epoch moves and the target is recomputed (with the last
        known partition counts unless new ones are given)."""
        self.members.pop(member_id, None)
        self.target.pop(member_id, None)
        self.dirty = True
        self.group_epoch += 1
        self.resolve_regexes(None)  # forget a regex only this member used
        self._refresh_target(
            self.subscribed_partitions if partition_counts is None else partition_counts
        )

    # ------------------------------------------------------------------ offsets, timers
    def validate_commit(
        self, member_id: str, member_epoch: int, *, transactional: bool
    ) -> ErrorCode:
        """Kafka's ConsumerGroup.validateOffsetCommit: a member commits at its current epoch;
        a commit with no member and no epoch only to a group without members."""
        if member_epoch < 0 and not member_id:
            return ErrorCode.none if not self.members else ErrorCode.unknown_member_id
        member = self.members.get(member_id)
        if member is None or member.left_static:
            return ErrorCode.unknown_member_id
        if member_epoch != member.member_epoch:
            if transactional:
                return ErrorCode.illegal_generation
            return ErrorCode.stale_member_epoch
        return ErrorCode.none

    def next_deadline_ms(self) -> int | None:
        deadlines = [m.session_deadline_ms for m in self.members.values()]
        deadlines += [
            m.revocation_deadline_ms
            for m in self.members.values()
            if m.revocation_deadline_ms is not None
        ]
        return min(deadlines, default=None)

    def tick(self, now_ms: int) -> list[str]:
        """Remove members whose session expired or who held partitions past their rebalance
        timeout; returns their ids."""
        expired = [
            m.member_id
            for m in self.members.values()
            if m.session_deadline_ms <= now_ms
            or (m.revocation_deadline_ms is not None and m.revocation_deadline_ms <= now_ms)
        ]
        for member_id in expired:
            self.remove_member(member_id, None)
        return expired

    def check_invariants(self) -> None:
        """No partition held by two members; epochs in order. Raises AssertionError."""
        seen: dict[TopicPartition, str] = {}
        for m in self.members.values():
            for tp in m.assigned | m.pending_revocation:
                assert tp not in seen, f"{tp} held by {seen[tp]} and {m.member_id}: {self!r}"
                seen[tp] = m.member_id
            assert not m.assigned & m.pending_revocation, f"{m!r}"
            assert m.left_static or m.member_epoch <= self.assignment_epoch, f"{m!r}"
        assert self.assignment_epoch <= self.group_epoch, f"{self!r}"
