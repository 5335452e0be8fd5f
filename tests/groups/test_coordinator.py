"""Offsets, routing, failover and admin APIs of the pure GroupCoordinator."""

from __future__ import annotations

import random

import pytest

from raftlog.errors import CorruptRecordError, ErrorCode
from raftlog.groups.coordinator import GroupCoordinator
from raftlog.groups.group import GroupState
from raftlog.groups.messages import (
    HeartbeatRequest,
    LeaveGroupRequest,
    LeaveMember,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitTopic,
    OffsetFetchRequest,
    OffsetFetchTopic,
    SyncGroupRequest,
)
from tests.groups.harness import Harness, join_req
from tests.groups.test_group import G, heartbeat, stable_two


def commit(group: str, offsets: dict[tuple[str, int], int], **kw) -> OffsetCommitRequest:
    topics: dict[str, list[OffsetCommitPartition]] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append(
            OffsetCommitPartition(partition, offset, leader_epoch=3, metadata=f"m{offset}")
        )
    return OffsetCommitRequest(
        group, tuple(OffsetCommitTopic(t, tuple(ps)) for t, ps in topics.items()), **kw
    )


def codes(response) -> set[ErrorCode]:
    return {p.error_code for t in response.topics for p in t.partitions}


def fetched(h_or_coord, group: str, topics=None) -> dict[tuple[str, int], int]:
    coord = getattr(h_or_coord, "coord", h_or_coord)
    response = coord.offset_fetch(OffsetFetchRequest(group, topics))
    assert response.error_code is ErrorCode.none
    return {(t.name, p.partition): p.offset for t in response.topics for p in t.partitions}


def failover(h: Harness) -> GroupCoordinator:
    """A new coordinator that loads every partition from h's replicated log."""
    coord = GroupCoordinator(h.config)
    for partition in range(h.config.offsets_topic_num_partitions):
        coord.begin_load(partition, h.now_ms)
        coord.complete_load(partition, h.log.get(partition, []), h.now_ms)
    return coord


def test_standalone_commit_and_fetch_round_trip() -> None:
    h = Harness(auto_flush=False)
    token = h.call("offset_commit", commit(G, {("t", 0): 10, ("t", 1): 20, ("u", 0): 5}))
    assert token not in h.replies, "answered only once replicated"
    assert fetched(h, G, (OffsetFetchTopic("t", (0,)),)) == {("t", 0): -1}
    h.flush()
    assert codes(h.replies[token]) == {ErrorCode.none}
    assert fetched(h, G) == {("t", 0): 10, ("t", 1): 20, ("u", 0): 5}
    one = h.coord.offset_fetch(OffsetFetchRequest(G, (OffsetFetchTopic("t", (1, 7)),)))
    [topic] = one.topics
    assert [(p.partition, p.offset, p.leader_epoch, p.metadata) for p in topic.partitions] == [
        (1, 20, 3, "m20"),
        (7, -1, -1, ""),
    ]
    assert h.coord.committed_offsets()[(G, "t", 1)].offset == 20
    assert fetched(h, "never-committed") == {}


def test_failed_append_is_not_cached_and_maps_the_error() -> None:
    h = Harness(auto_flush=False)
    token = h.call("offset_commit", commit(G, {("t", 0): 10}))
    h.flush(ErrorCode.not_enough_replicas)
    assert codes(h.replies[token]) == {ErrorCode.coordinator_not_available}
    assert fetched(h, G, (OffsetFetchTopic("t", (0,)),)) == {("t", 0): -1}


