"""Seeded random simulation of KIP-853 membership changes under the simulator's faults.

A pool of 5 nodes starts with 3 voters; the leader is asked now and then to add an observer
or remove a voter (itself included). Every invariant of tests/sim/invariants.py holds after
every step, including VoterSetAgreed; after healing, the final voter set commits a write.
RAFTLOG_SIM_MEMBERSHIP_SEEDS=<n> runs seeds 0..n-1 (default 60; `make sim` runs SEEDS);
RAFTLOG_SIM_SEED=<seed> replays one. A failure names its seed.
"""

from __future__ import annotations

import os
import time

from tests.sim.workload import check_acknowledged, run_seed

DEFAULT_SEEDS = 60
# Shorter than the plain simulation's 90 s: changes come every few hundred ms to seconds, so
# a minute holds dozens of them. 60 seeds (about 14 s) is what `make test`'s budget allows;
# `make sim SEEDS=2000` runs more.
DURATION_MS = 60_000


def _seeds() -> list[int]:
    replay = os.environ.get("RAFTLOG_SIM_SEED")
    if replay:
        return [int(replay)]
    return list(range(int(os.environ.get("RAFTLOG_SIM_MEMBERSHIP_SEEDS", DEFAULT_SEEDS))))


def test_random_membership_changes() -> None:
    seeds = _seeds()
    started = time.perf_counter()
    changes = {"add": 0, "remove": 0, "refused": 0}
    acked = 0
    for seed in seeds:
        sim = run_seed(seed, duration_ms=DURATION_MS, membership=True)  # names the seed
        check_acknowledged(sim)
        for kind, count in sim.voter_changes.items():
            changes[kind] += count
        acked += len(sim.acked)
    elapsed_s = time.perf_counter() - started
    print(f"{len(seeds)} seeds, {changes} voter changes, {acked} acked in {elapsed_s:.1f}s")
    assert acked > 0
    assert changes["add"] > 0 and changes["remove"] > 0


def test_membership_replay_is_deterministic() -> None:
    seed = int(os.environ.get("RAFTLOG_SIM_SEED", "11"))
    first = run_seed(seed, duration_ms=20_000, membership=True)
    second = run_seed(seed, duration_ms=20_000, membership=True)
    assert first.committed == second.committed, f"seed={seed}"
    assert first.voter_changes == second.voter_changes, f"seed={seed}"
