"""KIP-853 dynamic membership in the sans-IO Raft core: the voter set is the latest
VotersRecord in a node's log (else its snapshot's, else the bootstrap set), changed one voter
at a time by a leader that has committed an entry of its own epoch."""

from __future__ import annotations

import random
import uuid

import msgpack
import pytest

from raftlog.codec import DecodeError
from raftlog.epochs import DivergingEpoch
from raftlog.errors import ErrorCode
from raftlog.metadata.raft.core import RaftCore
from raftlog.metadata.raft.driver import refusal_reason
from raftlog.metadata.raft.membership import MembershipRefused
from raftlog.metadata.raft.messages import Entry, FetchResponse, Vote, VoteResponse
from raftlog.metadata.raft.roles import Follower, Leader, Resigned
from raftlog.metadata.raft.types import NotLeader, ProtocolViolation, QuorumState, RaftConfig
from raftlog.metadata.raft.voters import (
    NO_DIRECTORY_ID,
    RAFT_LISTENER_NAME,
    VOTERS_RECORD_PREFIX,
    Endpoint,
    Voter,
    VoterSet,
    decode_voters_record,
    encode_voters_record,
    unwrap_snapshot,
    wrap_snapshot,
)
from tests.sim.cluster import Simulation

CONFIG = RaftConfig(
    election_timeout_ms=100,
    fetch_timeout_ms=300,
    election_backoff_max_ms=100,
    fetch_max_wait_ms=50,
    max_fetch_entries=10,
)


def voter(node_id: int) -> Voter:
    return Voter(node_id, NO_DIRECTORY_ID, (Endpoint(RAFT_LISTENER_NAME, f"n{node_id}", 9000),))


def cluster(seed: int = 1) -> tuple[Simulation, int]:
    """Voters 1-3 and observers 4-5 on a clean network, with a leader that has committed."""
    sim = Simulation(seed, voters=3, observers=2)
    assert sim.run_until(20_000, lambda: _settled(sim))
    sim.run_until(sim.now_ms + 500)  # the observers' next fetches acknowledge what they hold
    return sim, sim.leaders()[0]


def _settled(sim: Simulation) -> bool:
    leaders = sim.leaders()
    if not leaders:
        return False
    leader = sim.core(leaders[0])
    role = leader.role
    assert isinstance(role, Leader)
    caught_up = all(
        n.core is not None and n.core.log_end == leader.log_end for n in sim.nodes.values()
    )
    return leader.high_watermark > role.epoch_start_offset and caught_up


def wait_committed(sim: Simulation, leader: int, offset: int) -> None:
    assert sim.run_until(sim.now_ms + 10_000, lambda: sim.core(leader).high_watermark > offset)


def test_add_voter_needs_the_new_majority_and_every_node_agrees() -> None:
    sim, leader = cluster()
    offset = sim.core(leader).add_voter(now_ms=sim.now_ms, voter=voter(4))
    core = sim.core(leader)
    # In force on the leader at once, committed or not (single-server change).
    assert core.voters == {1, 2, 3, 4} and core.voter_change_pending
    sim._drive(sim.nodes[leader])
    wait_committed(sim, leader, offset)
    assert not core.voter_change_pending
    sim.run_until(sim.now_ms + 2_000)
    for node_id in sim.nodes:
        assert sim.core(node_id).voters == {1, 2, 3, 4}
    assert sim.core(4).is_voter and not sim.core(5).is_voter
    # Four voters: a majority is three. With two of them cut off, nothing commits.
    others = [v for v in (1, 2, 3, 4) if v != leader]
    sim.partition([{leader, others[0], 5}, {others[1], others[2]}])
    (blocked,) = sim.propose(leader)
    sim.run_until(sim.now_ms + 200)
    assert sim.core(leader).high_watermark <= blocked


