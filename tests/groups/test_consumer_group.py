"""KIP-848 reconciliation in the pure ConsumerGroup: epochs, revocation before assignment,
leaving, timing out, fencing, static members, and the assignors' balance.

The randomized test drives simulated clients through joins, leaves, lost responses, slow
revocations, coordinator failovers (the group replayed from its record) and forged
heartbeats in a seeded random order and checks, after every step, that no partition is held
by two members (on the coordinator, and by what the clients were told), then that the group
converges to a balanced, complete assignment.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import pytest

from raftlog.errors import ErrorCode
from raftlog.groups import offsets_format as fmt
from raftlog.groups.assignors import range_assign, uniform_assign
from raftlog.groups.consumer_format import group_from_value, group_to_value
from raftlog.groups.consumer_group import ConsumerGroup, MemberState
from raftlog.groups.messages import ConsumerHeartbeatRequest, ConsumerHeartbeatResponse
from raftlog.groups.settings import GroupConfig

G = "cg"
T = "orders"
CONFIG = GroupConfig()
SESSION_MS = CONFIG.group_consumer_session_timeout_ms
REBALANCE_MS = 300_000
COUNTS = {T: 4}
ALL = frozenset((T, p) for p in range(4))


def hb(
    member_id: str,
    epoch: int,
    owned: frozenset[tuple[str, int]] | None = None,
    **kw: object,
) -> ConsumerHeartbeatRequest:
    if epoch == 0:
        kw.setdefault("subscribed_topic_names", (T,))
        kw.setdefault("rebalance_timeout_ms", REBALANCE_MS)
        if owned is None:
            owned = frozenset()
    return ConsumerHeartbeatRequest(G, member_id, epoch, owned=owned, **kw)  # type: ignore[arg-type]


class Group:
    """A ConsumerGroup and a clock."""

    def __init__(self, counts: dict[str, int] | None = None, config: GroupConfig = CONFIG) -> None:
        self.group = ConsumerGroup(G, config)
        self.counts = dict(COUNTS if counts is None else counts)
        self.now_ms = 0

    def beat(self, req: ConsumerHeartbeatRequest) -> ConsumerHeartbeatResponse:
        resp = self.group.heartbeat(req, self.counts, self.now_ms, "generated")
        self.group.check_invariants()
        return resp


def test_first_member_gets_everything_at_the_new_epoch() -> None:
    g = Group()
    resp = g.beat(hb("a", 0))
    assert resp.error_code is ErrorCode.none
    assert resp.member_epoch == g.group.group_epoch == g.group.assignment_epoch
    assert resp.assignment == ALL
    assert resp.heartbeat_interval_ms == CONFIG.group_consumer_heartbeat_interval_ms
    assert g.group.state == "Stable"
    # A steady heartbeat changes nothing and carries no assignment.
    again = g.beat(hb("a", resp.member_epoch))
    assert again.member_epoch == resp.member_epoch and again.assignment is None
    # A heartbeat that reports what it owns gets the assignment back (repairs lost ones).
    assert g.beat(hb("a", resp.member_epoch, ALL)).assignment == ALL


def test_a_partition_moves_only_after_its_owner_revoked_it() -> None:
    g = Group()
    a = g.beat(hb("a", 0))
    b = g.beat(hb("b", 0))
    # b's target is half the partitions, but a still holds them: b gets nothing yet.
    assert b.assignment == frozenset()
    assert g.group.members["b"].state is MemberState.UNRELEASED_PARTITIONS
    # a is asked to give up b's half, keeping its epoch until it acknowledges.
    a2 = g.beat(hb("a", a.member_epoch, ALL))
    assert a2.member_epoch == a.member_epoch
    assert a2.assignment is not None and len(a2.assignment) == 2
    revoked = ALL - a2.assignment
    # b heartbeats again before a acknowledged: still nothing.
    b2 = g.beat(hb("b", b.member_epoch, frozenset()))
    assert not b2.assignment
    # a acknowledges (owns only what it kept) and moves to the new epoch.
    a3 = g.beat(hb("a", a2.member_epoch, a2.assignment))
    assert a3.member_epoch == g.group.assignment_epoch > a.member_epoch
    b3 = g.beat(hb("b", b2.member_epoch, frozenset()))
    assert b3.assignment == revoked
    assert g.group.state == "Stable"


def two_stable(g: Group) -> dict[str, tuple[int, frozenset[tuple[str, int]]]]:
    """Members a and b, balanced and acknowledged: member -> (epoch, owned)."""
    clients = {"a": (0, frozenset()), "b": (0, frozenset())}
    for member in ("a", "b"):
        r = g.beat(hb(member, 0))
        clients[member] = (r.member_epoch, r.assignment or frozenset())
    for _ in range(4):
        for member, (epoch, owned) in list(clients.items()):
            r = g.beat(hb(member, epoch, owned))
            assert r.error_code is ErrorCode.none
            clients[member] = (r.member_epoch, owned if r.assignment is None else r.assignment)
    assert g.group.state == "Stable"
    return clients


def test_a_member_leaving_frees_its_partitions_at_once() -> None:
    g = Group()
    clients = two_stable(g)
    epoch_before = g.group.group_epoch
    left = g.beat(hb("b", -1))
    assert left.member_epoch == -1 and "b" not in g.group.members
    assert g.group.group_epoch > epoch_before
    a = g.beat(hb("a", clients["a"][0], clients["a"][1]))
    assert a.assignment == ALL and a.member_epoch == g.group.group_epoch


def test_a_member_that_stops_heartbeating_is_removed_after_the_session_timeout() -> None:
    g = Group()
    clients = two_stable(g)
    g.now_ms += SESSION_MS - 1
    g.beat(hb("a", *clients["a"]))  # a keeps its session alive
    assert g.group.tick(g.now_ms) == []
    g.now_ms += 2
    assert g.group.next_deadline_ms() is not None
    assert g.group.tick(g.now_ms) == ["b"]
    a = g.beat(hb("a", *clients["a"]))
    assert a.assignment == ALL
    # The removed member's next heartbeat is refused: it must rejoin owning nothing.
    assert g.beat(hb("b", *clients["b"])).error_code is ErrorCode.unknown_member_id


def test_a_member_that_never_revokes_is_removed_after_its_rebalance_timeout() -> None:
    g = Group()
    a = g.beat(hb("a", 0, rebalance_timeout_ms=10_000))
    g.beat(hb("b", 0))
    g.beat(hb("a", a.member_epoch, ALL))  # asked to revoke half
    assert g.group.members["a"].state is MemberState.UNREVOKED_PARTITIONS
    g.now_ms += 10_000
    g.beat(hb("b", g.group.members["b"].member_epoch, frozenset()))  # b stays alive
    assert g.group.tick(g.now_ms) == ["a"]
    b = g.beat(hb("b", g.group.members["b"].member_epoch, frozenset()))
    assert b.assignment == ALL


def test_forged_heartbeats_are_fenced_and_change_nothing() -> None:
    g = Group()
    clients = two_stable(g)
    epoch, owned = clients["a"]
    before = (g.group.group_epoch, dict(g.group.target), g.group.members["a"].assigned)
    assert g.group.members["a"].previous_member_epoch > 0
    for forged_epoch in (epoch + 1, epoch + 100, epoch - 1, 0):
        resp = g.beat(hb("a", forged_epoch, ALL))
        assert resp.error_code is ErrorCode.fenced_member_epoch
        assert resp.assignment is None
    assert g.beat(hb("a", 0, frozenset())).error_code is ErrorCode.fenced_member_epoch
    # The one-epoch lag of a lost response is accepted only owning nothing extra.
    previous = g.group.members["a"].previous_member_epoch
    assert g.beat(hb("a", previous, ALL)).error_code is ErrorCode.fenced_member_epoch
    assert g.beat(hb("ghost", epoch, ALL)).error_code is ErrorCode.unknown_member_id
    assert (g.group.group_epoch, dict(g.group.target), g.group.members["a"].assigned) == before
    # The real member goes on undisturbed.
    assert g.beat(hb("a", epoch, owned)).error_code is ErrorCode.none


def test_a_lost_response_is_caught_up_with_the_previous_epoch() -> None:
    g = Group()
    a = g.beat(hb("a", 0))
    g.beat(hb("b", 0))
    a2 = g.beat(hb("a", a.member_epoch, ALL))  # revoke half
    a3 = g.beat(hb("a", a2.member_epoch, a2.assignment))  # ack: new epoch; response lost
    assert a3.member_epoch > a.member_epoch
    again = g.beat(hb("a", a.member_epoch, a2.assignment))
    assert again.error_code is ErrorCode.none and again.member_epoch == a3.member_epoch
    assert again.assignment == a2.assignment


def test_static_member_keeps_its_partitions_across_a_restart() -> None:
    g = Group()
    a = g.beat(hb("a", 0, instance_id="i-1"))
    left = g.beat(hb("a", -2, instance_id="i-1"))
    assert left.member_epoch == -2 and "a" in g.group.members
    epoch = g.group.group_epoch
    # Another process claiming the instance while the first is active is refused.
    g.beat(hb("x", 0, instance_id="i-2"))
    back = g.beat(hb("a2", 0, instance_id="i-1"))
    assert back.error_code is ErrorCode.none and back.member_id == "a2"
    assert back.member_epoch == a.member_epoch or back.member_epoch == g.group.assignment_epoch
    assert "a" not in g.group.members and g.group.group_epoch >= epoch
    assert g.beat(hb("a3", 0, instance_id="i-1")).error_code is ErrorCode.unreleased_instance_id


def test_join_needs_a_subscription_and_a_known_assignor() -> None:
    g = Group()
    bad = ConsumerHeartbeatRequest(G, "a", 0, rebalance_timeout_ms=1000, owned=frozenset())
    assert g.beat(bad).error_code is ErrorCode.invalid_request
    assert g.beat(hb("a", 0, server_assignor="sticky")).error_code is ErrorCode.unsupported_assignor
    r = g.beat(hb("a", 0, server_assignor="range"))
    assert r.error_code is ErrorCode.none and g.group.assignor_name == "range"


def test_a_new_partition_bumps_the_group_epoch() -> None:
    g = Group()
    a = g.beat(hb("a", 0))
    g.counts[T] = 6
    r = g.beat(hb("a", a.member_epoch, ALL))
    assert r.member_epoch > a.member_epoch and r.assignment is not None and len(r.assignment) == 6


# ---------------------------------------------------------------- assignors
@pytest.mark.parametrize("members", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("partitions", [0, 1, 4, 7, 16])
def test_uniform_is_complete_and_balanced(members: int, partitions: int) -> None:
    subs = {f"m{i}": frozenset({T}) for i in range(members)}
    out = uniform_assign(subs, {T: partitions}, {})
    assigned = [tp for ps in out.values() for tp in ps]
    assert sorted(assigned) == [(T, p) for p in range(partitions)]
    sizes = [len(ps) for ps in out.values()]
    assert max(sizes) - min(sizes) <= 1


def test_uniform_is_sticky() -> None:
    subs = {"a": frozenset({T}), "b": frozenset({T})}
    first = uniform_assign(subs, {T: 8}, {})
    subs["c"] = frozenset({T})
    second = uniform_assign(subs, {T: 8}, first)
    moved = sum(len(first[m] - second[m]) for m in ("a", "b"))
    assert moved == 2  # only what c needs (8 // 3 = 2, 2 extra go to a and b)
    assert len(second["c"]) == 2


def test_uniform_respects_heterogeneous_subscriptions() -> None:
    subs = {"a": frozenset({"x"}), "b": frozenset({"x", "y"}), "c": frozenset({"y"})}
    out = uniform_assign(subs, {"x": 3, "y": 3}, {})
    for member, tps in out.items():
        assert all(t in subs[member] for t, _ in tps)
    assert sorted(tp for ps in out.values() for tp in ps) == sorted(
        [("x", p) for p in range(3)] + [("y", p) for p in range(3)]
    )
    assert max(map(len, out.values())) - min(map(len, out.values())) <= 1


def test_range_gives_contiguous_ranges() -> None:
    subs = {"b": frozenset({T}), "a": frozenset({T})}
    out = range_assign(subs, {T: 5}, {})
    assert out["a"] == {(T, 0), (T, 1), (T, 2)} and out["b"] == {(T, 3), (T, 4)}


# ---------------------------------------------------------------- randomized
@dataclass
class Client:
    member_id: str
    epoch: int = 0
    owned: frozenset[tuple[str, int]] = frozenset()
    # An assignment received but not applied yet (the application is slow to revoke); the
    # epoch is taken at once, as clients do, the owned partitions only once applied.
    pending: frozenset[tuple[str, int]] | None = None
    joined: bool = False
    fenced: bool = False
    log: list[str] = field(default_factory=list)


def client_beat(g: Group, c: Client, rng: random.Random) -> None:
    if c.pending is not None and rng.random() < 0.5:
        c.owned, c.pending = c.pending, None
    if not c.joined:
        resp = g.beat(hb(c.member_id, 0, frozenset(), server_assignor="uniform"))
    else:
        resp = g.beat(hb(c.member_id, c.epoch, c.owned))
    if rng.random() < 0.1:
        return  # the response is lost on the way back
    if resp.error_code is ErrorCode.fenced_member_epoch:
        # Responses lost across two epoch moves: the client drops everything; its member
        # is removed when the session ends and it joins again as a new one.
        c.owned, c.pending, c.fenced = frozenset(), None, True
        return
    assert resp.error_code is ErrorCode.none, resp
    c.joined = True
    c.epoch = resp.member_epoch
    if resp.assignment is None:
        return
    if c.owned - resp.assignment and rng.random() < 0.5:
        c.pending = resp.assignment  # slow revocation: keeps owning everything meanwhile
    else:
        c.owned, c.pending = resp.assignment, None


def check_clients(clients: dict[str, Client]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for c in clients.values():
        for tp in c.owned | (c.pending or frozenset()):
            assert tp not in seen, f"{tp} consumed by {seen[tp]} and {c.member_id}"
            seen[tp] = c.member_id


def run_random(seed: int, steps: int = 400) -> None:
    rng = random.Random(seed)
    g = Group(counts={T: rng.randint(1, 12), "other": 3})
    clients: dict[str, Client] = {}
    next_id = 0

    def new_client() -> None:
        nonlocal next_id
        next_id += 1
        clients[f"m{next_id}"] = Client(f"m{next_id}")

    for _ in range(steps):
        g.now_ms += rng.randint(0, 50)
        action = rng.random()
        live = sorted(m for m, c in clients.items() if not c.fenced)
        if (action < 0.08 and len(live) < 12) or not live:
            new_client()
        elif action < 0.13:
            c = clients.pop(rng.choice(live))
            if c.joined:
                assert g.beat(hb(c.member_id, -1)).error_code is ErrorCode.none
        elif action < 0.15:
            # A coordinator failover: the group comes back from its stored record.
            g.group = replayed(g.group, g.now_ms)
        elif action < 0.2:
            # A forged heartbeat: a member's id, an epoch that is not its own.
            victim = g.group.members.get(rng.choice(live))
            wrong = 0 if victim is None else victim.member_epoch + rng.choice([1, 2, 7, -3, -9])
            if victim is not None and wrong not in (victim.previous_member_epoch, -1, -2):
                before = (victim.assigned, victim.member_epoch, g.group.group_epoch)
                resp = g.beat(hb(victim.member_id, wrong, ALL))
                assert resp.error_code is ErrorCode.fenced_member_epoch, resp
                assert resp.assignment is None
                assert (victim.assigned, victim.member_epoch, g.group.group_epoch) == before
        else:
            client_beat(g, clients[rng.choice(live)], rng)
        check_clients(clients)
    # Quiet period: every live client heartbeats every interval and applies what it gets;
    # fenced ones are dropped and their members expire with their sessions.
    interval_ms = CONFIG.group_consumer_heartbeat_interval_ms
    for _ in range(3 * SESSION_MS // interval_ms):
        g.now_ms += interval_ms
        g.group.tick(g.now_ms)
        for fenced in [m for m, c in clients.items() if c.fenced]:
            del clients[fenced]
            new_client()
        for c in clients.values():
            if c.pending is not None:
                c.owned, c.pending = c.pending, None
            resp = g.beat(
                hb(c.member_id, c.epoch, c.owned)
                if c.joined
                else hb(c.member_id, 0, frozenset(), server_assignor="uniform")
            )
            if resp.error_code is ErrorCode.fenced_member_epoch:
                c.owned, c.fenced = frozenset(), True  # lagged two epochs behind
                continue
            assert resp.error_code is ErrorCode.none, (c, resp)
            c.joined = True
            c.epoch = resp.member_epoch
            if resp.assignment is not None:
                c.owned = resp.assignment
            check_clients(clients)
    assert set(g.group.members) == set(clients)
    assert g.group.state == ("Stable" if clients else "Empty")
    if clients:
        owned = [tp for c in clients.values() for tp in c.owned]
        assert sorted(owned) == sorted((T, p) for p in range(g.counts[T]))
        sizes = [len(c.owned) for c in clients.values()]
        assert max(sizes) - min(sizes) <= 1
        assert all(c.epoch == g.group.assignment_epoch for c in clients.values())


def replayed(group: ConsumerGroup, now_ms: int) -> ConsumerGroup:
    """`group` written to and replayed from `__consumer_offsets` records."""
    record = fmt.consumer_group_record(group.group_id, group_to_value(group))
    (value,) = fmt.replay([record]).consumer_groups.values()
    back = group_from_value(group.group_id, value, group.config, now_ms)
    assert back.describe() == group.describe()
    assert back.subscribed_partitions == group.subscribed_partitions
    return back


def test_random_join_leave_ack_orders() -> None:
    base = int(os.environ.get("RAFTLOG_SEED", random.randrange(1 << 30)))
    for seed in range(base, base + 60):
        try:
            run_random(seed)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed} (RAFTLOG_SEED={seed} replays it): {exc}") from exc
