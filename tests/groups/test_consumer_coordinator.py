"""KIP-848 groups in the GroupCoordinator: one protocol per group id, commits at the member
epoch, listing and describing, timeouts through tick(), and a failover (members rejoin)."""

from __future__ import annotations

from raftlog.errors import ErrorCode
from raftlog.groups.messages import (
    ConsumerHeartbeatRequest,
    OffsetFetchRequest,
    OffsetFetchTopic,
)
from tests.groups.harness import Harness, join_req
from tests.groups.test_coordinator import codes, commit

G = "kip848"
T = "orders"
COUNTS = {T: 4}


def join(h: Harness, member_id: str, group: str = G) -> tuple[ErrorCode, int]:
    req = ConsumerHeartbeatRequest(
        group,
        member_id,
        0,
        rebalance_timeout_ms=60_000,
        subscribed_topic_names=(T,),
        owned=frozenset(),
    )
    resp = h.coord.consumer_group_heartbeat(req, COUNTS, h.now_ms)
    return resp.error_code, resp.member_epoch


def do_commit(h: Harness, **kw: object) -> set[ErrorCode]:
    token = h.token()
    h.apply(h.coord.offset_commit(token, commit(G, {(T, 0): 5}, **kw), h.now_ms))  # type: ignore[arg-type]
    return codes(h.replies[token])


def test_one_group_id_speaks_one_protocol() -> None:
    h = Harness()
    assert join(h, "a")[0] is ErrorCode.none
    # A classic JoinGroup to a consumer group with members.
    token = h.token()
    h.apply(h.coord.join_group(token, join_req(G), h.now_ms))
    assert h.replies[token].error_code is ErrorCode.inconsistent_group_protocol
    # A consumer heartbeat to a classic group with members.
    token = h.token()
    h.apply(h.coord.join_group(token, join_req("classic", require_known_member_id=False), h.now_ms))
    assert h.replies[token].error_code is ErrorCode.none
    assert join(h, "b", "classic")[0] is ErrorCode.inconsistent_group_protocol


def test_an_empty_group_changes_protocol_and_keeps_its_offsets() -> None:
    h = Harness()
    assert do_commit(h) == {ErrorCode.none}  # a standalone commit: an Empty classic group
    code, epoch = join(h, "a")
    assert code is ErrorCode.none and epoch > 0
    fetched = h.coord.offset_fetch(OffsetFetchRequest(G, (OffsetFetchTopic(T, (0,)),)))
    assert fetched.topics[0].partitions[0].offset == 5
    listed = {g.group_id: g for g in h.coord.list_groups().groups}
    assert listed[G].group_type == "consumer" and listed[G].state == "Stable"


def test_commits_carry_the_member_epoch() -> None:
    h = Harness()
    _, epoch = join(h, "a")
    assert do_commit(h, generation_id=epoch, member_id="a") == {ErrorCode.none}
    assert do_commit(h, generation_id=epoch - 1, member_id="a") == {ErrorCode.stale_member_epoch}
    assert do_commit(h, generation_id=epoch, member_id="zz") == {ErrorCode.unknown_member_id}
    # No member, no epoch: only while the group has no members.
    assert do_commit(h) == {ErrorCode.unknown_member_id}


def test_describe_and_timeouts() -> None:
    h = Harness()
    join(h, "a")
    join(h, "b")
    (described,) = h.coord.consumer_group_describe([G])
    assert described.error_code is ErrorCode.none
    assert {m.member_id for m in described.members} == {"a", "b"}
    assert described.assignor_name == "uniform" and described.group_epoch >= 2
    (classic_view,) = h.coord.describe_groups([G])
    assert classic_view.protocol_type == "consumer" and len(classic_view.members) == 2
    (missing,) = h.coord.consumer_group_describe(["nope"])
    assert missing.error_code is ErrorCode.group_id_not_found
    deadline = h.coord.next_deadline_ms()
    assert deadline == h.now_ms + h.config.group_consumer_session_timeout_ms
    h.now_ms = deadline
    h.apply(h.coord.tick(h.now_ms))
    (after,) = h.coord.consumer_group_describe([G])
    assert after.members == () and after.state == "Empty"


def test_deleting_a_consumer_group() -> None:
    h = Harness()
    join(h, "a")
    token = h.token()
    h.apply(h.coord.delete_groups(token, [G], h.now_ms))
    assert h.replies[token][0].error_code is ErrorCode.non_empty_group
    h.coord.consumer_group_heartbeat(ConsumerHeartbeatRequest(G, "a", -1), COUNTS, h.now_ms)
    token = h.token()
    h.apply(h.coord.delete_groups(token, [G], h.now_ms))
    assert h.replies[token][0].error_code is ErrorCode.none
    assert G not in {g.group_id for g in h.coord.list_groups().groups}


def test_after_a_failover_members_rejoin() -> None:
    h = Harness()
    _, epoch = join(h, "a")
    partition = h.coord.partition_for(G)
    h.coord.resign(partition, h.now_ms)
    resp = h.coord.consumer_group_heartbeat(
        ConsumerHeartbeatRequest(G, "a", epoch), COUNTS, h.now_ms
    )
    assert resp.error_code is ErrorCode.not_coordinator
    h.coord.begin_load(partition, h.now_ms)
    h.coord.complete_load(partition, h.log.get(partition, []), h.now_ms)
    resp = h.coord.consumer_group_heartbeat(
        ConsumerHeartbeatRequest(G, "a", epoch), COUNTS, h.now_ms
    )
    assert resp.error_code is ErrorCode.unknown_member_id  # the client rejoins with epoch 0
    assert join(h, "a")[0] is ErrorCode.none
