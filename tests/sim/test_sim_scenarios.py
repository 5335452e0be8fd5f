"""Hand-written fault scenarios, in the step language of tests/sim/scenarios.py."""

from __future__ import annotations

import pytest

from tests.sim.cluster import SIM_RAFT_CONFIG
from tests.sim.scenarios import Step, run_scenario

FETCH_TIMEOUT_MS = SIM_RAFT_CONFIG.fetch_timeout_ms

DIVERGENCE_AFTER_LEADER_CHANGE: list[Step] = [
    ("until_leader", 5000),
    ("remember_leader", "L"),
    ("propose", "L", 5),
    ("deliver",),
    ("run", 500),
    ("expect", "hw_equal"),
    # The old leader appends entries nobody else will ever see...
    ("isolate", "L"),
    ("propose", "L", 3),
    ("until_leader", 5000, "L"),
    ("remember_leader", "M"),
    # ...while the majority commits different entries at the same offsets.
    ("propose", "M", 6),
    ("run", 1000),
    ("expect", "not_leader", "L"),
    ("heal",),
    ("run", 3000),
    ("expect", "leader", "M"),
    ("expect", "stat_at_least", "L", "truncations", 1),
    ("expect", "hw_equal"),
    ("expect", "log_equal"),
]

SNAPSHOT_CATCH_UP: list[Step] = [
    ("until_leader", 5000),
    ("remember_leader", "L"),
    ("run", 300),
    ("remember_follower", "F"),
    ("crash", "F"),
    ("propose", "L", 40),
    ("run", 1000),
    ("snapshot", 1),
    ("snapshot", 2),
    ("snapshot", 3),
    ("snapshot", 4),
    ("restart", "F"),
    ("run", 3000),
    ("expect", "stat_at_least", "F", "snapshots_installed", 1),
    ("expect", "leader", "L"),
    ("expect", "hw_equal"),
    ("propose", "L", 2),
    ("run", 1000),
    ("expect", "hw_equal"),
]

PRE_VOTE_FLAPPING_NODE: list[Step] = [
    ("until_leader", 5000),
    ("remember_leader", "L"),
    ("remember_epoch", "E"),
    ("run", 300),
    ("remember_follower", "F"),
    ("run", 1000),
]
for _ in range(5):
    # F loses the leader long enough to time out and pre-vote, then comes back.
    PRE_VOTE_FLAPPING_NODE += [
        ("isolate", "F"),
        ("run", 3 * FETCH_TIMEOUT_MS),
        ("heal",),
        ("run", 400),
    ]
PRE_VOTE_FLAPPING_NODE += [
    ("run", 2000),
    ("expect", "leader", "L"),
    ("expect", "epoch", "E"),  # nobody bumped the epoch: pre-vote was refused every time
    ("expect", "role", "F", "follower"),
    ("expect", "hw_equal"),
]

RESTARTED_LEADER: list[Step] = [
    ("until_leader", 5000),
    ("remember_leader", "L"),
    ("remember_epoch", "E"),
    ("propose", "L", 3),
    ("run", 500),
    ("crash", "L"),
    ("restart", "L"),
    ("expect", "role", "L", "resigned"),
    ("until_leader", 10_000),
    ("expect", "epoch_gt", "E"),
    ("run", 2000),
    ("expect", "hw_equal"),
]

CHECK_QUORUM_RESIGNATION: list[Step] = [
    ("until_leader", 5000),
    ("remember_leader", "L"),
    ("remember_epoch", "E"),
    ("isolate", "L"),
    ("run", FETCH_TIMEOUT_MS + 50),
    ("expect", "role", "L", "resigned", "prospective"),
    ("until_leader", 5000, "L"),
    ("expect", "epoch_gt", "E"),
    ("heal",),
    ("run", 3000),
    ("expect", "not_leader", "L"),
    ("expect", "hw_equal"),
]

# The leader is cut off right after an append answered both followers' parked fetches, so
# they last heard from it at the same moment. The first election after their fetch timeout
# must succeed (epoch E+1): the fetch deadlines are jittered, and a clash of simultaneous
# pre-votes goes to the lower id instead of splitting the vote.
ISOLATED_LEADER_ONE_ROUND: list[Step] = [
    ("until_leader", 5000),
    ("remember_leader", "L"),
    ("remember_epoch", "E"),
    ("run", 1000),
    ("propose", "L", 1),
    ("run", 20),
    ("isolate", "L"),
    ("until_leader", FETCH_TIMEOUT_MS + 100, "L"),
    ("expect", "newest_epoch", "E", 1),
    ("heal",),
    ("run", 3000),
    ("expect", "not_leader", "L"),
    ("expect", "hw_equal"),
]

GRACEFUL_RESIGNATION: list[Step] = [
    ("until_leader", 5000),
    ("remember_leader", "L"),
    ("remember_epoch", "E"),
    ("propose", "L", 3),
    ("run", 500),
    ("resign", "L"),
    ("crash", "L"),  # shut down right after handing over
    # EndQuorumEpoch lets the most caught-up follower start at once: well before any
    # follower's fetch timeout could have noticed the leader is gone.
    ("until_leader", FETCH_TIMEOUT_MS // 2, "L"),
    ("expect", "epoch_gt", "E"),
    ("restart", "L"),
    ("run", 3000),
    ("expect", "hw_equal"),
]

SCENARIOS = {
    "graceful_resignation": (GRACEFUL_RESIGNATION, 3),
    "divergence_after_leader_change": (DIVERGENCE_AFTER_LEADER_CHANGE, 3),
    "snapshot_catch_up": (SNAPSHOT_CATCH_UP, 3),
    "pre_vote_flapping_node": (PRE_VOTE_FLAPPING_NODE, 5),
    "restarted_leader": (RESTARTED_LEADER, 3),
    "check_quorum_resignation": (CHECK_QUORUM_RESIGNATION, 3),
    "isolated_leader_one_round": (ISOLATED_LEADER_ONE_ROUND, 3),
    "isolated_leader_one_round_5": (ISOLATED_LEADER_ONE_ROUND, 5),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_scenario(name: str, seed: int) -> None:
    steps, voters = SCENARIOS[name]
    run_scenario(steps, seed=seed, voters=voters)
