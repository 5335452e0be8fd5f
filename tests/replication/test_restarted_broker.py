"""A broker killed and restarted at once, before the controller noticed: its new process
starts from metadata that still names the old one leader. It must not lead under that
registration, and until its image holds its own registration it does not call a partition
unknown (three managers, no sockets).

Leading there would append at the old leader epoch to a log that may have lost an unflushed
tail the followers hold, while producers' retries go to whichever replica the controller
picks next: an idempotent producer then meets a leader whose sequences disagree with what it
was told (OUT_OF_ORDER_SEQUENCE_NUMBER, fatal in librdkafka).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import trio

from raftlog.errors import ErrorCode
from raftlog.metadata.controller.messages import RegisterBroker
from raftlog.metadata.image import MetadataDelta, MetadataImage
from tests.replication.test_manager import TOPIC, Cluster, produce, start_cluster
from tests.storage.helpers import batch
from tests.waiting import wait_until


def _register(cluster: Cluster, broker_id: int, incarnation: uuid.UUID) -> None:
    """The restarted process's registration, accepted once the old session is over."""
    reply = cluster.handle(
        RegisterBroker(broker_id, incarnation, "127.0.0.1", 9000 + broker_id, "127.0.0.1", 0)
    )
    assert reply.error_code == ErrorCode.none, reply
    cluster.broker_epochs[broker_id] = reply.broker_epoch


async def test_a_restarted_leader_leads_nothing_under_its_old_registration(tmp_path: Path):
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        assert (await produce(cluster)).error == ErrorCode.none
        await wait_until("replicas in sync", cluster.in_sync)
        old = cluster.leader_id
        old_epoch = cluster.partition().leader_epoch

        await cluster.stop(old)  # kill -9: the controller still holds its registration
        incarnation = cluster.incarnations[old] = uuid.uuid4()
        restarted = await cluster.start(old)
        await cluster.settle()
        assert (cluster.leader_id, cluster.partition().leader_epoch) == (old, old_epoch)
        hosted = restarted.replicas.partitions[(TOPIC, 0)]
        await wait_until("producer state loaded", lambda: hosted.producers.loaded)
        assert hosted.replica.leader is None
        refused = await restarted.writes.produce(TOPIC, 0, batch(1), -1, 10_000)
        assert refused.error == ErrorCode.not_leader_or_follower, refused

        # The old session ends and the new process registers: the leadership moves (a new
        # epoch) and the restarted broker follows.
        cluster.heartbeat(old, want_fence=True)
        _register(cluster, old, incarnation)
        cluster.heartbeat(old)
        assert cluster.leader_id != old and cluster.partition().leader_epoch > old_epoch
        await wait_until("the restarted broker follows", lambda: hosted.replica.follower)
        assert (await produce(cluster)).error == ErrorCode.none
        await wait_until("replicas in sync", cluster.in_sync)
        await cluster.stop_all()


async def test_a_restarted_broker_still_replaying_calls_no_partition_unknown(tmp_path: Path):
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        follower = next(b for b in cluster.managers if b != cluster.leader_id)
        await cluster.stop(follower)
        cluster.incarnations[follower] = uuid.uuid4()
        # Its image is still empty (the metadata log is being replayed).
        empty = (MetadataImage.empty("test-cluster"), MetadataDelta())
        restarted = await cluster.start(follower, changes=[empty])
        answer = await restarted.writes.produce(TOPIC, 0, batch(1), -1, 10_000)
        assert answer.error == ErrorCode.not_leader_or_follower, answer
        # A broker whose image holds its own registration knows what does not exist.
        leader = cluster.managers[cluster.leader_id]
        unknown = await leader.writes.produce("no-such-topic", 0, batch(1), -1, 10_000)
        assert unknown.error == ErrorCode.unknown_topic_or_partition, unknown
        await cluster.stop_all()
