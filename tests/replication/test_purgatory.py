from __future__ import annotations

import pytest

from raftlog.errors import ErrorCode
from raftlog.replication.core.purgatory import (
    DelayedFetch,
    DelayedProduce,
    FetchCompletion,
    FetchIsolation,
    ProduceAnswer,
    ProduceCompletion,
    ProduceWait,
    Purgatory,
    PurgatoryFullError,
    produce_answer,
)
from raftlog.replication.core.types import PartitionProgress

KEY = ("topic", 0)
BYTES_PER_OFFSET = 100


def size(key, start: int, end: int) -> int:
    return max(0, end - start) * BYTES_PER_OFFSET


def progress(hw: int, leo: int | None = None, flushed: int | None = None, isr: int = 3):
    leo = hw if leo is None else leo
    return PartitionProgress(hw, leo, leo if flushed is None else flushed, isr)


def produce(required: int, deadline: int = 1000, token: str = "p", **kw) -> DelayedProduce:
    return DelayedProduce(KEY, required, deadline, 2, token, **kw)


def test_acks_all_completes_when_hw_covers_the_batch() -> None:
    purgatory = Purgatory()
    assert purgatory.add_produce(waiter=produce(5), progress=progress(2, 5)) is None
    assert purgatory.on_progress(key=KEY, progress=progress(4, 5), bytes_between=size) == []
    assert purgatory.on_progress(key=("other", 0), progress=progress(9), bytes_between=size) == []
    done = purgatory.on_progress(key=KEY, progress=progress(5), bytes_between=size)
    assert done == [ProduceCompletion("p", ErrorCode.none)]
    assert len(purgatory) == 0
    assert purgatory.next_deadline_ms() is None


def test_isr_below_min_insync_when_hw_arrives_is_an_error() -> None:
    purgatory = Purgatory()
    purgatory.add_produce(waiter=produce(5), progress=progress(2, 5))
    done = purgatory.on_progress(key=KEY, progress=progress(5, isr=1), bytes_between=size)
    assert done == [ProduceCompletion("p", ErrorCode.not_enough_replicas_after_append)]


def test_already_covered_produce_completes_at_once() -> None:
    purgatory = Purgatory()
    assert purgatory.add_produce(waiter=produce(5), progress=progress(6)) == ProduceCompletion(
        "p", ErrorCode.none
    )


def test_acks_one_waits_for_the_local_flush() -> None:
    purgatory = Purgatory()
    waiter = produce(5, wait_for=ProduceWait.FLUSHED)
    assert purgatory.add_produce(waiter=waiter, progress=progress(0, 5, flushed=3)) is None
    assert purgatory.on_progress(
        key=KEY, progress=progress(0, 5, flushed=5), bytes_between=size
    ) == [ProduceCompletion("p", ErrorCode.none)]


def test_deadline_times_out_produce_and_answers_fetch_with_what_is_readable() -> None:
    purgatory = Purgatory()
    purgatory.add_produce(waiter=produce(5, deadline=100, token="slow"), progress=progress(0, 5))
    fetch = DelayedFetch(KEY, 2, 1000, 150, "f")
    assert purgatory.add_fetch(waiter=fetch, progress=progress(3, 5), bytes_between=size) is None
    assert purgatory.next_deadline_ms() == 100
    assert purgatory.on_deadline(now_ms=99, progress_of=lambda key: progress(3, 5)) == []
    assert purgatory.on_deadline(now_ms=100, progress_of=lambda key: progress(3, 5)) == [
        ProduceCompletion("slow", ErrorCode.request_timed_out)
    ]
    assert purgatory.on_deadline(now_ms=200, progress_of=lambda key: progress(4, 5)) == [
        FetchCompletion("f", ErrorCode.none, 4)
    ]
    assert len(purgatory) == 0


def test_consumer_fetch_sees_only_data_below_hw_and_waits_for_min_bytes() -> None:
    purgatory = Purgatory()
    fetch = DelayedFetch(KEY, 10, 3 * BYTES_PER_OFFSET, 500, "c")
    assert purgatory.add_fetch(waiter=fetch, progress=progress(10, 20), bytes_between=size) is None
    assert purgatory.on_progress(key=KEY, progress=progress(12, 20), bytes_between=size) == []
    assert purgatory.on_progress(key=KEY, progress=progress(13, 20), bytes_between=size) == [
        FetchCompletion("c", ErrorCode.none, 13)
    ]