def test_member_commits_are_validated() -> None:
    h = Harness()
    a, b, gen = stable_two(h)
    ok = h.call("offset_commit", commit(G, {("t", 0): 1}, generation_id=gen, member_id=a))
    stale = h.call("offset_commit", commit(G, {("t", 0): 2}, generation_id=gen - 1, member_id=a))
    ghost = h.call("offset_commit", commit(G, {("t", 0): 3}, generation_id=gen, member_id="x"))
    outsider = h.call("offset_commit", commit(G, {("t", 0): 4}))
    assert codes(h.replies[ok]) == {ErrorCode.none}
    assert codes(h.replies[stale]) == {ErrorCode.illegal_generation}
    assert codes(h.replies[ghost]) == {ErrorCode.unknown_member_id}
    assert codes(h.replies[outsider]) == {ErrorCode.unknown_member_id}
    assert fetched(h, G) == {("t", 0): 1}
    # During CompletingRebalance the member has no assignment yet.
    h.call("join_group", join_req(G, a, protocols=(("range", b"x"),)))
    h.call("join_group", join_req(G, b))
    mid = h.call("offset_commit", commit(G, {("t", 0): 9}, generation_id=gen + 1, member_id=a))
    assert codes(h.replies[mid]) == {ErrorCode.rebalance_in_progress}
    # A member commit for a group this coordinator never saw is from an old generation.
    lost = h.call("offset_commit", commit("gone", {("t", 0): 1}, generation_id=4, member_id=a))
    assert codes(h.replies[lost]) == {ErrorCode.illegal_generation}


def test_a_commit_without_a_generation_naming_a_member_id_is_standalone_while_empty() -> None:
    # librdkafka with group.protocol=consumer and assign() commits with generation -1 and the
    # member id it made for itself (it never joined); Kafka's KIP-848 coordinator accepts it.
    h = Harness()
    first = h.call("offset_commit", commit("solo", {("t", 0): 900}, member_id="self-made-uuid"))
    assert codes(h.replies[first]) == {ErrorCode.none}
    again = h.call("offset_commit", commit("solo", {("t", 0): 901}, member_id="self-made-uuid"))
    assert codes(h.replies[again]) == {ErrorCode.none}
    assert fetched(h, "solo") == {("t", 0): 901}
    # A live group still takes commits from its members only.
    stable_two(h)
    outsider = h.call("offset_commit", commit(G, {("t", 0): 4}, member_id="self-made-uuid"))
    assert codes(h.replies[outsider]) == {ErrorCode.unknown_member_id}


def test_oversized_metadata_fails_only_that_partition() -> None:
    h = Harness()
    big = "x" * (h.config.offset_metadata_max_bytes + 1)
    request = OffsetCommitRequest(
        G,
        (
            OffsetCommitTopic(
                "t", (OffsetCommitPartition(0, 5, metadata=big), OffsetCommitPartition(1, 6))
            ),
        ),
    )
    reply = h.replies[h.call("offset_commit", request)]
    assert [(p.partition, p.error_code) for p in reply.topics[0].partitions] == [
        (0, ErrorCode.offset_metadata_too_large),
        (1, ErrorCode.none),
    ]


def test_load_after_failover_replays_offsets_groups_and_tombstones() -> None:
    h = Harness()
    a, b, gen = stable_two(h)
    h.call("offset_commit", commit(G, {("t", 0): 1, ("t", 1): 1}, generation_id=gen, member_id=a))
    h.call("offset_commit", commit(G, {("t", 0): 7}, generation_id=gen, member_id=b))
    h.call("offset_commit", commit("solo", {("s", 0): 42}))
    h.call("offset_commit", commit("doomed", {("d", 0): 1}))
    assert h.replies[h.call("delete_groups", ["doomed"])][0].error_code is ErrorCode.none

    coord = failover(h)
    assert coord.committed_offsets() == h.coord.committed_offsets()
    assert fetched(coord, G) == {("t", 0): 7, ("t", 1): 1}
    assert fetched(coord, "doomed") == {}
    [described] = coord.describe_groups([G])
    assert described.state == "Stable" and described.protocol_data == "range"
    assert {m.member_id: m.assignment for m in described.members} == {a: b"for-a", b: b"for-b"}
    listed = {g.group_id: g.state for g in coord.list_groups().groups}
    assert listed == {G: "Stable", "solo": "Empty"}
    # Members carry on with the new coordinator at the same generation...
    assert heartbeat_on(coord, a, gen, h.now_ms) is ErrorCode.none
    # ...and a member that never shows up expires one session after the load.
    for step in range(1, 4):
        now = h.now_ms + 4_000 * step
        heartbeat_on(coord, a, gen, now)
        coord.tick(now)
    assert list(coord._groups[G].members) == [a]
    assert coord._groups[G].state is GroupState.PREPARING_REBALANCE


