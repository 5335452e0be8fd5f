"""KIP-848 regex subscriptions in the pure ConsumerGroup: matching, re-resolution when topics
come and go (which moves the group epoch and reassigns), the union with topic names,
invalid and hostile patterns, internal topics, and the stored record."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from raftlog.errors import ErrorCode
from raftlog.groups import offsets_format as fmt
from raftlog.groups.consumer_format import group_from_value, group_to_value
from raftlog.groups.consumer_group import ConsumerGroup
from raftlog.groups.messages import ConsumerHeartbeatRequest, ConsumerHeartbeatResponse
from raftlog.groups.settings import GroupConfig
from raftlog.groups.topic_regex import (
    MAX_REGEX_CHARS,
    MAX_REGEX_MATCHED_TOPICS,
    InvalidRegex,
    check_regex,
    match_topics,
)

CONFIG = GroupConfig()
REBALANCE_MS = 60_000


class Cluster:
    """A ConsumerGroup with the cluster's topics as the handler hands them in: every topic's
    partition count and the non-internal names."""

    def __init__(self, topics: dict[str, int], internal: frozenset[str] = frozenset()) -> None:
        self.group = ConsumerGroup("g", CONFIG)
        self.topics = dict(topics)
        self.internal = internal
        self.now_ms = 0

    def beat(
        self, req: ConsumerHeartbeatRequest, may_describe: Callable[[str], bool] | None = None
    ) -> ConsumerHeartbeatResponse:
        names = frozenset(t for t in self.topics if t not in self.internal)
        resp = self.group.heartbeat(req, self.topics, self.now_ms, "generated", names, may_describe)
        self.group.check_invariants()
        return resp


def join(
    member_id: str, regex: str | None, names: tuple[str, ...] | None = None
) -> ConsumerHeartbeatRequest:
    return ConsumerHeartbeatRequest(
        "g",
        member_id,
        0,
        rebalance_timeout_ms=REBALANCE_MS,
        subscribed_topic_names=names,
        subscribed_topic_regex=regex,
        owned=frozenset(),
    )


def beat(
    member_id: str, resp: ConsumerHeartbeatResponse, owned: frozenset[tuple[str, int]]
) -> ConsumerHeartbeatRequest:
    return ConsumerHeartbeatRequest("g", member_id, resp.member_epoch, owned=owned)


def tps(topic: str, count: int) -> frozenset[tuple[str, int]]:
    return frozenset((topic, p) for p in range(count))


def test_the_regex_matches_whole_names_and_the_member_gets_their_partitions() -> None:
    c = Cluster({"rx-a": 2, "rx-b": 1, "other": 3, "x-rx-c": 1})
    r = c.beat(join("m", "rx-.*"))
    assert r.error_code is ErrorCode.none
    # Whole-name match (Java's Matcher.matches()): "x-rx-c" does not match "rx-.*".
    assert r.assignment == tps("rx-a", 2) | tps("rx-b", 1)
    described = c.group.describe().members[0]
    assert described.subscribed_topic_regex == "rx-.*"
    assert described.subscribed_topic_names == ()


def test_names_and_regex_are_a_union() -> None:
    c = Cluster({"rx-a": 1, "other": 2})
    r = c.beat(join("m", "rx-.*", ("other",)))
    assert r.assignment == tps("rx-a", 1) | tps("other", 2)
    # A join with topic names and "" (librdkafka without a regex) is a plain subscription.
    c2 = Cluster({"rx-a": 1, "other": 2})
    assert c2.beat(join("m", "", ("other",))).assignment == tps("other", 2)


def test_topic_created_then_deleted_is_resolved_again_and_moves_the_epoch() -> None:
    c = Cluster({"rx-a": 2, "other": 1})
    r = c.beat(join("m", "^rx-.*"))
    owned = r.assignment or frozenset()
    assert owned == tps("rx-a", 2)
    # Nothing changed: a heartbeat keeps the epoch.
    steady = c.beat(beat("m", r, owned))
    assert steady.member_epoch == r.member_epoch
    # A matching topic is created: the group epoch moves and the member gets it.
    c.topics["rx-new"] = 3
    epoch_before = c.group.group_epoch
    r2 = c.beat(beat("m", r, owned))
    assert c.group.group_epoch > epoch_before
    assert r2.member_epoch == c.group.group_epoch
    assert r2.assignment == tps("rx-a", 2) | tps("rx-new", 3)
    owned = r2.assignment or frozenset()
    # A topic that does not match changes nothing.
    c.topics["unrelated"] = 1
    epoch_before = c.group.group_epoch
    r3 = c.beat(beat("m", r2, owned))
    assert c.group.group_epoch == epoch_before and r3.member_epoch == r2.member_epoch
    # The topic is deleted: resolved again, epoch moves, its partitions are revoked.
    del c.topics["rx-a"]
    r4 = c.beat(beat("m", r3, owned))
    assert c.group.group_epoch > epoch_before
    assert r4.assignment == tps("rx-new", 3)
    assert c.group.resolved_regexes == {"^rx-.*": frozenset({"rx-new"})}


def test_two_members_share_a_new_topic() -> None:
    c = Cluster({"rx-a": 2})
    a = c.beat(join("a", "rx-.*"))
    b = c.beat(join("b", "rx-.*"))
    owned = {"a": a.assignment or frozenset(), "b": b.assignment or frozenset()}
    epochs = {"a": a, "b": b}
    c.topics["rx-b"] = 2
    for _ in range(4):
        for m in ("a", "b"):
            r = c.beat(beat(m, epochs[m], owned[m]))
            assert r.error_code is ErrorCode.none
            epochs[m] = r
            if r.assignment is not None:
                owned[m] = r.assignment
    assert owned["a"] | owned["b"] == tps("rx-a", 2) | tps("rx-b", 2)
    assert not owned["a"] & owned["b"] and len(owned["a"]) == len(owned["b"]) == 2
    assert c.group.state == "Stable"


def test_a_regex_matches_only_what_the_resolving_member_may_describe() -> None:
    """KAFKA-18813: the member whose heartbeat resolves its regex gets only the topics its
    ACLs let it DESCRIBE, and the ACLs are asked only when a resolution is due."""
    c = Cluster({"orders": 2, "secret": 1})
    asked: list[str] = []

    def alice(name: str) -> bool:
        asked.append(name)
        return name != "secret" and name != "secret-2"

    a = c.beat(join("alice", ".*"), alice)
    assert a.assignment == tps("orders", 2)
    assert sorted(asked) == ["orders", "secret"]
    asked.clear()
    a = c.beat(beat("alice", a, tps("orders", 2)), alice)
    assert asked == []  # nothing changed: no resolution, no ACL lookups

    # bob may see everything and subscribes by name: a topic is created and bob beats first.
    # His heartbeat resolves no regex of the group, so alice's stays hers.
    b = c.beat(join("bob", None, ("orders",)), lambda name: True)
    c.topics["secret-2"] = 1
    b = c.beat(beat("bob", b, b.assignment or frozenset()), lambda name: True)
    assert c.group.resolved_regexes == {".*": frozenset({"orders"})}
    a = c.beat(beat("alice", a, tps("orders", 2)), alice)
    assert "secret-2" in asked  # alice's own heartbeat resolved it again, with her ACLs
    assert c.group.resolved_regexes == {".*": frozenset({"orders"})}
    assert all(t == "orders" for m in c.group.members.values() for t, _ in m.assigned)


def test_internal_topics_never_match() -> None:
    c = Cluster(
        {"__consumer_offsets": 50, "__transaction_state": 50, "t": 1},
        internal=frozenset({"__consumer_offsets", "__transaction_state"}),
    )
    r = c.beat(join("m", ".*"))
    assert r.assignment == tps("t", 1)


def test_dropping_the_regex_and_leaving_forget_it() -> None:
    c = Cluster({"rx-a": 1, "other": 1})
    r = c.beat(join("m", "rx-.*", ("other",)))
    owned = r.assignment or frozenset()
    dropped = ConsumerHeartbeatRequest(
        "g", "m", r.member_epoch, owned=owned, subscribed_topic_regex=""
    )
    c.beat(dropped)
    assert c.group.resolved_regexes == {}
    assert c.group.target["m"] == tps("other", 1)
    n = c.beat(join("n", "rx-.*"))
    assert n.error_code is ErrorCode.none and "rx-.*" in c.group.resolved_regexes
    c.beat(ConsumerHeartbeatRequest("g", "n", -1))
    assert c.group.resolved_regexes == {}


def test_without_topic_names_the_last_resolution_stands() -> None:
    c = Cluster({"rx-a": 1})
    r = c.beat(join("m", "rx-.*"))
    epoch = c.group.group_epoch
    # A caller that passes no names (nothing to resolve against) changes nothing.
    resp = c.group.heartbeat(beat("m", r, r.assignment or frozenset()), c.topics, 0, "x", None)
    assert resp.error_code is ErrorCode.none and c.group.group_epoch == epoch
    assert c.group.resolved_regexes == {"rx-.*": frozenset({"rx-a"})}


@pytest.mark.parametrize("pattern", ["(", "[a-", "a{2,1}", "(?<=a)b", "x{1001}", "\\8"])
def test_invalid_patterns_are_refused_with_a_message(pattern: str) -> None:
    with pytest.raises(InvalidRegex, match="is not a valid regular expression"):
        check_regex(pattern)


def test_a_too_long_pattern_is_refused() -> None:
    check_regex("a" * MAX_REGEX_CHARS)
    with pytest.raises(InvalidRegex, match="the limit is"):
        check_regex("a" * (MAX_REGEX_CHARS + 1))


def test_hostile_patterns_finish_fast() -> None:
    # Catastrophic for a backtracking engine (2**n paths); linear for RE2.
    names = ["a" * 248 + "!", "a" * 249, "b" * 249]
    started = time.monotonic()
    for pattern in ("(a+)+$", "(a|aa)+$", "(a*)*b", "(.*a){20}"):
        match_topics(pattern, names * 100)
    assert time.monotonic() - started < 2.0
    assert match_topics("(a+)+$", names) == frozenset({"a" * 249})


def test_matches_are_capped() -> None:
    names = [f"t{i:06d}" for i in range(MAX_REGEX_MATCHED_TOPICS + 5)]
    matched = match_topics("t.*", names)
    assert len(matched) == MAX_REGEX_MATCHED_TOPICS
    assert max(matched) == names[MAX_REGEX_MATCHED_TOPICS - 1]


def test_the_record_keeps_the_regex_and_its_resolution() -> None:
    c = Cluster({"rx-a": 2, "other": 1})
    r = c.beat(join("m", "rx-.*", ("other",)))
    data = fmt.consumer_group_record("g", group_to_value(c.group))[1]
    assert data is not None
    loaded = group_from_value("g", fmt.decode_consumer_group_value(data), CONFIG, 0)
    assert loaded.members["m"].subscribed_regex == "rx-.*"
    assert loaded.resolved_regexes == {"rx-.*": frozenset({"rx-a"})}
    # The loaded group resolves again on its first heartbeat: same topics, same epoch.
    epoch = loaded.group_epoch
    names = frozenset(c.topics)
    resp = loaded.heartbeat(beat("m", r, r.assignment or frozenset()), c.topics, 0, "x", names)
    assert resp.error_code is ErrorCode.none and loaded.group_epoch == epoch
