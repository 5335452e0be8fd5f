"""Running a handful of calls at once on the hot paths."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import trio


async def run_all(fn: Callable[..., Awaitable[Any]], calls: Iterable[tuple[Any, ...]]) -> None:
    """Await fn(*args) for every args in `calls`, concurrently; return when all have ended.

    A single call runs in the caller's task: starting a task (and a nursery) for it costs more
    than the call does on the paths this serves (one partition's produce, flush or marker),
    and it is by far their most common shape. An exception propagates as it would from one
    task; several from different tasks come as an ExceptionGroup, as trio's nursery raises
    them."""
    todo = list(calls)
    if len(todo) == 1:
        await fn(*todo[0])
        return
    if not todo:
        return
    async with trio.open_nursery() as nursery:
        for args in todo:
            nursery.start_soon(fn, *args)
