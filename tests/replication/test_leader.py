from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.errors import ErrorCode
from raftlog.replication.core.leader import LeaderState
from raftlog.replication.core.types import (
    FLUSH_INTERVAL,
    AlterPartitionRequest,
    DivergingEpoch,
    FetchOutcome,
    LeaderAndIsr,
    ReplicationSettings,
)
from tests.replication.memory_log import MemoryLog, ReadOnlyView

LAG_MS = 1000


def state(isr: set[int], leader_epoch: int = 5, partition_epoch: int = 10) -> LeaderAndIsr:
    return LeaderAndIsr(1, leader_epoch, partition_epoch, (1, 2, 3), frozenset(isr))


def make_leader(
    entries: int = 0, isr: set[int] | None = None, policy: str = "always", epoch: int = 5
) -> tuple[LeaderState, MemoryLog]:
    log = MemoryLog()
    log.append(epoch, [f"v{i}" for i in range(entries)])
    log.flush_to(log.log_end_offset)
    settings = ReplicationSettings(replica_lag_time_max_ms=LAG_MS, flush_policy=policy)
    leader = new_leader(log, state(isr or {1, 2, 3}, epoch), settings)
    return leader, log


def new_leader(log: MemoryLog, leader_state: LeaderAndIsr, settings: ReplicationSettings):
    return LeaderState(
        replica_id=1,
        log=ReadOnlyView(log),
        state=leader_state,
        settings=settings,
        now_ms=0,
        high_watermark=0,
    )


def fetch(leader: LeaderState, replica: int, offset: int, epoch: int = 5, now_ms: int = 0):
    return leader.on_follower_fetch(
        now_ms=now_ms,
        replica_id=replica,
        fetch_offset=offset,
        last_fetched_epoch=epoch,
        current_leader_epoch=leader.leader_epoch,
    )


def test_hw_is_min_of_isr_acknowledgements_and_waits_for_unknown_followers() -> None:
    leader, _log = make_leader(entries=10)
    assert leader.high_watermark == 0
    assert fetch(leader, 2, 10).effects.high_watermark == 0  # replica 3 still unknown
    decision = fetch(leader, 3, 7)
    assert decision.outcome is FetchOutcome.READ
    assert decision.read_from_offset == 7
    assert decision.effects.high_watermark_advanced
    assert leader.high_watermark == 7


def test_hw_uses_flushed_offset_under_always_and_leo_under_interval() -> None:
    for policy, expected in (("always", 10), (FLUSH_INTERVAL, 12)):
        leader, log = make_leader(entries=10, isr={1}, policy=policy)
        log.append(5, ["a", "b"])
        effects = leader.on_local_append(now_ms=0)
        assert effects.high_watermark == expected, policy
    leader, log = make_leader(entries=10, isr={1})
    log.append(5, ["a", "b"])
    leader.on_local_append(now_ms=0)
    log.flush_to(12)
    assert leader.on_flushed(now_ms=0).high_watermark == 12


def test_hw_never_moves_back() -> None:
    leader, _ = make_leader(entries=10)
    fetch(leader, 2, 8)
    fetch(leader, 3, 8)
    assert leader.high_watermark == 8
    fetch(leader, 3, 4)  # e.g. a reordered old fetch
    assert leader.high_watermark == 8


def test_epoch_fencing_and_unknown_replicas_are_refused() -> None:
    leader, _ = make_leader(entries=3)
    stale = leader.on_follower_fetch(
        now_ms=0, replica_id=2, fetch_offset=3, last_fetched_epoch=5, current_leader_epoch=4
    )
    assert stale.error == ErrorCode.fenced_leader_epoch
    ahead = leader.on_follower_fetch(
        now_ms=0, replica_id=2, fetch_offset=3, last_fetched_epoch=5, current_leader_epoch=6
    )
    assert ahead.error == ErrorCode.unknown_leader_epoch
    stranger = fetch(leader, 9, 3)
    assert stranger.error == ErrorCode.not_leader_or_follower
    assert fetch(leader, 1, 3).error == ErrorCode.not_leader_or_follower  # itself
    assert leader.followers[2].fetch_offset == -1


