"""The Kafka handler of UnregisterBroker over a sans-IO controller: kio request in, response
dict out, ALTER on the cluster, the controller's refusals and a failing controller path."""

from __future__ import annotations

from typing import Any

from kio.schema.unregister_broker.v0.request import UnregisterBrokerRequest
from kio.schema.unregister_broker.v0.response import UnregisterBrokerResponse

from raftlog.errors import ErrorCode, KafkaError
from raftlog.metadata.controller import messages as cm
from raftlog.net.kafka import authz, codec, handlers_cluster
from raftlog.net.kafka.apis import VERSION_TABLE, ApiKey
from raftlog.security.acl import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from raftlog.security.authorizer import Authorizer
from tests.kafka.test_lapsed_leader_backend import _backend as broker_backend
from tests.kafka.test_reassign_handlers import ControllerBackend, context
from tests.metadata.test_controller import cluster, create


def request(broker_id: int) -> Any:
    return codec.build(UnregisterBrokerRequest, {"broker_id": broker_id})


async def unregister(backend: Any, broker_id: int, authorizer: Any = None) -> dict[str, Any]:
    ctx = context(backend, ApiKey.UNREGISTER_BROKER, 0, authorizer)
    response = await handlers_cluster.handle_unregister_broker(ctx, request(broker_id))
    codec.build(UnregisterBrokerResponse, response)  # well formed for v0
    return response


def test_advertised_as_v0_with_alter_on_the_cluster() -> None:
    assert VERSION_TABLE[ApiKey.UNREGISTER_BROKER][:2] == (0, 0)
    assert ApiKey.UNREGISTER_BROKER == 64
    assert authz.API_RULES["unregister_broker"] == (authz.ALTER_CLUSTER,)


async def test_unregister_then_again() -> None:
    backend = ControllerBackend(cluster(4))
    response = await unregister(backend, 4)
    assert response == {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None}
    assert 4 not in backend.image.brokers
    again = await unregister(backend, 4)
    assert again["error_code"] == ErrorCode.broker_id_not_registered
    assert "4" in again["error_message"]
    for hostile in (-1, -(2**31), 2**31 - 1):
        answer = await unregister(backend, hostile)
        assert answer["error_code"] == ErrorCode.broker_id_not_registered


async def test_refused_without_alter_on_the_cluster() -> None:
    backend = ControllerBackend(cluster(3))
    before = backend.image
    nobody = Authorizer([])
    response = await unregister(backend, 3, nobody)
    assert response["error_code"] == ErrorCode.cluster_authorization_failed
    assert backend.image is before  # nothing reached the controller
    alter = Authorizer(
        [
            AclBinding(
                ResourceType.CLUSTER,
                "kafka-cluster",
                PatternType.LITERAL,
                "User:alice",
                "*",
                AclOperation.ALTER,
                AclPermissionType.ALLOW,
            )
        ]
    )
    assert (await unregister(backend, 3, alter))["error_code"] == ErrorCode.none


class FailingBackend(ControllerBackend):
    def __init__(self, error: Exception) -> None:
        super().__init__(cluster(1))
        self.error = error

    async def controller_call(self, request: Any, timeout_ms: int) -> Any:
        assert isinstance(request, cm.UnregisterBroker)
        raise self.error


async def test_controller_errors_are_answered() -> None:
    timed_out = KafkaError(ErrorCode.request_timed_out, "no active controller answered")
    response = await unregister(FailingBackend(timed_out), 1)
    assert response["error_code"] == ErrorCode.request_timed_out
    assert response["error_message"] == "no active controller answered"
    broken = await unregister(FailingBackend(RuntimeError("bug")), 1)
    assert broken["error_code"] == ErrorCode.unknown_server_error
    nothing = await unregister(object(), 1)
    assert nothing["error_code"] == ErrorCode.unknown_server_error


def test_metadata_lists_a_replica_of_an_unregistered_broker_as_offline() -> None:
    # Kafka's Metadata answer: the replica stays in the list, as an offline replica.
    backend, *_ = broker_backend()
    controller = cluster(3)
    create(controller, "t", partitions=2, rf=3)
    controller.handle(cm.UnregisterBroker(3), 0)
    backend.metadata.image = controller.image
    (topic,) = backend.topics(["t"])
    for partition in topic.partitions:
        assert 3 in partition.replicas and 3 not in partition.isr
        assert tuple(partition.offline_replicas) == (3,)
        assert partition.leader_id in (1, 2) and partition.error == ErrorCode.none
    assert 3 not in {b.node_id for b in backend.brokers()}
    assert 3 not in {b.node_id for b in backend.registered_brokers()}
