"""Unit tests of the sans-IO Raft core, driven by hand (the simulator covers the rest)."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

from raftlog.metadata.raft.core import RaftCore
from raftlog.metadata.raft.messages import (
    BeginQuorumEpoch,
    DivergingEpoch,
    Entry,
    Fetch,
    FetchResponse,
    Vote,
    VoteResponse,
)
from raftlog.metadata.raft.roles import (
    TRANSITIONS,
    Candidate,
    Follower,
    IllegalTransition,
    Leader,
    Prospective,
    Resigned,
    Unattached,
    Voted,
    check_transition,
)
from raftlog.metadata.raft.types import NotLeader, QuorumState, RaftConfig, Ready

CONFIG = RaftConfig(
    election_timeout_ms=100,
    fetch_timeout_ms=300,
    election_backoff_max_ms=100,
    fetch_max_wait_ms=50,
    max_fetch_entries=10,
)
VOTERS = frozenset({1, 2, 3})


def make(node_id: int = 1, voters: frozenset[int] = VOTERS, **kw: Any) -> RaftCore:
    kw.setdefault("persisted", QuorumState())
    return RaftCore(node_id=node_id, voters=voters, config=CONFIG, rng=random.Random(node_id), **kw)


def messages_of(ready: Ready, kind: type) -> list[tuple[int, object]]:
    return [(to, m) for to, m in ready.messages if isinstance(m, kind)]


def elect(core: RaftCore) -> Ready:
    """Drive node `core` through pre-vote and vote to leadership; returns the last Ready."""
    core.tick(now_ms=core.next_deadline_ms())
    ready = core.take_ready()
    assert {to for to, _ in messages_of(ready, Vote)} == VOTERS - {core.node_id}
    core.receive(now_ms=0, from_id=2, message=VoteResponse(True, core.epoch, None, True))
    ready = core.take_ready()
    votes = messages_of(ready, Vote)
    assert votes and not votes[0][1].pre_vote  # type: ignore[attr-defined]
    # The vote request reflects the new epoch and self-vote: both persisted first.
    assert ready.quorum_state == QuorumState(core.epoch, core.node_id, None)
    core.receive(now_ms=0, from_id=2, message=VoteResponse(False, core.epoch, None, True))
    ready = core.take_ready()
    assert isinstance(core.role, Leader)
    return ready


def test_single_voter_commits_only_after_flush() -> None:
    core = make(1, frozenset({1}))
    core.tick(now_ms=core.next_deadline_ms())
    ready = core.take_ready()
    assert isinstance(core.role, Leader) and core.epoch == 1
    assert [e.data for e in ready.entries] == [CONFIG.leader_change_payload]
    assert ready.committed == [] and core.high_watermark == 0
    assert core.propose(now_ms=5, payloads=[b"a", b"b"]) == [1, 2]
    assert core.take_ready().committed == []
    core.flushed(offset=3)
    assert [e.data for e in core.take_ready().committed] == [
        CONFIG.leader_change_payload,
        b"a",
        b"b",
    ]


def test_propose_on_follower_names_the_leader() -> None:
    core = make(2, persisted=QuorumState(4, None, 1))
    with pytest.raises(NotLeader) as info:
        core.propose(now_ms=0, payloads=[b"x"])
    assert (info.value.leader_id, info.value.epoch) == (1, 4)


def test_illegal_transition_shows_both_states() -> None:
    with pytest.raises(IllegalTransition, match=r"Leader\(epoch=3.*Candidate\(epoch=4"):
        check_transition(1, Leader(3, 0), Candidate(4, frozenset(), frozenset(), 0))


def test_restarted_leader_comes_back_resigned() -> None:
    core = make(1, persisted=QuorumState(7, 1, 1))
    assert isinstance(core.role, Resigned) and core.epoch == 7
    with pytest.raises(NotLeader):
        core.propose(now_ms=0, payloads=[b"x"])


def test_follower_acknowledges_only_flushed_entries() -> None:
    core = make(2, persisted=QuorumState(1, None, 1))
    ready = core.take_ready()
    ((to, fetch),) = messages_of(ready, Fetch)
    assert to == 1 and fetch.fetch_offset == 0  # type: ignore[attr-defined]
    entries = (Entry(0, 1, b"noop"), Entry(1, 1, b"x"))
    core.receive(now_ms=10, from_id=1, message=FetchResponse(1, 1, 0, 0, 0, entries))
    ready = core.take_ready()
    assert ready.entries == list(entries)
    assert messages_of(ready, Fetch) == []  # not flushed yet: no acknowledgement
    core.flushed(offset=2)
    ((_, fetch),) = messages_of(core.take_ready(), Fetch)
    assert fetch.fetch_offset == 2  # type: ignore[attr-defined]


def test_leader_reports_divergence_and_follower_truncates() -> None:
    log = [Entry(0, 1, b"a"), Entry(1, 1, b"b"), Entry(2, 3, b"c"), Entry(3, 3, b"d")]
    leader = make(1, persisted=QuorumState(4, 1, None), entries=log)
    leader.take_ready()
    ready = elect(leader)
    assert leader.epoch == 5
    leader.flushed(offset=leader.log_end)
    leader.receive(now_ms=1, from_id=2, message=Fetch(2, 5, 5, 2, 50))
    ((_, resp),) = messages_of(leader.take_ready(), FetchResponse)
    assert resp.diverging_epoch == DivergingEpoch(1, 2)  # type: ignore[attr-defined]

    follower_log = [Entry(0, 1, b"a"), Entry(1, 1, b"b"), Entry(2, 2, b"x"), Entry(3, 2, b"y")]
    follower = make(
        2, persisted=QuorumState(5, None, 1), entries=[*follower_log, Entry(4, 2, b"z")]
    )
    follower.take_ready()
    follower.receive(now_ms=2, from_id=1, message=resp)  # type: ignore[arg-type]
    ready = follower.take_ready()
    assert ready.truncate_to == 2
    assert follower.log_end == 2
    ((_, fetch),) = messages_of(ready, Fetch)
    assert (fetch.fetch_offset, fetch.last_fetched_epoch) == (2, 1)  # type: ignore[attr-defined]


def test_high_watermark_waits_for_an_entry_of_the_current_epoch() -> None:
    old = [Entry(0, 1, b"a"), Entry(1, 1, b"b")]
    leader = make(1, persisted=QuorumState(1, None, None), entries=old)
    elect(leader)
    leader.flushed(offset=leader.log_end)  # 3 entries: two old ones and the no-op
    leader.receive(
        now_ms=1, from_id=2, message=Fetch(2, leader.epoch, 2, 1, 50)
    )  # acks the old entries only
    assert leader.high_watermark == 0
    leader.receive(now_ms=2, from_id=2, message=Fetch(2, leader.epoch, 3, leader.epoch, 50))
    assert leader.high_watermark == 3


def test_pre_vote_refused_while_the_leader_is_live() -> None:
    follower = make(2, persisted=QuorumState(3, None, 1))
    follower.take_ready()
    follower.receive(
        now_ms=1, from_id=1, message=FetchResponse(3, 1, 0, 0, 0)
    )  # heard from the leader
    follower.take_ready()
    follower.receive(now_ms=2, from_id=3, message=Vote(True, 3, 4, 10, 3))
    ((_, resp),) = messages_of(follower.take_ready(), VoteResponse)
    assert not resp.vote_granted and resp.leader_id == 1  # type: ignore[attr-defined]
    assert follower.epoch == 3  # a pre-vote never bumps the epoch

    unattached = make(3, persisted=QuorumState(3, None, None))
    unattached.receive(now_ms=2, from_id=2, message=Vote(True, 2, 4, 0, 0))
    ((_, resp),) = messages_of(unattached.take_ready(), VoteResponse)
    assert resp.vote_granted and unattached.epoch == 3  # type: ignore[attr-defined]


def test_read_index_waits_for_a_majority_fetch_after_the_request() -> None:
    leader = make(1)
    elect(leader)
    epoch = leader.epoch
    leader.flushed(offset=1)
    leader.receive(now_ms=1, from_id=2, message=Fetch(2, epoch, 1, epoch, 50))
    assert leader.high_watermark == 1
    leader.take_ready()
    leader.read_index(now_ms=2, token="r1")
    assert leader.take_ready().reads == []
    # A fetch that may have been sent before the read (it carries an older read sequence,
    # e.g. a delayed duplicate) proves nothing.
    leader.receive(now_ms=3, from_id=3, message=Fetch(3, epoch, 1, epoch, 50, read_sequence=0))
    ready = leader.take_ready()
    assert ready.reads == []
    ((_, resp),) = messages_of(ready, FetchResponse)
    assert resp.read_sequence == 1  # type: ignore[attr-defined]
    leader.receive(now_ms=4, from_id=3, message=Fetch(3, epoch, 1, epoch, 50, read_sequence=1))
    assert leader.take_ready().reads == [("r1", 1)]


def test_pending_read_fails_when_leadership_is_lost() -> None:
    leader = make(1)
    elect(leader)
    leader.take_ready()
    leader.read_index(now_ms=1, token="r1")
    # A newer leader's claim ends this leadership (a vote request no longer does: KIP-996).
    leader.receive(now_ms=2, from_id=2, message=BeginQuorumEpoch(leader.epoch + 1, 2))
    assert ("r1", None) in leader.take_ready().reads


def test_check_quorum_resigns_a_lonely_leader() -> None:
    leader = make(1)
    elect(leader)
    now_ms = 0
    while isinstance(leader.role, Leader):
        now_ms = leader.next_deadline_ms()
        assert now_ms <= CONFIG.fetch_timeout_ms  # nobody fetched since the election (t=0)
        leader.tick(now_ms=now_ms)
    assert isinstance(leader.role, Resigned) and now_ms == CONFIG.fetch_timeout_ms


def test_observer_never_campaigns() -> None:
    observer = make(9)
    # It answers a vote request (KIP-853, the dissertation's 4.1: a node whose log does not
    # yet hold the change that made it a voter is counted by the candidate all the same),
    # but never asks for votes itself.
    observer.receive(now_ms=0, from_id=1, message=Vote(False, 1, 1, 0, 0))
    ((_, resp),) = messages_of(observer.take_ready(), VoteResponse)
    assert resp.vote_granted  # type: ignore[attr-defined]
    for _ in range(5):
        observer.tick(now_ms=observer.next_deadline_ms())
        assert observer.role.name in ("unattached", "voted", "follower")
        assert not messages_of(observer.take_ready(), Vote)


def test_pre_vote_from_a_node_stuck_in_a_newer_epoch_moves_the_quorum_there() -> None:
    leader = make(1)
    elect(leader)
    assert leader.epoch == 1
    # Node 3 reached epoch 4 (its vote requests were lost) and now pre-votes for epoch 5.
    leader.receive(now_ms=1, from_id=3, message=Vote(True, 3, 5, 0, 0))
    assert leader.epoch == 4 and leader.role.name == "unattached"
    ((_, resp),) = messages_of(leader.take_ready(), VoteResponse)
    assert resp.epoch == 4  # type: ignore[attr-defined]


def test_fetch_response_respects_max_fetch_bytes_and_backlog_is_bounded() -> None:
    import dataclasses

    from raftlog.metadata.raft.types import Overloaded

    config = dataclasses.replace(CONFIG, max_fetch_bytes=10, max_uncommitted_entries=5)
    core = RaftCore(
        node_id=1,
        voters=frozenset({1, 2, 3}),
        config=config,
        persisted=QuorumState(),
        rng=random.Random(1),
    )
    elect(core)
    core.propose(now_ms=0, payloads=[b"x" * 8, b"y" * 8])
    core.flushed(offset=core.log_end)
    core.take_ready()
    core.receive(now_ms=1, from_id=2, message=Fetch(2, core.epoch, 1, core.epoch, 50))
    ((_, resp),) = messages_of(core.take_ready(), FetchResponse)
    assert [e.data for e in resp.entries] == [b"x" * 8]  # type: ignore[attr-defined]
    core.propose(now_ms=1, payloads=[b"z"])
    with pytest.raises(Overloaded):
        core.propose(now_ms=1, payloads=[b"z"] * 3)  # 3 uncommitted + 3 > 5


ROLE_SAMPLES = {
    "unattached": lambda e: Unattached(e, 0),
    "voted": lambda e: Voted(e, 2, 0),
    "prospective": lambda e: Prospective(e, None, None, frozenset(), frozenset(), 0),
    "candidate": lambda e: Candidate(e, frozenset({1}), frozenset(), 0),
    "follower": lambda e: Follower(e, 2, None, 0),
    "leader": lambda e: Leader(e, 0),
    "resigned": lambda e: Resigned(e, 0),
}


@pytest.mark.parametrize("old_name", sorted(ROLE_SAMPLES))
@pytest.mark.parametrize("new_name", sorted(ROLE_SAMPLES))
def test_transition_table_is_enforced(old_name: str, new_name: str) -> None:
    old = ROLE_SAMPLES[old_name](5)
    for new_epoch in (4, 5, 6, 7):
        new = ROLE_SAMPLES[new_name](new_epoch)
        rule = TRANSITIONS.get((old_name, new_name))
        allowed = {
            None: False,
            "same": new_epoch == 5,
            "higher": new_epoch > 5,
            "same_or_higher": new_epoch >= 5,
            "next": new_epoch == 6,
        }[rule]
        if old_name == "voted" and new_name in ("voted", "follower", "prospective"):
            allowed = allowed and (new_epoch > 5 or new.quorum_state(1).voted_for == 2)
        if old_name == "candidate" and new_name == "follower" and new_epoch == 5:
            allowed = False  # the sample follower lost the candidate's own vote
        if old_name == "follower" and new_name == "prospective" and new_epoch == 5:
            allowed = False  # the sample prospective forgot the epoch's leader
        if allowed:
            check_transition(1, old, new)
        else:
            with pytest.raises(IllegalTransition, match=re.escape(repr(old))):
                check_transition(1, old, new)


def test_config_rejects_a_long_poll_longer_than_the_fetch_timeout() -> None:
    with pytest.raises(ValueError, match="fetch_max_wait_ms"):
        RaftConfig(fetch_timeout_ms=500, fetch_max_wait_ms=500)


def test_fenced_fetch_moves_the_follower_to_the_new_leader() -> None:
    from raftlog.metadata.raft.messages import ERROR_FENCED_EPOCH

    follower = make(2, persisted=QuorumState(1, None, 1))
    follower.take_ready()
    # Node 3 leads epoch 2 now; our fetch (epoch 1) went to it and came back fenced.
    follower.receive(
        now_ms=5, from_id=3, message=FetchResponse(2, 3, 0, 0, 0, error=ERROR_FENCED_EPOCH)
    )
    role = follower.role
    assert isinstance(role, Follower) and (role.epoch, role.leader_id) == (2, 3)
    assert not role.leader_resigned
    ((to, fetch),) = messages_of(follower.take_ready(), Fetch)
    assert to == 3 and fetch.epoch == 2  # type: ignore[attr-defined]
