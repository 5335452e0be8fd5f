"""Replication throttles in the drivers, in one process (tests/replication/test_manager.py's
three managers): a follower that fell out of the ISR catches up no faster than the throttle
allows, on the leader side (serving.py) and on the follower side (fetcher.py), while the
in-sync follower and acks=all produces are not slowed."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from raftlog.errors import ErrorCode
from raftlog.metadata import records as r
from raftlog.replication.core.throttle import (
    FOLLOWER_THROTTLED_RATE,
    FOLLOWER_THROTTLED_REPLICAS,
    LEADER_THROTTLED_RATE,
    LEADER_THROTTLED_REPLICAS,
    THROTTLE_BURST_S,
)
from tests.replication.test_manager import (
    TOPIC,
    Cluster,
    cluster_config,
    followers,
    start_cluster,
)
from tests.storage.helpers import batch
from tests.waiting import wait_until

KIB = 1024
RATE_BYTES_PER_S = 128 * KIB
BACKLOG_BYTES = 384 * KIB
# A follower-side throttle can only hold fetches back (Kafka's way): each fetch it lets go
# brings up to this much, which the budget then pays back.
FETCH_MAX_BYTES = 32 * KIB


async def fill_backlog(cluster: Cluster) -> int:
    """Append BACKLOG_BYTES with acks=1; the leader's log end afterwards."""
    leader = cluster.managers[cluster.leader_id]
    written = 0
    while written < BACKLOG_BYTES:
        records = batch(16, value_bytes=1000)
        result = await leader.writes.produce(TOPIC, 0, records, 1, 10_000)
        assert result.error == ErrorCode.none, result
        written += len(records)
    return cluster.status(cluster.leader_id).log_end_offset


@pytest.mark.parametrize("side", ["leader", "follower"])
async def test_a_lagging_follower_catches_up_at_the_throttled_rate(
    tmp_path: Path, side: str
) -> None:
    async with trio.open_nursery() as nursery:
        config = cluster_config(replica_fetch_max_bytes=FETCH_MAX_BYTES)
        cluster = await start_cluster(tmp_path, nursery, min_isr=1, config=config)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        leader_id = cluster.leader_id
        lagging, in_sync = followers(cluster)
        cluster.paused.add(lagging)
        # A follower is out of sync once it has not caught up for the lag time: with nothing
        # new to fetch it never falls behind, so give it something to miss.
        leader = cluster.managers[leader_id]
        assert (await leader.writes.produce(TOPIC, 0, batch(1), 1, 10_000)).error == ErrorCode.none
        await wait_until(
            "the paused follower out of the ISR", lambda: lagging not in cluster.partition().isr
        )
        end_offset = await fill_backlog(cluster)
        throttled_broker = leader_id if side == "leader" else lagging
        rate_key = LEADER_THROTTLED_RATE if side == "leader" else FOLLOWER_THROTTLED_RATE
        list_key = LEADER_THROTTLED_REPLICAS if side == "leader" else FOLLOWER_THROTTLED_REPLICAS
        cluster.commit(
            (
                r.Config("broker", str(throttled_broker), rate_key, str(RATE_BYTES_PER_S)),
                # Both followers listed: only the one outside the ISR is throttled.
                r.Config("topic", TOPIC, list_key, f"0:{throttled_broker}"),
            )
        )
        await wait_until(
            "the in-sync follower has it all", lambda: cluster.in_sync((leader_id, in_sync))
        )
        started_s = trio.current_time()
        cluster.paused.discard(lagging)
        slowest_s = 0.0

        async def produce_all_along() -> None:
            # acks=all produces during the catch-up wait for the ISR only (the throttled
            # replica is not in it), so they are not slowed. The sleep paces the load.
            nonlocal slowest_s
            while True:
                before_s = trio.current_time()
                result = await cluster.managers[leader_id].writes.produce(
                    TOPIC, 0, batch(1), -1, 10_000
                )
                assert result.error == ErrorCode.none, result
                slowest_s = max(slowest_s, trio.current_time() - before_s)
                await trio.sleep(0.02)

        async with trio.open_nursery() as load:
            load.start_soon(produce_all_along)
            await wait_until(
                "the throttled follower caught up",
                lambda: cluster.status(lagging).log_end_offset >= end_offset,
                timeout_s=30,
            )
            load.cancel_scope.cancel()
        elapsed_s = trio.current_time() - started_s
        # One burst moves at once (and one fetch beyond it); the rest at the rate.
        burst_bytes = RATE_BYTES_PER_S * THROTTLE_BURST_S + FETCH_MAX_BYTES
        expected_s = (BACKLOG_BYTES - burst_bytes) / RATE_BYTES_PER_S
        # Throttled, not stalled: about the time the rate gives, with room for a busy machine.
        assert 0.8 * expected_s <= elapsed_s < 3 * expected_s + 2, (elapsed_s, expected_s)
        assert slowest_s < 0.8 * expected_s, slowest_s
        await wait_until("all in sync again", cluster.in_sync)
        await cluster.stop_all()
