"""Sans-IO replication state of one partition: its role and the changes between roles.

A broker runs one `Partition` per hosted partition. The trio driver feeds it metadata
(`apply_metadata`), fetch requests and responses, "appended"/"flushed"/"truncated" events and
ticks with a `now_ms`, and acts on what comes back (records to read, AlterPartition requests
to send, truncations to perform, high-watermark advances that complete delayed requests).
Nothing here does I/O or reads a clock, so the seeded simulator in tests/sim/ can run the
same code.

The leader half lives in leader.py, the follower half in follower.py, the values they share
in types.py; this module holds the transitions between them (Kafka's makeLeader/makeFollower).
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass

from raftlog.constants import NO_LEADER
from raftlog.replication.core.follower import FollowerState
from raftlog.replication.core.leader import LeaderState
from raftlog.replication.core.types import (
    LeaderAndIsr,
    LeaderEffects,
    ReplicaLogView,
    ReplicationSettings,
    ReplicationStateError,
)

# What a replica is for one leader epoch: the leader, a follower, or neither (no leader, or
# not one of the replicas). One field, so "leader and follower at once" cannot be expressed.
Role = LeaderState | FollowerState | None


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


def is_stale(current: LeaderAndIsr | None, new: LeaderAndIsr) -> bool:
    """Older leader epoch, or the same leader epoch with an older partition epoch."""
    if current is None:
        return False
    if new.leader_epoch != current.leader_epoch:
        return new.leader_epoch < current.leader_epoch
    return new.partition_epoch < current.partition_epoch


class Partition:
    """One replica of one partition and its current role."""

    def __init__(
        self,
        *,
        replica_id: int,
        log: ReplicaLogView,
        settings: ReplicationSettings,
        high_watermark: int = 0,
    ) -> None:
        self.replica_id = replica_id
        self.log = log
        self.settings = settings
        self.state: LeaderAndIsr | None = None
        self.role: Role = None
        # The HW recovered from a checkpoint; a role takes it over.
        self._initial_high_watermark = high_watermark
        # Shared by every follower epoch so an answer to an old epoch's fetch never matches.
        self._fetch_request_ids = itertools.count(1)

    @property
    def leader(self) -> LeaderState | None:
        return self.role if isinstance(self.role, LeaderState) else None

    @property
    def follower(self) -> FollowerState | None:
        return self.role if isinstance(self.role, FollowerState) else None

    @property
    def high_watermark(self) -> int:
        if self.role is not None:
            return self.role.high_watermark
        return min(self._initial_high_watermark, self.log.log_end_offset)

    def apply_metadata(self, *, now_ms: int, state: LeaderAndIsr) -> MetadataResult:
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
            leader = self.leader
            if leader is not None:
                return MetadataResult(Transition.UPDATED, effects=leader.update_state(state))
            return MetadataResult(Transition.UPDATED)
        # A new leader epoch: every role starts over.
        was_leader = self.leader is not None
        high_watermark = self.high_watermark
        self.state = state
        self.role = None
        self._initial_high_watermark = high_watermark
        if state.leader_id == self.replica_id:
            leader = LeaderState(
                replica_id=self.replica_id,
                log=self.log,
                state=state,
                settings=self.settings,
                now_ms=now_ms,
                high_watermark=high_watermark,
            )
            self.role = leader
            # lost_leadership: waiters of our previous leader epoch end with it. The HW is
            # re-evaluated at once: with an ISR of one (e.g. after a full restart) it is our
            # own durable end, and waiting for the next append would serve a stale HW.
            return MetadataResult(
                Transition.BECAME_LEADER,
                lost_leadership=was_leader,
                effects=leader.on_flushed(now_ms=now_ms),
            )
        if state.leader_id != NO_LEADER and self.replica_id in state.replicas:
            self.role = FollowerState(
                replica_id=self.replica_id,
                log=self.log,
                state=state,
                settings=self.settings,
                high_watermark=high_watermark,
                request_ids=self._fetch_request_ids,
            )
        return MetadataResult(Transition.BECAME_FOLLOWER, lost_leadership=was_leader)