def test_replica_fetch_waits_for_leo() -> None:
    purgatory = Purgatory()
    fetch = DelayedFetch(KEY, 10, 1, 500, "r", isolation=FetchIsolation.LOG_END)
    assert purgatory.add_fetch(waiter=fetch, progress=progress(5, 10), bytes_between=size) is None
    assert purgatory.on_progress(key=KEY, progress=progress(5, 11), bytes_between=size) == [
        FetchCompletion("r", ErrorCode.none, 11)
    ]


def test_leadership_loss_fails_everything_and_limit_is_enforced() -> None:
    purgatory = Purgatory(max_waiters=2)
    purgatory.add_produce(waiter=produce(5, token="a"), progress=progress(0, 5))
    purgatory.add_fetch(
        waiter=DelayedFetch(KEY, 5, 1, 500, "b"), progress=progress(5, 5), bytes_between=size
    )
    with pytest.raises(PurgatoryFullError):
        purgatory.add_produce(waiter=produce(6, token="c"), progress=progress(0, 6))
    done = purgatory.fail_partition(key=KEY, error=ErrorCode.not_leader_or_follower)
    assert done == [
        ProduceCompletion("a", ErrorCode.not_leader_or_follower),
        FetchCompletion("b", ErrorCode.not_leader_or_follower, -1),
    ]
    assert len(purgatory) == 0 and purgatory.next_deadline_ms() is None


def test_produce_answer_rules() -> None:
    assert produce_answer(0, "always") is ProduceAnswer.NEVER
    assert produce_answer(1, "interval") is ProduceAnswer.NOW
    assert produce_answer(1, "always") is ProduceAnswer.AFTER_FLUSH
    assert produce_answer(-1, "interval") is ProduceAnswer.AFTER_HIGH_WATERMARK
    with pytest.raises(ValueError):
        produce_answer(2, "always")


def test_consumer_fetch_deadline_is_max_wait() -> None:
    purgatory = Purgatory()
    fetch = DelayedFetch.for_consumer(KEY, 0, 10 * BYTES_PER_OFFSET, 500, 1000, "c")
    assert purgatory.add_fetch(waiter=fetch, progress=progress(3, 20), bytes_between=size) is None
    assert purgatory.next_deadline_ms() == 1500
    assert purgatory.on_deadline(now_ms=1500, progress_of=lambda key: progress(4, 20)) == [
        FetchCompletion("c", ErrorCode.none, 4)
    ]


def test_progress_completes_each_kind_in_offset_order_and_only_what_it_covers() -> None:
    purgatory = Purgatory()
    start = progress(0, 10, flushed=0)
    # Parked out of offset order (a produce that awaited between its append and parking).
    for required in (6, 2, 9, 4):
        purgatory.add_produce(waiter=produce(required, token=f"hw{required}"), progress=start)
    for required in (3, 8):
        waiter = produce(required, token=f"fl{required}", wait_for=ProduceWait.FLUSHED)
        purgatory.add_produce(waiter=waiter, progress=start)
    assert purgatory.on_progress(key=KEY, progress=progress(1, 10, 1), bytes_between=size) == []
    done = purgatory.on_progress(key=KEY, progress=progress(5, 10, 3), bytes_between=size)
    assert [c.token for c in done] == ["hw2", "hw4", "fl3"]
    assert len(purgatory) == 3
    done = purgatory.on_progress(key=KEY, progress=progress(9, 10, 10), bytes_between=size)
    assert sorted(c.token for c in done) == ["fl8", "hw6", "hw9"]
    assert len(purgatory) == 0


def test_deadline_and_failover_reach_waiters_of_both_kinds() -> None:
    purgatory = Purgatory()
    start = progress(0, 10, flushed=0)
    purgatory.add_produce(waiter=produce(5, deadline=10, token="a"), progress=start)
    purgatory.add_produce(waiter=produce(7, deadline=99, token="b"), progress=start)
    flushed = produce(3, deadline=99, token="c", wait_for=ProduceWait.FLUSHED)
    purgatory.add_produce(waiter=flushed, progress=start)
    expired = purgatory.on_deadline(now_ms=10, progress_of=lambda key: None)
    assert expired == [ProduceCompletion("a", ErrorCode.request_timed_out)]
    assert purgatory.on_progress(key=KEY, progress=progress(6, 10, 0), bytes_between=size) == []
    failed = purgatory.fail_partition(key=KEY, error=ErrorCode.not_leader_or_follower)
    assert failed == [
        ProduceCompletion("c", ErrorCode.not_leader_or_follower),
        ProduceCompletion("b", ErrorCode.not_leader_or_follower),
    ]
    assert len(purgatory) == 0
