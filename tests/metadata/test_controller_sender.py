"""Issue 13: controller requests on the internal listener act only for the node their
connection speaks for. A forged BrokerHeartbeat asking for shutdown on behalf of a healthy
broker must not start its controlled shutdown (which left it fenced until it restarted), and
no refusal tells the sender the current broker or partition epochs.
"""

from __future__ import annotations

import logging

import pytest

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode
from raftlog.metadata.controller import messages as m
from raftlog.metadata.controller.controller import Controller
from raftlog.metadata.service import MetadataService
from raftlog.net.rpc import IdentityMismatch
from tests.metadata.test_controller import cluster, create
from tests.metadata.test_service_entry_batching import FakeQuorum

VOTERS = "1@127.0.0.1:19001,2@127.0.0.1:19002,3@127.0.0.1:19003"
ROGUE_ID = 9  # neither a voter nor a registered broker


class Quorum(FakeQuorum):
    def now_ms(self) -> int:
        return 0


def active_controller(controller: Controller) -> MetadataService:
    svc = MetadataService(NodeConfig(controller_quorum_voters=VOTERS), "cid")
    svc.quorum = Quorum()  # type: ignore[assignment]
    svc.controller = controller
    return svc


def shutdown_beat(controller: Controller, broker_id: int) -> m.BrokerHeartbeat:
    epoch = controller.image.brokers[broker_id].epoch
    return m.BrokerHeartbeat(broker_id, epoch, controller.committed_offset, want_shutdown=True)


@pytest.mark.parametrize("sender", [3, ROGUE_ID, -1])
async def test_a_heartbeat_for_another_broker_is_refused(sender: int) -> None:
    controller = cluster(3)
    svc = active_controller(controller)
    with pytest.raises(IdentityMismatch):
        await svc.handle(shutdown_beat(controller, 2), sender_id=sender)
    registration = controller.image.brokers[2]
    assert not registration.fenced and not registration.in_controlled_shutdown
    # The broker's own request is served as before.
    reply = await svc.handle(shutdown_beat(controller, 2), sender_id=2)
    assert reply.error_code == ErrorCode.none
    assert controller.image.brokers[2].in_controlled_shutdown


async def test_registrations_isr_changes_and_producer_ids_name_their_sender() -> None:
    controller = cluster(3)
    svc = active_controller(controller)
    create(controller, "t")
    registration = controller.image.brokers[1]
    requests = [
        m.RegisterBroker(1, registration.incarnation_id, "h", 1, "h", 2, cluster_id="cid"),
        m.AllocateProducerIds(1, registration.epoch),
        m.AlterPartition(
            1, registration.epoch, controller.image.topic("t").topic_id, 0, 1, 0, (1,)
        ),
    ]
    for request in requests:
        with pytest.raises(IdentityMismatch):
            await svc.handle(request, sender_id=2)


async def test_requests_from_a_node_that_is_not_known_are_refused() -> None:
    controller = cluster(3)
    svc = active_controller(controller)
    request = m.DeleteTopics(("t",))
    for sender in (ROGUE_ID, -1):
        with pytest.raises(IdentityMismatch):
            await svc.handle(request, sender_id=sender)
    reply = await svc.handle(request, sender_id=3)  # a voter and registered broker
    assert reply.results[0].error_code == ErrorCode.unknown_topic_or_partition


async def test_stale_epochs_are_refused_without_echoing_the_current_one(caplog) -> None:
    controller = cluster(3)
    svc = active_controller(controller)
    create(controller, "t")
    current = controller.image.brokers[2].epoch
    forged = m.BrokerHeartbeat(2, current + 7, 0, want_shutdown=True)
    with caplog.at_level(logging.INFO, logger="raftlog.metadata"):
        reply = await svc.handle(forged, sender_id=2)
    assert reply.error_code == ErrorCode.stale_broker_epoch
    assert not any(ch.isdigit() for ch in reply.error_message)
    assert not controller.image.brokers[2].in_controlled_shutdown
    # The detail is in this node's log only.
    assert f"registered broker epoch {current}" in caplog.text
    state = controller.image.topic("t").partitions[0]
    topic_id = controller.image.topic("t").topic_id
    leader = state.leader
    leader_epoch = controller.image.brokers[leader].epoch
    for request in (
        m.AlterPartition(leader, leader_epoch + 5, topic_id, 0, state.leader_epoch, 0, (leader,)),
        m.AlterPartition(leader, leader_epoch, topic_id, 0, state.leader_epoch + 5, 0, state.isr),
        m.AlterPartition(
            leader,
            leader_epoch,
            topic_id,
            0,
            state.leader_epoch,
            state.partition_epoch + 5,
            state.isr,
        ),
    ):
        reply = await svc.handle(request, sender_id=leader)
        assert reply.error_code != ErrorCode.none
        assert not any(ch.isdigit() for ch in reply.error_message), reply.error_message
