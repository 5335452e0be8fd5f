"""When a metadata election starts and how a simultaneous timeout resolves, under a mock clock.

The leader (node 1) is cut off; its two followers last heard from it at the same moment (one
answer woke both parked fetches). Whatever the moment each of them times out, the first
election must succeed, at the earlier of their deadlines: a voter grants a pre-vote once it
has not heard the leader for fetch_timeout_ms - jitter (the shortest deadline any voter
draws), though its own deadline may lie later; the lower id wins a clash of simultaneous
pre-votes; and a split vote backs off for a random while instead of a whole election
timeout. A leader whose answers come every long poll is never deposed by that earlier grant.
The cores are driven by a small event loop with a fixed one-way delay (no trio, no sockets:
the core is sans-IO).
"""

from __future__ import annotations

import heapq
import random
from typing import Any

import pytest

from raftlog.config import NodeConfig
from raftlog.metadata.raft.core import RaftCore
from raftlog.metadata.raft.driver import fetch_timeout_jitter_ms
from raftlog.metadata.raft.messages import Entry, FetchResponse, Message, Vote, VoteResponse
from raftlog.metadata.raft.roles import Candidate, Follower, Leader, Prospective
from raftlog.metadata.raft.types import LeaderContact, QuorumState, RaftConfig

FETCH_TIMEOUT_MS = 300
JITTER_MS = 75
CONFIG = RaftConfig(
    election_timeout_ms=100,
    fetch_timeout_ms=FETCH_TIMEOUT_MS,
    election_backoff_max_ms=100,
    fetch_max_wait_ms=50,
)
JITTERED = RaftConfig(
    election_timeout_ms=100,
    fetch_timeout_ms=FETCH_TIMEOUT_MS,
    fetch_timeout_jitter_ms=JITTER_MS,
    election_backoff_max_ms=100,
    fetch_max_wait_ms=50,
)
VOTERS = frozenset({1, 2, 3})
NOOP = Entry(0, 1, CONFIG.leader_change_payload)
HEARD_MS = 10


def follower(node_id: int, config: RaftConfig, seed: int, voters: frozenset[int] = VOTERS):
    """A follower of node 1 in epoch 1 holding the epoch's no-op entry, which last heard
    from its leader at HEARD_MS."""
    core = RaftCore(
        node_id=node_id,
        voters=voters,
        config=config,
        persisted=QuorumState(1, None, 1),
        entries=[NOOP],
        rng=random.Random(seed * 100 + node_id),
    )
    core.take_ready()
    core.receive(now_ms=HEARD_MS, from_id=1, message=FetchResponse(1, 1, 1, 1, 1))
    core.take_ready()
    return core


class Network:
    """Delivers messages after `delay_ms` and ticks every core at its deadline. Whatever goes
    to a node without a core here (node 1, the cut-off old leader) or across a cut link is
    lost. Entries count as flushed as soon as they are appended (the disk is not at issue)."""

    def __init__(self, cores: list[RaftCore], delay_ms: int, now_ms: int = HEARD_MS) -> None:
        self.cores = {c.node_id: c for c in cores}
        self.delay_ms = delay_ms
        self.now_ms = now_ms
        self.queue: list[tuple[int, int, int, Any]] = []
        self.seq = 0
        self.cut: set[frozenset[int]] = set()

    def _push(self, at_ms: int, what: Any) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (at_ms, self.seq, 0, what))

    def _drain(self, core: RaftCore) -> None:
        ready = core.take_ready()
        if ready.entries:
            core.flushed(offset=ready.entries[-1].offset + 1)
            ready.messages.extend(core.take_ready().messages)
        for to_id, message in ready.messages:
            if to_id in self.cores and frozenset({core.node_id, to_id}) not in self.cut:
                self._push(self.now_ms + self.delay_ms, (core.node_id, to_id, message))

    def step(self) -> None:
        """Deliver the next message, or tick the cores whose deadline came first."""
        tick_at = min(c.next_deadline_ms() for c in self.cores.values())
        if self.queue and self.queue[0][0] <= tick_at:
            self.now_ms, _, _, (src, dst, message) = heapq.heappop(self.queue)
            self.cores[dst].receive(now_ms=self.now_ms, from_id=src, message=message)
            self._drain(self.cores[dst])
        else:
            self.now_ms = max(self.now_ms, tick_at)
            for core in self.cores.values():
                if core.next_deadline_ms() <= self.now_ms:
                    core.tick(now_ms=self.now_ms)
                    self._drain(core)

    def leaders(self) -> list[int]:
        return [c.node_id for c in self.cores.values() if isinstance(c.role, Leader)]

    def run_until_leader(self, limit_ms: int) -> tuple[int, int]:
        """Run until a leader exists; (its id, the time it won)."""
        while self.now_ms < limit_ms:
            self.step()
            leaders = self.leaders()
            if leaders:
                return leaders[0], self.now_ms
        raise AssertionError(f"no leader by {limit_ms} ms: {self.roles()}")

    def roles(self) -> dict[int, Any]:
        return {i: c.role for i, c in self.cores.items()}