def test_diverging_epoch_when_follower_log_does_not_match() -> None:
    log = MemoryLog()
    log.append(1, ["a", "b", "c"])
    log.append(3, ["d", "e"])
    log.flush_to(5)
    leader = new_leader(log, state({1, 2, 3}, 3), ReplicationSettings())
    # Follower has epoch 2 data at offsets 3..6 which the leader never had.
    decision = leader.on_follower_fetch(
        now_ms=0, replica_id=2, fetch_offset=7, last_fetched_epoch=2, current_leader_epoch=3
    )
    assert decision.outcome is FetchOutcome.DIVERGING
    assert decision.diverging_epoch == DivergingEpoch(1, 3)
    assert leader.followers[2].fetch_offset == -1  # not acknowledged
    # Follower with epoch 1 but longer than the leader's epoch 1.
    assert fetch(leader, 2, 4, epoch=1).diverging_epoch == DivergingEpoch(1, 3)
    # Follower ahead of the leader in the latest epoch.
    assert fetch(leader, 2, 6, epoch=3).diverging_epoch == DivergingEpoch(3, 5)
    # Follower with an epoch older than anything the leader has.
    assert fetch(leader, 2, 1, epoch=0).diverging_epoch == DivergingEpoch(-1, 0)
    assert fetch(leader, 2, 3, epoch=1).outcome is FetchOutcome.READ


def test_offset_out_of_range_below_log_start() -> None:
    log = MemoryLog()
    log.truncate_fully_and_start_at(100)
    log.append(5, ["a"])
    leader = new_leader(log, state({1, 2, 3}), ReplicationSettings())
    decision = fetch(leader, 2, 50, epoch=-1)
    assert decision.outcome is FetchOutcome.OUT_OF_RANGE
    assert decision.error == ErrorCode.offset_out_of_range
    assert decision.log_start_offset == 100


def test_isr_shrinks_after_lag_time_and_hw_uses_committed_set_until_then() -> None:
    leader, _log = make_leader(entries=10)
    fetch(leader, 2, 10, now_ms=10)
    fetch(leader, 3, 5, now_ms=10)
    assert leader.high_watermark == 5
    assert leader.on_tick(now_ms=LAG_MS).alter_partition is None  # 3 is within the lag time
    effects = leader.on_tick(now_ms=LAG_MS + 1)
    request = effects.alter_partition
    assert request == AlterPartitionRequest(1, 5, 10, frozenset({1, 2}))
    assert leader.on_tick(now_ms=LAG_MS + 2).alter_partition is None  # one in flight at a time
    fetch(leader, 2, 10, now_ms=LAG_MS + 2)
    assert leader.high_watermark == 5  # the shrink is not committed yet
    result = state({1, 2}, partition_epoch=11)
    effects = leader.on_alter_partition_result(request=request, result=result)
    assert leader.isr == {1, 2}
    assert effects.high_watermark_advanced and leader.high_watermark == 10


def test_isr_expands_when_follower_reaches_hw_in_current_epoch() -> None:
    log = MemoryLog()
    log.append(4, ["a", "b", "c"])
    log.flush_to(3)
    leader = new_leader(log, state({1, 2}), ReplicationSettings())
    log.append(5, ["d", "e"])
    log.flush_to(5)
    leader.on_flushed(now_ms=0)
    fetch(leader, 2, 5)
    assert leader.high_watermark == 5
    assert fetch(leader, 3, 3, epoch=4).effects.alter_partition is None  # below HW
    request = fetch(leader, 3, 5).effects.alter_partition
    assert request is not None and request.new_isr == {1, 2, 3}
    assert leader.maximal_isr == {1, 2, 3} and leader.isr == {1, 2}
    # While the expansion is pending the HW already waits for replica 3.
    log.append(5, ["f"])
    log.flush_to(6)
    leader.on_flushed(now_ms=0)
    fetch(leader, 2, 6)
    assert leader.high_watermark == 5
    leader.on_alter_partition_result(request=request, result=ErrorCode.invalid_update_version)
    assert leader.pending is None and leader.maximal_isr == {1, 2}
    # It waits for newer metadata instead of retrying the same epochs.
    assert fetch(leader, 3, 6).effects.alter_partition is None
    leader.update_state(state({1, 2}, partition_epoch=11))
    assert fetch(leader, 3, 6).effects.alter_partition is not None


