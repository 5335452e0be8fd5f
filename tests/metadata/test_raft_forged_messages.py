"""Issue 13: forged Raft messages on the internal listener.

A vote request from a node that is not a voter (or naming another node as its candidate)
forced an election every time it was sent; one with epoch 2^31+10 was persisted to the
quorum-state file and then crashed every node on each restart with `struct.error`. The
driver refuses such messages before they reach the core, the codec and the quorum-state file
share one epoch bound (EPOCH_MAX), and the core never elects past it.
"""

from __future__ import annotations

import random

import pytest

from raftlog.codec import EPOCH_MAX, I32_MAX, Epoch
from raftlog.errors import LocalError
from raftlog.metadata.raft.core import RaftCore
from raftlog.metadata.raft.driver import QuorumDriver, refusal_reason
from raftlog.metadata.raft.log_store import (
    QUORUM_STATE_FILE,
    MetadataLogStore,
    MetadataRecoveryError,
    QuorumStateFile,
)
from raftlog.metadata.raft.messages import (
    CODEC,
    ERROR_NOT_LEADER,
    BeginQuorumEpoch,
    EndQuorumEpoch,
    Fetch,
    FetchResponse,
    FetchSnapshot,
    RaftCast,
    SnapshotId,
    Vote,
    VoteResponse,
)
from raftlog.metadata.raft.types import QuorumState
from raftlog.net.rpc import PeerSet
from raftlog.storage.checkpoint import write_checkpoint
from raftlog.storage.flusher import Flusher
from tests.metadata.test_node_quorum import make_configs
from tests.metadata.test_quorum_store import NOW_MS
from tests.metadata.test_raft_core import CONFIG

ROGUE_ID = 9  # not a voter of the three-voter quorum


def _driver(tmp_path) -> QuorumDriver:
    """Node 1 of a three-voter quorum (not running: receive() is driven by the test)."""
    config = make_configs(tmp_path, n=3)[0]
    store = MetadataLogStore(config.data_path, now_ms=NOW_MS)

    def noop(*_: object) -> None:
        return None

    return QuorumDriver(
        config,
        store,
        Flusher(),
        PeerSet(config.node_id),
        on_commit=noop,
        on_snapshot=noop,
        on_role_change=noop,
    )


def cast(message) -> list:
    return CODEC.to_wire(RaftCast(message, "127.0.0.1", 1))


def test_the_epoch_bound_is_the_one_a_record_batch_can_hold():
    # partitionLeaderEpoch is an INT32 of the record batch the metadata log stores entries in.
    assert EPOCH_MAX == I32_MAX == 2**31 - 1
    assert Epoch.__metadata__[0].max == EPOCH_MAX
    hints = QuorumStateFile.__annotations__
    assert "EPOCH_MAX" in str(hints["epoch"])


@pytest.mark.parametrize(
    ("sender", "message"),
    [
        # A client that is not a voter asks for votes, in its own name or a voter's.
        (ROGUE_ID, Vote(False, ROGUE_ID, 50, 10**6, 40)),
        (ROGUE_ID, Vote(False, 2, 50, 10**6, 40)),
        (ROGUE_ID, Vote(True, 2, 50, 10**6, 40)),
        # A voter's connection asking in another voter's name.
        (3, Vote(False, 2, 50, 10**6, 40)),
        # Answers and leadership claims from a non-voter move epochs just the same.
        (ROGUE_ID, VoteResponse(False, 50, None, False)),
        (ROGUE_ID, BeginQuorumEpoch(50, ROGUE_ID)),
        (3, BeginQuorumEpoch(50, 2)),
        (ROGUE_ID, EndQuorumEpoch(50, 2, (1,))),
        # An observer's fetch in its own name, but from an epoch ahead: at the top of the
        # range it would end elections for good.
        (ROGUE_ID, Fetch(ROGUE_ID, 50, 0, 0, 0)),
        (ROGUE_ID, Fetch(ROGUE_ID, EPOCH_MAX, 0, 0, 0)),
        (ROGUE_ID, FetchSnapshot(ROGUE_ID, EPOCH_MAX, SnapshotId(10, 1), 0, 10)),
    ],
)
async def test_forged_messages_never_reach_the_core(tmp_path, sender, message):
    driver = _driver(tmp_path)
    before = (driver.core.epoch, driver.core.role)
    driver.core.take_ready()
    driver.receive(sender, cast(message))
    assert (driver.core.epoch, driver.core.role) == before
    assert driver.core.take_ready().quorum_state is None  # nothing to persist
    driver.close()


async def test_a_vote_from_a_voter_in_its_own_name_still_counts(tmp_path):
    driver = _driver(tmp_path)
    driver.receive(2, cast(Vote(False, 2, 50, 10**6, 40)))
    assert driver.core.epoch == 50
    driver.close()


async def test_an_epoch_beyond_the_bound_is_refused_at_decode(tmp_path):
    driver = _driver(tmp_path)
    wire = cast(Vote(False, 2, 5, 0, 0))
    wire[0][3] = 2**31 + 10  # candidate_epoch
    driver.receive(2, wire)
    assert driver.core.epoch == 0
    driver.close()


