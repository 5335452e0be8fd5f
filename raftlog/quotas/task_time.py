"""Time a request really occupies the event loop, for request_percentage.

Kafka charges request_percentage with the time a request spends on the network and I/O
threads, not the time it waits in purgatory. On trio the equivalent is the time the
request's handler task and the tasks it spawns spend running: a fetch long-polling for
500 ms or a produce waiting for acks=all costs (almost) nothing, a request that decodes
and copies a lot costs what it costs. Wall time would make every idle long-polling consumer
look like half a thread.

TaskTimeMeter is a trio Instrument that adds up the steps of measured tasks and their
descendants. It is installed only while some quota uses request_percentage, so a broker
without such quotas pays nothing per task step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import trio

from raftlog.quotas.rate import MS_PER_S


class _Account:
    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0


class TaskTimeMeter(trio.abc.Instrument):
    """Per-request run time of tasks; see the module docstring."""

    def __init__(self) -> None:
        self._accounts: dict[trio.lowlevel.Task, _Account] = {}
        self._step_started_s = 0.0
        self.installed = False

    # ------------------------------------------------------------------ trio hooks
    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        nursery = task.parent_nursery
        if nursery is None:
            return
        account = self._accounts.get(nursery.parent_task)
        if account is not None:
            # Work a handler delegates to its own child tasks is still the request's work.
            self._accounts[task] = account

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        # Trio reports the exit inside the task's last step, before after_task_step: charge
        # that step here, or every task's final stretch of work would go uncounted.
        account = self._accounts.pop(task, None)
        if account is not None:
            account.seconds += time.perf_counter() - self._step_started_s

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task in self._accounts:
            self._step_started_s = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        account = self._accounts.get(task)
        if account is not None:
            account.seconds += time.perf_counter() - self._step_started_s

    # ------------------------------------------------------------------ use
    def install(self) -> None:
        if not self.installed:
            trio.lowlevel.add_instrument(self)
            self.installed = True

    def uninstall(self) -> None:
        if self.installed:
            trio.lowlevel.remove_instrument(self)
            self.installed = False
            self._accounts.clear()

    @property
    def tracked_tasks(self) -> int:
        return len(self._accounts)

    @contextmanager
    def measure(self) -> Iterator[Callable[[], float]]:
        """Measure the current task (and what it spawns) for the duration of the block;
        yields a function returning the run time so far, in ms."""
        task = trio.lowlevel.current_task()
        account = _Account()
        self._accounts[task] = account
        # The step that is running now began before the task was registered; count from here.
        self._step_started_s = time.perf_counter()
        try:
            yield lambda: account.seconds * MS_PER_S
        finally:
            if self._accounts.get(task) is account:
                del self._accounts[task]
                # The step in progress ends after this block: add what it has used so far.
                account.seconds += time.perf_counter() - self._step_started_s


@contextmanager
def no_measure() -> Iterator[Callable[[], float]]:
    """The timer used while no request_percentage quota exists: nothing to charge."""
    yield lambda: 0.0
