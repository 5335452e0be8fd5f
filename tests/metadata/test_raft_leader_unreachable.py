"""RaftCore.leader_unreachable: a follower whose leader's process is gone (the driver's
reconnect was refused) elects within the election backoff instead of the fetch timeout."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from raftlog.metadata.raft.core import RaftCore
from raftlog.metadata.raft.messages import FetchResponse, Vote, VoteResponse
from raftlog.metadata.raft.roles import Follower, Prospective
from raftlog.metadata.raft.types import QuorumState, RaftConfig

CONFIG = RaftConfig(
    election_timeout_ms=100,
    fetch_timeout_ms=300,
    election_backoff_max_ms=100,
    fetch_max_wait_ms=50,
    max_fetch_entries=10,
)
VOTERS = frozenset({1, 2, 3})


def following(node_id: int, leader_id: int, seed: int, now_ms: int = 0) -> RaftCore:
    """A voter that has heard from leader_id in epoch 3 at now_ms."""
    core = RaftCore(
        node_id=node_id,
        voters=VOTERS,
        config=CONFIG,
        persisted=QuorumState(3, None, leader_id),
        rng=random.Random(seed),
    )
    core.take_ready()
    core.receive(now_ms=now_ms, from_id=leader_id, message=FetchResponse(3, leader_id, 0, 0, 0))
    core.take_ready()
    return core


@given(seed=st.integers(0, 2**32 - 1), now_ms=st.integers(0, 10_000))
def test_unreachable_leader_is_replaced_within_the_backoff(seed: int, now_ms: int) -> None:
    follower = following(2, 1, seed, now_ms)
    assert follower.next_deadline_ms() == now_ms + CONFIG.fetch_timeout_ms, seed
    follower.leader_unreachable(now_ms=now_ms, leader_id=1)
    deadline = follower.next_deadline_ms()
    assert now_ms <= deadline <= now_ms + CONFIG.election_backoff_max_ms, (seed, deadline)
    follower.tick(now_ms=deadline)
    assert isinstance(follower.role, Prospective), (seed, follower.role)
    # A voter that saw the same refused connection grants the pre-vote at once.
    other = following(3, 1, seed + 1, now_ms)
    other.leader_unreachable(now_ms=now_ms, leader_id=1)
    other.receive(
        now_ms=deadline, from_id=2, message=Vote(True, 2, 4, follower.log_end, follower.last_epoch)
    )
    ((_, response),) = [(to, m) for to, m in other.take_ready().messages]
    assert isinstance(response, VoteResponse) and response.vote_granted, seed


def test_a_voter_that_still_hears_the_leader_refuses_and_the_node_follows_again() -> None:
    follower = following(2, 1, seed=7)
    follower.leader_unreachable(now_ms=0, leader_id=1)
    follower.tick(now_ms=follower.next_deadline_ms())
    assert isinstance(follower.role, Prospective)
    live = following(3, 1, seed=8)
    live.receive(
        now_ms=10, from_id=2, message=Vote(True, 2, 4, follower.log_end, follower.last_epoch)
    )
    ((_, response),) = live.take_ready().messages
    assert isinstance(response, VoteResponse) and not response.vote_granted
    follower.take_ready()
    follower.receive(now_ms=11, from_id=3, message=response)
    follower.tick(now_ms=follower.next_deadline_ms())
    assert isinstance(follower.role, Follower) and follower.role.leader_id == 1
    assert follower.epoch == 3  # nothing was disrupted


def test_other_peers_and_other_roles_are_ignored() -> None:
    follower = following(2, 1, seed=3)
    follower.leader_unreachable(now_ms=0, leader_id=3)  # not the leader
    assert follower.next_deadline_ms() == CONFIG.fetch_timeout_ms
    observer = RaftCore(
        node_id=4,
        voters=VOTERS,
        config=CONFIG,
        persisted=QuorumState(3, None, 1),
        rng=random.Random(4),
    )
    observer.take_ready()
    before = observer.next_deadline_ms()
    observer.leader_unreachable(now_ms=0, leader_id=1)  # observers never campaign
    assert observer.next_deadline_ms() == before
