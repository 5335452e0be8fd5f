"""The leader's produce path refuses batches that pass the CRC but are not valid, and appends
nothing of the refused partition data: three ReplicaManagers on real storage, as in
test_manager.py, attacked with forged batches."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import pytest
import trio

from raftlog.errors import ErrorCode
from raftlog.groups.node_service import NodeGroupService
from raftlog.groups.offsets_format import (
    CommittedOffset,
    OffsetKey,
    group_tombstone,
    offset_commit_record,
)
from raftlog.groups.settings import OFFSETS_TOPIC
from raftlog.metadata.controller.messages import CreateTopics, NewTopic
from raftlog.records import Compression, Record, build_batch, iter_all_records, make_attributes
from tests.replication.test_manager import (
    TOPIC,
    Cluster,
    clock_ms,
    followers,
    read_consumer,
    start_cluster,
)
from tests.test_batch_validation import forge, record, three_records
from tests.waiting import wait_until

GOOD = build_batch([Record(key=b"k%d" % i, value=b"v%d" % i) for i in range(3)])

BAD: dict[str, tuple[bytes, ErrorCode]] = {
    "recordCount 1,000,000 holding 3 records": (
        forge(three_records(), 1_000_000),
        ErrorCode.invalid_record,
    ),
    "recordCount 2^31-1 holding 3 records": (
        forge(three_records(), 2**31 - 1),
        ErrorCode.invalid_record,
    ),
    "random record bytes with a good CRC": (
        forge(bytes(range(7, 250)), 3),
        ErrorCode.invalid_record,
    ),
    "undecodable gzip with a good CRC": (
        forge(b"\x1f\x8b" + b"garbage" * 9, 3, attributes=make_attributes(Compression.GZIP)),
        ErrorCode.corrupt_message,
    ),
    "undecodable zstd with a good CRC": (
        forge(b"\x28\xb5\x2f\xfd" + b"junk" * 9, 3, attributes=make_attributes(Compression.ZSTD)),
        ErrorCode.corrupt_message,
    ),
    "offset deltas out of order": (
        forge(record(0) + record(2) + record(1), 3),
        ErrorCode.invalid_record,
    ),
    "a good batch followed by a lying one": (
        GOOD + forge(three_records(), 1_000_000),
        ErrorCode.invalid_record,
    ),
    "control batch": (
        forge(three_records(), 3, attributes=make_attributes(is_control=True)),
        ErrorCode.invalid_record,
    ),
    "idempotent batch without a sequence": (
        forge(three_records(), 3, producer_id=4, producer_epoch=0, base_sequence=-1),
        ErrorCode.invalid_record,
    ),
}


def leader_end(cluster: Cluster, topic: str = TOPIC) -> int:
    partition_log = cluster.log_managers[cluster.leader_id].get(topic, 0)
    assert partition_log is not None
    return partition_log.log_end_offset


@pytest.mark.parametrize("acks", [-1, 1, 0])
async def test_invalid_batches_are_refused_and_nothing_is_appended(
    tmp_path: Path, acks: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "raftlog.replication.produce")
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        writes = cluster.managers[cluster.leader_id].writes
        for what, (bad, code) in BAD.items():
            result = await writes.produce(TOPIC, 0, bad, acks, 5_000)
            assert result.error == code, (what, result)
            assert leader_end(cluster) == 0, f"{what}: appended"
            assert result.error_message, what
        # One line for the first refusal; the rest within the interval are counted in the next.
        lines = [r.getMessage() for r in caplog.records if "refused produce" in r.getMessage()]
        assert len(lines) == 1 and "recordCount 1000000" in lines[0], lines
        # The partition is intact: the next good batch is offset 0, replicated, readable.
        result = await writes.produce(TOPIC, 0, GOOD, -1, 10_000)
        assert (result.error, result.base_offset) == (ErrorCode.none, 0)
        await wait_until("replicas in sync", cluster.in_sync)
        for broker in followers(cluster):
            assert cluster.log_bytes(broker) == cluster.log_bytes(cluster.leader_id)
        _, data = await read_consumer(cluster.managers[cluster.leader_id])
        assert [(r.offset, r.value) for r in iter_all_records(data)] == [
            (0, b"v0"),
            (1, b"v1"),
            (2, b"v2"),
        ]
        await cluster.stop_all()


async def test_a_compacted_topic_refuses_records_without_keys(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        reply = cluster.handle(
            CreateTopics((NewTopic("table", 1, 3, configs={"cleanup.policy": "compact"}),))
        )
        assert reply.results[0].error_code == ErrorCode.none
        await cluster.settle()
        await wait_until("a leader", lambda: cluster.partition("table").leader > 0)
        writes = cluster.managers[cluster.partition("table").leader].writes
        keyless = build_batch([Record(key=b"a", value=b"1"), Record(key=None, value=b"2")])
        result = await writes.produce("table", 0, keyless, -1, 5_000)
        assert result.error == ErrorCode.invalid_record
        keyed = build_batch([Record(key=b"a", value=b"1"), Record(key=b"b", value=None)])
        result = await writes.produce("table", 0, keyed, -1, 10_000)
        assert (result.error, result.base_offset) == (ErrorCode.none, 0)
        await cluster.stop_all()


async def test_the_group_coordinators_own_appends_still_pass(tmp_path: Path) -> None:
    """The coordinator writes __consumer_offsets through the replication layer's produce path
    (not the Kafka Produce handler that refuses clients there); its batches validate."""
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        reply = cluster.handle(
            CreateTopics((NewTopic(OFFSETS_TOPIC, 1, 3, configs={"cleanup.policy": "compact"}),))
        )
        assert reply.results[0].error_code == ErrorCode.none
        await cluster.settle()
        await wait_until("a leader", lambda: cluster.partition(OFFSETS_TOPIC).leader > 0)
        leader_id = cluster.partition(OFFSETS_TOPIC).leader
        leader = cluster.managers[leader_id]
        service = NodeGroupService(
            cluster.config, cast(Any, None), cast(Any, None), leader, clock_ms
        )
        commit = offset_commit_record(OffsetKey("g", "t", 0), CommittedOffset(5, -1, "", 1))
        await service._append(0, [commit, group_tombstone("g")])
        partition_log = cluster.log_managers[leader_id].get(OFFSETS_TOPIC, 0)
        assert partition_log is not None and partition_log.log_end_offset == 2
        await cluster.stop_all()