def heartbeat_group(h: Harness, group: str, member: str, gen: int) -> ErrorCode:
    return h.coord.heartbeat(HeartbeatRequest(group, gen, member), h.now_ms).error_code


def heartbeat_on(coord: GroupCoordinator, member: str, gen: int, now_ms: int) -> ErrorCode:
    return coord.heartbeat(HeartbeatRequest(G, gen, member), now_ms).error_code


def test_routing_loading_and_resign() -> None:
    h = Harness()
    partition = h.coord.partition_for(G)
    a, b, gen = stable_two(h)
    parked = h.call("join_group", join_req(G, a, protocols=(("range", b"new"),)))
    h.auto_flush = False
    commit_token = h.call("offset_commit", commit(G, {("t", 0): 5}, generation_id=gen, member_id=b))
    h.apply(h.coord.resign(partition, h.now_ms))
    assert h.replies[parked].error_code is ErrorCode.not_coordinator
    assert heartbeat(h, b, gen) is ErrorCode.not_coordinator
    assert h.coord.offset_fetch(OffsetFetchRequest(G)).error_code is ErrorCode.not_coordinator
    # The commit's append completes after the resign: durable, but not ours to answer OK.
    h.flush()
    assert codes(h.replies[commit_token]) == {ErrorCode.not_coordinator}
    assert h.coord.committed_offsets() == {}
    h.coord.begin_load(partition, h.now_ms)
    assert heartbeat(h, b, gen) is ErrorCode.coordinator_load_in_progress
    assert h.coord.list_groups().error_code is ErrorCode.coordinator_load_in_progress
    h.coord.complete_load(partition, h.log[partition], h.now_ms)
    assert fetched(h, G) == {("t", 0): 5}
    assert heartbeat(h, b, gen) is ErrorCode.none


def test_corrupt_partition_refuses_to_load() -> None:
    coord = GroupCoordinator(Harness().config)
    coord.begin_load(0, 0)
    with pytest.raises(CorruptRecordError):
        coord.complete_load(0, [(b"\xc1", None)], 0)
    assert coord.is_loading(0)


def test_delete_groups_only_deletes_empty_groups() -> None:
    h = Harness()
    stable_two(h, "busy")
    h.auto_flush = False
    h.call("offset_commit", commit("idle", {("t", 0): 1}))
    h.flush()
    # A commit still replicating when the delete starts is tombstoned too.
    h.call("offset_commit", commit("idle", {("t", 9): 1}))
    token = h.call("delete_groups", ["idle", "busy", "nope", "idle"])
    assert token not in h.replies
    assert h.coord.describe_groups(["idle"])[0].state == "Dead"
    h.flush()
    assert [(r.group_id, r.error_code) for r in h.replies[token]] == [
        ("idle", ErrorCode.none),
        ("busy", ErrorCode.non_empty_group),
        ("nope", ErrorCode.group_id_not_found),
    ]
    assert fetched(h, "idle") == {}
    assert "idle" not in {g.group_id for g in h.coord.list_groups().groups}
    assert fetched(failover(h), "idle") == {}
    # The group id is free again.
    again = h.call("offset_commit", commit("idle", {("t", 0): 2}))
    h.flush()
    assert codes(h.replies[again]) == {ErrorCode.none}


def test_failed_delete_leaves_the_group_as_it_was() -> None:
    h = Harness(auto_flush=False)
    h.call("offset_commit", commit("idle", {("t", 0): 1}))
    h.flush()
    token = h.call("delete_groups", ["idle"])
    h.flush(ErrorCode.not_leader_or_follower)
    assert h.replies[token][0].error_code is ErrorCode.not_coordinator
    assert h.coord.describe_groups(["idle"])[0].state == "Empty"
    assert fetched(h, "idle") == {("t", 0): 1}


