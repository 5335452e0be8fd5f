"""The election half of the Raft core: who leads which epoch (mixed into RaftCore).

Pre-vote (KIP-996), votes, epochs, Begin/EndQuorumEpoch, and the moves between the role
objects of ``roles``. Replication (fetch, HW, snapshots) is ``replication``.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from raftlog.codec import EPOCH_MAX
from raftlog.metadata.raft.majority import VoteResult, vote_result
from raftlog.metadata.raft.messages import (
    BeginQuorumEpoch,
    BeginQuorumEpochResponse,
    EndQuorumEpoch,
    EndQuorumEpochResponse,
    Message,
    Vote,
    VoteResponse,
)
from raftlog.metadata.raft.roles import (
    Candidate,
    Follower,
    Leader,
    Prospective,
    Resigned,
    Role,
    Unattached,
    Voted,
    check_transition,
)
from raftlog.metadata.raft.types import LeaderContact, QuorumState, RaftConfig, Ready, RoleChange

__all__ = ["Elections"]


class Elections:
    """The role machine of RaftCore: elections, epochs, votes (mixed into RaftCore).

    Everything here decides *who leads which epoch*; replication (fetch, HW, snapshots) is
    replication.Replication. The attributes and hooks below are provided by RaftCore.
    """

    node_id: int
    voters: frozenset[int]
    is_voter: bool
    config: RaftConfig
    _rng: random.Random
    _role: Role
    _ready: Ready
    _persisted: QuorumState
    _reported: RoleChange | None
    leader_contact: LeaderContact | None

    # --- provided by RaftCore
    @property
    def epoch(self) -> int:
        return self._role.epoch

    @property
    def leader_id(self) -> int | None:
        if isinstance(self._role, Follower | Leader):
            return self._role.quorum_state(self.node_id).leader_id
        return None

    @property
    def log_end(self) -> int:
        raise NotImplementedError

    @property
    def last_epoch(self) -> int:
        raise NotImplementedError

    def _send(self, to_id: int, message: Message) -> None:
        raise NotImplementedError

    def _maybe_fetch(self, now_ms: int | None) -> None:
        raise NotImplementedError

    def _role_changed(self, old: Role, new: Role) -> None:
        raise NotImplementedError

    def _start_leading(self, now_ms: int) -> None:
        raise NotImplementedError

    # --- roles

    def _send_end_quorum_epoch(self, successors: tuple[int, ...]) -> None:
        for v in self.voters:
            if v != self.node_id:
                self._send(v, EndQuorumEpoch(self.epoch, self.node_id, successors))

    def _initial_role(self, qs: QuorumState, now_ms: int) -> Role:
        if qs.leader_id == self.node_id:
            # A restarted leader never resumes leading: its in-memory progress is gone.
            return Resigned(qs.epoch, self._election_deadline(now_ms))
        if qs.leader_id is not None:
            return Follower(qs.epoch, qs.leader_id, qs.voted_for, now_ms + self._fetch_timeout())
        if qs.voted_for is not None:
            return Voted(qs.epoch, qs.voted_for, self._election_deadline(now_ms))
        return Unattached(qs.epoch, self._election_deadline(now_ms))

    def _election_deadline(self, now_ms: int) -> int:
        if not self.is_voter:
            return now_ms + self.config.request_timeout_ms
        timeout_ms = self.config.election_timeout_ms
        return now_ms + timeout_ms + self._rng.randrange(timeout_ms)

    def _fetch_timeout(self) -> int:
        """How long a follower waits for its leader from now: fetch_timeout_ms, less a fresh
        random jitter on a voter (RaftConfig.fetch_timeout_jitter_ms), so voters cut off from
        their leader at one moment do not all start pre-vote at the same millisecond."""
        jitter_ms = self.config.fetch_timeout_jitter_ms
        if jitter_ms <= 0 or not self.is_voter:
            return self.config.fetch_timeout_ms
        return self.config.fetch_timeout_ms - self._rng.randrange(jitter_ms + 1)

    def _leader_live_ms(self) -> int:
        """How long after its last answer a followed leader still counts as live, for granting
        (pre-)votes: the shortest fetch deadline a voter may draw, fetch_timeout_ms less the
        whole jitter. Two voters that last heard the leader at one moment drew different
        deadlines; the one that times out first must be granted by the other at once, not at
        the other's own (later) deadline, or every election lands at the later of the two.
        Still far above the long poll (RaftConfig checks fetch_max_wait_ms is below it), so
        a follower of a live leader hears it again well within this and never grants."""
        if not self.is_voter:
            return self.config.fetch_timeout_ms
        return self.config.fetch_timeout_ms - self.config.fetch_timeout_jitter_ms

    def _become(self, new: Role) -> None:
        old = self._role
        check_transition(self.node_id, old, new)
        self._role = new
        self._role_changed(old, new)
        qs = new.quorum_state(self.node_id)
        if qs != self._persisted:
            self._persisted = qs
            self._ready.quorum_state = qs
        self._report_role()

    def _report_role(self) -> None:
        change = RoleChange(self._role.name, self._role.epoch, self.leader_id)
        if change != self._reported:
            self._reported = change
            self._ready.role_change = change

    def _election_timeout(self, now_ms: int) -> None:
        """A voter without a leader waited long enough: (re)start pre-vote."""
        role = self._role
        if isinstance(role, Prospective) and role.leader_id is not None:
            # Pre-vote failed: others still hear from that leader, so try it again.
            deadline_ms = now_ms + self._fetch_timeout()
            self._become(Follower(role.epoch, role.leader_id, role.voted_for, deadline_ms))
            self._maybe_fetch(now_ms)
        elif isinstance(role, Prospective | Voted):
            self._start_prospective(now_ms, role.voted_for, None)
        elif isinstance(role, Candidate | Resigned):
            self._start_prospective(now_ms, self.node_id, None)
        elif isinstance(role, Unattached):
            self._start_prospective(now_ms, None, None)

    def _start_prospective(self, now_ms: int, voted_for: int | None, leader: int | None) -> None:
        if self.epoch >= EPOCH_MAX:
            # No epoch is left to elect in: no log can hold a larger one. Real elections take
            # decades to get here; a forged epoch can. Stay put (and wait before trying again)
            # rather than persist an epoch that no node could load or append in.
            role = self._role
            deadline_ms = self._election_deadline(now_ms)
            if isinstance(role, Follower):
                self._role = dataclasses.replace(role, fetch_deadline_ms=deadline_ms)
            elif not isinstance(role, Leader):
                self._role = dataclasses.replace(role, election_deadline_ms=deadline_ms)
            return
        self._become(
            Prospective(
                self.epoch,
                voted_for,
                leader,
                frozenset({self.node_id}),
                frozenset(),
                self._election_deadline(now_ms),
            )
        )
        vote = Vote(True, self.node_id, self.epoch + 1, self.log_end, self.last_epoch)
        for v in self.voters:
            if v != self.node_id:
                self._send(v, vote)
        self._maybe_win_prevote(now_ms)

    def _maybe_win_prevote(self, now_ms: int) -> None:
        role = self._role
        if (
            isinstance(role, Prospective)
            and vote_result(role.granted, role.rejected, self.voters) is VoteResult.WON
        ):
            self._become(
                Candidate(
                    role.epoch + 1,
                    frozenset({self.node_id}),
                    frozenset(),
                    self._election_deadline(now_ms),
                )
            )
            vote = Vote(False, self.node_id, self.epoch, self.log_end, self.last_epoch)
            for v in self.voters:
                if v != self.node_id:
                    self._send(v, vote)
            self._maybe_win_election(now_ms)

    def _maybe_win_election(self, now_ms: int) -> None:
        role = self._role
        if (
            not isinstance(role, Candidate)
            or vote_result(role.granted, role.rejected, self.voters) is not VoteResult.WON
        ):
            return
        self._become(Leader(role.epoch, self.log_end))
        self._start_leading(now_ms)

    def _observe(self, now_ms: int, epoch: int, leader_id: int | None) -> None:
        """Learn from any message: a newer epoch, or the leader of the current epoch."""
        if leader_id == self.node_id:
            leader_id = None  # only this node can claim its own leadership
        role = self._role
        if epoch > role.epoch:
            if leader_id is not None:
                self._become(Follower(epoch, leader_id, None, now_ms + self._fetch_timeout()))
            else:
                self._become(Unattached(epoch, self._election_deadline(now_ms)))
        elif epoch == role.epoch and leader_id is not None:
            # A Prospective that already gave up on this very leader does not take it back
            # on hearsay: it retries that leader itself when its election timeout passes.
            if isinstance(role, Unattached | Voted | Candidate) or (
                isinstance(role, Prospective) and role.leader_id is None
            ):
                voted = role.quorum_state(self.node_id).voted_for
                self._become(Follower(epoch, leader_id, voted, now_ms + self._fetch_timeout()))
            else:
                return
        else:
            return
        if isinstance(self._role, Follower):
            self._maybe_fetch(now_ms)

    def _has_live_leader(self, now_ms: int) -> bool:
        """Whether this node refuses a newer epoch's (pre-)vote: it leads, or it follows a
        leader that answered it within _leader_live_ms (and did not resign). The follower's
        own fetch deadline may lie later (it is jittered up to fetch_timeout_ms): only when
        to start its own pre-vote depends on that, never whether to grant another's."""
        role = self._role
        if isinstance(role, Leader):
            return True
        if not (
            isinstance(role, Follower)
            and role.leader_heard
            and not role.leader_resigned
            and now_ms < role.fetch_deadline_ms
        ):
            return False
        contact = self.leader_contact
        # leader_heard means an answer came in this role, which set leader_contact to this
        # very leader and epoch; checked all the same, never relied on blindly.
        if contact is None or (contact.leader_id, contact.epoch) != (role.leader_id, role.epoch):
            return True
        return now_ms - contact.heard_ms < self._leader_live_ms()

    # --- election messages

    def _on_vote(self, now_ms: int, from_id: int, msg: Vote) -> None:
        candidate_log = (msg.last_epoch, msg.last_offset)
        log_ok = candidate_log >= (self.last_epoch, self.log_end)
        # Whether this node is a voter in its own latest voter set does not matter (the Raft
        # dissertation, 4.1: a server answers without consulting its own configuration): its
        # log may hold an uncommitted change removing it that the winner will truncate, and
        # the candidate's majority is counted in the candidate's voter set. A candidate that
        # is not a voter here is refused unless its log is strictly ahead of ours (it may
        # know of a change adding it that has not reached us): a removed voter, whose log
        # lacks the change removing it, cannot force elections on those that have it, and
        # pre-vote keeps it from disturbing a quorum that hears its leader (KIP-996).
        known = msg.candidate_id in self.voters or candidate_log > (
            self.last_epoch,
            self.log_end,
        )
        eligible = known and log_ok
        if msg.pre_vote:
            if msg.candidate_epoch - 1 > self.epoch and msg.candidate_id in self.voters:
                # The candidate already *is* in a newer epoch (it won a pre-vote there once, its
                # vote requests got lost): that epoch exists, so join it; else the candidate
                # could never rejoin a leader of an older epoch.
                self._observe(now_ms, msg.candidate_epoch - 1, None)
            # Otherwise pre-vote changes nothing; refused while we still hear from a leader,
            # so a node that was partitioned away cannot depose a healthy one when it returns.
            granted = (
                eligible
                and msg.candidate_epoch > self.epoch
                and not self._has_live_leader(now_ms)
                and not self._outranks_rival(msg)
            )
            self._send(from_id, VoteResponse(True, self.epoch, self.leader_id, granted))
            return
        if msg.candidate_epoch > self.epoch and self._has_live_leader(now_ms):
            # KIP-996: the pre-vote rule holds for real votes too. While this node hears from
            # a leader (or is one), a newer epoch's vote request moves nothing: a candidate
            # that won a pre-vote majority does not need this node, and a repeated (or
            # forged) vote request cannot force an election on a healthy quorum.
            self._send(from_id, VoteResponse(False, self.epoch, self.leader_id, False))
            return
        if msg.candidate_epoch > self.epoch and known:
            self._become(Unattached(msg.candidate_epoch, self._election_deadline(now_ms)))
        role = self._role
        granted = False
        if eligible and msg.candidate_epoch == role.epoch:
            current_vote = role.quorum_state(self.node_id).voted_for
            if isinstance(role, Unattached) or (
                isinstance(role, Prospective) and role.leader_id is None and current_vote is None
            ):
                self._become(Voted(role.epoch, msg.candidate_id, self._election_deadline(now_ms)))
                granted = True
            elif isinstance(role, Voted) and role.voted_for == msg.candidate_id:
                granted = True
        self._send(from_id, VoteResponse(False, self.epoch, self.leader_id, granted))

    def _outranks_rival(self, msg: Vote) -> bool:
        """Whether this Prospective refuses a rival's pre-vote to keep its own alive.

        Two voters that stopped hearing the leader at the same moment pre-vote at once; if
        each granted the other, both would become candidates of the same epoch, vote for
        themselves and split, costing a whole election timeout. Between two such rivals
        with equal logs the lower node id wins: the higher one refuses nothing, the lower one
        refuses the higher one. It stops refusing once that rival refused it (the rival still
        hears the leader, or has the better claim) or its own pre-vote is lost, so a rival is
        never blocked by a pre-vote that cannot win. Refusing a pre-vote changes nothing
        durable: only liveness is at stake, never safety."""
        role = self._role
        return (
            isinstance(role, Prospective)
            and msg.candidate_epoch == role.epoch + 1
            and msg.candidate_id > self.node_id
            and msg.candidate_id not in role.rejected
            and (msg.last_epoch, msg.last_offset) == (self.last_epoch, self.log_end)
            and vote_result(role.granted, role.rejected, self.voters) is not VoteResult.LOST
        )

    def _on_vote_response(self, now_ms: int, from_id: int, msg: VoteResponse) -> None:
        self._observe(now_ms, msg.epoch, msg.leader_id)
        role = self._role
        if from_id not in self.voters:
            return
        if msg.pre_vote and isinstance(role, Prospective) and msg.epoch <= role.epoch:
            if msg.vote_granted:
                self._role = dataclasses.replace(role, granted=role.granted | {from_id})
                self._maybe_win_prevote(now_ms)
            else:
                self._role = dataclasses.replace(role, rejected=role.rejected | {from_id})
        elif not msg.pre_vote and isinstance(role, Candidate) and msg.epoch == role.epoch:
            if msg.vote_granted:
                self._role = dataclasses.replace(role, granted=role.granted | {from_id})
                self._maybe_win_election(now_ms)
            else:
                first_refusal = from_id not in role.rejected  # not a duplicated response
                role = dataclasses.replace(role, rejected=role.rejected | {from_id})
                result = vote_result(role.granted, role.rejected, self.voters)
                if result is VoteResult.LOST:
                    # Lost: back off a random while before asking again (pre-vote first).
                    backoff_ms = self._rng.randrange(self.config.election_backoff_max_ms + 1)
                    role = dataclasses.replace(role, election_deadline_ms=now_ms + backoff_ms)
                elif first_refusal and self._split(role):
                    # Split: a rival candidate of this epoch (or a voter that chose one)
                    # refused, and only voters that have not answered could still make a
                    # majority. When they are gone (the case that split: the old leader cut
                    # off), waiting out the election timeout would cost a whole second; a
                    # random backoff makes one of the rivals start the next epoch first, and
                    # the other grants it. The deadline only moves earlier.
                    backoff_ms = self._rng.randrange(self.config.election_backoff_max_ms + 1)
                    deadline_ms = min(role.election_deadline_ms, now_ms + backoff_ms)
                    role = dataclasses.replace(role, election_deadline_ms=deadline_ms)
                self._role = role

    def _split(self, role: Candidate) -> bool:
        """One more refusal would lose: every voter that has not answered must still grant."""
        unanswered = self.voters - role.granted - role.rejected
        if not unanswered:
            return False
        return vote_result(role.granted, role.rejected | {min(unanswered)}, self.voters) is (
            VoteResult.LOST
        )

    def _on_begin_quorum_epoch(self, now_ms: int, from_id: int, msg: BeginQuorumEpoch) -> None:
        self._observe(now_ms, msg.epoch, msg.leader_id)
        self._send(from_id, BeginQuorumEpochResponse(self.epoch, self.leader_id))

    def _on_end_quorum_epoch(self, now_ms: int, from_id: int, msg: EndQuorumEpoch) -> None:
        self._observe(now_ms, msg.epoch, msg.leader_id)
        role = self._role
        if isinstance(role, Follower) and (role.epoch, role.leader_id) == (
            msg.epoch,
            msg.leader_id,
        ):
            # The first preferred successor starts at once; later ones wait longer so the
            # most caught-up voter most likely wins.
            if self.node_id in msg.preferred_successors:
                rank = msg.preferred_successors.index(self.node_id)
            else:
                rank = len(msg.preferred_successors)
            backoff_ms = 0
            if rank > 0:
                backoff_ms = self._rng.randrange(self.config.election_backoff_max_ms + 1) * rank
            self._role = dataclasses.replace(
                role, fetch_deadline_ms=now_ms + backoff_ms, leader_resigned=True
            )
        self._send(from_id, EndQuorumEpochResponse(self.epoch, self.leader_id))

    def leader_unreachable(self, *, now_ms: int, leader_id: int) -> None:
        """The driver cannot even connect to `leader_id` (its process is gone: the connection
        was reset and a reconnect was refused). Treat it like a resignation: elect after a
        random backoff instead of waiting out the whole fetch timeout. Only liveness is at
        stake if this is wrong: pre-vote still needs a majority that no longer hears the
        leader, and a refused pre-vote makes this node a follower of that leader again."""
        role = self._role
        if (
            not self.is_voter
            or not isinstance(role, Follower)
            or role.leader_id != leader_id
            or role.leader_resigned
        ):
            return
        backoff_ms = self._rng.randrange(self.config.election_backoff_max_ms + 1)
        self._role = dataclasses.replace(
            role,
            fetch_deadline_ms=min(role.fetch_deadline_ms, now_ms + backoff_ms),
            leader_resigned=True,
        )

    def _on_response(self, now_ms: int, from_id: int, msg: Any) -> None:
        self._observe(now_ms, msg.epoch, msg.leader_id)
