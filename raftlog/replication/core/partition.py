"""Sans-IO replication state of one partition: the log seam, shared types and role changes.

A broker runs one `Partition` per hosted partition. The trio driver feeds it metadata
(`apply_metadata`), fetch requests and responses, "appended"/"flushed" events and ticks with
a `now_ms`, and acts on what comes back (records to read, AlterPartition requests to send,
truncations, high-watermark advances that complete delayed requests). Nothing here does I/O
or reads a clock, so the seeded simulator in tests/sim/ can run the same code.

The leader half lives in leader.py, the follower half in follower.py; this module holds what
both share and the transitions between them (Kafka's makeLeader/makeFollower).
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode, RaftlogError

if TYPE_CHECKING:
    from raftlog.replication.core.follower import FollowerState
    from raftlog.replication.core.leader import LeaderState

# Kafka's sentinels: an offset or epoch nobody knows yet.
UNKNOWN_OFFSET = -1
UNDEFINED_EPOCH = -1
NO_LEADER = -1

FLUSH_ALWAYS = "always"
FLUSH_INTERVAL = "interval"


class ReplicaLog(Protocol):
    """What replication needs from a partition log (raftlog.storage.PartitionLog has it).

    Offsets are Kafka offsets. `flushed_offset` is exclusive: every offset below it is fsynced.
    """

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def flushed_offset(self) -> int: ...

    def latest_epoch(self) -> int:
        """Leader epoch of the last batch, UNDEFINED_EPOCH when the log is empty."""
        ...

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """KIP-279: (largest epoch <= `epoch` in the log, start offset of the next epoch or LEO).

        (UNDEFINED_EPOCH, UNKNOWN_OFFSET) when the log has no epoch <= `epoch`.
        """
        ...

    def truncate_to(self, offset: int) -> None:
        """Drop every offset >= `offset` (a no-op when offset >= LEO)."""
        ...


class ReplicationStateError(RaftlogError):
    """An illegal transition; the message carries the full state so the bug can be found."""


@dataclass(frozen=True)
class PartitionState:
    """The controller's view of a partition, as published in the metadata log."""

    leader_id: int
    leader_epoch: int
    partition_epoch: int
    replicas: tuple[int, ...]
    isr: frozenset[int]

    def __post_init__(self) -> None:
        if not self.isr <= set(self.replicas):
            raise ReplicationStateError(f"ISR is not a subset of the replicas: {self}")
        if self.leader_id != NO_LEADER and self.leader_id not in self.replicas:
            raise ReplicationStateError(f"leader is not a replica: {self}")


@dataclass(frozen=True)
class ReplicationSettings:
    """Per-broker replication limits (the node config's keys, with their units)."""

    replica_lag_time_max_ms: int = 30_000
    flush_policy: str = FLUSH_ALWAYS
    # A follower resends a fetch that got no answer after this long (the answer was lost).
    replica_fetch_timeout_ms: int = 2_000
    # A follower waits this long after an error answer before it fetches again.
    replica_fetch_backoff_ms: int = 100

    def __post_init__(self) -> None:
        if self.flush_policy not in (FLUSH_ALWAYS, FLUSH_INTERVAL):
            raise ReplicationStateError(f"unknown flush policy {self.flush_policy!r}")

    @classmethod
    def from_node_config(cls, config: NodeConfig) -> ReplicationSettings:
        return cls(
            replica_lag_time_max_ms=config.replica_lag_time_max_ms,
            flush_policy=config.flush_policy,
        )


@dataclass(frozen=True)
class AlterPartitionRequest:
    """An ISR change the leader asks the controller to commit (at most one in flight)."""

    leader_id: int
    leader_epoch: int
    partition_epoch: int
    new_isr: frozenset[int]


@dataclass(frozen=True)
class DivergingEpoch:
    """The leader's (epoch, end offset) for the follower's last fetched epoch (KIP-320)."""

    epoch: int
    end_offset: int


class FetchOutcome(enum.Enum):
    READ = "read"  # return records from read_from_offset
    DIVERGING = "diverging"  # the follower must truncate, see diverging_epoch
    OUT_OF_RANGE = "out_of_range"  # the follower must restart at log_start_offset
    ERROR = "error"  # error says why (fencing, not a replica, not leader)


@dataclass(frozen=True)
class LeaderEffects:
    """What a leader event asks the driver to do."""

    high_watermark: int
    # True when the HW moved: complete delayed produces and consumer fetches.
    high_watermark_advanced: bool = False
    # Send this to the controller (the leader remembers it as in flight).
    alter_partition: AlterPartitionRequest | None = None


