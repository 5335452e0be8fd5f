"""The roles of the Raft core and the transitions allowed between them.

Each role is a small immutable object (after Kafka's ``QuorumState``): the core swaps one for
another through ``check_transition``, which raises ``IllegalTransition`` with both full states
in the message when the move is not in ``TRANSITIONS``. Mutable leader bookkeeping (replica
progress, parked fetches) lives in the core, never in a role object. The election logic that
drives these transitions is ``elections.Elections``; the value types and errors are in
``types``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from raftlog.errors import LocalError
from raftlog.metadata.raft.types import QuorumState

__all__ = [
    "TRANSITIONS",
    "Candidate",
    "Follower",
    "IllegalTransition",
    "Leader",
    "Prospective",
    "Resigned",
    "Role",
    "Unattached",
    "Voted",
    "check_transition",
]


class IllegalTransition(LocalError):
    """The core tried a role change the protocol forbids: a bug, never a network condition."""


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
