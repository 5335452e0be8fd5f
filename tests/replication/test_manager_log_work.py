"""Metadata-driven disk work of the ReplicaManager: never on the event loop, ordered per
partition, and stray logs removed only once the broker is caught up. Real directories, three
managers in one process (the Cluster of test_manager.py)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import trio

from raftlog.errors import ErrorCode
from raftlog.metadata.controller.messages import CreateTopics, DeleteTopics, NewTopic
from raftlog.storage import LogManager
from raftlog.storage.log_dirs import read_topic_id
from tests.replication.test_manager import BROKERS, TOPIC, Cluster, start_cluster
from tests.storage.helpers import batch
from tests.waiting import wait_until

WIDE = "wide"
WIDE_PARTITIONS = 100
# Scheduling latency the event loop may show while a wide topic's logs are deleted. Generous:
# the machine is shared; deleting the logs on the loop stalls it for far longer (see below).
MAX_LOOP_STALL_S = 0.5
PROBE_INTERVAL_S = 0.002


def create(cluster: Cluster, *topics: NewTopic) -> None:
    reply = cluster.handle(CreateTopics(tuple(topics)))
    assert all(r.error_code == ErrorCode.none for r in reply.results), reply


def delete(cluster: Cluster, *names: str) -> None:
    reply = cluster.handle(DeleteTopics(names=tuple(names)))
    assert all(r.error_code == ErrorCode.none for r in reply.results), reply


def leftovers(root: Path) -> list[str]:
    """Directories renamed for removal that are still there."""
    return sorted(p.name for p in root.glob("broker-*/*") if p.name.endswith(("-delete", "-stray")))


def topic_dirs(root: Path, topic: str) -> list[Path]:
    return sorted(root.glob(f"broker-*/{topic}-*"))


class LoopProbe:
    """Measures how late the event loop wakes a task that sleeps PROBE_INTERVAL_S at a time."""

    def __init__(self) -> None:
        self.max_late_s = 0.0
        self.rounds = 0

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            before = time.perf_counter()
            await trio.sleep(PROBE_INTERVAL_S)  # a measurement, not a wait for state
            late_s = time.perf_counter() - before - PROBE_INTERVAL_S
            self.max_late_s = max(self.max_late_s, late_s)
            self.rounds += 1


@pytest.mark.usefixtures("no_cyclic_gc")
async def test_deleting_a_wide_topic_never_stalls_the_event_loop(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        create(cluster, NewTopic(WIDE, WIDE_PARTITIONS, 3))
        probe = LoopProbe()
        async with trio.open_nursery() as probing:
            await probing.start(probe.run)
            await cluster.settle()  # creation happens in worker threads too
            for index in range(0, WIDE_PARTITIONS, 7):
                leader = cluster.image.topic(WIDE).partitions[index].leader  # type: ignore[union-attr]
                result = await cluster.managers[leader].writes.produce(
                    WIDE, index, batch(3), 1, 10_000
                )
                assert result.error == ErrorCode.none, result
            directories = topic_dirs(tmp_path, WIDE)
            assert len(directories) == 3 * WIDE_PARTITIONS
            created_late_s, probe.max_late_s = probe.max_late_s, 0.0
            rounds = probe.rounds

            delete(cluster, WIDE)  # every broker applies the delta here, on the loop
            for manager in cluster.managers.values():
                assert not any(key[0] == WIDE for key in manager.partition_states())
            await cluster.settle()
            probing.cancel_scope.cancel()
        assert probe.rounds > rounds  # the probe ran while the logs went
        assert not any(d.exists() for d in directories)
        assert leftovers(tmp_path) == []
        assert created_late_s < MAX_LOOP_STALL_S, created_late_s
        assert probe.max_late_s < MAX_LOOP_STALL_S, probe.max_late_s
        await cluster.stop_all()


async def test_delete_and_recreate_of_one_name_run_in_order(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        leader = cluster.managers[cluster.leader_id]
        assert (await leader.writes.produce(TOPIC, 0, batch(5), -1, 10_000)).error == ErrorCode.none
        old_id = cluster.image.topic(TOPIC).topic_id  # type: ignore[union-attr]
        # Delete, re-create, delete and re-create again without a pause: every manager
        # queues the four jobs for "orders-0" and runs them in order.
        delete(cluster, TOPIC)
        create(cluster, NewTopic(TOPIC, 1, 3))
        delete(cluster, TOPIC)
        create(cluster, NewTopic(TOPIC, 1, 3))
        new_id = cluster.image.topic(TOPIC).topic_id  # type: ignore[union-attr]
        assert new_id != old_id
        await cluster.settle()
        for broker_id in BROKERS:
            status = cluster.status(broker_id)
            assert status.log_end_offset == 0, status  # nothing of the old topic survived
            directory = tmp_path / f"broker-{broker_id}" / f"{TOPIC}-0"
            assert read_topic_id(directory) == new_id
            assert cluster.managers[broker_id].replicas.partitions[(TOPIC, 0)].topic_id == new_id
        assert leftovers(tmp_path) == []
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        result = await cluster.managers[cluster.leader_id].writes.produce(
            TOPIC, 0, batch(2), -1, 10_000
        )
        assert result.error == ErrorCode.none and result.base_offset == 0, result
        await cluster.stop_all()


async def test_stray_logs_go_only_once_the_restarted_broker_is_caught_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raftlog.replication")
    restarted = 3
    root = tmp_path / f"broker-{restarted}"
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        create(
            cluster,
            NewTopic("kept", assignments={0: BROKERS}),
            NewTopic("gone", assignments={0: BROKERS}),
            NewTopic("elsewhere", assignments={0: (1, 2), 1: (1, 2)}),
        )
        await cluster.settle()
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        leader = cluster.managers[cluster.leader_id]
        assert (await leader.writes.produce(TOPIC, 0, batch(3), -1, 10_000)).error == ErrorCode.none
        await wait_until("replicas in sync", lambda: cluster.in_sync())
        old_orders_id = cluster.image.topic(TOPIC).topic_id  # type: ignore[union-attr]

        # The broker goes away; while it is down "gone" is deleted, "orders" deleted and
        # re-created under a new id, and (as if reassigned away) it keeps a log of
        # "elsewhere-1", a partition the metadata gives to brokers 1 and 2 only.
        await cluster.stop(restarted)
        cluster.heartbeat(restarted, want_fence=True)
        stale = cluster.full_delta()
        delete(cluster, "gone", TOPIC)
        create(cluster, NewTopic(TOPIC, assignments={0: BROKERS}))
        elsewhere_id = cluster.image.topic("elsewhere").topic_id  # type: ignore[union-attr]
        offline = LogManager(root, cluster.config)
        offline.open_all(now_ms=0)
        away = offline.get_or_create("elsewhere", 1, topic_id=elsewhere_id, now_ms=0)
        away.append_as_leader(batch(2), leader_epoch=0, now_ms=0)
        offline.close_all()
        for name in ("gone-0", "elsewhere-1", "kept-0", f"{TOPIC}-0"):
            assert (root / name).is_dir(), name

        # A new incarnation registers (fenced) and starts with the image it had on disk,
        # which still shows its old incarnation unfenced, then jumps to the present through a
        # snapshot (a full image: no "deleted" entries for what it skipped).
        cluster.register(restarted)
        manager = await cluster.start(restarted, changes=[stale, cluster.full_delta()])
        await cluster.settle()
        assert not manager.assignment.strays_checked
        assert (root / "gone-0").is_dir() and (root / "elsewhere-1").is_dir()
        # The re-created topic does not reuse the old log: its id says it is another topic.
        assert read_topic_id(root / f"{TOPIC}-0") != old_orders_id
        assert manager.partition_states()[(TOPIC, 0)].log_end_offset == 0

        # The controller unfences the incarnation once it reports the committed offset.
        cluster.heartbeat(restarted)
        assert manager.assignment.strays_checked
        await cluster.settle()
        assert not (root / "gone-0").exists()
        assert not (root / "elsewhere-1").exists()
        assert (root / "kept-0").is_dir() and (root / f"{TOPIC}-0").is_dir()
        assert ("kept", 0) in manager.replicas.partitions
        assert leftovers(tmp_path) == []
        strays = [r.getMessage() for r in caplog.records if "stray log" in r.getMessage()]
        assert len(strays) == 2, strays
        assert any("gone-0" in m and "not in the metadata" in m for m in strays), strays
        assert any("elsewhere-1" in m and "not one of its replicas" in m for m in strays), strays
        await cluster.stop_all()


async def test_without_an_incarnation_stray_logs_are_never_touched(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await cluster.stop(3)
        delete(cluster, TOPIC)
        cluster.incarnations.pop(3)  # a manager that cannot know when it is caught up
        manager = await cluster.start(3)
        cluster.heartbeat(3)
        await cluster.settle()
        assert not manager.assignment.strays_checked
        assert (tmp_path / "broker-3" / f"{TOPIC}-0").is_dir()
        await cluster.stop_all()


async def test_a_log_of_another_topic_id_is_held_until_the_broker_is_caught_up(
    tmp_path: Path,
) -> None:
    restarted = 3
    root = tmp_path / f"broker-{restarted}"
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        leader = cluster.managers[cluster.leader_id]
        assert (await leader.writes.produce(TOPIC, 0, batch(3), -1, 10_000)).error == ErrorCode.none
        await wait_until("replicas in sync", lambda: cluster.in_sync())
        old_id = cluster.image.topic(TOPIC).topic_id  # type: ignore[union-attr]
        await cluster.stop(restarted)
        cluster.heartbeat(restarted, want_fence=True)
        delete(cluster, TOPIC)
        create(cluster, NewTopic(TOPIC, assignments={0: BROKERS}))
        new_id = cluster.image.topic(TOPIC).topic_id  # type: ignore[union-attr]

        # Its first image already names the new topic, but the broker cannot know yet that
        # the image is not the stale one: the old log stays, untouched and unhosted.
        cluster.register(restarted)
        manager = await cluster.start(restarted)
        await cluster.settle()
        assert (TOPIC, 0) not in manager.replicas.partitions
        assert read_topic_id(root / f"{TOPIC}-0") == old_id
        assert manager.log_manager.get(TOPIC, 0) is not None

        cluster.heartbeat(restarted)  # unfenced: caught up
        await cluster.settle()
        assert read_topic_id(root / f"{TOPIC}-0") == new_id
        assert manager.replicas.partitions[(TOPIC, 0)].topic_id == new_id
        assert manager.partition_states()[(TOPIC, 0)].log_end_offset == 0
        assert leftovers(tmp_path) == []
        await cluster.stop_all()
