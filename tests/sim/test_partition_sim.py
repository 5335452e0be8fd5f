"""Seeded simulation of partition replication (see partition_sim.py).

RAFTLOG_SIM_SEED=<n> replays one seed; RAFTLOG_SIM_SEEDS=<count> sets how many seeds the
safe configuration, with and without disk faults, runs (default 500).
"""

from __future__ import annotations

import os

import pytest

from tests.sim.partition_checker import ACKED_WRITE_LOST, InvariantViolation
from tests.sim.partition_sim import (
    SAFE,
    SAFE_DISK_FAULTS,
    SAFE_MIN_ISR_ONE,
    UNSAFE_ACKS_ONE,
    UNSAFE_UNCLEAN,
    SimConfig,
    run_seed,
)

DEFAULT_SEEDS = 500
# How many seeds the unsafe configurations may take to show a loss (they usually need few).
UNSAFE_SEED_BUDGET = 200


def seeds() -> list[int]:
    one = os.environ.get("RAFTLOG_SIM_SEED")
    if one is not None:
        return [int(one)]
    return list(range(int(os.environ.get("RAFTLOG_SIM_SEEDS", DEFAULT_SEEDS))))


def test_safe_configuration_never_loses_acked_writes() -> None:
    total_acks = 0
    for seed in seeds():
        checker = run_seed(seed, SAFE)  # raises InvariantViolation naming the seed
        total_acks += len(checker.acks)
    # The faults must not starve the producers, or the run proves nothing.
    assert total_acks >= 5 * len(seeds()), f"only {total_acks} acked writes"


def test_damaged_disks_never_lose_acked_writes() -> None:
    # One replica at a time loses a suffix of its flushed log or finds a flipped byte; it
    # reports itself unsafe, leaves the ISR, is never elected, and fetches back (#13).
    total_acks = 0
    for seed in seeds():
        checker = run_seed(seed, SAFE_DISK_FAULTS)
        total_acks += len(checker.acks)
    assert total_acks >= 5 * len(seeds()), f"only {total_acks} acked writes"


def test_checker_catches_a_damaged_replica_elected(monkeypatch: pytest.MonkeyPatch) -> None:
    # The damage faults prove something only if ignoring the unsafe report loses data.
    from tests.sim.partition_controller import SimController

    monkeypatch.setattr(SimController, "report_unsafe", lambda self, broker_id: None)
    violation = first_loss(SAFE_DISK_FAULTS)
    assert violation is not None, f"no acked write lost in {UNSAFE_SEED_BUDGET} seeds"
    print(violation)


def test_min_isr_one_without_unclean_election_is_still_safe() -> None:
    # Fewer seeds: this shows that the loss below comes from unclean election, not min ISR 1.
    for seed in seeds()[:50]:
        run_seed(seed, SAFE_MIN_ISR_ONE)


def first_loss(config: SimConfig) -> InvariantViolation | None:
    for seed in range(UNSAFE_SEED_BUDGET):
        try:
            run_seed(seed, config)
        except InvariantViolation as violation:
            if violation.kind == ACKED_WRITE_LOST:
                return violation
    return None


@pytest.mark.parametrize(
    "config", [UNSAFE_UNCLEAN, UNSAFE_ACKS_ONE], ids=["min_isr_1_unclean", "acks_1"]
)
def test_checker_catches_losses_of_unsafe_configurations(config: SimConfig) -> None:
    violation = first_loss(config)
    assert violation is not None, f"no acked write lost in {UNSAFE_SEED_BUDGET} seeds"
    assert "RAFTLOG_SIM_SEED=" in str(violation)
    print(violation)


def test_same_seed_replays_identically() -> None:
    first = run_seed(7, SAFE)
    second = run_seed(7, SAFE)
    assert [a.offset for a in first.acks] == [a.offset for a in second.acks]
    assert first.sim.events == second.sim.events


def _follower_never_waits_for_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    from raftlog.replication.core.follower import FollowerState

    monkeypatch.setattr(FollowerState, "awaiting_flush", property(lambda self: False))


def _hw_from_committed_isr_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from raftlog.replication.core.leader import LeaderState

    monkeypatch.setattr(LeaderState, "maximal_isr", property(lambda self: self.state.isr))


def _no_divergence_check(monkeypatch: pytest.MonkeyPatch) -> None:
    from raftlog.replication.core.leader import LeaderState

    original = LeaderState.on_follower_fetch

    def blind(self, *, now_ms, replica_id, fetch_offset, last_fetched_epoch, current_leader_epoch):
        return original(
            self,
            now_ms=now_ms,
            replica_id=replica_id,
            fetch_offset=min(fetch_offset, self.log.log_end_offset),
            last_fetched_epoch=-1,
            current_leader_epoch=current_leader_epoch,
        )

    monkeypatch.setattr(LeaderState, "on_follower_fetch", blind)


@pytest.mark.parametrize(
    "break_core",
    [_follower_never_waits_for_flush, _hw_from_committed_isr_only, _no_divergence_check],
)
def test_checker_catches_a_broken_core(monkeypatch: pytest.MonkeyPatch, break_core) -> None:
    # The safe run proves something only if the checker fails when a rule is dropped.
    break_core(monkeypatch)
    for seed in range(50):
        try:
            run_seed(seed, SAFE)
        except InvariantViolation as violation:
            print(violation)
            return
    pytest.fail(f"{break_core.__name__}: no invariant broke in 50 seeds")
