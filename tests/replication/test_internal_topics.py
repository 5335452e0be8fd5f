"""internal_topics.wait_committed: a new coordinator loads only what its HW covers."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from raftlog.errors import ErrorCode, KafkaError
from raftlog.replication.internal_topics import wait_committed


def _hosted(high_watermark: int, log_end_offset: int) -> Any:
    """What wait_committed reads of a HostedPartition: its log end, its leader's HW and the
    waiters woken when either moves (Replicas.handle_effects, role_changed)."""
    hosted = SimpleNamespace(
        key=("__transaction_state", 0),
        log=SimpleNamespace(log_end_offset=log_end_offset),
        replica=SimpleNamespace(leader=SimpleNamespace(high_watermark=high_watermark)),
        waiters=set(),
    )

    def wake() -> None:
        for event in hosted.waiters:
            event.set()
        hosted.waiters.clear()

    hosted.wake = wake
    return hosted


async def test_returns_at_once_when_the_hw_covers_the_log_end() -> None:
    await wait_committed(_hosted(7, 7))
    await wait_committed(None)  # no replica here: nothing to wait for


async def test_waits_until_the_hw_reaches_the_log_end_as_of_the_call() -> None:
    hosted = _hosted(3, 7)
    done: list[bool] = []

    async def load() -> None:
        await wait_committed(hosted)
        done.append(True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(load)
        await trio.testing.wait_all_tasks_blocked()
        hosted.replica.leader.high_watermark = 5
        hosted.wake()
        await trio.testing.wait_all_tasks_blocked()
        assert done == []  # 5 < 7: the records at 5 and 6 may still be cut away
        hosted.log.log_end_offset = 9  # appended later: not waited for
        hosted.replica.leader.high_watermark = 7
        hosted.wake()
    assert done == [True]
    assert hosted.waiters == set()


async def test_a_lost_leadership_ends_the_wait_with_not_leader() -> None:
    hosted = _hosted(3, 7)

    async def lose_it() -> None:
        await trio.testing.wait_all_tasks_blocked()
        hosted.replica.leader = None
        hosted.wake()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(lose_it)
        with pytest.raises(KafkaError) as raised:
            await wait_committed(hosted)
    assert raised.value.code is ErrorCode.not_leader_or_follower
