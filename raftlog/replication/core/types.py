"""Values the sans-IO replication core shares: sentinels, settings, the log view, messages.

partition.py, leader.py, follower.py and purgatory.py all import from here and from nothing
above them, so the core's modules form no cycle.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

from raftlog.constants import NO_LEADER
from raftlog.epochs import DivergingEpoch
from raftlog.errors import ErrorCode, LocalError

# Kafka's sentinel: an offset nobody knows yet.
UNKNOWN_OFFSET = -1

FLUSH_ALWAYS = "always"
FLUSH_INTERVAL = "interval"


class ReplicaLogView(Protocol):
    """What the core reads of a partition log: offsets and epochs, never a write.

    raftlog.storage.PartitionLog has it. The core decides; the driver changes the log (appends,
    truncations, flushes) and reports back, as etcd's read-only Storage and its Ready do.
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


class ReplicationStateError(LocalError):
    """An illegal transition; the message carries the full state so the bug can be found."""


@dataclass(frozen=True)
class LeaderAndIsr:
    """The controller's leader, epochs, replicas and ISR of one partition (Kafka's
    LeaderAndIsr), as the replication core takes it from the metadata image."""

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


@dataclass(frozen=True)
class AlterPartitionRequest:
    """An ISR change the leader asks the controller to commit (at most one in flight)."""

    leader_id: int
    leader_epoch: int
    partition_epoch: int
    new_isr: frozenset[int]


@dataclass(frozen=True)
class PartitionProgress:
    """A leader's offsets and ISR size, handed to the purgatory to complete delayed requests."""

    high_watermark: int
    log_end_offset: int
    flushed_offset: int
    isr_size: int


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
