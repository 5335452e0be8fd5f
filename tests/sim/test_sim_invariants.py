"""Each named invariant of the simulator fires on the violation it names, with the seed."""

from __future__ import annotations

import pytest

from raftlog.metadata.raft.messages import Entry
from raftlog.metadata.raft.roles import Leader
from tests.sim.cluster import Simulation, SimulationError
from tests.sim.invariants import StepEffects


def _sim_with_commits() -> Simulation:
    sim = Simulation(seed=11, voters=3, observers=0)
    assert sim.run_until(5000, lambda: bool(sim.leaders()))
    sim.propose(sim.leaders()[0], 3)
    sim.run_until(sim.now_ms + 1000)
    assert len(sim.committed) >= 4
    return sim


def _violates(sim: Simulation, name: str, step: StepEffects | None = None) -> None:
    if step is not None:
        sim.step = step
    with pytest.raises(SimulationError, match=rf"^seed=11 .*{name}: "):
        sim._end_step()


def test_single_leader_per_epoch() -> None:
    sim = _sim_with_commits()
    leader = sim.core(sim.leaders()[0])
    other = next(n for n in sim.voter_ids if n != leader.node_id)
    sim.core(other)._role = Leader(leader.epoch, 0)
    _violates(sim, "SingleLeaderPerEpoch")


def test_monotonic_high_watermark() -> None:
    sim = _sim_with_commits()
    sim.core(sim.leaders()[0]).high_watermark -= 1
    _violates(sim, "MonotonicHighWatermark")


def test_committed_entries_identical() -> None:
    sim = _sim_with_commits()
    node = sim.nodes[1]
    forged = Entry(1, sim.committed[1].epoch, b"forged")
    _violates(sim, "CommittedEntriesIdentical", StepEffects(applied=[(node, 1, forged)]))


def test_applies_in_order() -> None:
    sim = _sim_with_commits()
    node = sim.nodes[1]
    _violates(sim, "AppliesInOrder", StepEffects(applied=[(node, 0, sim.committed[2])]))


def test_no_committed_entry_truncated() -> None:
    sim = _sim_with_commits()
    node = sim.nodes[1]
    step = StepEffects(truncated=[(node, [sim.committed[-1]])])
    _violates(sim, "NoCommittedEntryTruncated", step)


def test_reads_linearizable() -> None:
    sim = _sim_with_commits()
    _violates(sim, "ReadsLinearizable", StepEffects(reads=[(sim.nodes[1], 3, 2)]))
