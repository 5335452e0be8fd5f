"""TaskTimeMeter: a request is charged for the time its tasks run, not the time they wait."""

from __future__ import annotations

import time
from types import SimpleNamespace

import trio
import trio.lowlevel

from raftlog.quotas import QuotaLimits
from raftlog.quotas.broker_hook import BrokerQuotas
from raftlog.quotas.task_time import TaskTimeMeter

BUSY_MS = 30.0


def spin(duration_ms: float) -> None:
    """Occupy the event loop (no await) for duration_ms of real time."""
    end = time.perf_counter() + duration_ms / 1000
    while time.perf_counter() < end:
        pass


async def test_waiting_is_free_running_is_charged_children_included(autojump_clock) -> None:
    meter = TaskTimeMeter()
    meter.install()
    try:
        unrelated_done = trio.Event()

        async def unrelated() -> None:
            for _ in range(3):
                spin(BUSY_MS)
                await trio.lowlevel.checkpoint()
            unrelated_done.set()

        async def child() -> None:
            await trio.lowlevel.checkpoint()
            spin(BUSY_MS)

        async with trio.open_nursery() as outer:
            outer.start_soon(unrelated)
            with meter.measure() as elapsed_ms:
                await trio.sleep(
                    0.5
                )  # a long-poll (virtual time): the unrelated task runs meanwhile
                assert elapsed_ms() < BUSY_MS / 2
                spin(BUSY_MS)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(child)
            await unrelated_done.wait()
        # Own spin + child's spin; not the unrelated task's three spins, not the wait. The
        # upper bound leaves room for the machine preempting us mid-step (a step is timed in
        # wall time) while still failing if the unrelated 3 x BUSY_MS were charged.
        assert 2 * BUSY_MS * 0.9 <= elapsed_ms() < 4 * BUSY_MS, elapsed_ms()
        assert meter.tracked_tasks == 0
    finally:
        meter.uninstall()


async def test_broker_hook_installs_the_meter_only_for_request_quotas() -> None:
    hook = BrokerQuotas(QuotaLimits(), lambda: 0)
    with hook.request_timer() as elapsed_ms:
        spin(5)
    assert elapsed_ms() == 0.0 and not hook.task_time.installed
    quotas = {(("client-id", "c"),): {"request_percentage": 10.0}}
    hook.on_metadata(SimpleNamespace(client_quotas=quotas), None)  # type: ignore[arg-type]
    with hook.request_timer() as elapsed_ms:
        spin(5)
    assert elapsed_ms() >= 4.5 and hook.task_time.installed
    # 5 ms of a 10 % quota is 50 ms of budget: held back from a standing start.
    assert hook.record_request("c", "ANONYMOUS", elapsed_ms()) > 0
    hook.on_metadata(SimpleNamespace(client_quotas={}), None)  # type: ignore[arg-type]
    with hook.request_timer():
        pass
    assert not hook.task_time.installed