def test_add_voter_refuses_what_is_not_a_caught_up_observer() -> None:
    sim, leader = cluster()
    core = sim.core(leader)
    with pytest.raises(MembershipRefused) as refused:
        core.add_voter(now_ms=sim.now_ms, voter=voter(2))
    assert refused.value.error_code is ErrorCode.duplicate_voter
    with pytest.raises(MembershipRefused) as refused:
        core.add_voter(now_ms=sim.now_ms, voter=voter(9))  # never fetched
    assert refused.value.error_code is ErrorCode.request_timed_out
    sim.crash(5)
    sim.run_until(sim.now_ms + CONFIG.fetch_timeout_ms + 2_000)
    with pytest.raises(MembershipRefused) as refused:
        sim.core(leader).add_voter(now_ms=sim.now_ms, voter=voter(5))  # stopped fetching
    assert refused.value.error_code is ErrorCode.request_timed_out


def test_remove_voter_turns_it_into_an_observer() -> None:
    sim, leader = cluster()
    removed = next(v for v in (1, 2, 3) if v != leader)
    offset = sim.core(leader).remove_voter(now_ms=sim.now_ms, voter_id=removed)
    sim._drive(sim.nodes[leader])
    wait_committed(sim, leader, offset)
    sim.run_until(sim.now_ms + 2_000)
    assert not sim.core(removed).is_voter
    assert sim.core(removed).voters == {1, 2, 3} - {removed}
    # It still replicates, as an observer.
    (written,) = sim.propose(leader)
    assert sim.run_until(sim.now_ms + 5_000, lambda: sim.nodes[removed].sm_end > written)


def test_leader_removing_itself_leads_until_the_change_commits_then_resigns() -> None:
    sim, leader = cluster()
    core = sim.core(leader)
    offset = core.remove_voter(now_ms=sim.now_ms, voter_id=leader)
    assert isinstance(core.role, Leader) and not core.is_voter
    sim._drive(sim.nodes[leader])
    wait_committed(sim, leader, offset)
    assert isinstance(core.role, Resigned)
    assert sim.run_until(sim.now_ms + 10_000, lambda: bool(sim.leaders()))
    (new_leader,) = sim.leaders()
    assert new_leader != leader and sim.core(new_leader).voters == {1, 2, 3} - {leader}
    (written,) = sim.propose(new_leader)
    assert sim.run_until(sim.now_ms + 5_000, lambda: sim.nodes[leader].sm_end > written)
    assert isinstance(sim.core(leader).role, Follower) and not sim.core(leader).is_voter


def test_one_change_at_a_time() -> None:
    sim, leader = cluster()
    core = sim.core(leader)
    core.add_voter(now_ms=sim.now_ms, voter=voter(4))
    with pytest.raises(MembershipRefused) as refused:
        core.remove_voter(now_ms=sim.now_ms, voter_id=next(v for v in (1, 2, 3) if v != leader))
    assert refused.value.error_code is ErrorCode.request_timed_out
    with pytest.raises(MembershipRefused):
        core.add_voter(now_ms=sim.now_ms, voter=voter(5))


def test_no_change_before_the_leader_commits_in_its_epoch() -> None:
    core = RaftCore(
        node_id=1,
        voters=frozenset({1}),
        config=CONFIG,
        persisted=QuorumState(),
        rng=random.Random(1),
    )
    core.tick(now_ms=core.next_deadline_ms())
    assert isinstance(core.role, Leader) and core.high_watermark == 0  # no-op not flushed
    with pytest.raises(MembershipRefused) as refused:
        core.remove_voter(now_ms=0, voter_id=1)
    assert refused.value.error_code is ErrorCode.request_timed_out
    core.flushed(offset=1)
    with pytest.raises(MembershipRefused) as refused:
        core.remove_voter(now_ms=0, voter_id=1)  # committed now, but the last voter stays
    assert refused.value.error_code is ErrorCode.invalid_request
    with pytest.raises(MembershipRefused) as refused:
        core.remove_voter(now_ms=0, voter_id=7)
    assert refused.value.error_code is ErrorCode.voter_not_found


def test_a_follower_cannot_change_membership() -> None:
    core = RaftCore(
        node_id=2,
        voters=frozenset({1, 2, 3}),
        config=CONFIG,
        persisted=QuorumState(3, None, 1),
        rng=random.Random(2),
    )
    with pytest.raises(NotLeader):
        core.add_voter(now_ms=0, voter=voter(4))


