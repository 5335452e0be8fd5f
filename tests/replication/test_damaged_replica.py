"""Damaged bytes at a replica, in three managers on real storage: a fetch answer damaged on
the way, a committed batch damaged on a follower's disk (the scrubber), a full disk."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from raftlog.errors import ErrorCode
from raftlog.metadata.controller.messages import BrokerHeartbeat, CreateTopics, NewTopic
from raftlog.storage import segment as segment_module
from tests.replication.test_manager import (
    BROKERS,
    TOPIC,
    cluster_config,
    followers,
    last_offsets,
    produce,
    read_consumer,
    start_cluster,
)
from tests.storage.helpers import batch
from tests.storage.test_damage import FailingDisk
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

        # A fetch sent before the swap may be parked at the leader: pausing the victim makes
        # its answer lost, so every answer with records goes through flip_a_byte.
        cluster.paused.add(victim)
        pool.send_fetch = flip_a_byte
        assert (await produce(cluster, acks=1)).error == ErrorCode.none
        cluster.paused.discard(victim)
        await wait_until("three damaged answers", lambda: damaged >= 3)
        await wait_until("the follower to catch up", cluster.in_sync)
        assert cluster.log_bytes(victim) == cluster.log_bytes(cluster.leader_id)
        refusals = [r for r in caplog.records if "refused the batches fetched" in r.message]
        assert len(refusals) == 3 and "CRC" in refusals[0].message
        await cluster.stop_all()


def flip_byte_in_segment(segment_file: Path, batch_index: int) -> None:
    """Flip the last record byte of the `batch_index`th batch of a segment file on disk."""
    data = segment_file.read_bytes()
    position = 0
    for _ in range(batch_index):
        position += 12 + int.from_bytes(data[position + 8 : position + 12], "big")
    end = position + 12 + int.from_bytes(data[position + 8 : position + 12], "big")
    with open(segment_file, "r+b") as f:
        f.seek(end - 2)
        f.write(bytes([data[end - 2] ^ 0x08]))


def segment_file(root: Path, broker_id: int) -> Path:
    return root / f"broker-{broker_id}" / f"{TOPIC}-0" / f"{0:020d}.log"


async def produce_values(cluster: Any, count: int) -> None:
    for _ in range(count):
        assert (await produce(cluster)).error == ErrorCode.none


async def test_scrubber_repairs_a_followers_committed_batch_damaged_while_it_was_stopped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "raftlog")
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        # Enough batches for an offset-index entry: recovery then trusts the segment's
        # batches before it without reading them.
        await produce_values(cluster, 40)
        await wait_until("replicas in sync", cluster.in_sync)
        leader_id = cluster.leader_id
        expected = cluster.log_bytes(leader_id)
        victim = followers(cluster)[0]
        await cluster.stop(victim)
        # Below the recovery point a clean shutdown wrote: recovery trusts this segment.
        flip_byte_in_segment(segment_file(tmp_path, victim), 4)
        manager = await cluster.start(victim)
        manager.scrubber.schedule.pass_interval_s = 0.05
        await wait_until("the scrubber to find it", lambda: manager.scrubber.damage_found >= 1)
        await wait_until(
            "the repair", lambda: manager.unsafe_partitions() == () and cluster.in_sync()
        )
        assert cluster.log_bytes(victim) == expected
        messages = [r.getMessage() for r in caplog.records]
        assert any("found a damaged batch at offset 12" in m for m in messages)
        assert any("truncating to 12 to fetch the damaged batches again" in m for m in messages)
        # The next pass finds nothing more.
        passes = manager.scrubber.schedule.passes
        await wait_until("another pass", lambda: manager.scrubber.schedule.passes > passes + 1)
        assert manager.scrubber.damage_found == 1
        await cluster.stop_all()


async def test_a_damaged_leader_refuses_the_range_and_repairs_once_another_replica_leads(
    tmp_path: Path,
) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        await produce_values(cluster, 10)
        await wait_until("replicas in sync", cluster.in_sync)
        leader_id = cluster.leader_id
        expected = cluster.log_bytes(leader_id)
        # The running leader's segment file is damaged (the page cache holds the flip).
        flip_byte_in_segment(segment_file(tmp_path, leader_id), 4)
        leader = cluster.managers[leader_id]
        leader.scrubber.schedule.pass_interval_s = 0.05
        await wait_until("the scrubber to find it", lambda: leader.scrubber.damage_found >= 1)
        result, data = await read_consumer(leader)
        assert result.error == ErrorCode.none and last_offsets(data)[-1] == 11
        result, _ = await read_consumer(leader, 12)
        assert result.error == ErrorCode.kafka_storage_error
        # Leadership moves (here: the broker is fenced); the old leader fetches the range again.
        cluster.heartbeat(leader_id, want_fence=True)
        assert cluster.leader_id != leader_id
        await wait_until("the repair", lambda: leader.unsafe_partitions() == ())
        await wait_until(
            "the old leader to catch up", lambda: cluster.log_bytes(leader_id) == expected
        )
        _, data = await read_consumer(cluster.managers[cluster.leader_id])
        assert data == expected
        await cluster.stop_all()


async def test_a_replica_restarted_over_a_damaged_batch_never_serves_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No scrubber here: the damaged replica becomes leader before any pass could find the
    flip, and its first read of the bytes it took on trust finds it instead."""
    caplog.set_level(logging.INFO, "raftlog")
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(
            tmp_path, nursery, config=cluster_config(log_scrub_bytes_per_s=0)
        )
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        await produce_values(cluster, 40)
        await wait_until("replicas in sync", cluster.in_sync)
        expected = cluster.log_bytes(cluster.leader_id)
        victim = followers(cluster)[0]
        await cluster.stop(victim)
        flip_byte_in_segment(segment_file(tmp_path, victim), 4)  # offsets 12..14
        manager = await cluster.start(victim)
        await wait_until("the victim back in sync", cluster.in_sync)
        # Every other replica is fenced: the damaged one is the only leader left.
        for broker_id in BROKERS:
            if broker_id != victim:
                cluster.heartbeat(broker_id, want_fence=True)
        assert cluster.leader_id == victim
        result, data = await read_consumer(manager)
        assert result.error == ErrorCode.none
        assert data == expected[: len(data)] and last_offsets(data)[-1] == 11
        result, _ = await read_consumer(manager, 12)
        assert result.error == ErrorCode.kafka_storage_error
        assert manager.unsafe_partitions() != ()  # it reports itself: no more elections
        messages = [r.getMessage() for r in caplog.records]
        assert any("a read found a damaged batch at offset 12" in m for m in messages)
        await cluster.stop_all()


