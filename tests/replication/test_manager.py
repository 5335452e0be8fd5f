"""ReplicaManager end to end, in one process: three managers on real storage, no sockets.

send_fetch calls the target manager's handle_replica_fetch (bodies round-trip through msgpack,
as on the wire); alter_partition goes to a real sans-IO Controller whose records are applied to
an image that every running manager receives (a small in-test metadata bus). Tests wait for
conditions with deadlines; they never sleep for state.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

from raftlog.clock import wall_clock_ms
from raftlog.config import NodeConfig
from raftlog.constants import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from raftlog.errors import ErrorCode
from raftlog.metadata.controller.controller import Controller
from raftlog.metadata.controller.messages import (
    AlterPartition,
    AlterPartitionReply,
    BrokerHeartbeat,
    CreateTopics,
    DeleteTopics,
    NewTopic,
    RegisterBroker,
)
from raftlog.metadata.image import MetadataDelta, MetadataImage
from raftlog.records import iter_batches
from raftlog.replication.manager import ReplicaManager
from raftlog.storage import LogManager, PartitionLog
from tests.storage.helpers import batch
from tests.waiting import wait_until

TOPIC = "orders"
BROKERS = (1, 2, 3)


def cluster_config(**overrides: Any) -> NodeConfig:
    values: dict[str, Any] = {
        "replica_lag_time_max_ms": 300,
        "replica_fetch_wait_max_ms": 100,
        "request_timeout_ms": 20_000,
        "default_replication_factor": 3,
    }
    return NodeConfig(**{**values, **overrides})


def clock_ms() -> int:
    return int(trio.current_time() * 1000)


def _wire(value: Any) -> Any:
    """What the internal RPC would deliver: msgpack there and back (no pickle, no objects)."""
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False)


class Cluster:
    """Three brokers, a controller, and the plumbing between them."""

    def __init__(self, root: Path, nursery: trio.Nursery, config: NodeConfig | None = None) -> None:
        self.root = root
        self.nursery = nursery
        self.config = config or cluster_config()
        self.image = MetadataImage.empty("test-cluster")
        self.records: list[Any] = []
        self.offset = -1
        self.controller = Controller(self.image, self.config, 0)
        self.managers: dict[int, ReplicaManager] = {}
        self.log_managers: dict[int, LogManager] = {}
        self.broker_epochs: dict[int, int] = {}
        self.incarnations: dict[int, uuid.UUID] = {}
        self.paused: set[int] = set()  # brokers whose fetching fails as if the network were cut
        # (follower, leader, partitions named) of every replica fetch sent
        self.fetches: list[tuple[int, int, int]] = []
        self._stops: dict[int, tuple[trio.CancelScope, trio.Event]] = {}

    # ---------------------------------------------------------------- metadata bus
    def commit(self, records: tuple[Any, ...]) -> None:
        if not records:
            return
        self.records.extend(records)
        self.offset += len(records)
        self.image, delta = self.image.apply(records, self.offset)
        self.controller.committed(self.offset)
        for manager in list(self.managers.values()):
            manager.apply_metadata(self.image, delta)

    def handle(self, request: Any) -> Any:
        result = self.controller.handle(request, clock_ms())
        self.commit(result.records)
        return result.reply

    async def alter_partition(self, request: AlterPartition) -> AlterPartitionReply:
        await trio.lowlevel.checkpoint()  # a real RPC yields; so does this one
        return self.handle(request)

    def full_delta(self) -> tuple[MetadataImage, MetadataDelta]:
        if not self.records:
            return self.image, MetadataDelta()
        return MetadataImage.empty("test-cluster").apply(self.records, self.offset)

    # ---------------------------------------------------------------- network
    def send_fetch_from(self, source: int) -> Callable[[int, dict], Any]:
        async def send_fetch(leader_id: int, body: dict) -> dict:
            await trio.lowlevel.checkpoint()
            self.fetches.append((source, leader_id, len(body["partitions"])))
            target = self.managers.get(leader_id)
            if source in self.paused or target is None:
                raise ConnectionError(f"broker {source} cannot reach broker {leader_id}")
            reply = await target.reads.handle_replica_fetch(source, _wire(body))
            if source in self.paused:  # cut while the fetch was parked: the answer is lost
                raise ConnectionError(f"broker {source} lost the answer of broker {leader_id}")
            return _wire(reply)

        return send_fetch

    # ---------------------------------------------------------------- brokers
    def register_all(self) -> None:
        for broker_id in BROKERS:
            self.register(broker_id)
        for broker_id in BROKERS:
            self.heartbeat(broker_id)

    def register(self, broker_id: int) -> None:
        """A new incarnation of the broker registers (fenced until its first heartbeat)."""
        incarnation = self.incarnations[broker_id] = uuid.uuid4()
        reply = self.handle(
            RegisterBroker(broker_id, incarnation, "127.0.0.1", 9000 + broker_id, "127.0.0.1", 0)
        )
        assert reply.error_code == ErrorCode.none, reply
        self.broker_epochs[broker_id] = reply.broker_epoch

    def heartbeat(self, broker_id: int, *, want_fence: bool = False) -> None:
        reply = self.handle(
            BrokerHeartbeat(
                broker_id, self.broker_epochs[broker_id], self.offset, want_fence=want_fence
            )
        )
        assert reply.error_code == ErrorCode.none, reply

    async def settle(self) -> None:
        """Wait until every running manager has done the log work metadata asked for."""
        for manager in list(self.managers.values()):
            await manager.wait_log_work()

    async def start(
        self, broker_id: int, *, changes: list[tuple[MetadataImage, MetadataDelta]] | None = None
    ) -> ReplicaManager:
        """Start a broker's manager and give it the current image (or `changes`, in order)."""
        log_manager = LogManager(self.root / f"broker-{broker_id}", self.config)
        # Storage time is wall-clock ms, as the node passes it (segment.ms compares it).
        await log_manager.open_all_async(now_ms=wall_clock_ms())
        manager = ReplicaManager(
            broker_id,
            self.config,
            log_manager,
            log_manager.flusher,
            alter_partition=self.alter_partition,
            send_fetch=self.send_fetch_from(broker_id),
            clock_ms=clock_ms,
            incarnation_id=self.incarnations.get(broker_id),
        )
        stopped = trio.Event()

        async def run_node(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            try:
                with trio.CancelScope() as scope:
                    async with trio.open_nursery() as nursery:
                        await nursery.start(log_manager.flusher.run)
                        await nursery.start(manager.run)
                        task_status.started(scope)
            finally:
                stopped.set()

        scope = await self.nursery.start(run_node)
        self._stops[broker_id] = (scope, stopped)
        self.log_managers[broker_id] = log_manager
        self.managers[broker_id] = manager
        for image, delta in changes or [self.full_delta()]:
            manager.apply_metadata(image, delta)
        return manager

    async def stop(self, broker_id: int) -> None:
        manager = self.managers.pop(broker_id)
        await manager.shutdown()
        scope, stopped = self._stops.pop(broker_id)
        scope.cancel()
        await stopped.wait()
        self.log_managers.pop(broker_id).close_all()

    async def stop_all(self) -> None:
        for broker_id in list(self.managers):
            await self.stop(broker_id)

    # ---------------------------------------------------------------- views
    def partition(self, topic: str = TOPIC) -> Any:
        info = self.image.topic(topic)
        assert info is not None
        return info.partitions[0]

    @property
    def leader_id(self) -> int:
        return self.partition().leader

    def status(self, broker_id: int, topic: str = TOPIC) -> Any:
        return self.managers[broker_id].partition_states()[(topic, 0)]

    def log_bytes(self, broker_id: int, topic: str = TOPIC) -> bytes:
        partition_log = self.log_managers[broker_id].get(topic, 0)
        assert partition_log is not None
        return partition_log.read(0, 1 << 30).read_bytes()

    def in_sync(self, brokers: tuple[int, ...] = BROKERS, topic: str = TOPIC) -> bool:
        leader = self.status(self.leader_id, topic)
        return all(
            self.status(b, topic).log_end_offset == leader.log_end_offset
            and self.status(b, topic).high_watermark == leader.log_end_offset
            for b in brokers
        )


async def start_cluster(
    root: Path, nursery: trio.Nursery, min_isr: int = 2, config: NodeConfig | None = None
) -> Cluster:
    cluster = Cluster(root, nursery, config)
    cluster.register_all()
    for broker_id in BROKERS:
        await cluster.start(broker_id)
    reply = cluster.handle(
        CreateTopics((NewTopic(TOPIC, 1, 3, configs={"min.insync.replicas": str(min_isr)}),))
    )
    assert reply.results[0].error_code == ErrorCode.none, reply
    await cluster.settle()
    return cluster


def followers(cluster: Cluster) -> list[int]:
    return [b for b in BROKERS if b != cluster.leader_id]


async def produce(cluster: Cluster, acks: int = -1, count: int = 3, leader: int | None = None):
    leader_id = cluster.leader_id if leader is None else leader
    return await cluster.managers[leader_id].writes.produce(TOPIC, 0, batch(count), acks, 10_000)


def last_offsets(records: bytes) -> list[int]:
    return [header.last_offset for _, header in iter_batches(records)]


async def read_consumer(manager: ReplicaManager, offset: int = 0) -> tuple[Any, bytes]:
    result = await manager.reads.fetch(TOPIC, 0, offset, 1 << 20, -1)
    data = b"".join(trio_read(r) for r in result.records)
    return result, data


def trio_read(region: Any) -> bytes:
    return region.read_bytes() if hasattr(region, "read_bytes") else bytes(region)


# ==================================================================== tests
async def test_acks_all_replicates_and_consumers_stop_at_the_high_watermark(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        leader = cluster.managers[cluster.leader_id]
        event = leader.replicas.data_event(TOPIC, 0)
        for i in range(5):
            result = await produce(cluster)
            assert result.error == ErrorCode.none, result
            assert result.base_offset == 3 * i
            assert cluster.status(cluster.leader_id).high_watermark >= 3 * i + 3
        assert event.is_set()  # the HW advanced

        # A tail nobody else has: consumers must not see it.
        cluster.paused.update(followers(cluster))
        result = await produce(cluster, acks=1)
        assert result.error == ErrorCode.none and result.base_offset == 15
        status = cluster.status(cluster.leader_id)
        assert status.log_end_offset == 18 and status.high_watermark == 15
        fetched, data = await read_consumer(leader)
        assert fetched.error == ErrorCode.none and fetched.high_watermark == 15
        assert last_offsets(data) == [2, 5, 8, 11, 14]
        empty, _ = await read_consumer(leader, 15)
        assert empty.error == ErrorCode.none and not empty.records
        latest = await leader.reads.list_offset(TOPIC, 0, LATEST_TIMESTAMP, -1)
        earliest = await leader.reads.list_offset(TOPIC, 0, EARLIEST_TIMESTAMP, -1)
        assert (latest.offset, earliest.offset) == (15, 0)

        cluster.paused.clear()
        await wait_until("every replica at the leader's LEO and HW", cluster.in_sync)
        expected = cluster.log_bytes(cluster.leader_id)
        assert last_offsets(expected) == [2, 5, 8, 11, 14, 17]
        for broker_id in BROKERS:
            assert cluster.log_bytes(broker_id) == expected, broker_id

        epoch = cluster.partition().leader_epoch
        end = await leader.reads.offset_for_leader_epoch(TOPIC, 0, epoch, epoch)
        assert (end.leader_epoch, end.end_offset) == (epoch, 18)
        follower = cluster.managers[followers(cluster)[0]]
        refused = await follower.reads.fetch(TOPIC, 0, 0, 1024, -1)
        assert refused.error == ErrorCode.not_leader_or_follower
        assert refused.current_leader is not None
        assert refused.current_leader.leader_id == cluster.leader_id
        not_led = await follower.writes.produce(TOPIC, 0, batch(1), -1, 1000)
        assert not_led.error == ErrorCode.not_leader_or_follower
        ahead = await leader.reads.fetch(TOPIC, 0, 0, 1024, epoch + 1)
        assert ahead.error == ErrorCode.unknown_leader_epoch
        await cluster.stop_all()


async def test_a_later_produce_with_a_shorter_timeout_times_out_at_its_own_deadline(
    tmp_path: Path,
) -> None:
    """The purgatory's deadline loop sleeps until the earliest deadline it knows; a produce
    parked after it with an earlier deadline must wake it, or it would wait the longer one."""
    # Followers that stop fetching stay in the ISR for the whole test: the HW cannot move.
    config = cluster_config(replica_lag_time_max_ms=60_000)
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=config)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        assert (await produce(cluster)).error == ErrorCode.none
        cluster.paused.update(followers(cluster))
        leader = cluster.managers[cluster.leader_id]
        answers: dict[str, Any] = {}

        async def long_wait() -> None:
            answers["long"] = await leader.writes.produce(TOPIC, 0, batch(1), -1, 20_000)

        nursery.start_soon(long_wait)
        await wait_until(
            "the first produce parked",
            lambda: leader.replicas.purgatory.next_deadline_ms() is not None,
        )
        started_s = trio.current_time()
        with trio.fail_after(10):
            short = await leader.writes.produce(TOPIC, 0, batch(1), -1, 300)
        assert short.error == ErrorCode.request_timed_out, short
        assert trio.current_time() - started_s < 5
        assert "long" not in answers
        cluster.paused.clear()
        await wait_until("the first produce answered", lambda: "long" in answers, timeout_s=15)
        assert answers["long"].error == ErrorCode.none, answers["long"]
        nursery.cancel_scope.cancel()


async def test_isr_shrinks_and_expands_with_min_insync_replicas(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        assert (await produce(cluster)).error == ErrorCode.none
        leader_id = cluster.leader_id
        first, second = followers(cluster)

        # One follower stops fetching: acks=all waits until the ISR drops it, then succeeds.
        cluster.paused.add(first)
        result = await produce(cluster)
        assert result.error == ErrorCode.none, result
        assert cluster.status(leader_id).isr == tuple(sorted((leader_id, second)))
        assert set(cluster.partition().isr) == {leader_id, second}  # committed by the controller

        # The second one stops too: the append happened with ISR 2, the HW then needs a shrink.
        cluster.paused.add(second)
        result = await produce(cluster)
        assert result.error == ErrorCode.not_enough_replicas_after_append, result
        assert cluster.status(leader_id).isr == (leader_id,)
        result = await produce(cluster)
        assert result.error == ErrorCode.not_enough_replicas, result
        assert (await produce(cluster, acks=1)).error == ErrorCode.none

        cluster.paused.clear()
        await wait_until("the ISR to expand to three", lambda: len(cluster.partition().isr) == 3)
        assert (await produce(cluster)).error == ErrorCode.none
        await wait_until("replicas in sync", cluster.in_sync)
        expected = cluster.log_bytes(leader_id)
        assert all(cluster.log_bytes(b) == expected for b in BROKERS)
        await cluster.stop_all()


async def test_an_alter_partition_answer_that_no_longer_fits_is_ignored(tmp_path: Path) -> None:
    """The controller's answer names an ISR outside the leader's replicas, as when a
    reassignment's completion reached the leader before the answer to its ISR change did:
    logged and left to the metadata, never raised in the node's nursery."""
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        assert (await produce(cluster)).error == ErrorCode.none
        leader_id = cluster.leader_id
        first, _ = followers(cluster)
        real = cluster.alter_partition
        odd: list[AlterPartitionReply] = []

        async def answer_with_a_stranger(request: AlterPartition) -> AlterPartitionReply:
            reply = await real(request)
            if not odd and reply.error_code == ErrorCode.none:
                reply = dataclasses.replace(reply, isr=(*reply.isr, 99))
                odd.append(reply)
            return reply

        cluster.managers[leader_id].replicas._alter_partition = answer_with_a_stranger
        cluster.paused.add(first)  # the ISR shrinks: the first answer is the odd one
        await produce(cluster)
        await wait_until("the odd answer", lambda: bool(odd))
        cluster.paused.clear()
        # The node goes on: the metadata carries the shrink, and the ISR expands again.
        await wait_until("the ISR to expand to three", lambda: len(cluster.partition().isr) == 3)
        assert (await produce(cluster)).error == ErrorCode.none
        await wait_until("replicas in sync", cluster.in_sync)
        await cluster.stop_all()


async def test_leader_change_truncates_the_old_leaders_unreplicated_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Truncation is the driver's disk work: it must run in a worker thread, never on the loop.
    truncation_threads: list[bool] = []
    truncate_to = PartitionLog.truncate_to

    def recording_truncate_to(self: PartitionLog, offset: int) -> None:
        truncation_threads.append(threading.current_thread() is threading.main_thread())
        truncate_to(self, offset)

    monkeypatch.setattr(PartitionLog, "truncate_to", recording_truncate_to)
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        for _ in range(3):
            assert (await produce(cluster)).error == ErrorCode.none
        await wait_until("replicas in sync", cluster.in_sync)
        acknowledged = cluster.log_bytes(cluster.leader_id)
        old_leader = cluster.leader_id
        old_epoch = cluster.partition().leader_epoch

        # The leader appends a tail nobody fetches, then the controller fences it.
        cluster.paused.update(followers(cluster))
        assert (await produce(cluster, acks=1, count=5)).error == ErrorCode.none
        assert cluster.status(old_leader).log_end_offset == 14
        cluster.heartbeat(old_leader, want_fence=True)
        new_leader = cluster.leader_id
        assert new_leader != old_leader and cluster.partition().leader_epoch == old_epoch + 1
        assert cluster.status(old_leader).role == "follower"
        assert cluster.status(new_leader).role == "leader"
        # Every follower now fetches the partition from the new leader, and only from it.
        for broker_id in BROKERS:
            fetchers = cluster.managers[broker_id].fetchers
            expected = None if broker_id == new_leader else new_leader
            assert fetchers.leader_of((TOPIC, 0)) == expected
            assert old_leader not in fetchers.fetchers
        cluster.paused.clear()

        # The old leader rejoins: its tail diverges and is cut back to the acknowledged data.
        await wait_until(
            "the old leader to truncate", lambda: cluster.status(old_leader).log_end_offset == 9
        )
        cluster.heartbeat(old_leader)  # unfenced again, so it may re-enter the ISR
        await wait_until("the ISR to expand", lambda: len(cluster.partition().isr) == 3)
        result = await produce(cluster)
        assert result.error == ErrorCode.none and result.base_offset == 9
        await wait_until("replicas in sync", cluster.in_sync)
        final = cluster.log_bytes(new_leader)
        assert last_offsets(final) == [2, 5, 8, 11]
        # Acknowledged batches keep their bytes (offsets and epoch included) everywhere.
        assert final.startswith(acknowledged)
        assert all(cluster.log_bytes(b) == final for b in BROKERS)
        await cluster.stop_all()
    assert truncation_threads and not any(truncation_threads)


async def test_deleted_topic_removes_replicas_and_data(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        assert (await produce(cluster)).error == ErrorCode.none
        directories = [tmp_path / f"broker-{b}" / f"{TOPIC}-0" for b in BROKERS]
        assert all(d.is_dir() for d in directories)
        reply = cluster.handle(DeleteTopics(names=(TOPIC,)))
        assert reply.results[0].error_code == ErrorCode.none
        for broker_id in BROKERS:
            assert cluster.managers[broker_id].partition_states() == {}
            assert cluster.log_managers[broker_id].get(TOPIC, 0) is None
        await cluster.settle()
        assert not any(d.exists() for d in directories)
        assert not any(list(d.parent.glob("*-delete")) for d in directories)
        result = await cluster.managers[1].writes.produce(TOPIC, 0, batch(1), -1, 1000)
        assert result.error == ErrorCode.unknown_topic_or_partition
        await cluster.stop_all()


async def test_restarted_broker_starts_from_its_hw_checkpoint_and_catches_up(
    tmp_path: Path,
) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        for _ in range(2):
            assert (await produce(cluster)).error == ErrorCode.none
        await wait_until("replicas in sync", cluster.in_sync)
        leader_id = cluster.leader_id
        restarted = followers(cluster)[0]
        await cluster.stop(restarted)

        # Writes go on while it is away (the ISR drops it after the lag time).
        for _ in range(3):
            assert (await produce(cluster)).error == ErrorCode.none
        assert cluster.status(leader_id).high_watermark == 15

        cluster.paused.add(restarted)  # hold its fetching to look at the recovered state
        await cluster.start(restarted)
        recovered = cluster.status(restarted)
        assert recovered.role == "follower"
        assert (recovered.log_end_offset, recovered.high_watermark) == (6, 6)
        cluster.paused.clear()
        await wait_until("the restarted broker to catch up", cluster.in_sync)
        await wait_until("the ISR to expand", lambda: len(cluster.partition().isr) == 3)
        expected = cluster.log_bytes(leader_id)
        assert cluster.log_bytes(restarted) == expected
        await cluster.stop_all()


@pytest.mark.parametrize("acks", [0, 1])
async def test_acks_zero_and_one_answer_after_the_local_append(tmp_path: Path, acks: int) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        leader_id = cluster.leader_id
        cluster.paused.update(followers(cluster))
        result = await produce(cluster, acks=acks)
        assert result.error == ErrorCode.none and result.base_offset == 0
        leader_log = cluster.log_managers[leader_id].get(TOPIC, 0)
        assert leader_log is not None
        if acks == 1:  # flush_policy=always: acks=1 means on the leader's disk
            assert leader_log.flushed_offset >= 3
        bad = await cluster.managers[leader_id].writes.produce(TOPIC, 0, b"\x00" * 70, acks, 1000)
        assert bad.error == ErrorCode.corrupt_message
        cluster.paused.clear()
        await wait_until("replicas in sync", cluster.in_sync)
        await cluster.stop_all()
