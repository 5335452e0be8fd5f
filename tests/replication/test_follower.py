from __future__ import annotations

from raftlog.errors import ErrorCode
from raftlog.replication.core.follower import FetchResponse, FollowerAction, FollowerState
from raftlog.replication.core.types import (
    FLUSH_INTERVAL,
    DivergingEpoch,
    LeaderAndIsr,
    ReplicationSettings,
)
from tests.replication.memory_log import Entry, MemoryLog, ReadOnlyView

SETTINGS = ReplicationSettings(replica_fetch_timeout_ms=500, replica_fetch_backoff_ms=50)


def make_follower(log: MemoryLog, policy: str = "always", hw: int = 0) -> FollowerState:
    state = LeaderAndIsr(1, 7, 3, (1, 2, 3), frozenset({1, 2, 3}))
    settings = ReplicationSettings(
        replica_fetch_timeout_ms=500, replica_fetch_backoff_ms=50, flush_policy=policy
    )
    return FollowerState(
        replica_id=2, log=ReadOnlyView(log), state=state, settings=settings, high_watermark=hw
    )


def answer(request_id: int, **fields) -> FetchResponse:
    fields.setdefault("error", ErrorCode.none)
    fields.setdefault("high_watermark", 0)
    fields.setdefault("log_start_offset", 0)
    return FetchResponse(request_id=request_id, **fields)


def test_request_carries_leo_last_epoch_and_current_leader_epoch() -> None:
    log = MemoryLog()
    log.append(4, ["a", "b"])
    log.flush_to(2)
    follower = make_follower(log)
    request = follower.fetch_request(now_ms=0)
    assert request is not None
    assert (request.fetch_offset, request.last_fetched_epoch, request.current_leader_epoch) == (
        2,
        4,
        7,
    )
    assert request.leader_id == 1 and request.replica_id == 2
    assert follower.fetch_request(now_ms=1) is None  # one in flight
    retry = follower.fetch_request(now_ms=500)  # the answer was lost: ask again
    assert retry is not None and retry.request_id != request.request_id
    stale = follower.on_fetch_response(now_ms=501, response=answer(request.request_id))
    assert stale.action is FollowerAction.IGNORED


def test_next_fetch_waits_for_flush_under_always_only() -> None:
    for policy, blocked in (("always", True), (FLUSH_INTERVAL, False)):
        log = MemoryLog()
        follower = make_follower(log, policy)
        request = follower.fetch_request(now_ms=0)
        step = follower.on_fetch_response(
            now_ms=1, response=answer(request.request_id, has_records=True, high_watermark=2)
        )
        assert step.action is FollowerAction.APPEND
        log.append_entries([Entry(0, 7, "a"), Entry(1, 7, "b")])
        assert follower.awaiting_flush is blocked, policy
        if blocked:
            assert follower.fetch_request(now_ms=2) is None
            log.flush_to(2)
            assert follower.on_flushed(now_ms=3)
        assert follower.fetch_request(now_ms=3).fetch_offset == 2
        assert follower.high_watermark == 2


def test_high_watermark_is_min_of_leader_hw_and_own_leo() -> None:
    log = MemoryLog()
    follower = make_follower(log)
    request = follower.fetch_request(now_ms=0)
    follower.on_fetch_response(
        now_ms=1, response=answer(request.request_id, has_records=True, high_watermark=9)
    )
    assert follower.high_watermark == 0
    log.append_entries([Entry(0, 7, "a")])
    assert follower.high_watermark == 1


def test_diverging_epoch_truncates_to_min_of_both_end_offsets() -> None:
    log = MemoryLog()
    log.append(1, ["a", "b", "c"])
    log.append(2, ["d", "e", "f"])
    log.flush_to(6)
    follower = make_follower(log)
    request = follower.fetch_request(now_ms=0)
    assert request.last_fetched_epoch == 2
    step = follower.on_fetch_response(
        now_ms=1, response=answer(request.request_id, diverging_epoch=DivergingEpoch(1, 4))
    )
    # The leader's epoch 1 ends at 4, ours at 3: keep the shorter.
    assert step.action is FollowerAction.TRUNCATE and step.truncate_to_offset == 3
    log.truncate_to(step.truncate_to_offset)  # the driver's work
    follower.on_truncated(now_ms=2)
    assert log.log_end_offset == 3 and log.flushed_offset == 3
    request = follower.fetch_request(now_ms=2)
    assert (request.fetch_offset, request.last_fetched_epoch) == (3, 1)
    # Unknown epoch on the leader: everything goes.
    step = follower.on_fetch_response(
        now_ms=3, response=answer(request.request_id, diverging_epoch=DivergingEpoch(-1, 0))
    )
    assert step.action is FollowerAction.TRUNCATE and step.truncate_to_offset == 0