async def test_the_leader_a_voter_names_is_heard_before_this_log_names_it_a_voter(tmp_path):
    """A voter added by AddRaftVoter after this log's last VotersRecord leads: once a known
    voter's answer names it leader, its messages reach the core (its fetch answers carry
    the record naming it); a node nobody named is still refused."""
    added, stranger = ROGUE_ID, ROGUE_ID - 1
    driver = _driver(tmp_path)
    # Voter 2 answers a fetch: epoch 5 is led by the added voter.
    driver.receive(2, cast(FetchResponse(5, added, 0, 0, 0, error=ERROR_NOT_LEADER)))
    assert (driver.core.epoch, driver.core.leader_id) == (5, added)
    driver.receive(added, cast(BeginQuorumEpoch(6, added)))
    assert (driver.core.epoch, driver.core.leader_id) == (6, added)
    driver.receive(stranger, cast(BeginQuorumEpoch(7, stranger)))
    assert (driver.core.epoch, driver.core.leader_id) == (6, added)
    driver.close()


def test_observers_may_fetch_in_their_own_name_only():
    voters = {1: None, 2: None, 3: None}
    snapshot = SnapshotId(10, 1)
    assert refusal_reason(Fetch(ROGUE_ID, 1, 0, 0, 100), ROGUE_ID, voters) is None
    assert refusal_reason(FetchSnapshot(ROGUE_ID, 1, snapshot, 0, 10), ROGUE_ID, voters) is None
    assert refusal_reason(Fetch(2, 1, 0, 0, 100), ROGUE_ID, voters) is not None
    assert refusal_reason(Fetch(2, 1, 0, 0, 100), 3, voters) is not None
    assert refusal_reason(VoteResponse(False, 1, None, True), 2, voters) is None


def test_a_quorum_state_file_beyond_the_bound_is_refused_with_a_clear_error(tmp_path):
    store = MetadataLogStore(tmp_path, now_ms=NOW_MS)
    path = store.directory / QUORUM_STATE_FILE
    write_checkpoint(path, "quorum-state", {"epoch": 2**31 + 10, "voted_for": 2, "leader_id": None})
    with pytest.raises(MetadataRecoveryError, match="quorum state out of range"):
        store.load_quorum_state()
    # A file this node could not load again is never written.
    store.save_quorum_state(QuorumState(EPOCH_MAX, 2, 2))
    with pytest.raises(LocalError):
        store.save_quorum_state(QuorumState(EPOCH_MAX + 1, 2, None))
    assert store.load_quorum_state() == QuorumState(EPOCH_MAX, 2, 2)
    store.close()


def test_the_core_never_elects_past_the_bound():
    core = RaftCore(
        node_id=1,
        voters=frozenset({1, 2, 3}),
        config=CONFIG,
        persisted=QuorumState(EPOCH_MAX, None, None),
        rng=random.Random(1),
    )
    now_ms = 0
    for _ in range(20):
        deadline_ms = core.next_deadline_ms()
        assert deadline_ms > now_ms  # waits between tries instead of spinning
        now_ms = deadline_ms
        core.tick(now_ms=now_ms)
        ready = core.take_ready()
        assert core.epoch == EPOCH_MAX
        assert all(m.candidate_epoch <= EPOCH_MAX for _, m in ready.messages if isinstance(m, Vote))
        assert ready.quorum_state is None or ready.quorum_state.epoch <= EPOCH_MAX


def test_a_vote_request_for_a_newer_epoch_moves_nothing_while_a_leader_is_heard():
    """KIP-996: the pre-vote rule for real votes too. A vote request in a voter's name (all a
    connection can prove until the internal listener is authenticated) no longer forces an
    election on a healthy quorum; once the leader is gone it counts as before."""
    from tests.metadata.test_raft_core import elect, make

    leader = make(1)
    elect(leader)
    epoch = leader.epoch
    follower = make(3)
    follower.receive(now_ms=0, from_id=1, message=BeginQuorumEpoch(epoch, 1))
    leader.take_ready()
    # One fetch round: the follower has heard from its leader.
    ((_, fetch),) = [(to, m) for to, m in follower.take_ready().messages if isinstance(m, Fetch)]
    leader.receive(now_ms=0, from_id=3, message=fetch)
    for to, answer in leader.take_ready().messages:
        if to == 3:
            follower.receive(now_ms=0, from_id=1, message=answer)
    follower.take_ready()
    forged = Vote(False, 2, epoch + 5, 10**6, epoch)
    for core in (leader, follower):
        core.receive(now_ms=1, from_id=2, message=forged)
        ready = core.take_ready()
        assert core.epoch == epoch and ready.quorum_state is None
        assert [m.vote_granted for _, m in ready.messages if isinstance(m, VoteResponse)] == [False]
    # The leader is no longer heard: the same request is a real election's and is granted.
    late_ms = follower.next_deadline_ms() - 1
    follower.receive(now_ms=late_ms + 2, from_id=2, message=forged)
    assert follower.epoch == epoch + 5
