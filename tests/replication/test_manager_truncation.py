"""A follower's truncation runs in a worker thread while metadata keeps arriving on the loop.

Three managers in one process (the Cluster of test_manager.py), real segment files, and a
truncation held in its worker thread (or held before it starts) by the test, so a role change
lands exactly where a slow disk or a long compaction would put it. Unclean election is on so
the replica whose log is being cut can be made leader.
"""

from __future__ import annotations

import errno
import logging
import threading
from pathlib import Path

import pytest
import trio

from raftlog.errors import ErrorCode
from raftlog.metadata.controller.messages import DeleteTopics
from raftlog.storage import PartitionLog
from tests.replication.test_manager import (
    TOPIC,
    Cluster,
    cluster_config,
    followers,
    produce,
    start_cluster,
)
from tests.storage.helpers import batch
from tests.waiting import wait_until

# Offsets of the scenario: three acknowledged batches of three records, then an
# unreplicated tail of five on the old leader.
ACKNOWLEDGED_END = 9
TAIL_END = 14
# A produce that would wait for a held lock gives up this soon (the test then fails fast).
SHORT_PRODUCE_TIMEOUT_MS = 2_000


class HeldTruncation:
    """Holds PartitionLog.truncate_to inside its worker thread until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        truncate_to = PartitionLog.truncate_to

        def held_truncate_to(plog: PartitionLog, offset: int) -> None:
            self.entered.set()
            assert self.release.wait(timeout=60), "the test never released the truncation"
            truncate_to(plog, offset)

        monkeypatch.setattr(PartitionLog, "truncate_to", held_truncate_to)


async def diverge_old_leader(cluster: Cluster) -> int:
    """Leave the old leader with an unreplicated tail, fenced out of leadership and the ISR,
    then let it rejoin as a follower; returns its id."""
    await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
    for _ in range(3):
        assert (await produce(cluster)).error == ErrorCode.none
    await wait_until("replicas in sync", cluster.in_sync)
    old_leader = cluster.leader_id
    cluster.paused.update(followers(cluster))
    assert (await produce(cluster, acks=1, count=5)).error == ErrorCode.none
    assert cluster.status(old_leader).log_end_offset == TAIL_END
    cluster.heartbeat(old_leader, want_fence=True)
    assert cluster.leader_id != old_leader
    cluster.heartbeat(old_leader)  # unfenced, still outside the ISR
    return old_leader


def elect_unclean(cluster: Cluster, broker_id: int) -> None:
    """Fence every other broker: with no ISR member left, unclean election picks broker_id."""
    for other in sorted(set(cluster.managers) - {broker_id}):
        cluster.heartbeat(other, want_fence=True)
    assert cluster.leader_id == broker_id, cluster.partition()


def topic_dirs(root: Path, broker_id: int) -> list[str]:
    return sorted(p.name for p in root.glob(f"broker-{broker_id}/{TOPIC}-*"))


def assert_leader_consistent(cluster: Cluster, broker_id: int) -> None:
    hosted = cluster.managers[broker_id].replicas.partitions[(TOPIC, 0)]
    leader = hosted.replica.leader
    assert leader is not None
    end = hosted.log.log_end_offset
    # The leader's view of its log is the log: its epoch starts at (not past) the end it had
    # when it took over, and its HW never covers offsets the log does not hold.
    assert leader.leader_epoch_start_offset <= end, (leader.leader_epoch_start_offset, end)
    assert leader.high_watermark <= end, (leader.high_watermark, end)
    assert hosted.log.epoch_cache.latest_epoch() <= leader.leader_epoch


async def test_becoming_leader_while_the_log_is_cut_waits_for_the_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldTruncation(monkeypatch)
    config = cluster_config(unclean_leader_election=True)
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=config)
        old_leader = await diverge_old_leader(cluster)
        cluster.paused.clear()
        await wait_until("the cut to start in its thread", held.entered.is_set)

        try:
            elect_unclean(cluster, old_leader)
            # Mid-cut the replica must not build a leader from a log whose end is moving.
            status = cluster.status(old_leader)
            assert status.role != "leader" or status.high_watermark <= ACKNOWLEDGED_END, status
        finally:
            held.release.set()
        await cluster.settle()
        await wait_until(
            "the old leader to lead", lambda: cluster.status(old_leader).role == "leader"
        )
        assert cluster.status(old_leader).log_end_offset == ACKNOWLEDGED_END
        assert_leader_consistent(cluster, old_leader)
        result = await produce(cluster, acks=1, leader=old_leader)
        assert result.error == ErrorCode.none and result.base_offset == ACKNOWLEDGED_END, result
        await cluster.stop_all()


async def test_a_cut_still_queued_when_the_replica_becomes_leader_is_dropped(
    tmp_path: Path,
) -> None:
    config = cluster_config(unclean_leader_election=True)
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=config)
        old_leader = await diverge_old_leader(cluster)
        hosted = cluster.managers[old_leader].replicas.partitions[(TOPIC, 0)]
        # A compaction of the directory (or a snapshot write) holds the cut back.
        async with hosted.disk_lock:
            cluster.paused.clear()
            await wait_until(
                "the cut to be asked for",
                lambda: (
                    (follower := hosted.replica.follower) is not None
                    and follower.awaiting_truncation
                ),
            )
            elect_unclean(cluster, old_leader)
            assert cluster.status(old_leader).role == "leader"
            # The new leader takes writes while the compaction still runs: the dropped cut
            # does not keep its producer state waiting for the directory.
            writes = cluster.managers[old_leader].writes
            result = await writes.produce(TOPIC, 0, batch(3), 1, SHORT_PRODUCE_TIMEOUT_MS)
            assert result.error == ErrorCode.none and result.base_offset == TAIL_END, result
        await cluster.settle()
        # A leader's log is never cut for a follower state that no longer exists: it leads
        # with the log it had when it took over.
        assert cluster.status(old_leader).log_end_offset == TAIL_END + 3
        assert_leader_consistent(cluster, old_leader)
        await cluster.stop_all()


async def test_deleting_the_topic_while_its_log_is_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    held = HeldTruncation(monkeypatch)
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        old_leader = await diverge_old_leader(cluster)
        cluster.paused.clear()
        await wait_until("the cut to start in its thread", held.entered.is_set)
        try:
            reply = cluster.handle(DeleteTopics(names=(TOPIC,)))
            assert reply.results[0].error_code == ErrorCode.none, reply
            assert (TOPIC, 0) not in cluster.managers[old_leader].replicas.partitions
        finally:
            held.release.set()
        await cluster.settle()
        assert not topic_dirs(tmp_path, old_leader)
        await cluster.stop_all()
    # Removal closes the log under the cut: that is no failure worth an error line.
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


async def test_a_failed_cut_is_asked_for_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures = [OSError(errno.ENOSPC, "No space left on device")]
    truncate_to = PartitionLog.truncate_to

    def failing_truncate_to(plog: PartitionLog, offset: int) -> None:
        if failures:
            raise failures.pop()
        truncate_to(plog, offset)

    monkeypatch.setattr(PartitionLog, "truncate_to", failing_truncate_to)
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        old_leader = await diverge_old_leader(cluster)
        cluster.paused.clear()
        # The follower backs off, meets the divergence again and cuts: no wake-up is lost.
        await wait_until(
            "the old leader to truncate",
            lambda: cluster.status(old_leader).log_end_offset == ACKNOWLEDGED_END,
        )
        assert not failures
        await wait_until("the ISR to expand", lambda: len(cluster.partition().isr) == 3)
        result = await produce(cluster)
        assert result.error == ErrorCode.none and result.base_offset == ACKNOWLEDGED_END, result
        await wait_until("replicas in sync", cluster.in_sync)
        await cluster.stop_all()