def test_describe_and_list() -> None:
    h = Harness()
    stable_two(h)
    h.call("offset_commit", commit("solo", {("s", 0): 1}))
    [desc, unknown] = h.coord.describe_groups([G, "unknown"])
    assert desc.state == "Stable" and desc.protocol_type == "consumer"
    assert [m.metadata for m in desc.members] == [b"sub-range", b"sub-range"]
    assert unknown.state == "Dead" and unknown.error_code is ErrorCode.none
    assert [g.group_id for g in h.coord.list_groups(["empty"]).groups] == ["solo"]
    assert {g.group_id for g in h.coord.list_groups().groups} == {G, "solo"}


@pytest.mark.parametrize("seed", range(12))
def test_random_operations_replay_to_the_same_state(seed: int) -> None:
    """Whatever sequence of joins, syncs, leaves, commits, deletions and expiries happens,
    a coordinator loaded from the log holds the same offsets and stable groups."""
    rng = random.Random(seed)
    h = Harness()
    groups = ["g0", "g1", "g2", "g3"]
    members: dict[str, list[str]] = {g: [] for g in groups}
    for step in range(300):
        group = rng.choice(groups)
        op = rng.random()
        group_obj = h.coord._groups.get(group)
        gen = group_obj.generation_id if group_obj else -1
        if op < 0.25:
            member = rng.choice([*members[group], ""])
            token = h.call("join_group", join_req(group, member))
            reply = h.replies.get(token)
            if reply is not None and reply.error_code is ErrorCode.member_id_required:
                members[group].append(reply.member_id)
        elif op < 0.45 and members[group]:
            member = rng.choice(members[group])
            if group_obj is not None and group_obj.leader_id and rng.random() < 0.5:
                member = group_obj.leader_id
            assignments = tuple((m, m.encode()) for m in members[group])
            h.call("sync_group", SyncGroupRequest(group, gen, member, assignments=assignments))
        elif op < 0.55 and members[group]:
            member = members[group].pop(rng.randrange(len(members[group])))
            h.apply(
                h.coord.leave_group(LeaveGroupRequest(group, (LeaveMember(member),)), h.now_ms)[1]
            )
        elif op < 0.8:
            member = rng.choice([*members[group], ""])
            offsets = {(f"t{rng.randrange(2)}", rng.randrange(3)): rng.randrange(1000)}
            h.call(
                "offset_commit",
                commit(group, offsets, generation_id=gen if member else -1, member_id=member),
            )
        elif op < 0.85:
            h.call("delete_groups", [group])
        elif op < 0.93:
            for g, ids in members.items():
                g_obj = h.coord._groups.get(g)
                for member in ids:
                    if g_obj is not None:
                        heartbeat_group(h, g, member, g_obj.generation_id)
        else:
            h.advance(rng.choice([100, 3_000, 3_000, 11_000, 31_000]))
        for g in h.coord._groups.values():
            assert g.state is not GroupState.DEAD, f"seed={seed} step={step}: dead group kept"
            if g.state is GroupState.STABLE:
                assert g.leader_id in g.members, f"seed={seed} step={step}"
        if step % 25 == 24:
            assert_replay_matches(h, f"seed={seed} step={step}")


def assert_replay_matches(h: Harness, where: str) -> None:
    coord = failover(h)
    assert coord.committed_offsets() == h.coord.committed_offsets(), where
    for group_id, group in h.coord._groups.items():
        if group.state is GroupState.STABLE:
            loaded = coord._groups[group_id]
            assert loaded.generation_id == group.generation_id, f"{where} {group_id}"
            assert {m: x.assignment for m, x in loaded.members.items()} == {
                m: x.assignment for m, x in group.members.items()
            }, f"{where} {group_id}"
