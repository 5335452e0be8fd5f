"""The classic group protocol, driven step by step through the pure coordinator."""

from __future__ import annotations

from raftlog.errors import ErrorCode
from raftlog.groups.group import GroupState
from raftlog.groups.messages import (
    HeartbeatRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveMember,
    SyncGroupRequest,
)
from raftlog.groups.settings import GroupConfig
from tests.groups.harness import REBALANCE_MS, SESSION_MS, Harness, join_req

G = "orders-app"


def get_member_id(h: Harness, group: str = G, **overrides) -> str:
    token = h.call("join_group", join_req(group, **overrides))
    reply = h.replies[token]
    assert reply.error_code is ErrorCode.member_id_required, reply
    assert reply.member_id.startswith("client-")
    return reply.member_id


def join_two(h: Harness, group: str = G) -> tuple[JoinGroupResponse, JoinGroupResponse]:
    a_id, b_id = get_member_id(h, group), get_member_id(h, group)
    ta = h.call("join_group", join_req(group, a_id))
    assert ta not in h.replies, "join is parked while another member is still pending"
    tb = h.call("join_group", join_req(group, b_id))
    return h.replies[ta], h.replies[tb]


def stable_two(h: Harness, group: str = G) -> tuple[str, str, int]:
    ra, rb = join_two(h, group)
    gen = ra.generation_id
    tb = h.call("sync_group", SyncGroupRequest(group, gen, rb.member_id))
    assert tb not in h.replies
    assignments = ((ra.member_id, b"for-a"), (rb.member_id, b"for-b"))
    ta = h.call("sync_group", SyncGroupRequest(group, gen, ra.member_id, assignments=assignments))
    assert h.replies[ta].assignment == b"for-a"
    assert h.replies[tb].assignment == b"for-b"
    return ra.member_id, rb.member_id, gen


def state(h: Harness, group: str = G) -> GroupState:
    return h.coord._groups[group].state


def heartbeat(h: Harness, member_id: str, gen: int, group: str = G) -> ErrorCode:
    return h.coord.heartbeat(HeartbeatRequest(group, gen, member_id), h.now_ms).error_code


def test_two_members_join_in_one_rebalance_and_sync_distributes_assignments() -> None:
    h = Harness()
    ra, rb = join_two(h)
    assert ra.error_code is rb.error_code is ErrorCode.none
    assert ra.generation_id == rb.generation_id == 1, "exactly one rebalance"
    assert ra.leader == rb.leader == ra.member_id
    assert ra.protocol_name == "range"
    # Only the leader gets the members and their metadata for the chosen protocol.
    assert [(m.member_id, m.metadata) for m in ra.members] == [
        (ra.member_id, b"sub-range"),
        (rb.member_id, b"sub-range"),
    ]
    assert rb.members == ()
    assert state(h) is GroupState.COMPLETING_REBALANCE
    assert heartbeat(h, rb.member_id, 1) is ErrorCode.none

    assert stable_two(Harness())[2] == 1


def test_leader_assignment_is_answered_only_after_it_is_stored() -> None:
    h = Harness(auto_flush=False)
    ra, _ = join_two(h)
    ta = h.call("sync_group", SyncGroupRequest(G, 1, ra.member_id, assignments=()))
    assert ta not in h.replies and len(h.queued) == 1
    h.flush()
    # Members left out of the leader's assignment get an empty one.
    assert h.replies[ta].assignment == b""
    assert state(h) is GroupState.STABLE
    assert len(h.log[h.coord.partition_for(G)]) == 1


def test_store_failure_fails_the_sync_and_rebalances() -> None:
    h = Harness(auto_flush=False)
    ra, rb = join_two(h)
    tb = h.call("sync_group", SyncGroupRequest(G, 1, rb.member_id))
    ta = h.call("sync_group", SyncGroupRequest(G, 1, ra.member_id, assignments=()))
    h.flush(ErrorCode.not_leader_or_follower)
    assert h.replies[ta].error_code is ErrorCode.not_coordinator
    assert h.replies[tb].error_code is ErrorCode.not_coordinator
    assert state(h) is GroupState.PREPARING_REBALANCE