def test_voter_set_from_the_log_and_back_on_truncation() -> None:
    record = encode_voters_record(VoterSet.of_ids({1, 2, 3, 4}))
    entries = [Entry(0, 1, b"noop"), Entry(1, 1, record), Entry(2, 1, b"x")]
    core = RaftCore(
        node_id=4,
        voters=frozenset({1, 2, 3}),
        config=CONFIG,
        persisted=QuorumState(2, None, 1),
        entries=entries,
        rng=random.Random(4),
    )
    assert core.voters == {1, 2, 3, 4} and core.is_voter  # uncommitted, still in force
    assert core.voters_at(1).ids == {1, 2, 3}
    # The leader of epoch 2 never had the record: the follower truncates it and is an
    # observer again.
    core.take_ready()
    core.receive(
        now_ms=1,
        from_id=1,
        message=FetchResponse(2, 1, 3, 1, 0, diverging_epoch=DivergingEpoch(1, 1)),
    )
    assert core.log_end == 1 and core.voters == {1, 2, 3} and not core.is_voter


def test_voter_set_from_a_snapshot() -> None:
    sim, leader = cluster()
    offset = sim.core(leader).add_voter(now_ms=sim.now_ms, voter=voter(5))
    sim._drive(sim.nodes[leader])
    wait_committed(sim, leader, offset)
    sim.run_until(sim.now_ms + 1_000)
    node = sim.nodes[leader]
    assert sim.take_snapshot(leader, node.sm_end)
    snapshot = sim.core(leader).snapshot
    assert snapshot is not None and snapshot.voters is not None
    assert snapshot.voters.ids == {1, 2, 3, 5}
    # A node that starts from nothing but that snapshot knows the voters.
    fresh = RaftCore(
        node_id=5,
        voters=frozenset({1, 2, 3}),
        config=CONFIG,
        persisted=QuorumState(),
        snapshot=snapshot,
        rng=random.Random(5),
    )
    assert fresh.voters == {1, 2, 3, 5} and fresh.is_voter
    # On the wire the snapshot carries it too; a damaged envelope does not decode.
    blob = wrap_snapshot(snapshot.voters, snapshot.data)
    assert unwrap_snapshot(blob) == (snapshot.voters, snapshot.data)
    with pytest.raises(DecodeError):
        unwrap_snapshot(blob[:-3])
    assert unwrap_snapshot(b"plain") == (None, b"plain")


def test_a_snapshot_installed_from_the_leader_brings_its_voter_set() -> None:
    sim, leader = cluster(3)
    lagging = 5
    sim.crash(lagging)
    offset = sim.core(leader).add_voter(now_ms=sim.now_ms, voter=voter(4))
    sim._drive(sim.nodes[leader])
    wait_committed(sim, leader, offset)
    sim.propose(leader, 5)
    sim.run_until(sim.now_ms + 1_000)
    assert sim.take_snapshot(leader, sim.nodes[leader].sm_end)
    sim.nodes[lagging].disk.log.clear()
    sim.nodes[lagging].disk.durable_end = 0
    sim.restart(lagging)
    assert sim.run_until(
        sim.now_ms + 10_000, lambda: sim.nodes[lagging].stats["snapshots_installed"] > 0
    )
    assert sim.core(lagging).voters == {1, 2, 3, 4}


def test_a_removed_voter_cannot_disrupt_elections() -> None:
    sim, leader = cluster()
    removed = next(v for v in (1, 2, 3) if v != leader)
    sim.isolate(removed)  # it never hears of its removal
    offset = sim.core(leader).remove_voter(now_ms=sim.now_ms, voter_id=removed)
    sim._drive(sim.nodes[leader])
    wait_committed(sim, leader, offset)
    epoch = sim.core(leader).epoch
    sim.run_until(sim.now_ms + 5_000)  # the removed node times out, pre-votes, gets nothing
    sim.heal()
    sim.run_until(sim.now_ms + 5_000)
    assert sim.leaders() == [leader] and sim.core(leader).epoch == epoch
    # A real vote request from it moves no one, even with a newer epoch.
    remaining = next(v for v in (1, 2, 3) if v not in (leader, removed))
    core = sim.core(remaining)
    core.receive(
        now_ms=sim.now_ms,
        from_id=removed,
        message=Vote(False, removed, epoch + 5, 0, 0),
    )
    responses = [m for _, m in core.take_ready().messages if isinstance(m, VoteResponse)]
    assert responses and not responses[0].vote_granted and core.epoch == epoch


