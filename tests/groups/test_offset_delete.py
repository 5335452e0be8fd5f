"""OffsetDelete (KIP-496) in the pure GroupCoordinator: Kafka's per-group and per-partition
rules, tombstones replicated before the answer, and a replay that agrees."""

from __future__ import annotations

from raftlog.client.consumer_protocol import Subscription, encode_subscription
from raftlog.errors import ErrorCode
from raftlog.groups.messages import (
    OffsetDeleteRequest,
    OffsetFetchTopic,
    SyncGroupRequest,
)
from tests.groups.harness import Harness, join_req
from tests.groups.test_coordinator import commit, failover, fetched

E = ErrorCode


def delete(group: str, partitions: dict[str, tuple[int, ...]]) -> OffsetDeleteRequest:
    return OffsetDeleteRequest(
        group, tuple(OffsetFetchTopic(t, ps) for t, ps in partitions.items())
    )


def answer(response) -> dict[tuple[str, int], ErrorCode]:
    return {(t.name, p.partition): p.error_code for t in response.topics for p in t.partitions}


def stable_member(h: Harness, group: str, protocols, protocol_type: str = "consumer") -> str:
    """One member joined and synced: the group is Stable."""
    first = h.replies[
        h.call("join_group", join_req(group, protocols=protocols, protocol_type=protocol_type))
    ]
    member = first.member_id
    joined = h.replies[
        h.call(
            "join_group", join_req(group, member, protocols=protocols, protocol_type=protocol_type)
        )
    ]
    assert joined.error_code is E.none
    synced = h.call(
        "sync_group",
        SyncGroupRequest(group, joined.generation_id, member, assignments=((member, b""),)),
    )
    assert h.replies[synced].error_code is E.none
    return member


def test_empty_group_loses_the_named_offsets_once_replicated() -> None:
    h = Harness()
    h.call("offset_commit", commit("idle", {("t", 0): 1, ("t", 1): 2, ("u", 0): 3}))
    h.auto_flush = False
    token = h.call("offset_delete", delete("idle", {"t": (0, 5, 0)}))
    assert token not in h.replies, "answered only once the tombstones are replicated"
    assert fetched(h, "idle")[("t", 0)] == 1
    h.flush()
    reply = h.replies[token]
    assert reply.error_code is E.none
    # Every requested partition answered once, one without an offset too.
    assert answer(reply) == {("t", 0): E.none, ("t", 5): E.none}
    assert fetched(h, "idle") == {("t", 1): 2, ("u", 0): 3}
    assert fetched(failover(h), "idle") == {("t", 1): 2, ("u", 0): 3}
    # The group itself stays (Empty), as Kafka's does until it expires.
    assert h.coord.describe_groups(["idle"])[0].state == "Empty"


def test_unknown_group_and_routing() -> None:
    h = Harness()
    reply = h.replies[h.call("offset_delete", delete("nobody", {"t": (0,)}))]
    assert (reply.error_code, reply.topics) == (E.group_id_not_found, ())
    h.coord.resign(h.coord.partition_for("elsewhere"), h.now_ms)
    reply = h.replies[h.call("offset_delete", delete("elsewhere", {"t": (0,)}))]
    assert reply.error_code is E.not_coordinator


def test_active_consumer_group_keeps_the_offsets_of_subscribed_topics() -> None:
    h = Harness()
    subscription = encode_subscription(Subscription(("t",)))
    member = stable_member(h, "live", (("range", subscription),))
    h.call(
        "offset_commit",
        commit("live", {("t", 0): 4, ("old", 0): 9}, generation_id=1, member_id=member),
    )
    reply = h.replies[h.call("offset_delete", delete("live", {"t": (0,), "old": (0,)}))]
    assert reply.error_code is E.none
    assert answer(reply) == {("t", 0): E.group_subscribed_to_topic, ("old", 0): E.none}
    assert fetched(h, "live") == {("t", 0): 4}


def test_undecodable_subscriptions_count_as_subscribed_to_everything() -> None:
    h = Harness()
    stable_member(h, "odd", (("range", b"\x00"),))
    h.call(
        "offset_commit",
        commit(
            "odd",
            {("x", 0): 1},
            generation_id=1,
            member_id=next(iter(h.coord._groups["odd"].members)),
        ),
    )
    reply = h.replies[h.call("offset_delete", delete("odd", {"x": (0,)}))]
    assert answer(reply) == {("x", 0): E.group_subscribed_to_topic}
    assert fetched(h, "odd") == {("x", 0): 1}


def test_other_protocol_types_with_members_are_non_empty() -> None:
    h = Harness()
    stable_member(h, "connect", (("default", b"cfg"),), protocol_type="connect")
    reply = h.replies[h.call("offset_delete", delete("connect", {"x": (0,)}))]
    assert (reply.error_code, reply.topics) == (E.non_empty_group, ())


def test_a_failed_append_deletes_nothing() -> None:
    h = Harness()
    h.call("offset_commit", commit("idle", {("t", 0): 1}))
    h.auto_flush = False
    token = h.call("offset_delete", delete("idle", {"t": (0,)}))
    h.flush(E.not_leader_or_follower)
    assert h.replies[token].error_code is E.not_coordinator
    assert fetched(h, "idle") == {("t", 0): 1}


def test_a_commit_in_flight_is_tombstoned_too() -> None:
    h = Harness()
    h.call("offset_commit", commit("idle", {("t", 0): 1}))
    h.auto_flush = False
    h.call("offset_commit", commit("idle", {("t", 1): 7}))
    token = h.call("offset_delete", delete("idle", {"t": (1,)}))
    h.flush()
    assert answer(h.replies[token]) == {("t", 1): E.none}
    assert fetched(h, "idle") == {("t", 0): 1}
    assert fetched(failover(h), "idle") == {("t", 0): 1}


def test_kip848_group_keeps_the_offsets_of_subscribed_topics() -> None:
    from tests.groups.test_consumer_coordinator import G as CG
    from tests.groups.test_consumer_coordinator import T as CT
    from tests.groups.test_consumer_coordinator import join

    h = Harness()
    code, epoch = join(h, "m1")
    assert code is E.none
    h.call("offset_commit", commit(CG, {(CT, 0): 5}, generation_id=epoch, member_id="m1"))
    h.call("offset_commit", commit(CG, {("gone", 0): 3}, generation_id=epoch, member_id="m1"))
    assert fetched(h, CG) == {(CT, 0): 5, ("gone", 0): 3}
    reply = h.replies[h.call("offset_delete", delete(CG, {CT: (0,), "gone": (0,)}))]
    assert reply.error_code is E.none
    assert answer(reply) == {(CT, 0): E.group_subscribed_to_topic, ("gone", 0): E.none}
    assert fetched(h, CG) == {(CT, 0): 5}