def test_protocol_is_chosen_by_votes_among_protocols_all_members_support() -> None:
    h = Harness()
    rr_first = (("roundrobin", b"r"), ("range", b"g"), ("sticky", b"s"))
    ids = [get_member_id(h) for _ in range(3)]
    protocols = [rr_first, rr_first, (("range", b"g"), ("roundrobin", b"r"))]
    tokens = [
        h.call("join_group", join_req(G, i, protocols=p))
        for i, p in zip(ids, protocols, strict=True)
    ]
    assert {h.replies[t].protocol_name for t in tokens} == {"roundrobin"}
    leader = h.replies[tokens[0]]
    assert [m.metadata for m in leader.members] == [b"r", b"r", b"r"]


def test_inconsistent_protocols_are_refused() -> None:
    h = Harness()
    stable_two(h)
    other_type = h.call("join_group", join_req(G, protocol_type="connect"))
    no_common = h.call("join_group", join_req(G, protocols=(("sticky", b""),)))
    for token in (other_type, no_common):
        assert h.replies[token].error_code is ErrorCode.inconsistent_group_protocol
    assert state(h) is GroupState.STABLE


def test_member_leaving_triggers_a_rebalance() -> None:
    h = Harness()
    a, b, gen = stable_two(h)
    response, fx = h.coord.leave_group(LeaveGroupRequest(G, (LeaveMember(b),)), h.now_ms)
    h.apply(fx)
    assert response.members[0].error_code is ErrorCode.none
    assert state(h) is GroupState.PREPARING_REBALANCE
    assert heartbeat(h, a, gen) is ErrorCode.rebalance_in_progress
    token = h.call("join_group", join_req(G, a))
    reply = h.replies[token]
    assert reply.generation_id == gen + 1 and [m.member_id for m in reply.members] == [a]
    assert heartbeat(h, b, gen) is ErrorCode.unknown_member_id


def test_leaving_unknown_member_is_reported_per_member() -> None:
    h = Harness()
    stable_two(h)
    response, _ = h.coord.leave_group(LeaveGroupRequest(G, (LeaveMember("nobody"),)), h.now_ms)
    assert response.members[0].error_code is ErrorCode.unknown_member_id
    assert state(h) is GroupState.STABLE


def test_last_member_leaving_empties_the_group() -> None:
    h = Harness()
    a, b, gen = stable_two(h)
    for member in (a, b):
        h.apply(h.coord.leave_group(LeaveGroupRequest(G, (LeaveMember(member),)), h.now_ms)[1])
    assert state(h) is GroupState.EMPTY
    assert h.coord._groups[G].generation_id == gen + 1


def test_session_timeout_expels_a_silent_member() -> None:
    h = Harness()
    a, b, gen = stable_two(h)
    for _ in range(3):  # a heartbeats every 4 s, b is silent
        h.advance(4_000)
        assert heartbeat(h, a, gen) in (ErrorCode.none, ErrorCode.rebalance_in_progress)
    assert h.now_ms - 1_000 >= SESSION_MS
    assert b not in h.coord._groups[G].members
    assert state(h) is GroupState.PREPARING_REBALANCE
    token = h.call("join_group", join_req(G, a))
    assert h.replies[token].generation_id == gen + 1


def test_heartbeat_during_rebalance_and_with_a_stale_generation() -> None:
    h = Harness()
    a, b, gen = stable_two(h)
    assert heartbeat(h, b, gen + 5) is ErrorCode.illegal_generation
    assert heartbeat(h, "ghost", gen) is ErrorCode.unknown_member_id
    h.call("join_group", join_req(G, a, protocols=(("range", b"new-sub"),)))  # a rejoins
    assert state(h) is GroupState.PREPARING_REBALANCE
    assert heartbeat(h, b, gen) is ErrorCode.rebalance_in_progress