@pytest.mark.parametrize("config", [CONFIG, JITTERED], ids=["no_jitter", "jitter"])
@pytest.mark.parametrize("delay_ms", [0, 1, 5, 30])
def test_a_cut_off_leader_is_replaced_in_one_round_at_the_earlier_deadline(
    config: RaftConfig, delay_ms: int
) -> None:
    apart = 0
    for seed in range(40):
        cores = [follower(2, config, seed), follower(3, config, seed)]
        deadlines = [c.next_deadline_ms() for c in cores]
        leader, won_ms = Network(cores, delay_ms).run_until_leader(5_000)
        # One round: epoch 2, the next after the cut-off leader's, whoever won it.
        assert {c.epoch for c in cores} == {2}, (seed, [c.role for c in cores])
        # Won right after the *earlier* deadline: the other voter grants the first pre-vote
        # although its own deadline lies ahead. Pre-vote and vote are two round trips; one
        # more delay when the other voter times out before the first pre-vote reaches it
        # and, with the lower id, keeps its own pre-vote instead (then it wins).
        assert won_ms <= min(deadlines) + 5 * delay_ms, (seed, deadlines, won_ms)
        if max(deadlines) - min(deadlines) > 5 * delay_ms:
            apart += 1
            # The voter that timed out first won, before the other one even timed out.
            first_id = cores[deadlines.index(min(deadlines))].node_id
            assert (leader, won_ms < max(deadlines)) == (first_id, True), (seed, deadlines)
        loser = next(c for c in cores if c.node_id != leader)
        assert loser.role.quorum_state(loser.node_id).voted_for == leader
    if config.fetch_timeout_jitter_ms and delay_ms < 30:
        assert apart > 20  # the seeds do try deadlines far apart, not only a clash


def test_a_follower_grants_a_pre_vote_once_the_shortest_deadline_passed() -> None:
    # Its own deadline lies later (drawn up to fetch_timeout_ms); what it grants depends on
    # fetch_timeout_ms - jitter only, the earliest any voter may time out.
    shortest_ms = HEARD_MS + FETCH_TIMEOUT_MS - JITTER_MS
    for seed in range(20):
        core = follower(3, JITTERED, seed)
        deadline_ms = core.next_deadline_ms()
        for now_ms, granted in ((shortest_ms - 1, False), (shortest_ms, True)):
            if now_ms >= deadline_ms:
                continue  # drew the shortest deadline: then it is a Prospective itself
            core.receive(now_ms=now_ms, from_id=2, message=_pre_vote(2))
            ((_, response),) = core.take_ready().messages
            assert isinstance(response, VoteResponse) and response.pre_vote
            assert response.vote_granted is granted, (seed, now_ms, deadline_ms)
            # A pre-vote changes nothing here: still following node 1 to its own deadline.
            assert isinstance(core.role, Follower) and core.epoch == 1
            assert core.next_deadline_ms() == deadline_ms


def test_a_follower_grants_the_vote_after_granting_the_pre_vote() -> None:
    # The vote request follows the pre-vote a round trip later; refusing it while the own
    # deadline has not passed would make the granted pre-vote worthless.
    shortest_ms = HEARD_MS + FETCH_TIMEOUT_MS - JITTER_MS
    for seed in range(20):
        core = follower(3, JITTERED, seed)
        if core.next_deadline_ms() <= shortest_ms + 1:
            continue
        vote = Vote(False, 2, 2, NOOP.offset + 1, NOOP.epoch)
        core.receive(now_ms=shortest_ms - 1, from_id=2, message=vote)
        ((_, refused),) = core.take_ready().messages
        assert not refused.vote_granted and core.epoch == 1
        core.receive(now_ms=shortest_ms + 1, from_id=2, message=vote)
        ready = core.take_ready()
        ((_, response),) = ready.messages
        assert isinstance(response, VoteResponse) and response.vote_granted
        assert ready.quorum_state == QuorumState(2, 2, None)  # durable before it is sent


def test_without_jitter_a_follower_grants_at_its_own_deadline_only() -> None:
    core = follower(3, CONFIG, 0)
    core.receive(now_ms=HEARD_MS + FETCH_TIMEOUT_MS - 1, from_id=2, message=_pre_vote(2))
    ((_, response),) = core.take_ready().messages
    assert not response.vote_granted


