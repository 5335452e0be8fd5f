from __future__ import annotations

import pytest

from raftlog.replication.core.partition import Partition, Transition
from raftlog.replication.core.types import (
    LeaderAndIsr,
    ReplicationSettings,
    ReplicationStateError,
)
from tests.replication.memory_log import MemoryLog, ReadOnlyView


def state(leader: int, leader_epoch: int, partition_epoch: int, isr=(1, 2, 3)) -> LeaderAndIsr:
    return LeaderAndIsr(leader, leader_epoch, partition_epoch, (1, 2, 3), frozenset(isr))


def test_transitions_follow_epochs_and_refuse_stale_ones() -> None:
    log = MemoryLog()
    log.append(1, ["a", "b", "c"])
    log.flush_to(3)
    partition = Partition(
        replica_id=1, log=ReadOnlyView(log), settings=ReplicationSettings(), high_watermark=2
    )
    result = partition.apply_metadata(now_ms=0, state=state(2, 1, 1))
    assert result.transition is Transition.BECAME_FOLLOWER
    assert partition.follower is not None and partition.high_watermark == 2
    assert (
        partition.apply_metadata(now_ms=0, state=state(2, 1, 1)).transition is Transition.UNCHANGED
    )
    result = partition.apply_metadata(now_ms=0, state=state(1, 2, 2))
    assert result.transition is Transition.BECAME_LEADER
    leader = partition.leader
    assert leader is not None and leader.high_watermark == 2
    assert all(p.fetch_offset == -1 for p in leader.followers.values())
    assert partition.apply_metadata(now_ms=0, state=state(2, 1, 5)).transition is Transition.STALE
    assert partition.apply_metadata(now_ms=0, state=state(1, 2, 1)).transition is Transition.STALE
    result = partition.apply_metadata(now_ms=0, state=state(1, 2, 3, isr=(1, 2)))
    assert result.transition is Transition.UPDATED
    assert partition.leader is leader and leader.isr == {1, 2}
    result = partition.apply_metadata(now_ms=0, state=state(3, 3, 4))
    assert result.transition is Transition.BECAME_FOLLOWER and result.lost_leadership
    assert partition.leader is None and partition.follower.leader_id == 3


def test_same_epoch_with_another_leader_is_a_bug() -> None:
    partition = Partition(
        replica_id=1, log=ReadOnlyView(MemoryLog()), settings=ReplicationSettings()
    )
    partition.apply_metadata(now_ms=0, state=state(2, 4, 4))
    with pytest.raises(ReplicationStateError, match="without an epoch bump"):
        partition.apply_metadata(now_ms=0, state=state(3, 4, 5))


def test_no_leader_means_no_role() -> None:
    partition = Partition(
        replica_id=1, log=ReadOnlyView(MemoryLog()), settings=ReplicationSettings()
    )
    partition.apply_metadata(now_ms=0, state=state(-1, 4, 4))
    assert partition.leader is None and partition.follower is None


def test_sole_isr_leader_serves_its_durable_end_at_once() -> None:
    # After a full restart the checkpointed HW lags the durable log; a leader whose ISR is
    # only itself must not serve that stale HW until its next append (found by Jepsen:
    # a consumer saw the high watermark go backwards).
    log = MemoryLog()
    log.append(1, ["a", "b", "c", "d", "e"])
    log.flush_to(5)
    partition = Partition(
        replica_id=1, log=ReadOnlyView(log), settings=ReplicationSettings(), high_watermark=2
    )
    result = partition.apply_metadata(now_ms=0, state=state(1, 2, 2, isr=(1,)))
    assert result.transition is Transition.BECAME_LEADER
    assert partition.high_watermark == 5
    assert result.effects is not None and result.effects.high_watermark == 5


def test_new_leader_with_followers_keeps_its_hw_until_they_fetch() -> None:
    log = MemoryLog()
    log.append(1, ["a", "b", "c"])
    log.flush_to(3)
    partition = Partition(
        replica_id=1, log=ReadOnlyView(log), settings=ReplicationSettings(), high_watermark=2
    )
    result = partition.apply_metadata(now_ms=0, state=state(1, 2, 2))
    assert result.transition is Transition.BECAME_LEADER
    leader = partition.leader
    assert leader is not None
    # Followers are unknown: the HW cannot move past what was known, and it is below the
    # start of this epoch, which is what makes ListOffsets answer OFFSET_NOT_AVAILABLE.
    assert leader.high_watermark == 2 < leader.leader_epoch_start_offset == 3
