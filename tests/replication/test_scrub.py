"""The scrubber's driver on trio's MockClock: its pacing and its reaction to damage."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio
from trio.testing import MockClock

from raftlog.replication.core.follower import FollowerAction
from raftlog.replication.scrub import Scrubber
from raftlog.storage import LogConfig, PartitionLog
from raftlog.storage.scrubber import ScrubResult
from tests.replication.memory_log import MemoryLog
from tests.replication.test_follower import answer, make_follower
from tests.storage.helpers import batch
from tests.waiting import wait_until

CONFIG = LogConfig(segment_bytes=2000, index_interval_bytes=200)


@dataclass(eq=False)
class FakeHosted:
    """What the scrubber reads of a hosted replica."""

    topic: str
    partition: int
    log: PartitionLog
    replica: Any = field(default_factory=lambda: SimpleNamespace(follower=None))
    disk_lock: trio.Lock = field(default_factory=trio.Lock)
    log_cut: trio.Event | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)


def make_log(path: Path, batches: int) -> PartitionLog:
    lg = PartitionLog.open(path, CONFIG, now_ms=0)
    for _ in range(batches):
        lg.append_as_leader(batch(3), leader_epoch=1, now_ms=0)
    return lg


def damage_last_batch(lg: PartitionLog) -> None:
    segment = lg.segments[-1]
    with open(segment.log_path, "r+b") as f:
        f.seek(segment.size_bytes - 3)
        f.write(b"\xff")


async def in_loop(fn: Callable[[], ScrubResult]) -> ScrubResult:
    # No worker thread: the MockClock must not jump while a read is in progress.
    await trio.lowlevel.checkpoint()
    return fn()


async def test_the_scrubber_reads_at_the_configured_rate(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    logs = [make_log(tmp_path / f"t-{i}", 40) for i in range(3)]
    partitions: dict[Any, Any] = {}
    for i, lg in enumerate(logs):
        hosted = FakeHosted("t", i, lg)
        partitions[hosted.key] = hosted
    total = sum(lg.size_bytes for lg in logs)
    rate = 1000
    scrubber = Scrubber(
        partitions=partitions, bytes_per_s=rate, truncate=lambda *a: None, run_sync=in_loop
    )
    scrubber.schedule.pass_interval_s = 0
    start = trio.current_time()
    samples: list[tuple[float, int]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(scrubber.run)
        while scrubber.schedule.passes < 2:
            await trio.sleep(1)
            samples.append((trio.current_time() - start, scrubber.schedule.bytes_verified))
        nursery.cancel_scope.cancel()
    # Never ahead of the rate (one step of up to a second's worth of bytes may be in hand)...
    assert all(verified <= rate * (t + 1) for t, verified in samples)
    # ...and never far behind it: two passes take about 2 * total / rate seconds (a batch cut
    # by a step's end is read again by the next step, and the limit counts bytes read).
    elapsed = samples[-1][0]
    assert 2 * total / rate <= elapsed + 1 <= 2 * total / rate * 1.2 + 3
    assert scrubber.damage_found == 0


async def test_damage_on_a_replica_without_a_follower_role_is_marked_not_cut(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    lg = make_log(tmp_path / "t-0", 10)
    damage_last_batch(lg)
    hosted = FakeHosted("t", 0, lg)
    cuts: list[Any] = []
    partitions: dict[Any, Any] = {hosted.key: hosted}
    scrubber = Scrubber(
        partitions=partitions,
        bytes_per_s=10_000,
        truncate=lambda *a: cuts.append(a),
        run_sync=in_loop,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(scrubber.run)
        await wait_until("the damage found", lambda: scrubber.damage_found > 0)
        nursery.cancel_scope.cancel()
    assert lg.damaged_range == (27, 30) and not cuts
    assert scrubber.status()["damaged_partitions"] == [("t", 0)]


def test_a_damage_cut_forgets_the_fetch_in_flight_and_waits_for_the_driver() -> None:
    log = MemoryLog()
    log.append(4, ["a", "b", "c", "d"])
    log.flush_to(4)
    follower = make_follower(log)
    request = follower.fetch_request(now_ms=0)
    assert request is not None and request.fetch_offset == 4
    step = follower.truncation_for_damage(offset=2)
    assert step is not None and step.truncate_to_offset == 2
    assert follower.truncation_for_damage(offset=1) is None  # one cut at a time
    # The answer to the fetch from the old end must not be appended after the cut.
    late = follower.on_fetch_response(
        now_ms=1, response=answer(request.request_id, has_records=True, high_watermark=4)
    )
    assert late.action is FollowerAction.IGNORED
    assert follower.fetch_request(now_ms=2) is None  # the driver has not cut yet
    log.truncate_to(2)
    follower.on_truncated(now_ms=3)
    again = follower.fetch_request(now_ms=3)
    assert again is not None and again.fetch_offset == 2


async def test_a_log_cut_and_rewritten_between_steps_is_not_reported_damaged(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    lg = make_log(tmp_path / "t-0", 6)
    hosted = FakeHosted("t", 0, lg)
    partitions: dict[Any, Any] = {hosted.key: hosted}
    scrubber = Scrubber(
        partitions=partitions, bytes_per_s=10**6, truncate=lambda *a: None, run_sync=in_loop
    )
    scrubber.schedule.chunk_bytes = 400  # a few batches a step: the cursor stops mid-segment

    async def one_step() -> None:
        step = scrubber.schedule.next_step(
            now_s=trio.current_time() + 10, keys=[hosted.key], segments_of=scrubber._segments_of
        )
        assert step is not None
        if not isinstance(step, float):  # a float: the pass is over, the next one waits
            await scrubber._verify(hosted, step)

    await one_step()
    # A follower's divergent tail is cut and the leader's batches, of other sizes, appended:
    # the cursor's position is no batch boundary of the new bytes.
    lg.truncate_to(0)
    for _ in range(8):
        lg.append_as_leader(batch(5, value_bytes=37), leader_epoch=2, now_ms=0)
    while scrubber.schedule.passes == 0:
        await one_step()
    assert scrubber.damage_found == 0 and lg.damaged_range is None
