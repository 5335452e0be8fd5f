"""Who is in one consumer group and which protocols they speak: the member record and the
queries over a group's member table that change nothing.

group.py is the state machine that decides when members join, are parked, expire or leave;
it keeps its members in a `dict[str, Member]` (insertion order = join order) and asks this
module which protocols they have in common, which one wins Kafka's vote, and which member
holds a static instance id.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from raftlog.groups.messages import DescribedMember, JoinGroupMember

# Identifies a parked reply (a caller's pending JoinGroup or SyncGroup) to the driver.
Token = Hashable


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    last_heartbeat_ms: int = 0
    join_token: Token | None = None  # parked JoinGroup reply
    sync_token: Token | None = None  # parked SyncGroup reply

    def metadata_for(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]


def protocol_support(members: Mapping[str, Member]) -> dict[str, int]:
    """Protocol name -> how many members support it."""
    counts: dict[str, int] = {}
    for member in members.values():
        for name in set(member.protocol_names()):
            counts[name] = counts.get(name, 0) + 1
    return counts


def all_support_one_of(members: Mapping[str, Member], names: list[str]) -> bool:
    """Whether some protocol in `names` is supported by every member."""
    counts = protocol_support(members)
    return any(counts.get(name, 0) == len(members) for name in names)


def select_protocol(group_id: str, members: Mapping[str, Member], leader_id: str | None) -> str:
    """Kafka's vote: candidates are protocols every member supports; each member votes
    for its most preferred candidate; most votes wins (ties: the leader's preference)."""
    counts = protocol_support(members)
    candidates = {name for name, count in counts.items() if count == len(members)}
    if not candidates:
        raise AssertionError(f"group {group_id!r}: no protocol common to all members")
    votes = dict.fromkeys(candidates, 0)
    for member in members.values():
        choice = next(n for n in member.protocol_names() if n in candidates)
        votes[choice] += 1
    leader = members.get(leader_id or "") or next(iter(members.values()))
    preference = {name: i for i, name in enumerate(leader.protocol_names())}
    return min(candidates, key=lambda name: (-votes[name], preference.get(name, 0), name))


def instance_owner(members: Mapping[str, Member], group_instance_id: str | None) -> Member | None:
    """The member holding static instance id `group_instance_id` (KIP-345), if any."""
    if group_instance_id is None:
        return None
    for member in members.values():
        if member.group_instance_id == group_instance_id:
            return member
    return None


def replace_member_id(members: dict[str, Member], old_id: str, new_id: str) -> Member:
    """Re-key member `old_id` as `new_id` in place, keeping its place in the join order (a
    restarted static member takes over its old incarnation's record, KIP-345)."""
    entries = list(members.items())
    members.clear()
    for member_id, member in entries:
        if member_id == old_id:
            member.member_id = new_id
            member_id = new_id
        members[member_id] = member
    return members[new_id]


def max_rebalance_timeout_ms(members: Mapping[str, Member]) -> int:
    """The group's rebalance timeout: the longest any member asked for."""
    return max((m.rebalance_timeout_ms for m in members.values()), default=0)


def next_leader(members: Mapping[str, Member]) -> str | None:
    """Who leads once the leader is gone. A member already waiting in the join phase is
    preferred: it will get the member list and can compute the assignment."""
    waiting = [m.member_id for m in members.values() if m.join_token is not None]
    candidates = waiting or list(members)
    return candidates[0] if candidates else None


def join_group_members(
    members: Mapping[str, Member], protocol: str | None
) -> tuple[JoinGroupMember, ...]:
    """The member list only the leader's JoinGroup response carries, with each member's
    metadata for the chosen protocol."""
    return tuple(
        JoinGroupMember(m.member_id, m.group_instance_id, m.metadata_for(protocol))
        for m in members.values()
    )


def described_members(
    members: Mapping[str, Member], protocol: str | None, *, stable: bool
) -> tuple[DescribedMember, ...]:
    """DescribeGroups' member list: metadata and assignment only while the group is Stable."""
    return tuple(
        DescribedMember(
            member_id=m.member_id,
            group_instance_id=m.group_instance_id,
            client_id=m.client_id,
            client_host=m.client_host,
            metadata=m.metadata_for(protocol) if stable else b"",
            assignment=m.assignment if stable else b"",
        )
        for m in members.values()
    )