async def test_a_follower_whose_disk_is_full_takes_the_partition_offline_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "raftlog")
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, min_isr=1)
        reply = cluster.handle(CreateTopics((NewTopic("other", 1, 3),)))
        assert reply.results[0].error_code == ErrorCode.none
        await cluster.settle()
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        await produce_values(cluster, 2)
        await wait_until("replicas in sync", cluster.in_sync)
        victim = followers(cluster)[0]
        victim_log = cluster.log_managers[victim].get(TOPIC, 0)
        assert victim_log is not None
        disk = FailingDisk()
        disk.fail(victim_log.active_segment.file.fileno())
        monkeypatch.setattr(segment_module, "os", disk)
        await produce_values(cluster, 3)  # the victim's append of these fails: ENOSPC
        await wait_until("the append to fail", lambda: victim_log.offline)
        # The node goes on: the other topic still replicates to it, the partition is served
        # by the others, and the failure was one ERROR line (no retry storm, no traceback).
        other_leader = cluster.partition("other").leader
        produced = await cluster.managers[other_leader].writes.produce(
            "other", 0, batch(3), -1, 10_000
        )
        assert produced.error == ErrorCode.none
        await wait_until("the other topic in sync", lambda: cluster.in_sync(topic="other"))
        assert (await produce(cluster, acks=1)).error == ErrorCode.none
        lines = [r for r in caplog.records if "log directory failed" in r.getMessage()]
        assert len(lines) == 1 and "orders-0" in lines[0].getMessage()
        assert not [r for r in caplog.records if r.exc_info]
        # Space comes back and the node restarts: it recovers what was durable, catches up,
        # and nothing acknowledged is lost.
        await cluster.stop(victim)
        monkeypatch.undo()
        await cluster.start(victim)
        await wait_until("the victim to catch up", cluster.in_sync)
        assert cluster.log_bytes(victim) == cluster.log_bytes(cluster.leader_id)
        await cluster.stop_all()


def report(cluster: Any, broker_id: int, unsafe: tuple[tuple[Any, int], ...]) -> None:
    """The heartbeat a broker's lifecycle sends, with its replicas unsafe to lead."""
    reply = cluster.handle(
        BrokerHeartbeat(
            broker_id, cluster.broker_epochs[broker_id], cluster.offset, unsafe_partitions=unsafe
        )
    )
    assert reply.error_code == ErrorCode.none, reply


