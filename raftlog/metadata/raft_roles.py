"""Roles, persisted quorum state, configuration and the Ready record of the Raft core.

Each role is a small immutable object (after Kafka's ``QuorumState``): the core swaps one for
another through ``check_transition``, which raises ``IllegalTransition`` with both full states
in the message when the move is not in ``TRANSITIONS``. Mutable leader bookkeeping (replica
progress, parked fetches) lives in the core, never in a role object.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any, Literal

from raftlog.errors import RaftlogError
from raftlog.metadata.raft_messages import (
    BeginQuorumEpoch,
    BeginQuorumEpochResponse,
    EndQuorumEpoch,
    EndQuorumEpochResponse,
    Entry,
    Message,
    Vote,
    VoteResponse,
)

__all__ = [
    "TRANSITIONS",
    "Candidate",
    "Elections",
    "Follower",
    "IllegalTransition",
    "Leader",
    "NotLeader",
    "Overloaded",
    "Prospective",
    "ProtocolViolation",
    "QuorumState",
    "RaftConfig",
    "Ready",
    "Resigned",
    "Role",
    "RoleChange",
    "Snapshot",
    "Unattached",
    "Voted",
    "check_transition",
]


class IllegalTransition(RaftlogError):
    """The core tried a role change the protocol forbids: a bug, never a network condition."""


class ProtocolViolation(RaftlogError):
    """A peer sent a message no correct node sends (bad offsets, entries out of order)."""


class Overloaded(RaftlogError):
    """propose() on a leader whose uncommitted backlog is at max_uncommitted_entries."""


class NotLeader(RaftlogError):
    """propose()/read_index() on a node that is not the leader; says whom to ask instead."""

    def __init__(self, leader_id: int | None, epoch: int) -> None:
        super().__init__(f"not the leader (leader_id={leader_id}, epoch={epoch})")
        self.leader_id = leader_id
        self.epoch = epoch


@dataclass(frozen=True, slots=True)
class QuorumState:
    """What must be durable before any message reflecting it is sent (KIP-595 quorum-state)."""

    epoch: int = 0
    voted_for: int | None = None
    leader_id: int | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A snapshot of the state machine covering every entry below end_offset."""

    end_offset: int
    epoch: int  # epoch of entry end_offset - 1 (0 for an empty prefix)
    data: bytes


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Timing and size limits of the core; every value carries its unit in its name."""

    election_timeout_ms: int = 1000  # base; the actual timeout is randomized in [t, 2t)
    fetch_timeout_ms: int = 2000  # follower: no leader contact -> pre-vote; leader: check-quorum
    election_backoff_max_ms: int = 1000  # random wait after a lost election
    fetch_max_wait_ms: int = 500  # long-poll: how long the leader may park an idle fetch
    max_fetch_entries: int = 500  # entries per FetchResponse
    max_fetch_bytes: int = 1024 * 1024  # payload bytes per FetchResponse (at least one entry)
    max_uncommitted_entries: int = 10_000  # propose() refuses beyond this backlog
    snapshot_chunk_bytes: int = 64 * 1024  # bytes per FetchSnapshotResponse
    request_timeout_ms: int = 2000  # resend a fetch whose response never came
    leader_change_payload: bytes = b"\x00raftlog-leader-change"  # the per-epoch no-op entry

    def __post_init__(self) -> None:
        if self.fetch_max_wait_ms >= self.fetch_timeout_ms:
            # An idle follower fetches once per fetch_max_wait_ms; if that were not well below
            # the fetch timeout, a healthy leader would fail check-quorum.
            raise ValueError(f"fetch_max_wait_ms must be < fetch_timeout_ms: {self}")
        for name in (
            "election_timeout_ms",
            "fetch_timeout_ms",
            "max_fetch_entries",
            "max_fetch_bytes",
            "max_uncommitted_entries",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0: {self}")
        if self.snapshot_chunk_bytes <= 0 or self.request_timeout_ms <= 0:
            raise ValueError(f"snapshot_chunk_bytes and request_timeout_ms must be > 0: {self}")


@dataclass(frozen=True, slots=True)
class Unattached:
    """Knows the epoch but neither a leader nor its own vote in it."""

    epoch: int
    election_deadline_ms: int
    name: str = "unattached"

    def quorum_state(self, node_id: int) -> QuorumState:
        return QuorumState(self.epoch, None, None)


@dataclass(frozen=True, slots=True)
class Voted:
    """Granted its vote for this epoch (durably) and waits for that leader."""

    epoch: int
    voted_for: int
    election_deadline_ms: int
    name: str = "voted"

    def quorum_state(self, node_id: int) -> QuorumState:
        return QuorumState(self.epoch, self.voted_for, None)


@dataclass(frozen=True, slots=True)
class Prospective:
    """Pre-vote (KIP-996): asks whether it could win epoch+1 without bumping anything."""

    epoch: int
    voted_for: int | None
    leader_id: int | None  # a leader of this epoch it stopped hearing from, if any
    granted: frozenset[int]
    rejected: frozenset[int]
    election_deadline_ms: int
    name: str = "prospective"

    def quorum_state(self, node_id: int) -> QuorumState:
        return QuorumState(self.epoch, self.voted_for, self.leader_id)


@dataclass(frozen=True, slots=True)
class Candidate:
    """Bumped the epoch and voted for itself; asks the other voters."""

    epoch: int
    granted: frozenset[int]
    rejected: frozenset[int]
    election_deadline_ms: int
    name: str = "candidate"

    def quorum_state(self, node_id: int) -> QuorumState:
        return QuorumState(self.epoch, node_id, None)


@dataclass(frozen=True, slots=True)
class Follower:
    """Replicates from a known leader by fetching; an observer is always this or Unattached."""

    epoch: int
    leader_id: int
    voted_for: int | None
    fetch_deadline_ms: int
    leader_resigned: bool = False  # got EndQuorumEpoch: no longer a "live" leader for pre-vote
    # True once a fetch succeeded in this role. Only then does the leader count as live for
    # pre-vote: a follower that merely heard of the leader (from a vote response, on restart)
    # must not shield a dead leader from being replaced.
    leader_heard: bool = False
    name: str = "follower"

    def quorum_state(self, node_id: int) -> QuorumState:
        return QuorumState(self.epoch, self.voted_for, self.leader_id)


@dataclass(frozen=True, slots=True)
class Leader:
    """Won the election of this epoch; epoch_start_offset is where its no-op entry sits."""

    epoch: int
    epoch_start_offset: int
    name: str = "leader"

    def quorum_state(self, node_id: int) -> QuorumState:
        return QuorumState(self.epoch, node_id, node_id)


@dataclass(frozen=True, slots=True)
class Resigned:
    """Was the leader of this epoch (or restarted as it); serves nothing, waits to elect."""

    epoch: int
    election_deadline_ms: int
    preferred_successors: tuple[int, ...] = ()
    name: str = "resigned"

    def quorum_state(self, node_id: int) -> QuorumState:
        return QuorumState(self.epoch, node_id, node_id)


Role = Unattached | Voted | Prospective | Candidate | Follower | Leader | Resigned

EpochRule = Literal["same", "higher", "same_or_higher", "next"]

# (from role name, to role name) -> how the epoch may move. Anything absent is illegal.
TRANSITIONS: dict[tuple[str, str], EpochRule] = {
    ("unattached", "unattached"): "higher",
    ("unattached", "voted"): "same_or_higher",
    ("unattached", "follower"): "same_or_higher",
    ("unattached", "prospective"): "same",
    ("voted", "unattached"): "higher",
    ("voted", "voted"): "higher",
    ("voted", "follower"): "same_or_higher",
    ("voted", "prospective"): "same",
    ("follower", "unattached"): "higher",
    ("follower", "voted"): "higher",
    ("follower", "follower"): "higher",
    ("follower", "prospective"): "same",
    ("prospective", "unattached"): "higher",
    ("prospective", "voted"): "same_or_higher",
    ("prospective", "follower"): "same_or_higher",
    ("prospective", "prospective"): "same",
    ("prospective", "candidate"): "next",
    ("candidate", "unattached"): "higher",
    ("candidate", "voted"): "higher",
    ("candidate", "follower"): "same_or_higher",
    ("candidate", "prospective"): "same",
    ("candidate", "leader"): "same",
    ("leader", "unattached"): "higher",
    ("leader", "voted"): "higher",
    ("leader", "follower"): "higher",
    ("leader", "resigned"): "same",
    ("resigned", "unattached"): "higher",
    ("resigned", "voted"): "higher",
    ("resigned", "follower"): "higher",
    ("resigned", "prospective"): "same",
}


def check_transition(node_id: int, old: Role, new: Role) -> None:
    """Raise IllegalTransition (with both full states) unless old -> new is allowed."""
    rule = TRANSITIONS.get((old.name, new.name))
    ok = rule is not None and (
        (rule == "same" and new.epoch == old.epoch)
        or (rule == "higher" and new.epoch > old.epoch)
        or (rule == "same_or_higher" and new.epoch >= old.epoch)
        or (rule == "next" and new.epoch == old.epoch + 1)
    )
    if ok and isinstance(old, Voted) and isinstance(new, Voted | Prospective | Follower):
        # A vote is durable for the whole epoch: it may never silently change or vanish.
        voted = getattr(new, "voted_for", None)
        ok = new.epoch > old.epoch or voted == old.voted_for
    if ok and isinstance(new, Follower) and isinstance(old, Candidate | Voted | Prospective):
        ok = new.epoch > old.epoch or new.voted_for == old.quorum_state(node_id).voted_for
    if ok and isinstance(old, Follower | Prospective) and isinstance(new, Follower | Prospective):
        # Two leaders in one epoch would break Raft; a node never follows a second one.
        old_leader = old.leader_id
        ok = new.epoch > old.epoch or old_leader is None or new.leader_id == old_leader
    if not ok:
        raise IllegalTransition(f"node {node_id}: illegal transition {old!r} -> {new!r}")


@dataclass(frozen=True, slots=True)
class RoleChange:
    """Reported in Ready whenever the role name, epoch or known leader changes."""

    role: str
    epoch: int
    leader_id: int | None


@dataclass(slots=True)
class Ready:
    """Everything the driver must do, in field order: see docs/raft.md ("The Ready contract").

    truncate_to removes every entry at or above that offset; entries are appended after the
    truncation; a snapshot replaces the whole log (the core never puts entries after it in the
    same Ready); committed entries are handed to the state machine in offset order, once each.
    """

    quorum_state: QuorumState | None = None
    truncate_to: int | None = None
    entries: list[Entry] = field(default_factory=list)
    snapshot: Snapshot | None = None
    messages: list[tuple[int, Message]] = field(default_factory=list)
    committed: list[Entry] = field(default_factory=list)
    high_watermark: int = 0
    reads: list[tuple[object, int | None]] = field(default_factory=list)
    role_change: RoleChange | None = None

    def is_empty(self) -> bool:
        return (
            self.quorum_state is None
            and self.truncate_to is None
            and not self.entries
            and self.snapshot is None
            and not self.messages
            and not self.committed
            and not self.reads
            and self.role_change is None
        )


class Elections:
    """The role machine of RaftCore: elections, epochs, votes (mixed into RaftCore).

    Everything here decides *who leads which epoch*; replication (fetch, HW, snapshots) stays
    in raft.py. The attributes and hooks below are provided by RaftCore.
    """

    node_id: int
    voters: frozenset[int]
    is_voter: bool
    config: RaftConfig
    _rng: random.Random
    _majority: int
    _role: Role
    _ready: Ready
    _persisted: QuorumState
    _reported: RoleChange | None

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
        return self.config.fetch_timeout_ms

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
            deadline_ms = now_ms + self.config.fetch_timeout_ms
            self._become(Follower(role.epoch, role.leader_id, role.voted_for, deadline_ms))
            self._maybe_fetch(now_ms)
        elif isinstance(role, Prospective | Voted):
            self._start_prospective(now_ms, role.voted_for, None)
        elif isinstance(role, Candidate | Resigned):
            self._start_prospective(now_ms, self.node_id, None)
        elif isinstance(role, Unattached):
            self._start_prospective(now_ms, None, None)

    def _start_prospective(self, now_ms: int, voted_for: int | None, leader: int | None) -> None:
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
        if isinstance(role, Prospective) and len(role.granted) >= self._majority:
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
        if not isinstance(role, Candidate) or len(role.granted) < self._majority:
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
        role = self._role
        if isinstance(role, Leader):
            return True
        return (
            isinstance(role, Follower)
            and role.leader_heard
            and not role.leader_resigned
            and now_ms < role.fetch_deadline_ms
        )

    # --- election messages

    def _on_vote(self, now_ms: int, from_id: int, msg: Vote) -> None:
        log_ok = (msg.last_epoch, msg.last_offset) >= (self.last_epoch, self.log_end)
        eligible = self.is_voter and msg.candidate_id in self.voters and log_ok
        if msg.pre_vote:
            if msg.candidate_epoch - 1 > self.epoch and msg.candidate_id in self.voters:
                # The candidate already *is* in a newer epoch (it won a pre-vote there once, its
                # vote requests got lost): that epoch exists, so join it; else the candidate
                # could never rejoin a leader of an older epoch.
                self._observe(now_ms, msg.candidate_epoch - 1, None)
            # Otherwise pre-vote changes nothing; refused while we still hear from a leader,
            # so a node that was partitioned away cannot depose a healthy one when it returns.
            granted = (
                eligible and msg.candidate_epoch > self.epoch and not self._has_live_leader(now_ms)
            )
            self._send(from_id, VoteResponse(True, self.epoch, self.leader_id, granted))
            return
        if msg.candidate_epoch > self.epoch and msg.candidate_id in self.voters and self.is_voter:
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
                role = dataclasses.replace(role, rejected=role.rejected | {from_id})
                if len(role.rejected) >= self._majority:
                    # Lost: back off a random while before asking again (pre-vote first).
                    backoff_ms = self._rng.randrange(self.config.election_backoff_max_ms + 1)
                    role = dataclasses.replace(role, election_deadline_ms=now_ms + backoff_ms)
                self._role = role

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

    def leader_unreachable(self, now_ms: int, leader_id: int) -> None:
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
