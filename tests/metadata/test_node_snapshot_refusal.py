"""Metadata snapshots a node cannot apply, on three in-process nodes (real RPC, real disks).

A leader that serves a snapshot the follower cannot decode (as one written by a newer
version) must not take the follower down: it refuses the snapshot, keeps its log, and catches
up once the leader has a snapshot it can apply. A node restarted with an undecodable newest
snapshot on disk starts from the snapshot before it.
"""

import logging

import pytest
import trio

from raftlog.errors import ErrorCode
from raftlog.metadata import service as metadata_service
from raftlog.metadata.raft.log_store import UNUSABLE_SNAPSHOT_SUFFIX
from raftlog.metadata.snapshot import SnapshotCorruptError, decode_snapshot, encode_snapshot
from raftlog.storage.checkpoint import read_checkpoint, write_checkpoint
from tests.metadata.test_node_quorum import Cluster, create_topic, make_configs
from tests.metadata.test_snapshot import snapshot_from_a_newer_version
from tests.waiting import wait_until


async def _create_topics(node, prefix, count):
    for k in range(count):
        result = await create_topic(node, f"{prefix}{k}", partitions=1, rf=2)
        assert result.error_code == ErrorCode.none, result


async def test_follower_refuses_a_snapshot_it_cannot_decode_and_catches_up_later(
    tmp_path, caplog, monkeypatch
):
    # No broker is fenced while this runs: a fence writes records, and enough of them make
    # the leader take a newer (decodable) snapshot before the restarted node fetches the bad
    # one. The killed node's old incarnation would be fenced (its listener refused, or its
    # session expired) at a moment that depends on the machine's load.
    configs = make_configs(
        tmp_path,
        metadata_snapshot_max_records=10,
        broker_session_timeout_ms=60_000,
        broker_unreachable_fence_ms=60_000,
    )
    async with trio.open_nursery() as nursery:
        cluster = Cluster(nursery, configs)
        leader = await cluster.start_all()
        epoch = leader.quorum.core.epoch
        lagging = next(i for i in (1, 2, 3) if i != leader.config.node_id)
        await cluster.kill_and_wait(lagging)

        # The leader writes its next snapshot as a newer version would: with a record type
        # the others do not know. Only the leader's: the other follower stays as it was.
        def leader_writes_newer(image):
            if image is leader.metadata.image:
                return snapshot_from_a_newer_version(image)
            return encode_snapshot(image)

        monkeypatch.setattr(metadata_service, "encode_snapshot", leader_writes_newer)
        await _create_topics(leader, "t", 12)
        await wait_until(
            "leader snapshot", lambda: leader.quorum.core.log_start > 0, wake=cluster.any_change
        )
        monkeypatch.undo()
        bad = leader.quorum.core.snapshot
        with pytest.raises(SnapshotCorruptError, match="unknown metadata record type 99"):
            decode_snapshot(bad.data)

        with caplog.at_level(logging.ERROR, "raftlog.quorum"):
            restarted = await cluster.start(lagging)
            log_range = (
                restarted.quorum.store.log.log_start_offset,
                restarted.quorum.store.log.log_end_offset,
            )
            refused = (
                f"node {lagging}: refused metadata snapshot (end offset {bad.end_offset}, "
                f"epoch {bad.epoch}) from leader {leader.config.node_id}: snapshot body is "
                "damaged: unknown metadata record type 99"
            )
            await wait_until(
                "the snapshot refused", lambda: refused in caplog.text, wake=cluster.any_change
            )
        # Nothing of it was kept: same log, no snapshot, the image it had before.
        store = restarted.quorum.store
        assert (store.log.log_start_offset, store.log.log_end_offset) == log_range
        assert restarted.quorum.core.snapshot is None
        assert restarted.metadata.image.topic("t11") is None
        assert leader.quorum.core.epoch == epoch  # and no election was needed

        # The leader moves on to a snapshot the follower can apply: it catches up.
        await _create_topics(leader, "u", 6)
        await wait_until(
            "a newer snapshot",
            lambda: leader.quorum.core.snapshot.end_offset > bad.end_offset,
            wake=cluster.any_change,
        )
        await wait_until(
            "catch-up through the newer snapshot",
            lambda: restarted.metadata.image.topic("u5") is not None,
            timeout_s=20,
            wake=cluster.any_change,
        )
        assert restarted.quorum.core.log_start > bad.end_offset
        assert leader.quorum.core.epoch == epoch
        nursery.cancel_scope.cancel()


async def test_node_restarted_with_an_undecodable_newest_snapshot_starts_from_the_older(
    tmp_path, caplog
):
    configs = make_configs(tmp_path, metadata_snapshot_max_records=10)
    async with trio.open_nursery() as nursery:
        cluster = Cluster(nursery, configs)
        leader = await cluster.start_all()
        follower = next(n for n in cluster.nodes.values() if n is not leader)
        node_id = follower.config.node_id
        directory = follower.quorum.store.directory
        k = 0
        while len(list(directory.glob("*.snapshot"))) < 2:
            assert k < 40, "the follower never kept two snapshots"
            await _create_topics(leader, f"t{k}-", 1)
            k += 1
        await cluster.kill_and_wait(node_id)  # its files are changed below

        # Its newest snapshot now reads as one written by a newer version.
        older, newest = sorted(directory.glob("*.snapshot"))[-2:]
        payload = read_checkpoint(newest, "metadata-snapshot")
        payload["data"] = snapshot_from_a_newer_version(decode_snapshot(payload["data"]))
        write_checkpoint(newest, "metadata-snapshot", payload)
        older_end = read_checkpoint(older, "metadata-snapshot")["end_offset"]

        with caplog.at_level(logging.WARNING, "raftlog.quorum"):
            restarted = await cluster.start(node_id)
        # (It may install a newer snapshot from the leader at once: the log says where it began.)
        assert f"passing over metadata snapshot {newest.name}" in caplog.text
        assert f"metadata starts from the older snapshot at offset {older_end}" in caplog.text
        assert newest.with_name(
            newest.name.removesuffix(".snapshot") + UNUSABLE_SNAPSHOT_SUFFIX
        ).exists()

        await _create_topics(leader, "after-restart", 1)
        await wait_until(
            "restarted node caught up",
            lambda: restarted.metadata.image.topic("after-restart0") is not None,
            wake=cluster.any_change,
        )
        await wait_until(
            "same topics as the leader",
            lambda: (
                restarted.metadata.image.topics_by_name.keys()
                == leader.metadata.image.topics_by_name.keys()
            ),
            wake=cluster.any_change,
        )
        nursery.cancel_scope.cancel()
