"""Damaged bytes at a replica, in three managers on real storage: a fetch answer damaged on
the way, a committed batch damaged on a follower's disk (the scrubber), a full disk."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio

from raftlog.errors import ErrorCode
from tests.replication.test_manager import followers, produce, start_cluster
from tests.waiting import wait_until


async def test_follower_refuses_a_damaged_fetch_answer_and_fetches_it_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "raftlog.replication")
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, min_isr=1)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        victim = followers(cluster)[0]
        pool = cluster.managers[victim].fetchers
        honest = pool.send_fetch
        damaged = 0

        async def flip_a_byte(leader_id: int, body: dict) -> dict:
            nonlocal damaged
            reply: dict[str, Any] = await honest(leader_id, body)
            for part in reply["partitions"]:
                if part["records"] and damaged < 3:
                    records = bytearray(part["records"])
                    records[-3] ^= 0x01
                    part["records"] = bytes(records)
                    damaged += 1
            return reply

        pool.send_fetch = flip_a_byte
        assert (await produce(cluster, acks=1)).error == ErrorCode.none
        await wait_until("three damaged answers", lambda: damaged >= 3)
        await wait_until("the follower to catch up", cluster.in_sync)
        assert cluster.log_bytes(victim) == cluster.log_bytes(cluster.leader_id)
        refusals = [r for r in caplog.records if "refused the batches fetched" in r.message]
        assert len(refusals) == 3 and "CRC" in refusals[0].message
        await cluster.stop_all()