def _elected_cluster(config: RaftConfig, seed: int, delay_ms: int) -> tuple[Network, int]:
    cores = [
        RaftCore(
            node_id=node_id,
            voters=VOTERS,
            config=config,
            persisted=QuorumState(0, None, None),
            entries=[],
            rng=random.Random(seed * 100 + node_id),
        )
        for node_id in sorted(VOTERS)
    ]
    network = Network(cores, delay_ms, now_ms=0)
    leader, _ = network.run_until_leader(10_000)
    # Until every voter holds the whole log and follows the leader: a voter's pre-vote is
    # then refused only because the leader is live, never because its log is behind.
    while not all(
        c.log_end == c.high_watermark == network.cores[leader].log_end
        and (c.node_id == leader or isinstance(c.role, Follower))
        for c in cores
    ):
        assert network.now_ms < 20_000, network.roles()
        network.step()
    return network, leader


# The largest jitter RaftConfig allows (half the timeout): the shortest deadline, and so the
# time after which a follower grants others' pre-votes, is as close to the long poll as it
# may be. The leader's answers still come every long poll plus a round trip, well within it.
MAX_JITTERED = RaftConfig(
    election_timeout_ms=100,
    fetch_timeout_ms=FETCH_TIMEOUT_MS,
    fetch_timeout_jitter_ms=FETCH_TIMEOUT_MS // 2,
    election_backoff_max_ms=100,
    fetch_max_wait_ms=50,
)


@pytest.mark.parametrize("delay_ms", [0, 1, 5, 30])
def test_a_live_leader_is_never_replaced(delay_ms: int) -> None:
    # One follower is cut off from the leader (but not from the other follower): it times
    # out again and again and asks the other for its pre-vote, which that one refuses
    # every time, since the leader's long-polled answers reach it far more often than the
    # shortest fetch deadline.
    assert MAX_JITTERED.fetch_max_wait_ms + 2 * delay_ms < (
        MAX_JITTERED.fetch_timeout_ms - MAX_JITTERED.fetch_timeout_jitter_ms
    )
    for seed in range(10):
        network, leader = _elected_cluster(MAX_JITTERED, seed, delay_ms)
        epoch = network.cores[leader].epoch
        cut_off, other = sorted(VOTERS - {leader})
        if seed % 2:
            cut_off, other = other, cut_off
        network.cut.add(frozenset({leader, cut_off}))
        pre_voted = False
        end_ms = network.now_ms + 20 * FETCH_TIMEOUT_MS
        while network.now_ms < end_ms:
            network.step()
            assert network.leaders() == [leader], (seed, network.roles())
            assert network.cores[other].epoch == epoch, (seed, network.roles())
            pre_voted |= isinstance(network.cores[cut_off].role, Prospective)
        # It did ask (the test is not vacuous) and never got to be a candidate.
        assert pre_voted and network.cores[cut_off].epoch == epoch, (seed, network.roles())
        assert isinstance(network.cores[other].role, Follower)


def test_simultaneous_timeouts_elect_the_lower_id() -> None:
    cores = [follower(2, CONFIG, 0), follower(3, CONFIG, 0)]
    assert cores[0].next_deadline_ms() == cores[1].next_deadline_ms()
    leader, _ = Network(cores, delay_ms=2).run_until_leader(5_000)
    assert leader == 2
    assert isinstance(cores[1].role, Follower | Prospective) or cores[1].role.name == "voted"


def test_fetch_deadline_is_jittered_below_the_timeout_at_every_answer() -> None:
    core = follower(2, JITTERED, 0)
    waits = set()
    for i in range(200):
        now_ms = HEARD_MS + 10 * (i + 1)
        core.receive(now_ms=now_ms, from_id=1, message=FetchResponse(1, 1, 1, 1, 1))
        core.take_ready()
        role = core.role
        assert isinstance(role, Follower)
        wait_ms = role.fetch_deadline_ms - now_ms
        assert FETCH_TIMEOUT_MS - JITTER_MS <= wait_ms <= FETCH_TIMEOUT_MS
        waits.add(wait_ms)
    assert len(waits) > 20  # drawn anew each time, not once per node


def test_no_jitter_waits_exactly_the_fetch_timeout() -> None:
    core = follower(2, CONFIG, 0)
    assert core.next_deadline_ms() == HEARD_MS + FETCH_TIMEOUT_MS


def test_an_observer_is_not_jittered() -> None:
    core = follower(4, JITTERED, 0)
    assert core.next_deadline_ms() == HEARD_MS + FETCH_TIMEOUT_MS


