"""Nemesis scheduling and fault choice against a fake cluster (the one fake: at the edge)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from jepsen.forger import Forger, Target
from jepsen.history import FAULT_START, FAULT_STOP, Recorder
from jepsen.nemesis import (
    FAMILIES,
    Nemesis,
    PartitionReplicas,
    bridge,
    halves,
    isolate,
    majorities_ring,
    parse_families,
    split_kind,
)
from raftlog.metadata.raft.majority import majority_size


class FakeCluster:
    """Records every control call with trio's (mock) time; tracks node states, voters and
    the placement of two partitions so tests can assert that the run ends whole.

    Membership follows KIP-853's rules as raftlog's controller enforces them: one voter
    change at a time (each committed before the call returns), a new voter must be a
    running node, the last voter stays. Reassignments finish at once unless
    ``moves_finish`` is False (then they stay in flight until cancelled)."""

    def __init__(self, n: int = 5, controller: str | None = "n1", spare: bool = True) -> None:
        self.names = [f"n{i}" for i in range(1, n + 1)]
        self.spare = f"n{n + 1}" if spare else None
        self.up = set(self.names)
        self.paused: set[str] = set()
        self.grudge: dict[str, list[str]] = {}
        self.controller = controller
        self.calls: list[tuple[float, str, object]] = []
        self.voter_set = set(self.names)
        # Every voter set the quorum went through, in order.
        self.voter_history: list[frozenset[str]] = [frozenset(self.voter_set)]
        replicas = tuple(self.names[:3])
        self.baseline = {0: replicas, 1: replicas}
        self.placement = dict(self.baseline)
        self.lagging = {1}  # partition 1's last replica is out of the ISR: never damaged
        self.in_flight: dict[int, tuple[str, ...]] = {}  # partition -> replicas before
        self.moves_finish = True

    def _log(self, what: str, arg: object = None) -> None:
        self.calls.append((trio.current_time(), what, arg))

    async def kill(self, name: str) -> None:
        self._log("kill", name)
        self.up.discard(name)

    async def start(self, name: str) -> None:
        self._log("start", name)
        self.up.add(name)

    async def pause(self, name: str) -> None:
        self._log("pause", name)
        self.paused.add(name)

    async def resume(self, name: str) -> None:
        self._log("resume", name)
        self.paused.discard(name)

    async def partition(self, grudge: Mapping[str, Sequence[str]]) -> None:
        self._log("partition", dict(grudge))
        self.grudge = {k: list(v) for k, v in grudge.items()}

    async def heal_network(self) -> None:
        self._log("heal", None)
        self.grudge = {}

    async def stop(self, name: str) -> None:
        self._log("stop", name)
        self.up.discard(name)

    def is_running(self, name: str) -> bool:
        return name in self.up

    async def controller_leader(self) -> str | None:
        return self.controller

    async def partition_leaders(self) -> dict[int, str]:
        return {0: "n2", 1: "n3"}

    async def partition_replicas(self) -> dict[int, PartitionReplicas]:
        leaders = {0: "n2", 1: "n3"}
        out = {}
        for p, replicas in self.placement.items():
            isr = replicas[:-1] if p in self.lagging else replicas
            leader = leaders[p] if leaders[p] in replicas else replicas[0]
            out[p] = PartitionReplicas(leader, replicas, isr)
        return out

    # -- membership
    async def voters(self) -> list[str]:
        return sorted(self.voter_set)

    def _voters_changed(self) -> None:
        self.voter_history.append(frozenset(self.voter_set))

    async def add_voter(self, name: str) -> None:
        self._log("add_voter", name)
        assert name in self.up, f"{name} is not running: it cannot be an observer"
        self.voter_set.add(name)
        self._voters_changed()

    async def remove_voter(self, name: str) -> None:
        self._log("remove_voter", name)
        assert len(self.voter_set) > 1, "the last voter stays"
        self.voter_set.discard(name)
        self._voters_changed()

    async def brokers(self) -> list[str]:
        return sorted(self.up)

    async def reassign(self, moves: Mapping[int, Sequence[str] | None]) -> None:
        self._log("reassign", dict(moves))
        for p, replicas in moves.items():
            if replicas is None:  # cancel: back to where the move started
                if p in self.in_flight:
                    self.placement[p] = self.in_flight.pop(p)
                continue
            assert p not in self.in_flight, f"partition {p} is already moving"
            assert set(replicas) <= self.up, f"{replicas} are not all running brokers"
            if self.moves_finish:
                self.placement[p] = tuple(replicas)
            else:
                self.in_flight[p] = self.placement[p]

    async def reassigning(self) -> set[int]:
        return set(self.in_flight)

    async def damage(self, name: str, partition: int, kind: str, rng: random.Random) -> str:
        self._log("damage", (name, partition, kind))
        return f"{kind} of partition {partition}"

    def forger(self, rng: random.Random) -> Forger:
        # Nothing listens there: every forgery counts as unreachable.
        return Forger({1: ("127.0.0.1", 1)}, Target([1], "t", 1), rng)

    @property
    def whole(self) -> bool:
        return (
            self.up == set(self.names)
            and not self.paused
            and not self.grudge
            and self.voter_set == set(self.names)
            and self.placement == self.baseline
            and not self.in_flight
        )


def recorder() -> Recorder:
    return Recorder(lambda: int(trio.current_time() * 1e9))


async def run_nemesis(nemesis: Nemesis, limit_s: float) -> None:
    with trio.move_on_after(limit_s):
        await nemesis.run()


@pytest.mark.parametrize("seed", range(5))
async def test_schedule_alternates_start_and_stop_every_interval(
    seed: int, mock_clock: MockClock
) -> None:
    mock_clock.autojump_threshold = 0
    cluster, rec = FakeCluster(), recorder()
    nemesis = Nemesis(cluster, list(FAMILIES), rec, random.Random(seed), interval_s=10)
    t0 = trio.current_time()
    await run_nemesis(nemesis, 65)
    events = [(round((op.time_ns / 1e9) - t0), op.f, op.type) for op in rec.history.ops]
    starts = [t for t, f, _ in events if f == FAULT_START]
    stops = [t for t, f, _ in events if f == FAULT_STOP]
    assert starts == [10, 30, 50], f"seed={seed} {events}"
    # Three scheduled stops plus nothing left for the final heal.
    assert stops == [20, 40, 60], f"seed={seed} {events}"
    assert all(op.type == "info" for op in rec.history.ops), f"seed={seed}"
    assert cluster.whole, f"seed={seed}"
    assert not any(w.healed is False for w in rec.history.fault_windows()), f"seed={seed}"


@pytest.mark.parametrize("family", FAMILIES)
async def test_cancel_mid_fault_heals_and_records_the_stop(
    family: str, mock_clock: MockClock
) -> None:
    mock_clock.autojump_threshold = 0
    seed = 3
    cluster, rec = FakeCluster(), recorder()
    nemesis = Nemesis(cluster, [family], rec, random.Random(seed), interval_s=10)
    await run_nemesis(nemesis, 15)  # cancelled 5 s into the first fault
    windows = rec.history.fault_windows()
    assert len(windows) == 1 and windows[0].healed, f"seed={seed} {windows}"
    assert windows[0].kind.startswith(family + "-")
    assert cluster.whole, f"seed={seed} family={family}"
    assert not nemesis.active


async def test_no_nemesis_records_nothing(mock_clock: MockClock) -> None:
    mock_clock.autojump_threshold = 0
    cluster, rec = FakeCluster(), recorder()
    await run_nemesis(Nemesis(cluster, [], rec, random.Random(0), interval_s=1), 30)
    assert rec.history.ops == []
    assert cluster.whole


async def test_leader_targeting_and_fallback(mock_clock: MockClock) -> None:
    mock_clock.autojump_threshold = 0
    rng = random.Random(1)
    for mode, expect in (("controller-leader", "n1"), ("partition-leader", {"n2", "n3"})):
        cluster, rec = FakeCluster(), recorder()
        nemesis = Nemesis(cluster, ["kill"], rec, rng, interval_s=1)
        target, used = await nemesis._target(mode, cluster.names)
        assert used == mode and (target == expect or target in expect)
    # No known controller leader: a random node, and the recorded mode says so.
    cluster = FakeCluster(controller=None)
    nemesis = Nemesis(cluster, ["kill"], recorder(), rng, interval_s=1)
    target, used = await nemesis._target("controller-leader", cluster.names)
    assert used == "one" and target in cluster.names


async def test_failed_start_is_recorded_as_fail(mock_clock: MockClock) -> None:
    mock_clock.autojump_threshold = 0

    class Broken(FakeCluster):
        async def pause(self, name: str) -> None:
            raise OSError("no such process")

    cluster, rec = Broken(), recorder()
    nemesis = Nemesis(cluster, ["pause"], rec, random.Random(0), interval_s=1)
    assert await nemesis.start_fault("pause") is None
    assert [(op.f, op.type) for op in rec.history.ops] == [(FAULT_START, "fail")]
    assert nemesis.active == []


def test_parse_families() -> None:
    assert parse_families("kill,partition") == ["kill", "partition"]
    assert parse_families("all") == list(FAMILIES)
    assert parse_families("none") == [] and parse_families("") == []
    with pytest.raises(ValueError, match="unknown nemesis"):
        parse_families("kill,flood")
    # One fault kind, as the history records it, is an entry of its own.
    assert parse_families("partition-partition-leader,kill") == [
        "partition-partition-leader",
        "kill",
    ]
    assert split_kind("kill-majority") == ("kill", "majority")
    assert split_kind("pause") == ("pause", None)
    for bad in ("kill-halves", "partition-", "flood-one"):
        assert split_kind(bad) is None
        with pytest.raises(ValueError, match="unknown nemesis"):
            parse_families(bad)


@pytest.mark.parametrize("seed", range(3))
async def test_a_fault_kind_entry_always_starts_that_fault(
    seed: int, mock_clock: MockClock
) -> None:
    mock_clock.autojump_threshold = 0
    cluster, rec = FakeCluster(), recorder()
    nemesis = Nemesis(
        cluster, ["partition-partition-leader"], rec, random.Random(seed), interval_s=10
    )
    await run_nemesis(nemesis, 45)
    windows = rec.history.fault_windows()
    assert len(windows) == 2, f"seed={seed} {windows}"
    for w in windows:
        assert w.kind == "partition-partition-leader" and w.healed, f"seed={seed} {w}"
        assert w.targets[0] in {"n2", "n3"}, f"seed={seed} {w}"
    partitioned = [arg for _, what, arg in cluster.calls if what == "partition"]
    for grudge in partitioned:
        isolated = [n for n, peers in grudge.items() if len(peers) == len(cluster.names) - 1]
        assert len(isolated) == 1 and isolated[0] in {"n2", "n3"}, f"seed={seed} {grudge}"
    assert cluster.whole, f"seed={seed}"
    with pytest.raises(ValueError, match="unknown nemesis"):
        Nemesis(cluster, ["partition-everything"], rec, random.Random(seed), interval_s=1)


def check_grudge(grudge: dict[str, list[str]], names: list[str]) -> None:
    for node, blocked in grudge.items():
        assert node in names and node not in blocked
        for peer in blocked:
            assert node in grudge.get(peer, []), f"{node} blocks {peer} but not the reverse"


def hears(grudge: dict[str, list[str]], node: str, names: list[str]) -> set[str]:
    return set(names) - set(grudge.get(node, []))


@settings(max_examples=200, deadline=None)
@given(n=st.sampled_from([3, 5]), seed=st.integers(0, 2**32 - 1))
def test_grudges_are_symmetric_and_shaped(n: int, seed: int) -> None:
    names = [f"n{i}" for i in range(1, n + 1)]
    rng = random.Random(seed)
    majority = majority_size(n)

    g = isolate("n2", names)
    check_grudge(g, names)
    assert hears(g, "n2", names) == {"n2"}

    g, minority = halves(names, rng)
    check_grudge(g, names)
    assert len(minority) == n // 2
    assert all(hears(g, m, names) == set(minority) for m in minority)

    g = majorities_ring(names, rng)
    check_grudge(g, names)
    assert any(g.values()), "the ring must cut something"
    assert all(len(hears(g, node, names)) >= majority for node in names), f"seed={seed}"

    g, middle = bridge(names, rng)
    check_grudge(g, names)
    assert hears(g, middle, names) == set(names)
    assert all(len(hears(g, node, names)) < n for node in names if node != middle)


@pytest.mark.parametrize("mode", ["leader", "follower"])
async def test_damage_hits_one_replica_of_a_partition_whose_replicas_are_all_in_sync(
    mode: str, mock_clock: MockClock
) -> None:
    mock_clock.autojump_threshold = 0
    for seed in range(10):
        cluster, rec = FakeCluster(), recorder()
        nemesis = Nemesis(cluster, [f"corrupt-{mode}"], rec, random.Random(seed), interval_s=1)
        fault = await nemesis.start_fault(f"corrupt-{mode}")
        assert fault is not None and fault.kind == f"corrupt-{mode}", f"seed={seed}"
        damaged = [arg for _, what, arg in cluster.calls if what == "damage"]
        assert len(damaged) == 1, f"seed={seed}"
        name, partition, kind = damaged[0]  # type: ignore[misc]
        assert partition == 0 and kind == "corrupt", f"seed={seed}"  # partition 1 lacks a replica
        assert (name == "n2") == (mode == "leader") and name in ("n1", "n2", "n3"), f"seed={seed}"


async def test_forge_runs_for_its_window_and_stops_with_it(mock_clock: MockClock) -> None:
    mock_clock.autojump_threshold = 0
    cluster, rec = FakeCluster(), recorder()
    nemesis = Nemesis(cluster, ["forge"], rec, random.Random(5), interval_s=10)
    await run_nemesis(nemesis, 25)
    windows = rec.history.fault_windows()
    assert [w.kind for w in windows] == ["forge-internal"] and windows[0].healed
    assert not nemesis.active