async def test_a_leader_whose_recovery_lost_acknowledged_records_is_not_elected_again(
    tmp_path: Path,
) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        await produce_values(cluster, 40)  # acks=all: every record is acknowledged
        await wait_until("replicas in sync", cluster.in_sync)
        expected = cluster.log_bytes(cluster.leader_id)
        damaged = cluster.leader_id
        await cluster.stop(damaged)
        # Its last segment cut in the middle of a batch, below its clean-shutdown recovery
        # point: recovery cuts cleanly, but acknowledged records are gone from this copy.
        path = segment_file(tmp_path, damaged)
        os.truncate(path, path.stat().st_size - 30)
        cluster.paused.add(damaged)
        manager = await cluster.start(damaged)
        hosted = manager.replicas.partitions[(TOPIC, 0)]
        unsafe = manager.unsafe_partitions()
        assert unsafe == ((hosted.topic_id, 0),)
        # Its heartbeat reports it: it leaves the ISR and leadership goes to an intact copy.
        report(cluster, damaged, unsafe)
        state = cluster.partition()
        assert state.leader != damaged and damaged not in state.isr
        for broker_id in BROKERS:
            if broker_id != damaged:
                report(cluster, broker_id, ())
        # Even the periodic elections (offline partitions, preferred leader) pass it over.
        cluster.commit(cluster.controller.rebalance_preferred_leaders().records)
        assert cluster.leader_id != damaged
        # It fetches back what the others committed, stops reporting itself, and rejoins.
        cluster.paused.discard(damaged)
        await wait_until("the copy to be whole", lambda: manager.unsafe_partitions() == ())
        report(cluster, damaged, ())
        await wait_until("the ISR to expand", lambda: damaged in cluster.partition().isr)
        assert cluster.log_bytes(cluster.leader_id) == expected
        assert cluster.log_bytes(damaged) == expected
        await cluster.stop_all()


async def test_a_partition_whose_only_in_sync_replica_lost_data_stays_offline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, min_isr=1)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        leader_id = cluster.leader_id
        others = followers(cluster)
        for broker_id in others:
            await cluster.stop(broker_id)
            cluster.heartbeat(broker_id, want_fence=True)  # fenced: out of the ISR
        assert cluster.partition().isr == (leader_id,)
        hosted = cluster.managers[leader_id].replicas.partitions[(TOPIC, 0)]
        report(cluster, leader_id, ((hosted.topic_id, 0),))
        assert cluster.partition().leader == -1 and cluster.partition().isr == (leader_id,)
        assert any("is offline: broker" in r.getMessage() for r in caplog.records)
        # The periodic election does not bring it back with the damaged copy either.
        cluster.commit(cluster.controller.tick(10**12).records)
        assert cluster.partition().leader == -1
        await cluster.stop_all()


async def test_unclean_election_takes_a_replica_unsafe_to_lead_when_nothing_else_is_left(
    tmp_path: Path,
) -> None:
    async with trio.open_nursery() as nursery:
        config = cluster_config(unclean_leader_election=True)
        cluster = await start_cluster(tmp_path, nursery, min_isr=1, config=config)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        leader_id = cluster.leader_id
        for broker_id in followers(cluster):
            await cluster.stop(broker_id)
            cluster.heartbeat(broker_id, want_fence=True)
        hosted = cluster.managers[leader_id].replicas.partitions[(TOPIC, 0)]
        # The operator accepted losing data: the damaged copy keeps leading, as the only one.
        report(cluster, leader_id, ((hosted.topic_id, 0),))
        assert cluster.partition().leader == leader_id
        await cluster.stop_all()


async def test_a_leader_whose_disk_is_full_hands_its_partition_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        await produce_values(cluster, 2)
        await wait_until("replicas in sync", cluster.in_sync)
        expected = cluster.log_bytes(cluster.leader_id)
        broken = cluster.leader_id
        manager = cluster.managers[broken]
        leader_log = cluster.log_managers[broken].get(TOPIC, 0)
        assert leader_log is not None
        disk = FailingDisk()
        disk.fail(leader_log.active_segment.file.fileno())
        monkeypatch.setattr(segment_module, "os", disk)
        answer = await produce(cluster)
        assert answer.error == ErrorCode.kafka_storage_error
        result, _ = await read_consumer(manager)
        assert result.error == ErrorCode.kafka_storage_error
        # Its heartbeat reports the replica: leadership moves to an intact copy.
        unsafe = manager.unsafe_partitions()
        assert len(unsafe) == 1
        report(cluster, broken, unsafe)
        assert cluster.leader_id != broken and broken not in cluster.partition().isr
        await wait_until(
            "the new leader", lambda: cluster.status(cluster.leader_id).role == "leader"
        )
        assert (await produce(cluster)).error == ErrorCode.none
        _, data = await read_consumer(cluster.managers[cluster.leader_id])
        assert data.startswith(expected) and len(data) > len(expected)
        monkeypatch.undo()
        await cluster.stop_all()
