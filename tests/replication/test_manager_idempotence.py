"""ReplicaManager with idempotent producers: retries, sequence errors, leader changes,
truncation and restarts keep exactly one copy of every batch (three managers, no sockets)."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from raftlog.errors import ErrorCode
from raftlog.metadata.controller.messages import CreateTopics, NewTopic
from raftlog.records import Record, build_batch, iter_batches
from raftlog.replication.producer_state import list_snapshots, rebuild
from tests.replication.test_manager import (
    BROKERS,
    TOPIC,
    Cluster,
    cluster_config,
    followers,
    start_cluster,
)
from tests.waiting import wait_until

PID = 4242
# Followers stay in the ISR through a few seconds of a starved CPU: these tests are about
# producer state, and an ISR shrink would turn their acks=all answers into other errors.
CONFIG = cluster_config(replica_lag_time_max_ms=3_000)


def idempotent(seq: int, count: int = 2, *, epoch: int = 0, pid: int = PID) -> bytes:
    records = [Record(value=f"{pid}-{epoch}-{seq + i}".encode()) for i in range(count)]
    # CreateTime is wall-clock time: producers idle for a day by it expire.
    now_ms = time.time_ns() // 1_000_000
    return build_batch(
        records, producer_id=pid, producer_epoch=epoch, base_sequence=seq, now_ms=now_ms
    )


async def send(cluster: Cluster, data: bytes, acks: int = -1, leader: int | None = None):
    leader_id = cluster.leader_id if leader is None else leader
    return await cluster.managers[leader_id].writes.produce(TOPIC, 0, data, acks, 10_000)


def values(cluster: Cluster, broker_id: int) -> list[bytes]:
    data = cluster.log_bytes(broker_id)
    out = []
    for _, header in iter_batches(data):
        out.append((header.producer_id, header.base_sequence, header.base_offset))
    return out


def table_matches_log(cluster: Cluster, broker_id: int) -> bool:
    hosted = cluster.managers[broker_id].replicas.partitions[(TOPIC, 0)]
    if not hosted.producers.loaded:
        return False
    fresh = rebuild(hosted.log, hosted.log.directory / "no-such-dir")
    return fresh.as_tuple() == hosted.producers.table.as_tuple()


async def test_retries_are_answered_with_the_original_offsets(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        first = await send(cluster, idempotent(0))
        second = await send(cluster, idempotent(2))
        assert (first.error, first.base_offset) == (ErrorCode.none, 0)
        assert (second.error, second.base_offset) == (ErrorCode.none, 2)
        # A retry of either batch (the answer was lost) is not appended again.
        for acks in (-1, 1, 0):
            retry = await send(cluster, idempotent(0), acks=acks)
            assert (retry.error, retry.base_offset) == (ErrorCode.none, 0), acks
        retry = await send(cluster, idempotent(2))
        assert (retry.error, retry.base_offset) == (ErrorCode.none, 2)
        gap = await send(cluster, idempotent(7))
        assert gap.error == ErrorCode.out_of_order_sequence_number, gap
        bumped = await send(cluster, idempotent(0, epoch=1))
        assert (bumped.error, bumped.base_offset) == (ErrorCode.none, 4)
        fenced = await send(cluster, idempotent(4, epoch=0))
        assert fenced.error == ErrorCode.invalid_producer_epoch, fenced
        # An unknown producer id is accepted at any sequence (KIP-360).
        stranger = await send(cluster, idempotent(50, pid=7))
        assert (stranger.error, stranger.base_offset) == (ErrorCode.none, 6)
        await wait_until("replicas in sync", cluster.in_sync)
        expected = [(PID, 0, 0), (PID, 2, 2), (PID, 0, 4), (7, 50, 6)]
        for broker_id in BROKERS:
            assert values(cluster, broker_id) == expected, broker_id
            assert table_matches_log(cluster, broker_id), broker_id
        await cluster.stop_all()


async def test_new_leader_answers_retries_of_batches_it_replicated(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        assert (await send(cluster, idempotent(0))).base_offset == 0
        assert (await send(cluster, idempotent(2))).base_offset == 2
        await wait_until("replicas in sync", cluster.in_sync)
        old_leader = cluster.leader_id
        cluster.heartbeat(old_leader, want_fence=True)
        new_leader = cluster.leader_id
        assert new_leader != old_leader
        retry = await send(cluster, idempotent(2))
        assert (retry.error, retry.base_offset) == (ErrorCode.none, 2), retry
        follow_on = await send(cluster, idempotent(4))
        assert (follow_on.error, follow_on.base_offset) == (ErrorCode.none, 4)
        cluster.heartbeat(old_leader)
        await wait_until("the ISR to expand", lambda: len(cluster.partition().isr) == 3)
        await wait_until("replicas in sync", cluster.in_sync)
        for broker_id in BROKERS:
            assert [v[1] for v in values(cluster, broker_id)] == [0, 2, 4]
        await cluster.stop_all()


async def test_truncated_tail_leaves_no_producer_state_behind(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        assert (await send(cluster, idempotent(0))).error == ErrorCode.none
        await wait_until("replicas in sync", cluster.in_sync)
        old_leader = cluster.leader_id
        # Seq 2 reaches only the old leader (acks=1), which is then fenced.
        cluster.paused.update(followers(cluster))
        assert (await send(cluster, idempotent(2), acks=1)).base_offset == 2
        cluster.heartbeat(old_leader, want_fence=True)
        cluster.paused.clear()
        # The producer retries seq 2 at the new leader: it was never there, so it is appended.
        retry = await send(cluster, idempotent(2))
        assert (retry.error, retry.base_offset) == (ErrorCode.none, 2), retry
        assert (await send(cluster, idempotent(4, count=3))).base_offset == 4
        cluster.heartbeat(old_leader)
        await wait_until("the ISR to expand", lambda: len(cluster.partition().isr) == 3)
        await wait_until("replicas in sync", cluster.in_sync)
        expected = values(cluster, cluster.leader_id)
        for broker_id in BROKERS:
            assert values(cluster, broker_id) == expected
            await wait_until(
                f"broker {broker_id}'s table", lambda b=broker_id: table_matches_log(cluster, b)
            )
        entry = (
            cluster.managers[old_leader].replicas.partitions[(TOPIC, 0)].producers.table.get(PID)
        )
        assert entry is not None and entry.last_seq == 6
        await cluster.stop_all()


async def test_restart_recovers_producer_state_from_its_snapshot(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        for seq in (0, 2, 4):
            assert (await send(cluster, idempotent(seq))).error == ErrorCode.none
        await wait_until("replicas in sync", cluster.in_sync)
        leader_id = cluster.leader_id
        directory = tmp_path / f"broker-{leader_id}" / f"{TOPIC}-0"
        await cluster.stop(leader_id)
        assert [o for o, _ in list_snapshots(directory)] == [6]
        # Nothing fenced it (the in-test controller has no session timeout): it leads again.
        await cluster.start(leader_id)
        hosted = cluster.managers[leader_id].replicas.partitions[(TOPIC, 0)]
        await wait_until("the producer state to load", lambda: hosted.producers.loaded)
        assert hosted.producers.table.get(PID) is not None
        assert cluster.leader_id == leader_id
        retry = await send(cluster, idempotent(4), acks=1)
        assert (retry.error, retry.base_offset) == (ErrorCode.none, 4), retry
        assert cluster.status(leader_id).log_end_offset == 6
        await cluster.stop_all()


async def test_segment_rolls_snapshot_the_producer_state_on_every_replica(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        small = "small"
        reply = cluster.handle(
            CreateTopics((NewTopic(small, 1, 3, configs={"segment.bytes": "300"}),))
        )
        assert reply.results[0].error_code == ErrorCode.none
        await cluster.settle()
        leader_id = cluster.image.topic(small).partitions[0].leader  # type: ignore[union-attr]
        leader = cluster.managers[leader_id]
        for seq in range(0, 12, 2):
            result = await leader.writes.produce(small, 0, idempotent(seq), -1, 10_000)
            assert result.error == ErrorCode.none, result

        def snapshotted(broker_id: int) -> bool:
            hosted = cluster.managers[broker_id].replicas.partitions[(small, 0)]
            offsets = [o for o, _ in list_snapshots(hosted.log.directory)]
            return bool(offsets) and all(0 < o <= hosted.log.log_end_offset for o in offsets)

        for broker_id in BROKERS:
            await wait_until("a producer snapshot", lambda b=broker_id: snapshotted(b))
        await cluster.stop_all()