@dataclass(frozen=True)
class FetchDecision:
    """The leader's answer to one replica fetch, before any record is read."""

    outcome: FetchOutcome
    error: ErrorCode
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    read_from_offset: int | None = None
    diverging_epoch: DivergingEpoch | None = None
    effects: LeaderEffects = field(default_factory=lambda: LeaderEffects(UNKNOWN_OFFSET))


class Transition(enum.Enum):
    BECAME_LEADER = "became_leader"
    BECAME_FOLLOWER = "became_follower"
    UPDATED = "updated"  # same leader epoch, newer partition epoch (ISR change)
    UNCHANGED = "unchanged"  # the same state again
    STALE = "stale"  # older epochs than the ones applied: refused


@dataclass(frozen=True)
class MetadataResult:
    transition: Transition
    # The driver fails every delayed produce/fetch of the partition when this is set.
    lost_leadership: bool = False
    effects: LeaderEffects | None = None


def is_stale(current: PartitionState | None, new: PartitionState) -> bool:
    """Older leader epoch, or the same leader epoch with an older partition epoch."""
    if current is None:
        return False
    if new.leader_epoch != current.leader_epoch:
        return new.leader_epoch < current.leader_epoch
    return new.partition_epoch < current.partition_epoch


class Partition:
    """One replica of one partition: leader, follower, or neither (no leader / not a replica)."""

    def __init__(
        self,
        replica_id: int,
        log: ReplicaLog,
        settings: ReplicationSettings,
        *,
        high_watermark: int = 0,
    ) -> None:
        # Imported here: leader.py and follower.py import this module's types.
        from raftlog.replication.core.follower import FollowerState
        from raftlog.replication.core.leader import LeaderState

        self._leader_cls = LeaderState
        self._follower_cls = FollowerState
        self.replica_id = replica_id
        self.log = log
        self.settings = settings
        self.state: PartitionState | None = None
        self.leader: LeaderState | None = None
        self.follower: FollowerState | None = None
        # The HW recovered from a checkpoint; a role takes it over.
        self._initial_high_watermark = high_watermark
        # Shared by every follower epoch so an answer to an old epoch's fetch never matches.
        self._fetch_request_ids = itertools.count(1)

    @property
    def high_watermark(self) -> int:
        if self.leader is not None:
            return self.leader.high_watermark
        if self.follower is not None:
            return self.follower.high_watermark
        return min(self._initial_high_watermark, self.log.log_end_offset)

    def apply_metadata(self, now_ms: int, state: PartitionState) -> MetadataResult:
        """Apply the controller's state: become leader, follower, or update the ISR."""
        current = self.state
        if is_stale(current, state):
            return MetadataResult(Transition.STALE)
        if current is not None and current.leader_epoch == state.leader_epoch:
            if current.leader_id != state.leader_id:
                raise ReplicationStateError(
                    f"replica {self.replica_id}: leader changed without an epoch bump: "
                    f"{current} -> {state}"
                )
            if current.partition_epoch == state.partition_epoch:
                if current != state:
                    raise ReplicationStateError(
                        f"replica {self.replica_id}: same epochs, different state: "
                        f"{current} -> {state}"
                    )
                return MetadataResult(Transition.UNCHANGED)
            self.state = state
            if self.leader is not None:
                return MetadataResult(Transition.UPDATED, effects=self.leader.update_state(state))
            return MetadataResult(Transition.UPDATED)
        # A new leader epoch: every role starts over.
        was_leader = self.leader is not None
        high_watermark = self.high_watermark
        self.state = state
        self.leader = None
        self.follower = None
        self._initial_high_watermark = high_watermark
        if state.leader_id == self.replica_id:
            self.leader = self._leader_cls(
                self.replica_id, self.log, state, self.settings, now_ms, high_watermark
            )
            # lost_leadership: waiters of our previous leader epoch end with it. The HW is
            # re-evaluated at once: with an ISR of one (e.g. after a full restart) it is our
            # own durable end, and waiting for the next append would serve a stale HW.
            return MetadataResult(
                Transition.BECAME_LEADER,
                lost_leadership=was_leader,
                effects=self.leader.on_flushed(now_ms),
            )
        if state.leader_id != NO_LEADER and self.replica_id in state.replicas:
            self.follower = self._follower_cls(
                self.replica_id,
                self.log,
                state,
                self.settings,
                high_watermark,
                request_ids=self._fetch_request_ids,
            )
        return MetadataResult(Transition.BECAME_FOLLOWER, lost_leadership=was_leader)
