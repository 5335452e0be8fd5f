"""The two clocks of a node, kept apart on purpose.

- `clock_ms()`: trio's monotonic clock, for timeouts, sessions, leases and elections (tests
  drive it with trio's MockClock).
- `wall_clock_ms()`: the wall clock, for everything Kafka defines in wall-clock time: record
  timestamps, segment.ms rolls, retention, producer-id expiry.
Mixing them (e.g. comparing a record timestamp with the monotonic clock) is a bug.
"""

from __future__ import annotations

import time

import trio


def clock_ms() -> int:
    """Monotonic ms from trio's clock (only inside trio.run)."""
    return int(trio.current_time() * 1000)


def wall_clock_ms() -> int:
    return int(time.time() * 1000)