def test_rebalance_timeout_drops_members_that_do_not_rejoin() -> None:
    h = Harness()
    a, b, gen = stable_two(h)
    ta = h.call("join_group", join_req(G, a, protocols=(("range", b"new-sub"),)))
    for _ in range(REBALANCE_MS // 5_000):  # b keeps its session alive but never rejoins
        assert ta not in h.replies
        assert heartbeat(h, b, gen) is ErrorCode.rebalance_in_progress
        h.advance(5_000)
    reply = h.replies[ta]
    assert reply.generation_id == gen + 1 and [m.member_id for m in reply.members] == [a]
    assert heartbeat(h, b, gen) is ErrorCode.unknown_member_id


def test_members_that_never_sync_are_removed_after_the_rebalance_timeout() -> None:
    h = Harness()
    ra, rb = join_two(h)
    tb = h.call("sync_group", SyncGroupRequest(G, 1, rb.member_id))
    # The leader heartbeats (so its session is fine) but never sends its assignment.
    for _ in range(REBALANCE_MS // 5_000):
        assert tb not in h.replies
        assert heartbeat(h, ra.member_id, 1) is ErrorCode.none
        h.advance(5_000)
    assert h.replies[tb].error_code is ErrorCode.rebalance_in_progress
    assert list(h.coord._groups[G].members) == [rb.member_id]
    assert state(h) is GroupState.PREPARING_REBALANCE


def test_sync_errors() -> None:
    h = Harness()
    _, b, gen = stable_two(h)
    cases = [
        (SyncGroupRequest(G, gen, "ghost"), ErrorCode.unknown_member_id),
        (SyncGroupRequest(G, gen + 1, b), ErrorCode.illegal_generation),
        (
            SyncGroupRequest(G, gen, b, protocol_name="sticky"),
            ErrorCode.inconsistent_group_protocol,
        ),
        (SyncGroupRequest("no-such-group", 1, b), ErrorCode.unknown_member_id),
    ]
    for request, code in cases:
        assert h.replies[h.call("sync_group", request)].error_code is code
    # A follower's sync in Stable returns its current assignment.
    assert h.replies[h.call("sync_group", SyncGroupRequest(G, gen, b))].assignment == b"for-b"


def test_join_errors() -> None:
    h = Harness()
    cases = [
        (join_req(""), ErrorCode.invalid_group_id),
        (join_req(G, session_timeout_ms=10), ErrorCode.invalid_session_timeout),
        (join_req(G, "made-up-id"), ErrorCode.unknown_member_id),
    ]
    for request, code in cases:
        assert h.replies[h.call("join_group", request)].error_code is code


def test_follower_rejoining_unchanged_gets_current_generation_without_rebalance() -> None:
    h = Harness()
    _, b, gen = stable_two(h)
    reply = h.replies[h.call("join_group", join_req(G, b))]
    assert reply.generation_id == gen and reply.members == ()
    assert state(h) is GroupState.STABLE


def test_initial_rebalance_delay_waits_for_more_members() -> None:
    delay_ms = 3_000
    h = Harness(
        GroupConfig(offsets_topic_num_partitions=3, group_initial_rebalance_delay_ms=delay_ms)
    )
    ta = h.call("join_group", join_req(G, require_known_member_id=False))
    h.advance(1_000)
    tb = h.call("join_group", join_req(G, require_known_member_id=False))
    h.advance(delay_ms - 1_000 - 1)
    assert ta not in h.replies and tb not in h.replies
    # A member arrived during the first delay, so the delay is extended once more.
    h.advance(delay_ms)
    assert ta not in h.replies
    h.advance(1)
    assert h.replies[ta].generation_id == h.replies[tb].generation_id == 1
    assert len(h.replies[ta].members) == 2


def test_static_member_restart_fences_the_old_incarnation() -> None:
    h = Harness()
    first = h.replies[h.call("join_group", join_req(G, group_instance_id="pod-1"))]
    assert first.error_code is ErrorCode.none, "static members skip MEMBER_ID_REQUIRED"
    old = first.member_id
    h.call("sync_group", SyncGroupRequest(G, first.generation_id, old, assignments=()))
    second = h.replies[h.call("join_group", join_req(G, group_instance_id="pod-1"))]
    assert second.member_id != old and second.member_id.startswith("pod-1-")
    assert heartbeat(h, old, second.generation_id) is ErrorCode.unknown_member_id
    stale = HeartbeatRequest(G, second.generation_id, old, "pod-1")
    assert h.coord.heartbeat(stale, h.now_ms).error_code is ErrorCode.fenced_instance_id


def test_pending_member_that_never_rejoins_expires() -> None:
    h = Harness()
    a, b, gen = stable_two(h)
    get_member_id(h)
    assert len(h.coord._groups[G].pending_members) == 1
    for _ in range(3):
        h.advance(4_000)
        heartbeat(h, a, gen), heartbeat(h, b, gen)
    assert not h.coord._groups[G].pending_members
    assert state(h) is GroupState.STABLE


def test_group_max_size() -> None:
    h = Harness(GroupConfig(offsets_topic_num_partitions=3, group_max_size=2))
    stable_two(h)
    reply = h.replies[h.call("join_group", join_req(G))]
    assert reply.error_code is ErrorCode.group_max_size_reached
