"""ReplicaManager: batching per leader, long-poll wake-ups, retention under the HW, configs."""

from __future__ import annotations

from pathlib import Path

import trio

from raftlog.constants import EARLIEST_TIMESTAMP
from raftlog.errors import ErrorCode
from raftlog.metadata.controller.messages import CreateTopics, NewTopic
from tests.replication.test_manager import (
    BROKERS,
    TOPIC,
    cluster_config,
    followers,
    produce,
    start_cluster,
)
from tests.storage.helpers import batch
from tests.waiting import wait_until

WIDE = "wide"
WIDE_PARTITIONS = 6


async def test_one_fetcher_per_leader_batches_all_its_partitions(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        reply = cluster.handle(CreateTopics((NewTopic(WIDE, WIDE_PARTITIONS, 3),)))
        assert reply.results[0].error_code == ErrorCode.none
        await cluster.settle()
        topic = cluster.image.topic(WIDE)
        assert topic is not None
        leaders = {index: state.leader for index, state in topic.partitions.items()}
        for index, leader_id in leaders.items():
            manager = cluster.managers[leader_id]
            result = await manager.writes.produce(WIDE, index, batch(2), -1, 10_000)
            assert result.error == ErrorCode.none, (index, result)
        for broker_id in BROKERS:
            followed = {leaders[i] for i in leaders if leaders[i] != broker_id}
            fetchers = cluster.managers[broker_id].fetchers.fetchers
            # TOPIC-0 is followed too; its leader is one of the same brokers.
            assert set(fetchers) == followed | {cluster.leader_id} - {broker_id}
            for leader_id, fetcher in fetchers.items():
                expected = {(WIDE, i) for i in leaders if leaders[i] == leader_id}
                assert expected <= fetcher.keys
        # One request names every partition the follower has on that leader.
        per_pair = {}
        for source, leader_id, count in cluster.fetches:
            per_pair[(source, leader_id)] = max(per_pair.get((source, leader_id), 0), count)
        for (source, leader_id), count in per_pair.items():
            hosted = cluster.managers[source].fetchers.fetchers.get(leader_id)
            if hosted is not None:
                assert count == len(hosted.keys), (source, leader_id)
        await cluster.stop_all()


async def test_parked_replica_fetches_wake_on_new_data_not_on_a_timer(tmp_path: Path) -> None:
    # Followers park for up to a minute: only LEO/HW events can make acks=all fast.
    config = cluster_config(replica_fetch_wait_max_ms=60_000)
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=config)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        leader = cluster.managers[cluster.leader_id]
        hosted = leader.replicas.partitions[(TOPIC, 0)]
        await wait_until("both followers parked", lambda: len(hosted.waiters) == 2)
        with trio.fail_after(10):
            for i in range(3):
                result = await produce(cluster)
                assert result.error == ErrorCode.none and result.base_offset == 3 * i
            # Followers learn the new HW from a wake-up too, not after the minute.
            await wait_until("followers to learn the HW", cluster.in_sync, timeout_s=10)
        await cluster.stop_all()


async def test_retention_never_passes_the_high_watermark(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        reply = cluster.handle(
            CreateTopics(
                (
                    NewTopic(
                        "short",
                        1,
                        3,
                        configs={"segment.bytes": "200", "retention.ms": "1000"},
                    ),
                )
            )
        )
        assert reply.results[0].error_code == ErrorCode.none
        await cluster.settle()
        state = cluster.image.topic("short").partitions[0]  # type: ignore[union-attr]
        leader = cluster.managers[state.leader]
        for _ in range(4):  # old timestamps (ts 1000 ms): every closed segment is expired
            assert (
                await leader.writes.produce("short", 0, batch(2), -1, 10_000)
            ).error == ErrorCode.none
        for follower_id in [b for b in BROKERS if b != state.leader]:
            cluster.paused.add(follower_id)
        assert (
            await leader.writes.produce("short", 0, batch(2), 1, 10_000)
        ).error == ErrorCode.none
        status = leader.partition_states()[("short", 0)]
        assert (status.high_watermark, status.log_end_offset) == (8, 10)
        log = cluster.log_managers[state.leader].get("short", 0)
        assert log is not None and log.config.segment_bytes == 200  # topic config reached storage
        await leader.run_log_cleanup()
        status = leader.partition_states()[("short", 0)]
        assert 0 < status.log_start_offset <= status.high_watermark
        earliest = await leader.reads.list_offset("short", 0, EARLIEST_TIMESTAMP, -1)
        assert earliest.offset == status.log_start_offset
        gone = await leader.reads.fetch("short", 0, 0, 1024, -1)
        assert gone.error == ErrorCode.offset_out_of_range
        cluster.paused.clear()
        await cluster.stop_all()


async def test_stale_and_repeated_metadata_changes_nothing(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        assert (await produce(cluster)).error == ErrorCode.none
        before = {b: cluster.managers[b].partition_states() for b in BROKERS}
        stale_image, stale_delta = cluster.full_delta()
        cluster.paused.update(followers(cluster))
        # Bump the leader epoch, then replay the older full image: it must be refused.
        old_leader = cluster.leader_id
        cluster.heartbeat(old_leader, want_fence=True)
        after_fence = {b: cluster.managers[b].partition_states() for b in BROKERS}
        for broker_id in BROKERS:
            manager = cluster.managers[broker_id]
            manager.apply_metadata(stale_image, stale_delta)
            manager.apply_metadata(*cluster.full_delta())  # idempotent
            assert manager.partition_states() == after_fence[broker_id]
        assert after_fence[old_leader][(TOPIC, 0)].role == "follower"
        assert before[old_leader][(TOPIC, 0)].role == "leader"
        cluster.paused.clear()
        await cluster.stop_all()
