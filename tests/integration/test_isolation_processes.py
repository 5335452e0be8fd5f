"""A partition leader cut off from the other nodes by the network (network namespaces and
nftables drops, jepsen.netns; not SIGSTOP) under a stock acks=all producer, with the
production liveness defaults: the cut-off broker's session lease lapses and it answers
NOT_LEADER_OR_FOLLOWER, the controller fences it and elects another leader, the producer
resumes within the failover target, and after the heal the old leader rejoins as a follower
(the cluster agrees again with a full ISR) with no acknowledged message lost."""

import pytest

from benchmarks import failover

pytestmark = pytest.mark.cluster

ISOLATIONS = 2
RATE_PER_S = 100.0
SETTLE_S = 1.0
# The failover target for the longest window (the median target is 2 s).
MAX_WINDOW_S = 4.0
# A cut-off leader that is also the active controller: the others first need a new
# controller (fetch_timeout_ms, 2 s, then an election), which then gives every broker a fresh
# session (broker_session_timeout_ms, 1.5 s) before it may fence the old one. That case does
# not meet the target yet (docs/results.md, Failover); this bounds it.
CONTROLLER_MAX_WINDOW_S = 8.0


@pytest.mark.skipif(
    failover.netns_unavailable() is not None,
    reason=f"network namespaces unavailable: {failover.netns_unavailable()}",
)
def test_an_isolated_leader_steps_down_and_nothing_acknowledged_is_lost(tmp_path):
    events, _quiet, _acks, _started, lost = failover.isolation_events(
        tmp_path, ISOLATIONS, RATE_PER_S, failover.default_timings(), SETTLE_S, lambda: None
    )
    assert len(events) == ISOLATIONS
    report = [(e.node_id, e.was_controller, e.window_s, e.recovered) for e in events]
    assert all(e.recovered for e in events), report
    for e in events:
        limit_s = CONTROLLER_MAX_WINDOW_S if e.was_controller else MAX_WINDOW_S
        assert e.window_s is not None and e.window_s < limit_s, report
    assert lost == [], f"acknowledged offsets lost: {lost[:20]}"
