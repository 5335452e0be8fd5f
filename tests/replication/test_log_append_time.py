"""message.timestamp.type=LogAppendTime through the leader's produce path (three managers, real
storage, no sockets): the leader stamps each batch header with its append time, followers
store the leader's bytes unchanged, and the time index and ListOffsets see the append time."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from raftlog.clock import wall_clock_ms
from raftlog.errors import ConfigError, ErrorCode
from raftlog.metadata.controller.messages import (
    AlterConfigs,
    AlterConfigsResource,
    CreateTopics,
    NewTopic,
)
from raftlog.records import (
    HEADER_SIZE_BYTES,
    NO_TIMESTAMP,
    Record,
    TimestampType,
    build_batch,
    iter_all_records,
    iter_batches,
)
from raftlog.storage.config import LogConfig
from tests.replication.test_manager import (
    BROKERS,
    TOPIC,
    Cluster,
    cluster_config,
    start_cluster,
)
from tests.waiting import wait_until

STAMPED = "stamped"
OLD_CREATE_TIME_MS = 1_000_000
# Every batch gets a time-index entry, so the index itself can be checked.
CONFIG = cluster_config(replica_lag_time_max_ms=3_000, index_interval_bytes=0)


def old_batch(count: int = 3, *, pid: int = -1, seq: int = -1) -> bytes:
    records = [Record(value=b"v%d" % i, timestamp_ms=OLD_CREATE_TIME_MS + i) for i in range(count)]
    return build_batch(
        records, producer_id=pid, producer_epoch=0 if pid >= 0 else -1, base_sequence=seq
    )


async def create_stamped_topic(cluster: Cluster) -> None:
    configs = {"min.insync.replicas": "2", "message.timestamp.type": "LogAppendTime"}
    reply = cluster.handle(CreateTopics((NewTopic(STAMPED, 1, 3, configs=configs),)))
    assert reply.results[0].error_code == ErrorCode.none, reply
    await cluster.settle()
    await wait_until("a leader", lambda: cluster.partition(STAMPED).leader in cluster.managers)


def leader_of(cluster: Cluster, topic: str) -> int:
    return cluster.partition(topic).leader


async def send(cluster: Cluster, topic: str, data: bytes):
    manager = cluster.managers[leader_of(cluster, topic)]
    return await manager.writes.produce(topic, 0, data, -1, 10_000)


def headers(cluster: Cluster, broker_id: int, topic: str) -> list:
    return [h for _, h in iter_batches(cluster.log_bytes(broker_id, topic))]


def all_in_sync(cluster: Cluster, topic: str) -> bool:
    leader = cluster.status(leader_of(cluster, topic), topic)
    return all(
        cluster.status(b, topic).log_end_offset == leader.log_end_offset
        and cluster.status(b, topic).high_watermark == leader.log_end_offset
        for b in BROKERS
    )


async def test_leader_stamps_append_time_and_followers_keep_its_bytes(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        await create_stamped_topic(cluster)
        leader = cluster.managers[leader_of(cluster, STAMPED)]
        # A controlled wall clock: two appends ten seconds apart, whatever the machine does.
        first_ms = wall_clock_ms()
        second_ms = first_ms + 10_000
        sent = old_batch()
        leader.replicas.wall_clock_ms = lambda: first_ms
        first = await send(cluster, STAMPED, sent)
        leader.replicas.wall_clock_ms = lambda: second_ms
        second = await send(cluster, STAMPED, old_batch(2))
        assert (first.error, first.base_offset, first.log_append_time_ms) == (
            ErrorCode.none,
            0,
            first_ms,
        )
        assert (second.error, second.base_offset, second.log_append_time_ms) == (
            ErrorCode.none,
            3,
            second_ms,
        )

        await wait_until("replicas in sync", lambda: all_in_sync(cluster, STAMPED))
        stored = cluster.log_bytes(leader_of(cluster, STAMPED), STAMPED)
        for broker_id in BROKERS:
            assert cluster.log_bytes(broker_id, STAMPED) == stored, broker_id
        stamped = headers(cluster, leader_of(cluster, STAMPED), STAMPED)
        assert [(h.timestamp_type, h.max_timestamp_ms) for h in stamped] == [
            (TimestampType.LOG_APPEND_TIME, first_ms),
            (TimestampType.LOG_APPEND_TIME, second_ms),
        ]
        # Records themselves are the producer's bytes; readers see the append time.
        first_size = stamped[0].size_bytes
        assert stored[HEADER_SIZE_BYTES:first_size] == sent[HEADER_SIZE_BYTES:]
        assert [r.timestamp_ms for r in iter_all_records(stored)] == [first_ms] * 3 + [
            second_ms
        ] * 2

        # The time index (leader's and followers' alike) holds append times, not create times.
        for broker_id in BROKERS:
            plog = cluster.log_managers[broker_id].get(STAMPED, 0)
            assert plog is not None
            assert plog.active_segment.time_index.max_timestamp() == second_ms, broker_id
        by_time = [
            (await leader.reads.list_offset(STAMPED, 0, ts, -1)).offset
            for ts in (OLD_CREATE_TIME_MS, first_ms, first_ms + 1, second_ms, second_ms + 1)
        ]
        assert by_time == [0, 0, 3, 3, -1]
        found = await leader.reads.list_offset(STAMPED, 0, first_ms + 1, -1)
        assert found.timestamp_ms == second_ms

        # The topic next door keeps CreateTime: no stamp, no log_append_time in the answer.
        plain = await send(cluster, TOPIC, old_batch())
        assert (plain.error, plain.log_append_time_ms) == (ErrorCode.none, NO_TIMESTAMP)
        await wait_until("replicas of the plain topic", lambda: all_in_sync(cluster, TOPIC))
        [plain_header] = headers(cluster, leader_of(cluster, TOPIC), TOPIC)
        assert plain_header.timestamp_type == TimestampType.CREATE_TIME
        assert plain_header.max_timestamp_ms == OLD_CREATE_TIME_MS + 2
        await cluster.stop_all()


async def test_a_retried_batch_is_answered_with_its_original_append_time(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        await create_stamped_topic(cluster)
        leader = cluster.managers[leader_of(cluster, STAMPED)]
        original_ms = wall_clock_ms()
        leader.replicas.wall_clock_ms = lambda: original_ms
        first = await send(cluster, STAMPED, old_batch(pid=77, seq=0))
        assert (first.error, first.log_append_time_ms) == (ErrorCode.none, original_ms)
        leader.replicas.wall_clock_ms = lambda: original_ms + 5_000
        retry = await send(cluster, STAMPED, old_batch(pid=77, seq=0))
        assert (retry.error, retry.base_offset, retry.log_append_time_ms) == (
            ErrorCode.none,
            0,
            original_ms,
        )
        [header] = headers(cluster, leader_of(cluster, STAMPED), STAMPED)
        assert (header.producer_id, header.producer_epoch, header.base_sequence) == (77, 0, 0)
        assert header.max_timestamp_ms == original_ms
        await cluster.stop_all()


async def test_altered_timestamp_type_reaches_every_replica_and_a_new_leader(
    tmp_path: Path,
) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        before = await send(cluster, TOPIC, old_batch())
        assert before.log_append_time_ms == NO_TIMESTAMP
        reply = cluster.handle(
            AlterConfigs(
                (
                    AlterConfigsResource(
                        "topic",
                        TOPIC,
                        {"min.insync.replicas": "2", "message.timestamp.type": "LogAppendTime"},
                    ),
                )
            )
        )
        assert reply.results[0].error_code == ErrorCode.none, reply
        for broker_id in BROKERS:
            plog = cluster.log_managers[broker_id].get(TOPIC, 0)
            assert plog is not None and plog.config.message_timestamp_type == "LogAppendTime"
        after = await send(cluster, TOPIC, old_batch())
        assert after.error == ErrorCode.none and after.log_append_time_ms >= 0
        await wait_until("replicas in sync", cluster.in_sync)

        # The follower that takes over stamps too: it had the topic config all along.
        old_leader = cluster.leader_id
        cluster.heartbeat(old_leader, want_fence=True)
        assert cluster.leader_id != old_leader
        await wait_until("a new leader", lambda: cluster.leader_id in cluster.managers)
        taken_over = await send(cluster, TOPIC, old_batch())
        assert taken_over.error == ErrorCode.none, taken_over
        assert taken_over.log_append_time_ms >= after.log_append_time_ms
        stamped = headers(cluster, cluster.leader_id, TOPIC)
        assert [h.timestamp_type for h in stamped] == [
            TimestampType.CREATE_TIME,
            TimestampType.LOG_APPEND_TIME,
            TimestampType.LOG_APPEND_TIME,
        ]
        assert [h.max_timestamp_ms for h in stamped] == [
            OLD_CREATE_TIME_MS + 2,
            after.log_append_time_ms,
            taken_over.log_append_time_ms,
        ]
        await cluster.stop_all()


def test_log_config_parses_the_timestamp_type_and_names_a_bad_one() -> None:
    node = cluster_config()
    assert LogConfig.from_node_config(node).message_timestamp_type == "CreateTime"
    parsed = LogConfig.from_node_config(node, {"message.timestamp.type": " LogAppendTime "})
    assert parsed.message_timestamp_type == "LogAppendTime"
    with pytest.raises(ConfigError, match=r"message\.timestamp\.type: .* is not one of"):
        LogConfig.from_node_config(node, {"message.timestamp.type": "WallClock"})
