"""Issue 13: a replica fetch is an acknowledgement, so it counts only for the node whose
connection sent it. A rogue that names a stopped follower's replica id must not keep that
follower in the ISR (which would let acks=all be answered with one real copy).

The managers are the in-process cluster of test_manager; the rogue calls the leader's
handle_replica_fetch with the node id its connection is bound to, as net/rpc.py does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from raftlog.errors import ErrorCode
from raftlog.net.rpc import IdentityMismatch
from raftlog.replication.fetch_wire import (
    ReplicaFetchPartition,
    ReplicaFetchRequest,
    encode_request,
)
from tests.replication.test_manager import TOPIC, followers, produce, start_cluster
from tests.waiting import wait_until

ROGUE_ID = -1  # what a client that is not a node sends as its sender id


def forged_fetch(cluster, replica_id: int) -> dict:
    """A fetch at the leader's log end: it would say replica_id has everything."""
    leader = cluster.status(cluster.leader_id)
    epoch = cluster.partition().leader_epoch
    partition = ReplicaFetchPartition(TOPIC, 0, leader.log_end_offset, epoch, epoch)
    request = ReplicaFetchRequest(replica_id, 0, 1, (partition,))
    return encode_request(request)


async def test_a_fetch_naming_another_replica_is_refused_and_records_nothing(
    tmp_path: Path,
) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        leader = cluster.managers[cluster.leader_id]
        first, second = followers(cluster)
        # A client that is no node, and a real follower speaking for the other one.
        for sender in (ROGUE_ID, second):
            with pytest.raises(IdentityMismatch):
                await leader.reads.handle_replica_fetch(sender, forged_fetch(cluster, first))
        await cluster.stop_all()


async def test_forged_fetches_for_stopped_followers_do_not_keep_them_in_the_isr(
    tmp_path: Path,
) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        assert (await produce(cluster)).error == ErrorCode.none
        leader_id = cluster.leader_id
        leader = cluster.managers[leader_id]
        stopped = followers(cluster)
        cluster.paused.update(stopped)
        refused = 0

        async def rogue() -> None:
            nonlocal refused
            while True:
                for replica_id in stopped:
                    try:
                        await leader.reads.handle_replica_fetch(
                            ROGUE_ID, forged_fetch(cluster, replica_id)
                        )
                    except IdentityMismatch:
                        refused += 1
                await trio.sleep(0.01)

        nursery.start_soon(rogue)
        # acks=all with min.insync.replicas=2 must not be answered while only the leader has
        # the batch: it fails once the ISR has shrunk, however many forged fetches arrive.
        first = await produce(cluster)
        assert first.error == ErrorCode.not_enough_replicas_after_append, first
        assert cluster.status(leader_id).isr == (leader_id,)
        assert (await produce(cluster)).error == ErrorCode.not_enough_replicas
        assert refused > 0
        cluster.paused.clear()
        await wait_until("the ISR to expand to three", lambda: len(cluster.partition().isr) == 3)
        nursery.cancel_scope.cancel()