@pytest.mark.parametrize(
    "fields",
    [
        {"fetch_timeout_jitter_ms": -1},
        {"fetch_timeout_jitter_ms": FETCH_TIMEOUT_MS // 2 + 1},
        {"fetch_timeout_jitter_ms": 200, "fetch_max_wait_ms": 100},
    ],
)
def test_config_bounds_the_jitter(fields: dict[str, int]) -> None:
    base = {"fetch_timeout_ms": FETCH_TIMEOUT_MS, "fetch_max_wait_ms": 50} | fields
    with pytest.raises(ValueError, match="fetch_timeout_jitter_ms"):
        RaftConfig(**base)


def _prospective(node_id: int) -> RaftCore:
    core = follower(node_id, CONFIG, 0)
    core.tick(now_ms=core.next_deadline_ms())
    core.take_ready()
    assert isinstance(core.role, Prospective)
    return core


def _pre_vote(candidate_id: int) -> Vote:
    return Vote(True, candidate_id, 2, NOOP.offset + 1, NOOP.epoch)


def _answer(core: RaftCore, from_id: int, message: Message) -> VoteResponse:
    core.receive(now_ms=core.next_deadline_ms() - 1, from_id=from_id, message=message)
    ((_, response),) = [(to, m) for to, m in core.take_ready().messages if to == from_id]
    assert isinstance(response, VoteResponse)
    return response


def test_a_prospective_refuses_a_higher_rival_with_an_equal_log() -> None:
    assert not _answer(_prospective(2), 3, _pre_vote(3)).vote_granted


def test_a_prospective_grants_a_lower_rival() -> None:
    assert _answer(_prospective(3), 2, _pre_vote(2)).vote_granted


def test_a_prospective_grants_a_rival_that_refused_it() -> None:
    # The rival still heard the leader when it refused: this node's pre-vote cannot win, so
    # it must not block the rival's, whatever their ids.
    core = _prospective(2)
    refusal = VoteResponse(True, 1, None, False)
    core.receive(now_ms=HEARD_MS + FETCH_TIMEOUT_MS, from_id=3, message=refusal)
    core.take_ready()
    assert _answer(core, 3, _pre_vote(3)).vote_granted


def test_a_prospective_grants_a_higher_rival_with_a_longer_log() -> None:
    better = Vote(True, 3, 2, NOOP.offset + 2, NOOP.epoch)
    assert _answer(_prospective(2), 3, better).vote_granted


def _candidate(voters: frozenset[int]) -> RaftCore:
    core = follower(2, CONFIG, 0, voters)
    core.tick(now_ms=core.next_deadline_ms())
    grant = VoteResponse(True, 1, None, True)
    for voter in sorted(voters - {1, 2}):
        core.receive(now_ms=core.next_deadline_ms() - 1, from_id=voter, message=grant)
        if isinstance(core.role, Candidate):
            break
    core.take_ready()
    assert isinstance(core.role, Candidate) and core.epoch == 2
    return core


def test_a_split_vote_backs_off_for_a_random_while() -> None:
    core = _candidate(VOTERS)
    now_ms = HEARD_MS + FETCH_TIMEOUT_MS + 5
    assert core.next_deadline_ms() > now_ms + CONFIG.election_backoff_max_ms
    # Node 3 is a rival of epoch 2: only node 1, which never answers, could still grant.
    core.receive(now_ms=now_ms, from_id=3, message=VoteResponse(False, 2, None, False))
    assert core.next_deadline_ms() <= now_ms + CONFIG.election_backoff_max_ms


def test_a_refusal_that_leaves_a_majority_possible_waits_the_election_timeout() -> None:
    voters = frozenset({1, 2, 3, 4, 5})
    core = _candidate(voters)
    deadline_ms = core.next_deadline_ms()
    now_ms = HEARD_MS + FETCH_TIMEOUT_MS + 5
    core.receive(now_ms=now_ms, from_id=4, message=VoteResponse(False, 2, None, False))
    assert core.next_deadline_ms() == deadline_ms


def test_leader_contact_outlives_the_follower_role() -> None:
    core = follower(2, JITTERED, 0)
    assert core.leader_contact == LeaderContact(1, 1, HEARD_MS)
    core.tick(now_ms=core.next_deadline_ms())
    assert isinstance(core.role, Prospective)
    assert core.leader_contact == LeaderContact(1, 1, HEARD_MS)


@pytest.mark.parametrize(
    ("fetch_timeout_ms", "session_ms", "expected_ms"),
    [(2000, 1500, 500), (2000, 1800, 200), (2000, 9000, 0), (4000, 1500, 1000)],
)
def test_the_driver_jitters_a_quarter_of_the_timeout_but_never_below_a_session(
    fetch_timeout_ms: int, session_ms: int, expected_ms: int
) -> None:
    config = NodeConfig.from_dict(
        {"fetch_timeout_ms": fetch_timeout_ms, "broker_session_timeout_ms": session_ms}
    )
    assert fetch_timeout_jitter_ms(config) == expected_ms