def test_voters_record_is_range_checked_at_decode() -> None:
    good = VoterSet((voter(1), voter(2)))
    assert decode_voters_record(encode_voters_record(good)) == good
    wire = {"v": 0, "voters": [[1, uuid.uuid4(), [["CONTROLLER", "h", 70_000]]]]}
    bad_port = VOTERS_RECORD_PREFIX + msgpack.packb(wire, default=_uuid_ext)
    with pytest.raises(DecodeError):
        decode_voters_record(bad_port)
    duplicate = {"v": 0, "voters": [[1, uuid.uuid4(), []], [1, uuid.uuid4(), []]]}
    with pytest.raises(DecodeError):
        decode_voters_record(VOTERS_RECORD_PREFIX + msgpack.packb(duplicate, default=_uuid_ext))
    negative = {"v": 0, "voters": [[-1, uuid.uuid4(), []]]}
    with pytest.raises(DecodeError):
        decode_voters_record(VOTERS_RECORD_PREFIX + msgpack.packb(negative, default=_uuid_ext))
    with pytest.raises(DecodeError):
        decode_voters_record(VOTERS_RECORD_PREFIX + msgpack.packb({"v": 0, "voters": []}))


def test_a_damaged_voters_record_from_the_leader_is_a_protocol_violation() -> None:
    core = RaftCore(
        node_id=2,
        voters=frozenset({1, 2, 3}),
        config=CONFIG,
        persisted=QuorumState(1, None, 1),
        rng=random.Random(2),
    )
    core.take_ready()
    damaged = (Entry(0, 1, VOTERS_RECORD_PREFIX + b"\xc1"),)
    with pytest.raises(ProtocolViolation):
        core.receive(now_ms=1, from_id=1, message=FetchResponse(1, 1, 0, 0, 0, damaged))
    assert core.log_end == 0 and core.voters == {1, 2, 3}


def _uuid_ext(value: object) -> object:
    from raftlog.codec_checks import UUID_EXT

    assert isinstance(value, uuid.UUID)
    return msgpack.ExtType(UUID_EXT, value.bytes)


def test_a_forged_voter_change_from_a_non_leader_changes_nothing() -> None:
    # Entries with a VotersRecord that would make node 9 a voter, sent by a node that is not
    # the leader: only the leader's log may change membership. A node that is not a voter is
    # refused by the driver before the core sees anything but a fetch; the core ignores
    # entries from anyone but its leader of the epoch. (A voter claiming a newer epoch is
    # inside Raft's trust model: voters are authenticated peers, as in Kafka.)
    core = RaftCore(
        node_id=2,
        voters=frozenset({1, 2, 3}),
        config=CONFIG,
        persisted=QuorumState(1, None, 1),
        rng=random.Random(2),
    )
    core.take_ready()
    forged = (Entry(0, 1, encode_voters_record(VoterSet.of_ids({1, 2, 3, 9}))),)
    forged_response = FetchResponse(1, 1, 0, 0, 0, forged)
    assert refusal_reason(forged_response, 9, core.known_voter_ids()) is not None
    for sender in (3, 9):
        core.receive(now_ms=1, from_id=sender, message=forged_response)
    core.receive(now_ms=1, from_id=9, message=FetchResponse(5, 3, 0, 0, 0, forged))
    assert core.log_end == 0 and core.voters == {1, 2, 3}


def test_add_voter_adds_the_directory_the_observer_fetches_with() -> None:
    sim, leader = cluster()
    disk = uuid.uuid4()
    sim.core(4).directory_id = disk  # what the driver gives it from its log directory
    sim.run_until(sim.now_ms + 1_000)  # its next fetches name that directory
    core = sim.core(leader)
    other_disk = Voter(4, uuid.uuid4(), voter(4).endpoints)
    with pytest.raises(MembershipRefused) as refused:
        core.add_voter(now_ms=sim.now_ms, voter=other_disk)
    assert refused.value.error_code is ErrorCode.request_timed_out
    core.add_voter(now_ms=sim.now_ms, voter=voter(4))  # no directory named: the fetched one
    added = core.voter_set.get(4)
    assert added is not None and added.directory_id == disk
