"""Static membership (KIP-345): a restarted member with the same group.instance.id takes its
old incarnation's place; in a Stable group the other members see no rebalance."""

from __future__ import annotations

from raftlog.errors import ErrorCode
from raftlog.groups.group import GroupState
from raftlog.groups.messages import HeartbeatRequest, SyncGroupRequest
from tests.groups.harness import Harness, join_req

G = "static-app"


def stable_static_pair(h: Harness) -> tuple[str, str, int]:
    """Two static members, pod-1 (the leader) and pod-2, Stable with assignments."""
    t1 = h.call("join_group", join_req(G, group_instance_id="pod-1"))
    assert h.replies[t1].error_code is ErrorCode.none
    t2 = h.call("join_group", join_req(G, group_instance_id="pod-2"))
    # pod-2's arrival rebalances the group: pod-1 rejoins with its member id.
    r1 = h.replies[
        h.call("join_group", join_req(G, h.replies[t1].member_id, group_instance_id="pod-1"))
    ]
    r2 = h.replies[t2]
    assert r1.generation_id == r2.generation_id and r1.leader == r1.member_id
    gen = r1.generation_id
    t2s = h.call("sync_group", SyncGroupRequest(G, gen, r2.member_id, "pod-2"))
    assignments = ((r1.member_id, b"for-1"), (r2.member_id, b"for-2"))
    h.call("sync_group", SyncGroupRequest(G, gen, r1.member_id, "pod-1", assignments=assignments))
    assert h.replies[t2s].assignment == b"for-2"
    assert h.coord._groups[G].state is GroupState.STABLE
    return r1.member_id, r2.member_id, gen


def heartbeat(h: Harness, member_id: str, gen: int, instance: str) -> ErrorCode:
    return h.coord.heartbeat(HeartbeatRequest(G, gen, member_id, instance), h.now_ms).error_code


def test_a_restarted_static_follower_gets_its_assignment_back_without_a_rebalance() -> None:
    h = Harness()
    leader, old_follower, gen = stable_static_pair(h)
    stores_before = len(h.log[h.coord.partition_for(G)])
    rejoin = h.replies[h.call("join_group", join_req(G, group_instance_id="pod-2"))]
    assert rejoin.error_code is ErrorCode.none
    assert rejoin.generation_id == gen, "no new generation"
    assert rejoin.member_id != old_follower and rejoin.member_id.startswith("pod-2-")
    assert rejoin.leader == leader and rejoin.members == ()
    # The new member id was stored before the member was answered.
    assert len(h.log[h.coord.partition_for(G)]) == stores_before + 1
    assert h.coord._groups[G].state is GroupState.STABLE
    # The other member is not asked to rejoin; the old incarnation is fenced.
    assert heartbeat(h, leader, gen, "pod-1") is ErrorCode.none
    assert heartbeat(h, old_follower, gen, "pod-2") is ErrorCode.fenced_instance_id
    sync = h.replies[h.call("sync_group", SyncGroupRequest(G, gen, rejoin.member_id, "pod-2"))]
    assert (sync.error_code, sync.assignment) == (ErrorCode.none, b"for-2")
    assert heartbeat(h, rejoin.member_id, gen, "pod-2") is ErrorCode.none


def test_a_restarted_static_leader_is_not_told_it_leads_before_join_group_v9() -> None:
    h = Harness()
    old_leader, follower, gen = stable_static_pair(h)
    rejoin = h.replies[h.call("join_group", join_req(G, group_instance_id="pod-1"))]
    assert (rejoin.error_code, rejoin.generation_id) == (ErrorCode.none, gen)
    # The old id: the member takes itself for a follower and does not run its assignor.
    assert rejoin.leader == old_leader and rejoin.members == () and not rejoin.skip_assignment
    assert h.coord._groups[G].leader_id == rejoin.member_id
    assert heartbeat(h, follower, gen, "pod-2") is ErrorCode.none
    v9 = h.replies[
        h.call("join_group", join_req(G, group_instance_id="pod-1", supports_skip_assignment=True))
    ]
    assert v9.leader == v9.member_id and v9.skip_assignment
    assert {m.member_id for m in v9.members} == {v9.member_id, follower}


def test_a_failed_store_restores_the_old_incarnation() -> None:
    h = Harness(auto_flush=False)
    h.auto_flush = True
    leader, follower, gen = stable_static_pair(h)
    h.auto_flush = False
    token = h.call("join_group", join_req(G, group_instance_id="pod-2"))
    assert token not in h.replies, "answered only once stored"
    h.flush(ErrorCode.not_enough_replicas)
    reply = h.replies[token]
    assert reply.error_code is not ErrorCode.none and reply.member_id == ""
    assert set(h.coord._groups[G].members) == {leader, follower}
    assert heartbeat(h, follower, gen, "pod-2") is ErrorCode.none


def test_a_static_restart_during_completing_rebalance_rebalances() -> None:
    h = Harness()
    t1 = h.call("join_group", join_req(G, group_instance_id="pod-1"))
    old = h.replies[t1].member_id
    t2 = h.call("join_group", join_req(G, group_instance_id="pod-2"))
    h.call("join_group", join_req(G, old, group_instance_id="pod-1"))
    r2 = h.replies[t2]
    assert h.coord._groups[G].state is GroupState.COMPLETING_REBALANCE
    # A follower's sync is parked while the leader has not assigned yet.
    parked = h.call("sync_group", SyncGroupRequest(G, r2.generation_id, r2.member_id, "pod-2"))
    assert parked not in h.replies
    restarted = h.call("join_group", join_req(G, group_instance_id="pod-1"))
    # The leader may be assigning to the old id: rebalance; the parked sync is released.
    assert h.replies[parked].error_code is ErrorCode.rebalance_in_progress
    assert h.coord._groups[G].state is GroupState.PREPARING_REBALANCE
    assert restarted not in h.replies
    assert old not in h.coord._groups[G].members
