"""Waiting on a condition with a deadline, never a bare sleep (DESIGN.md rule 8).

The synchronous twin, for harnesses that drive real node processes from plain threads, is
`raftlog.testing.cluster.ProcessCluster.wait_for`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import trio

DEFAULT_TIMEOUT_S = 15.0
# Between two checks when nothing better to wait on is given: short, and free on a MockClock.
POLL_INTERVAL_S = 0.01


async def wait_until(
    what: str,
    predicate: Callable[[], Any],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    wake: Callable[[], Awaitable[object]] | None = None,
) -> Any:
    """Check `predicate()` (a plain or an async function) until its value is truthy and return
    that value; after `timeout_s` fail with an AssertionError naming `what` and the last value.

    `wake` is awaited between checks when the caller knows an event that may change the answer
    (a metadata change, a poll); without it the check repeats every POLL_INTERVAL_S.
    """
    last: Any = None
    with trio.move_on_after(timeout_s):
        while True:
            last = predicate()
            if inspect.isawaitable(last):
                last = await last
            if last:
                return last
            if wake is None:
                await trio.sleep(POLL_INTERVAL_S)
            else:
                await wake()
    shown = "" if last is None or last is False else f" (last: {last!r})"
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{shown}")
