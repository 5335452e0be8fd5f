"""A node process freezes its start-up heap out of the cyclic GC (raftlog.node.settle_gc)."""

from __future__ import annotations

import subprocess
import sys

from raftlog.node import GC_GEN0_THRESHOLD

# In a child process: freezing pytest's own heap would change how every later test collects.
PROBE = """
import gc
from raftlog.node import settle_gc
before = gc.get_freeze_count()
settle_gc()
print(before, gc.get_freeze_count(), gc.get_threshold()[0], gc.isenabled())
"""


def test_settle_gc_freezes_the_start_up_heap_and_raises_the_young_threshold() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    before, frozen, threshold, enabled = result.stdout.split()
    assert int(before) == 0
    # Everything imported so far (the whole node's modules) is out of the collector's reach.
    assert int(frozen) > 10_000
    assert int(threshold) == GC_GEN0_THRESHOLD
    # The collector still runs: cycles created while serving are still freed.
    assert enabled == "True"
