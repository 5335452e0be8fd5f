"""KIP-848 groups in the GroupCoordinator: one protocol per group id, commits at the member
epoch, listing and describing, timeouts through tick(), the group's record in
`__consumer_offsets` and a failover that replays it."""

from __future__ import annotations

import pytest

from raftlog.errors import ErrorCode
from raftlog.groups.messages import (
    ConsumerHeartbeatRequest,
    ConsumerHeartbeatResponse,
    LeaveGroupRequest,
    LeaveMember,
    OffsetFetchRequest,
    OffsetFetchTopic,
)
from tests.groups.harness import Harness, join_req
from tests.groups.test_coordinator import codes, commit

G = "kip848"
T = "orders"
COUNTS = {T: 4}


def beat(h: Harness, req: ConsumerHeartbeatRequest) -> ConsumerHeartbeatResponse:
    token = h.token()
    h.apply(h.coord.consumer_group_heartbeat(token, req, COUNTS, h.now_ms))
    resp: ConsumerHeartbeatResponse = h.replies[token]
    return resp


def join(h: Harness, member_id: str, group: str = G) -> tuple[ErrorCode, int]:
    req = ConsumerHeartbeatRequest(
        group,
        member_id,
        0,
        rebalance_timeout_ms=60_000,
        subscribed_topic_names=(T,),
        owned=frozenset(),
    )
    resp = beat(h, req)
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


def test_a_refused_join_leaves_no_group() -> None:
    h = Harness()
    resp = beat(h, ConsumerHeartbeatRequest(G, "a", 0, owned=frozenset()))
    assert resp.error_code is ErrorCode.invalid_request
    assert h.coord.list_groups().groups == ()


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
    beat(h, ConsumerHeartbeatRequest(G, "a", -1))
    token = h.token()
    h.apply(h.coord.delete_groups(token, [G], h.now_ms))
    assert h.replies[token][0].error_code is ErrorCode.none
    assert G not in {g.group_id for g in h.coord.list_groups().groups}


def reload(h: Harness, group: str = G) -> None:
    partition = h.coord.partition_for(group)
    h.coord.resign(partition, h.now_ms)
    h.coord.begin_load(partition, h.now_ms)
    h.coord.complete_load(partition, h.log.get(partition, []), h.now_ms)


def test_a_failover_replays_the_group_and_members_carry_on() -> None:
    h = Harness()
    join(h, "a")
    join(h, "b")
    # Reconcile a partway: it is asked to revoke, the failover comes before it acknowledges.
    a = h.coord.consumer.get(G).members["a"]  # type: ignore[union-attr]
    resp = beat(h, ConsumerHeartbeatRequest(G, "a", a.member_epoch, owned=a.assigned))
    (before,) = h.coord.consumer_group_describe([G])
    reload(h)
    (after,) = h.coord.consumer_group_describe([G])
    assert after == before
    group = h.coord.consumer.get(G)
    assert group is not None
    group.check_invariants()
    # a acknowledges at the new coordinator; b then gets what a gave up.
    ack = beat(h, ConsumerHeartbeatRequest(G, "a", resp.member_epoch, owned=resp.assignment))
    assert ack.error_code is ErrorCode.none and ack.member_epoch > resp.member_epoch
    b = group.members["b"]
    got = beat(h, ConsumerHeartbeatRequest(G, "b", b.member_epoch, owned=frozenset()))
    assert got.assignment is not None and got.assignment | (ack.assignment or frozenset()) == {
        (T, p) for p in range(4)
    }


def test_a_heartbeat_that_changes_nothing_writes_nothing() -> None:
    h = Harness()
    _, epoch = join(h, "a")
    partition = h.coord.partition_for(G)
    written = len(h.log[partition])
    for _ in range(3):
        h.now_ms += 1000
        assert beat(h, ConsumerHeartbeatRequest(G, "a", epoch)).error_code is ErrorCode.none
    assert len(h.log[partition]) == written


def test_leaving_timeouts_and_deletion_replay() -> None:
    h = Harness()
    join(h, "a")
    join(h, "b")
    beat(h, ConsumerHeartbeatRequest(G, "b", -1))
    h.now_ms += h.config.group_consumer_session_timeout_ms
    h.apply(h.coord.tick(h.now_ms))  # a's session ends too
    reload(h)
    (after,) = h.coord.consumer_group_describe([G])
    assert after.state == "Empty" and after.members == () and after.group_epoch >= 4
    token = h.token()
    h.apply(h.coord.delete_groups(token, [G], h.now_ms))
    assert h.replies[token][0].error_code is ErrorCode.none
    reload(h)
    (gone,) = h.coord.consumer_group_describe([G])
    assert gone.error_code is ErrorCode.group_id_not_found


def test_a_protocol_change_replays_as_the_new_protocol() -> None:
    h = Harness()
    token = h.token()
    h.apply(h.coord.join_group(token, join_req(G, require_known_member_id=False), h.now_ms))
    member_id = h.replies[token].member_id
    h.apply(h.coord.leave_group(_leave(member_id), h.now_ms)[1])
    assert join(h, "a")[0] is ErrorCode.none  # the Empty classic group turns consumer
    reload(h)
    assert [(g.group_id, g.group_type) for g in h.coord.list_groups().groups] == [(G, "consumer")]


def _leave(member_id: str) -> LeaveGroupRequest:
    return LeaveGroupRequest(G, (LeaveMember(member_id),))


def test_a_damaged_consumer_group_record_stops_the_load() -> None:
    from raftlog.groups import offsets_format as fmt
    from raftlog.groups.consumer_format import ConsumerGroupValue, ConsumerMemberValue
    from raftlog.groups.offsets_format import CODEC, OffsetsRecordError

    member = ConsumerMemberValue(
        "m", None, None, "c", "/h", (T,), None, 1000, 1, 0, "dancing", (), (), (), False
    )
    bad = ConsumerGroupValue(1, 1, (), (member,))
    with pytest.raises(OffsetsRecordError, match="unknown state"):
        fmt.replay([(fmt.consumer_group_key(G), CODEC.encode(bad))])
    ahead = ConsumerGroupValue(1, 2, (), ())
    with pytest.raises(OffsetsRecordError, match="assignment epoch"):
        fmt.replay([(fmt.consumer_group_key(G), CODEC.encode(ahead))])
    with pytest.raises(OffsetsRecordError):
        fmt.replay([(fmt.consumer_group_key(G), b"\x93\x01")])
