"""Produce requests of one connection take turns in arrival order (raftlog.net.kafka.turns)."""

from __future__ import annotations

import trio
import trio.testing

from raftlog.net.kafka.turns import Turns


async def test_a_turn_waits_for_every_earlier_one_whatever_order_they_end_in() -> None:
    turns = Turns()
    first, second, third = turns.take(), turns.take(), turns.take()
    passed: list[str] = []

    async def go(name: str, turn) -> None:  # type: ignore[no-untyped-def]
        await turn.wait()
        passed.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(go, "third", third)
        nursery.start_soon(go, "second", second)
        await trio.testing.wait_all_tasks_blocked()
        assert passed == []
        third.done()  # ending out of order lets nobody pass the first
        await trio.testing.wait_all_tasks_blocked()
        assert passed == []
        await first.wait()  # the oldest never waits
        first.done()
        first.done()  # idempotent: the second's end is not skipped
        await trio.testing.wait_all_tasks_blocked()
        assert passed == ["second"]
        second.done()
    assert passed == ["second", "third"]
    await turns.take().wait()  # everything before it is done


async def test_a_cancelled_wait_leaves_the_order_intact() -> None:
    turns = Turns()
    first, second, third = turns.take(), turns.take(), turns.take()
    with trio.move_on_after(0.01):
        await second.wait()
    second.done()  # its handler ended (the connection closed) without its turn
    first.done()
    with trio.fail_after(1):
        await third.wait()