def test_follower_below_epoch_start_does_not_join_isr() -> None:
    leader, log = make_leader(entries=5, isr={1})
    assert leader.leader_epoch_start_offset == 5
    leader.on_flushed(now_ms=0)
    assert leader.high_watermark == 5
    # Offset 4 is below the HW anyway; the epoch-start rule matters when HW lags behind.
    leader2 = new_leader(log, state({1}), ReplicationSettings())
    assert leader2.high_watermark == 0
    assert fetch(leader2, 2, 3).effects.alter_partition is None


def test_stale_alter_partition_answers_are_ignored() -> None:
    leader, _ = make_leader(entries=1)
    other = AlterPartitionRequest(1, 4, 9, frozenset({1}))
    leader.on_alter_partition_result(request=other, result=state({1}, partition_epoch=11))
    assert leader.isr == {1, 2, 3}


def test_check_produce_uses_committed_isr() -> None:
    leader, _ = make_leader(isr={1})
    assert leader.check_produce(acks=-1, min_insync_replicas=2) == ErrorCode.not_enough_replicas
    assert leader.check_produce(acks=1, min_insync_replicas=2) == ErrorCode.none
    assert leader.check_produce(acks=-1, min_insync_replicas=1) == ErrorCode.none


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([2, 3]), st.integers(0, 30), st.booleans()),
        max_size=40,
    )
)
def test_hw_is_monotonic_and_never_above_an_isr_acknowledgement(steps) -> None:
    leader, log = make_leader(entries=0)
    acked = {2: -1, 3: -1}
    for replica, offset, append in steps:
        if append:
            log.append(5, ["x"])
            log.flush_to(log.log_end_offset)
            leader.on_flushed(now_ms=0)
        before = leader.high_watermark
        offset = min(offset, log.log_end_offset)
        if fetch(leader, replica, offset).outcome is FetchOutcome.READ:
            acked[replica] = max(acked[replica], offset)
        assert leader.high_watermark >= before
        if leader.high_watermark > 0:
            assert leader.high_watermark <= min(acked.values())
            assert leader.high_watermark <= log.flushed_offset


class KafkaEpochAnswers(MemoryLog):
    """Answers (-1, -1) for epochs newer than its latest, as the storage epoch cache does."""

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        if epoch > self.latest_epoch():
            return -1, -1
        return super().end_offset_for_epoch(epoch)


def test_follower_epoch_newer_than_leader_log_truncates_to_leader_leo_only() -> None:
    log = KafkaEpochAnswers()
    log.append(3, ["a", "b"])
    log.flush_to(2)
    leader = new_leader(log, state({1, 2, 3}, 5), ReplicationSettings())
    decision = leader.on_follower_fetch(
        now_ms=0, replica_id=2, fetch_offset=4, last_fetched_epoch=4, current_leader_epoch=5
    )
    assert decision.diverging_epoch == DivergingEpoch(3, 2)


def test_storage_partition_log_has_the_replica_log_seam() -> None:
    from raftlog.storage.log import PartitionLog

    for name in (
        "log_start_offset",
        "log_end_offset",
        "flushed_offset",
        "latest_epoch",
        "end_offset_for_epoch",
        "truncate_to",
        "truncate_fully_and_start_at",
    ):
        assert hasattr(PartitionLog, name), name


def test_refused_expansion_backs_off_instead_of_retrying_every_fetch() -> None:
    # INELIGIBLE_REPLICA (the follower's broker is fenced) is not visible in the partition's
    # metadata, so the leader retries on time, not on every fetch (found by Jepsen: hundreds
    # of refused AlterPartitions a second).
    from raftlog.replication.core.leader import ALTER_PARTITION_RETRY_BACKOFF_MS

    log = MemoryLog()
    log.append(5, ["a", "b"])
    log.flush_to(2)
    leader = new_leader(log, state({1, 2}), ReplicationSettings())
    fetch(leader, 2, 2)
    request = fetch(leader, 3, 2, now_ms=100).effects.alter_partition
    assert request is not None
    leader.on_alter_partition_result(request=request, result=ErrorCode.ineligible_replica)
    assert fetch(leader, 3, 2, now_ms=110).effects.alter_partition is None
    backoff_end = 110 + ALTER_PARTITION_RETRY_BACKOFF_MS
    assert fetch(leader, 3, 2, now_ms=backoff_end - 1).effects.alter_partition is None
    assert fetch(leader, 3, 2, now_ms=backoff_end).effects.alter_partition is not None
