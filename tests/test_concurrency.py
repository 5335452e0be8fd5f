from __future__ import annotations

import pytest
import trio
import trio.lowlevel

from raftlog.concurrency import run_all


async def test_one_call_runs_in_the_callers_task() -> None:
    tasks = []

    async def call(x: int) -> None:
        tasks.append((x, trio.lowlevel.current_task()))

    await run_all(call, [(1,)])
    assert tasks == [(1, trio.lowlevel.current_task())]


async def test_several_calls_run_concurrently_and_all_end_first() -> None:
    # Each call waits for the other's event: run one after the other, they would deadlock.
    events = [trio.Event(), trio.Event()]
    ended = []

    async def call(mine: int) -> None:
        events[mine].set()
        await events[1 - mine].wait()
        ended.append(mine)

    with trio.fail_after(5):
        await run_all(call, [(0,), (1,)])
    assert sorted(ended) == [0, 1]


async def test_no_calls_return_at_once() -> None:
    async def call() -> None:
        raise AssertionError("not called")

    await run_all(call, [])


async def test_a_single_calls_exception_comes_as_itself() -> None:
    async def call() -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError):
        await run_all(call, [()])
