"""The consumer-protocol (KIP-848) groups one coordinator serves, beside its classic groups.

GroupCoordinator owns routing (which offsets partitions are served here) and committed
offsets; this holds the consumer groups and settles which protocol a group id speaks: one
group id is one protocol. A consumer heartbeat for a classic group with members, or a classic
JoinGroup for a consumer group with members, is INCONSISTENT_GROUP_PROTOCOL; a group without
members (only committed offsets) changes protocol with its next member, keeping its offsets
(Kafka's conversion of empty groups).

Each group is stored in `__consumer_offsets` as one record (consumer_format.py), written by
the coordinator whenever a heartbeat, leave or timeout changed it; a new coordinator replays
it and members carry on at their epochs. Sans-IO.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping

from raftlog.client.consumer_protocol import Subscription, encode_assignment, encode_subscription
from raftlog.errors import ErrorCode
from raftlog.groups.consumer_group import ConsumerGroup
from raftlog.groups.messages import (
    ConsumerHeartbeatRequest,
    ConsumerHeartbeatResponse,
    DescribedConsumerGroup,
    DescribedGroup,
    DescribedMember,
    ListedGroup,
)
from raftlog.groups.settings import GroupConfig

log = logging.getLogger(__name__)

CONSUMER_GROUP_TYPE = "consumer"
# Kafka's protocol type for consumer groups, which DescribeGroups/ListGroups report.
CONSUMER_PROTOCOL_TYPE = "consumer"


class ConsumerGroups:
    def __init__(
        self, config: GroupConfig, new_uuid: Callable[[], str] = lambda: str(uuid.uuid4())
    ) -> None:
        self.config = config
        self._new_uuid = new_uuid
        self.groups: dict[str, ConsumerGroup] = {}

    def get(self, group_id: str) -> ConsumerGroup | None:
        return self.groups.get(group_id)

    def has_members(self, group_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and bool(group.members)

    def subscribed_topics(self, group_id: str) -> set[str]:
        group = self.groups.get(group_id)
        return set() if group is None else group.subscribed_topics()

    def uses_regex(self, group_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and group.uses_regex()

    def heartbeat(
        self,
        req: ConsumerHeartbeatRequest,
        partition_counts: Mapping[str, int],
        now_ms: int,
        may_create: bool,
        topic_names: Collection[str] | None = None,
        may_describe: Callable[[str], bool] | None = None,
    ) -> ConsumerHeartbeatResponse:
        """`may_create`: the caller checked the group id is free of classic members and
        under max_groups; `topic_names` and `may_describe` as ConsumerGroup.heartbeat."""
        group = self.groups.get(req.group_id)
        if group is None:
            if req.member_epoch != 0:
                return ConsumerHeartbeatResponse(ErrorCode.unknown_member_id, req.member_id)
            if not may_create:
                return ConsumerHeartbeatResponse(ErrorCode.coordinator_not_available)
            group = self.groups[req.group_id] = ConsumerGroup(req.group_id, self.config)
            resp = group.heartbeat(
                req, partition_counts, now_ms, self._new_uuid(), topic_names, may_describe
            )
            if not group.members:
                del self.groups[req.group_id]  # the join was refused: no group after all
            return resp
        return group.heartbeat(
            req, partition_counts, now_ms, self._new_uuid(), topic_names, may_describe
        )

    def remove(self, group_id: str) -> None:
        self.groups.pop(group_id, None)

    def drop(self, belongs: Callable[[str], bool]) -> None:
        """Forget the groups `belongs` names (an offsets partition resigned)."""
        for group_id in [g for g in self.groups if belongs(g)]:
            del self.groups[group_id]

    def next_deadline_ms(self) -> int | None:
        deadlines = [d for g in self.groups.values() if (d := g.next_deadline_ms()) is not None]
        return min(deadlines, default=None)

    def tick(self, now_ms: int) -> list[str]:
        """Expire members; returns the groups that changed (to be stored)."""
        changed = []
        for group in self.groups.values():
            deadline_ms = group.next_deadline_ms()
            if deadline_ms is not None and deadline_ms <= now_ms:
                for member_id in group.tick(now_ms):
                    log.info(
                        "group %r: member %s removed (session or rebalance timeout)",
                        group.group_id,
                        member_id,
                    )
                if group.dirty:
                    changed.append(group.group_id)
        return changed

    def listed(self, states: set[str]) -> list[ListedGroup]:
        return [
            ListedGroup(g.group_id, CONSUMER_PROTOCOL_TYPE, g.state, CONSUMER_GROUP_TYPE)
            for g in self.groups.values()
            if not states or g.state.lower() in states
        ]

    def describe(self, group_ids: Iterable[str]) -> list[DescribedConsumerGroup]:
        out = []
        for group_id in group_ids:
            group = self.groups.get(group_id)
            if group is None:
                out.append(DescribedConsumerGroup(group_id, ErrorCode.group_id_not_found))
            else:
                out.append(group.describe())
        return out

    def describe_classic(self, group_id: str) -> DescribedGroup | None:
        """DescribeGroups (the classic API) of a consumer group: state, protocol type "consumer"
        and members, whose metadata and assignment are the classic consumer protocol's
        encodings of their subscription and current partitions (what a classic client's admin
        tool decodes for protocol type "consumer")."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        members = tuple(
            DescribedMember(
                m.member_id,
                m.instance_id,
                m.client_id,
                m.client_host,
                encode_subscription(Subscription(tuple(sorted(group.member_topics(m))))),
                encode_assignment(m.assigned),
            )
            for m in group.members.values()
        )
        return DescribedGroup(
            group_id,
            ErrorCode.none,
            group.state,
            protocol_type=CONSUMER_PROTOCOL_TYPE,
            protocol_data=group.assignor_name,
            members=members,
            topics=frozenset(
                topic
                for m in group.members.values()
                for topic in (*group.member_topics(m), *(t for t, _ in m.assigned))
            ),
        )
