"""Convert a Group to and from its `__consumer_offsets` metadata value.

Kept apart from the state machine: group.py decides *when* a group is stored, this module
decides *what* is stored and how a failed-over coordinator rebuilds the group from it.
"""

from __future__ import annotations

from raftlog.groups.group import Group, GroupState, Member
from raftlog.groups.offsets_format import GroupMetadataValue, MemberMetadataValue
from raftlog.groups.settings import GroupConfig


def group_to_value(
    group: Group, wall_ms: int, assignments: dict[str, bytes] | None = None
) -> GroupMetadataValue:
    """The stored form of `group`; `assignments` (the leader's pending SyncGroup) override
    the members' current assignments, because they are stored before they are handed out."""
    members = tuple(
        MemberMetadataValue(
            member_id=m.member_id,
            group_instance_id=m.group_instance_id,
            client_id=m.client_id,
            client_host=m.client_host,
            session_timeout_ms=m.session_timeout_ms,
            rebalance_timeout_ms=m.rebalance_timeout_ms,
            subscription=m.metadata_for(group.protocol_name),
            assignment=(assignments or {}).get(m.member_id, m.assignment),
        )
        for m in group.members.values()
    )
    return GroupMetadataValue(
        protocol_type=group.protocol_type,
        generation_id=group.generation_id,
        protocol_name=group.protocol_name,
        leader_id=group.leader_id,
        state_time_ms=wall_ms,
        members=members if group.state is not GroupState.EMPTY else (),
    )


def group_from_value(
    group_id: str, value: GroupMetadataValue, config: GroupConfig, now_ms: int
) -> Group:
    """Rebuild a group after failover: Stable with its stored members, or Empty.

    Every member's session starts now, so live consumers (which heartbeat the new
    coordinator as soon as they find it) stay, and dead ones expire one session later.
    """
    group = Group(group_id, config, now_ms)
    group.generation_id = value.generation_id
    group.protocol_type = value.protocol_type
    if value.members:
        group.protocol_name = value.protocol_name
        group.leader_id = value.leader_id
        for m in value.members:
            group.members[m.member_id] = Member(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                session_timeout_ms=m.session_timeout_ms,
                rebalance_timeout_ms=m.rebalance_timeout_ms,
                protocol_type=value.protocol_type or "",
                protocols=[(value.protocol_name or "", m.subscription)],
                assignment=m.assignment,
                last_heartbeat_ms=now_ms,
            )
        # Loading is not a transition of this group's lifecycle: it resumes where the old
        # coordinator's last stored state left it.
        group.state = GroupState.STABLE
    return group