def test_truncation_is_the_drivers_and_the_next_fetch_waits_for_it() -> None:
    log = MemoryLog()
    log.append(1, ["a", "b"])
    log.append(2, ["c", "d"])
    log.flush_to(4)
    follower = make_follower(log)  # behind ReadOnlyView: a write in the core fails here
    request = follower.fetch_request(now_ms=0)
    step = follower.on_fetch_response(
        now_ms=1, response=answer(request.request_id, diverging_epoch=DivergingEpoch(1, 2))
    )
    assert step.action is FollowerAction.TRUNCATE and step.truncate_to_offset == 2
    assert log.log_end_offset == 4  # the core only asked
    assert follower.awaiting_truncation
    # Until the driver reports the cut, a fetch would carry offsets of the uncut log.
    assert follower.fetch_request(now_ms=1_000) is None
    log.truncate_to(2)
    follower.on_truncated(now_ms=1_001)
    request = follower.fetch_request(now_ms=1_001)
    assert (request.fetch_offset, request.last_fetched_epoch) == (2, 1)


def test_a_failed_truncation_backs_off_then_fetches_the_uncut_log_again() -> None:
    log = MemoryLog()
    log.append(1, ["a", "b"])
    log.append(2, ["c"])
    log.flush_to(3)
    follower = make_follower(log)
    request = follower.fetch_request(now_ms=0)
    follower.on_fetch_response(
        now_ms=1, response=answer(request.request_id, diverging_epoch=DivergingEpoch(1, 2))
    )
    follower.on_truncated(now_ms=10)  # the driver could not cut (a disk error)
    assert not follower.awaiting_truncation
    assert follower.fetch_request(now_ms=59) is None  # replica_fetch_backoff_ms is 50
    request = follower.fetch_request(now_ms=60)
    assert (request.fetch_offset, request.last_fetched_epoch) == (3, 2)  # the leader asks again


def test_out_of_range_resets_to_leader_log_start_and_errors_back_off() -> None:
    log = MemoryLog()
    log.append(1, ["a"])
    log.flush_to(1)
    follower = make_follower(log)
    request = follower.fetch_request(now_ms=0)
    step = follower.on_fetch_response(
        now_ms=1,
        response=answer(
            request.request_id, error=ErrorCode.offset_out_of_range, log_start_offset=50
        ),
    )
    assert step.action is FollowerAction.RESET and step.reset_to_offset == 50
    assert follower.fetch_request(now_ms=2) is None  # the reset is not done yet
    log.truncate_fully_and_start_at(50)
    follower.on_truncated(now_ms=2)
    request = follower.fetch_request(now_ms=2)
    assert (request.fetch_offset, request.last_fetched_epoch) == (50, -1)
    step = follower.on_fetch_response(
        now_ms=3, response=answer(request.request_id, error=ErrorCode.fenced_leader_epoch)
    )
    assert step.action is FollowerAction.BACKOFF
    assert follower.fetch_request(now_ms=4) is None
    assert follower.fetch_request(now_ms=53) is not None


def test_a_failed_reset_backs_off_even_when_the_log_is_shorter_than_the_target() -> None:
    log = MemoryLog()
    log.append(1, ["a"])
    log.flush_to(1)
    follower = make_follower(log)
    request = follower.fetch_request(now_ms=0)
    follower.on_fetch_response(
        now_ms=1,
        response=answer(
            request.request_id, error=ErrorCode.offset_out_of_range, log_start_offset=50
        ),
    )
    follower.on_truncated(now_ms=10)  # the log still ends at 1, not at 50: the reset failed
    assert follower.fetch_request(now_ms=59) is None
    assert follower.fetch_request(now_ms=60).fetch_offset == 1
