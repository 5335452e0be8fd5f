"""ListOffsets MAX_TIMESTAMP (-3, KIP-734) through the leader's serving path (three managers,
real storage, no sockets): the offset of the record holding the largest timestamp, not its
batch's first offset, and nothing while that record is above the high watermark."""

from __future__ import annotations

from pathlib import Path

import trio

from raftlog.constants import MAX_TIMESTAMP
from raftlog.errors import ErrorCode
from raftlog.records import Record, build_batch
from tests.replication.test_manager import BROKERS, TOPIC, cluster_config, start_cluster
from tests.waiting import wait_until

ACKS_LEADER = 1
ACKS_ALL = -1
# Followers stay in the ISR while stopped, so the high watermark waits for them.
CONFIG = cluster_config(replica_lag_time_max_ms=60_000)


def batch(*timestamps_ms: int) -> bytes:
    return build_batch([Record(value=b"v", timestamp_ms=ts) for ts in timestamps_ms])


async def test_max_timestamp_is_the_exact_record_below_the_hw(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        leader_id = cluster.partition(TOPIC).leader
        leader = cluster.managers[leader_id]

        async def max_timestamp() -> tuple[ErrorCode, int, int]:
            got = await leader.reads.list_offset(TOPIC, 0, MAX_TIMESTAMP, -1)
            return got.error, got.offset, got.timestamp_ms

        assert await max_timestamp() == (ErrorCode.none, -1, -1)  # an empty log
        # 0081_admin's case: three records in one batch, the second holds the max.
        sent = await leader.writes.produce(TOPIC, 0, batch(1000, 3000, 2000), ACKS_ALL, 10_000)
        assert (sent.error, sent.base_offset) == (ErrorCode.none, 0)
        assert await max_timestamp() == (ErrorCode.none, 1, 3000)
        sent = await leader.writes.produce(TOPIC, 0, batch(500, 2999), ACKS_ALL, 10_000)
        assert await max_timestamp() == (ErrorCode.none, 1, 3000)

        # A larger timestamp the followers have not fetched is above the high watermark:
        # Kafka answers nothing (offset -1) until it is committed.
        followers = [b for b in BROKERS if b != leader_id]
        for broker_id in followers:
            await cluster.stop(broker_id)
        sent = await leader.writes.produce(TOPIC, 0, batch(10, 9000), ACKS_LEADER, 10_000)
        assert (sent.error, sent.base_offset) == (ErrorCode.none, 5)
        assert cluster.status(leader_id).high_watermark == 5
        assert await max_timestamp() == (ErrorCode.none, -1, -1)
        for broker_id in followers:
            await cluster.start(broker_id)
        await wait_until(
            "the high watermark past the new record",
            lambda: cluster.status(leader_id).high_watermark == 7,
        )
        assert await max_timestamp() == (ErrorCode.none, 6, 9000)
        await cluster.stop_all()
