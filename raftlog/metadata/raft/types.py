"""Value types and errors of the Raft core: what the driver hands in and gets back.

``RaftConfig`` (limits with units), ``QuorumState`` (what is fsynced before a vote or a
leader claim is sent), ``Snapshot`` and the ``SnapshotCheck`` that vets a downloaded one, the
``Ready`` record of effects with its ``RoleChange`` and ``SnapshotRejected``, and the errors
the core raises. No logic lives here beyond validating the config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from raftlog.errors import LocalError, RemoteError
from raftlog.metadata.raft.messages import Entry, Message
from raftlog.metadata.raft.voters import VoterSet

__all__ = [
    "LeaderContact",
    "NotLeader",
    "Overloaded",
    "ProtocolViolation",
    "QuorumState",
    "RaftConfig",
    "Ready",
    "RoleChange",
    "Snapshot",
    "SnapshotCheck",
    "SnapshotRejected",
]


class ProtocolViolation(RemoteError):
    """A peer sent a message no correct node sends (bad offsets, entries out of order)."""


class Overloaded(LocalError):
    """propose() on a leader whose uncommitted backlog is at max_uncommitted_entries."""


class NotLeader(LocalError):
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
class LeaderContact:
    """The last answer a node had from a leader it followed: who, of which epoch, when."""

    leader_id: int
    epoch: int
    heard_ms: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A snapshot of the state machine covering every entry below end_offset."""

    end_offset: int
    epoch: int  # epoch of entry end_offset - 1 (0 for an empty prefix)
    data: bytes  # the state machine's bytes
    # The voter set in force at end_offset (KIP-853: a snapshot carries it); None: the
    # bootstrap set (a snapshot from before dynamic membership). Left out of equality: it is
    # a function of the log below end_offset, so it never tells two snapshots of one log apart.
    voters: VoterSet | None = field(default=None, compare=False)


# Vets a snapshot before this node makes it durable: None if the state machine can apply
# it, else the reason it cannot (damaged, or written by a newer version). Must be pure.
SnapshotCheck = Callable[[Snapshot], str | None]


@dataclass(frozen=True, slots=True)
class SnapshotRejected:
    """A downloaded snapshot failed the SnapshotCheck: nothing of it was kept."""

    end_offset: int
    epoch: int
    leader_id: int | None
    reason: str
    retry_in_ms: int  # no new snapshot download starts before this has passed


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Timing and size limits of the core; every value carries its unit in its name."""

    election_timeout_ms: int = 1000  # base; the actual timeout is randomized in [t, 2t)
    fetch_timeout_ms: int = 2000  # follower: no leader contact -> pre-vote; leader: check-quorum
    # A voter's fetch deadline is drawn anew from [fetch_timeout_ms - this, fetch_timeout_ms]
    # at every contact with its leader. Followers that last heard a leader at the same moment
    # (one append answered both) would otherwise time out together and clash in pre-vote;
    # drawn below the timeout, so fetch_timeout_ms stays the longest wait (Kafka's meaning of
    # quorum.fetch.timeout.ms). A voter grants (pre-)votes once its leader has been silent for
    # fetch_timeout_ms - this, the shortest deadline, so the earlier of two deadlines elects.
    fetch_timeout_jitter_ms: int = 0
    election_backoff_max_ms: int = 1000  # random wait after a lost election
    fetch_max_wait_ms: int = 500  # long-poll: how long the leader may park an idle fetch
    max_fetch_entries: int = 500  # entries per FetchResponse
    max_fetch_bytes: int = 1024 * 1024  # payload bytes per FetchResponse (at least one entry)
    max_uncommitted_entries: int = 10_000  # propose() refuses beyond this backlog
    snapshot_chunk_bytes: int = 64 * 1024  # bytes per FetchSnapshotResponse
    # A follower buffers a snapshot download in memory: one claimed above this is refused
    # (like one that does not decode) instead of growing the buffer without bound.
    max_snapshot_bytes: int = 1024 * 1024 * 1024
    request_timeout_ms: int = 2000  # resend a fetch whose response never came
    # A follower that could not apply a downloaded snapshot waits this long before the next
    # download, doubling per consecutive refusal up to the max: a snapshot the leader keeps
    # serving unchanged would otherwise be downloaded and refused in a tight loop.
    snapshot_retry_backoff_ms: int = 1000
    snapshot_retry_backoff_max_ms: int = 30_000
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
            "max_snapshot_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0: {self}")
        if not 0 <= self.fetch_timeout_jitter_ms <= self.fetch_timeout_ms // 2:
            # Half the timeout at most: the shortest deadline stays well above the long poll
            # (fetch_max_wait_ms), so an idle, healthy follower never times out.
            raise ValueError(f"fetch_timeout_jitter_ms must be in [0, fetch_timeout_ms/2]: {self}")
        if self.fetch_max_wait_ms >= self.fetch_timeout_ms - self.fetch_timeout_jitter_ms:
            raise ValueError(
                f"fetch_max_wait_ms must be < fetch_timeout_ms - fetch_timeout_jitter_ms: {self}"
            )
        if self.snapshot_chunk_bytes <= 0 or self.request_timeout_ms <= 0:
            raise ValueError(f"snapshot_chunk_bytes and request_timeout_ms must be > 0: {self}")
        if not 0 < self.snapshot_retry_backoff_ms <= self.snapshot_retry_backoff_max_ms:
            raise ValueError(
                f"need 0 < snapshot_retry_backoff_ms <= snapshot_retry_backoff_max_ms: {self}"
            )


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
    same Ready); snapshot_rejected only needs logging (the core kept its log and state);
    committed entries are handed to the state machine in offset order, once each.
    """

    quorum_state: QuorumState | None = None
    truncate_to: int | None = None
    entries: list[Entry] = field(default_factory=list)
    snapshot: Snapshot | None = None
    snapshot_rejected: SnapshotRejected | None = None
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
            and self.snapshot_rejected is None
            and not self.messages
            and not self.committed
            and not self.reads
            and self.role_change is None
        )
