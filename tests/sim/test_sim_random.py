"""Seeded random fault simulation of the Raft core.

RAFTLOG_SIM_SEEDS=<n> runs seeds 0..n-1 (default 100, about 28 s: what `make test`'s
budget allows; `make sim SEEDS=N` runs more);
RAFTLOG_SIM_SEED=<seed> replays exactly one seed. A failure names its seed.
"""

from __future__ import annotations

import os
import time

from tests.sim.workload import check_acknowledged, run_seed

DEFAULT_SEEDS = 100


def _seeds() -> list[int]:
    replay = os.environ.get("RAFTLOG_SIM_SEED")
    if replay:
        return [int(replay)]
    return list(range(int(os.environ.get("RAFTLOG_SIM_SEEDS", DEFAULT_SEEDS))))


def test_random_seeds() -> None:
    seeds = _seeds()
    started = time.perf_counter()
    committed = acked = 0
    for seed in seeds:
        sim = run_seed(seed)  # raises SimulationError naming the seed
        check_acknowledged(sim)
        committed += len(sim.committed)
        acked += len(sim.acked)
    elapsed_s = time.perf_counter() - started
    print(f"{len(seeds)} seeds, {committed} committed, {acked} acked in {elapsed_s:.1f}s")
    assert acked > 0


def test_replay_is_deterministic() -> None:
    seed = int(os.environ.get("RAFTLOG_SIM_SEED", "7"))
    first, second = run_seed(seed, duration_ms=20_000), run_seed(seed, duration_ms=20_000)
    assert first.committed == second.committed, f"seed={seed}"
    assert first.events == second.events, f"seed={seed}"
