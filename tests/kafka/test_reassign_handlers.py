"""The Kafka handlers of AlterPartitionReassignments, ListPartitionReassignments and
ElectLeaders over a sans-IO controller: kio requests in, response dicts out (every version
kio models), authorization as Kafka's (ALTER / DESCRIBE on the cluster), and hostile input."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.alter_partition_reassignments.v1.request import (
    AlterPartitionReassignmentsRequest,
)
from kio.schema.alter_partition_reassignments.v1.response import (
    AlterPartitionReassignmentsResponse,
)
from kio.schema.elect_leaders.v0.request import ElectLeadersRequest as ElectLeadersV0
from kio.schema.elect_leaders.v0.response import ElectLeadersResponse as ElectLeadersV0Response
from kio.schema.elect_leaders.v2.request import ElectLeadersRequest
from kio.schema.elect_leaders.v2.response import ElectLeadersResponse
from kio.schema.list_partition_reassignments.v0.request import ListPartitionReassignmentsRequest
from kio.schema.list_partition_reassignments.v0.response import (
    ListPartitionReassignmentsResponse,
)

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode
from raftlog.metadata.controller.controller import Controller
from raftlog.metadata.image import MetadataImage
from raftlog.net.kafka import codec, handlers_reassign
from raftlog.net.kafka.apis import ApiKey
from raftlog.net.kafka.context import NoQuotas, RequestContext
from raftlog.security.acl import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from raftlog.security.authorizer import Authorizer
from tests.metadata.test_controller import cluster
from tests.metadata.test_controller_elections import assign


class ControllerBackend:
    """ReassignmentBackend over a sans-IO controller whose records commit at once."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    @property
    def image(self) -> MetadataImage:
        return self.controller.image

    async def controller_call(self, request: Any, timeout_ms: int) -> Any:
        return self.controller.handle(request, 0).reply

    async def wait_for_image(
        self, predicate: Callable[[MetadataImage], bool], timeout_ms: int
    ) -> None:
        assert predicate(self.image)


def context(backend: Any, api_key: int, version: int, authorizer: Any = None) -> RequestContext:
    connection = SimpleNamespace(
        peer="127.0.0.1:5000",
        client_id="test",
        user="alice",
        principal="User:alice",
        listener="PLAINTEXT",
        mute=lambda ms: None,
    )
    return RequestContext(
        backend=backend,  # type: ignore[arg-type]
        config=NodeConfig(),
        quotas=NoQuotas(),
        connection=connection,  # type: ignore[arg-type]
        api_key=api_key,
        api_version=version,
        correlation_id=1,
        client_id="test",
        authorizer=authorizer,
    )


@pytest.fixture
def backend() -> ControllerBackend:
    c = cluster(4)
    assign(c, "t", {0: (1, 2), 1: (2, 3)})
    return ControllerBackend(c)


def alter_request(*partitions: tuple[str, int, list[int] | None]) -> Any:
    return codec.build(
        AlterPartitionReassignmentsRequest,
        {
            "timeout": 1000,
            "allow_replication_factor_change": True,
            "topics": [
                {"name": t, "partitions": [{"partition_index": p, "replicas": rs}]}
                for t, p, rs in partitions
            ],
        },
    )


def result_codes(response: dict[str, Any]) -> dict[tuple[str, int], ErrorCode]:
    return {
        (t["name"], p["partition_index"]): p["error_code"]
        for t in response["responses"]
        for p in t["partitions"]
    }


async def test_alter_then_list_then_cancel(backend: ControllerBackend) -> None:
    ctx = context(backend, ApiKey.ALTER_PARTITION_REASSIGNMENTS, 1)
    response = await handlers_reassign.handle_alter_partition_reassignments(
        ctx, alter_request(("t", 0, [3, 4]), ("t", 9, [1]), ("ghost", 0, [1]))
    )
    codec.build(AlterPartitionReassignmentsResponse, response)  # a valid v1 response
    assert result_codes(response) == {
        ("t", 0): ErrorCode.none,
        ("t", 9): ErrorCode.unknown_topic_or_partition,
        ("ghost", 0): ErrorCode.unknown_topic_or_partition,
    }
    listed = await handlers_reassign.handle_list_partition_reassignments(
        context(backend, ApiKey.LIST_PARTITION_REASSIGNMENTS, 0),
        codec.build(ListPartitionReassignmentsRequest, {"timeout": 1000, "topics": None}),
    )
    codec.build(ListPartitionReassignmentsResponse, listed)
    assert listed["topics"] == [
        {
            "name": "t",
            "partitions": [
                {
                    "partition_index": 0,
                    "replicas": [3, 4, 1, 2],
                    "adding_replicas": [3, 4],
                    "removing_replicas": [1, 2],
                }
            ],
        }
    ]
    response = await handlers_reassign.handle_alter_partition_reassignments(
        ctx, alter_request(("t", 0, None), ("t", 1, None))
    )
    assert result_codes(response) == {
        ("t", 0): ErrorCode.none,
        ("t", 1): ErrorCode.no_reassignment_in_progress,
    }


async def test_elect_leaders_every_version(backend: ControllerBackend) -> None:
    response = await handlers_reassign.handle_elect_leaders(
        context(backend, ApiKey.ELECT_LEADERS, 2),
        codec.build(
            ElectLeadersRequest,
            {
                "election_type": 0,
                "timeout": 1000,
                "topic_partitions": [{"topic": "t", "partitions": [0, 7, -1]}],
            },
        ),
    )
    codec.build(ElectLeadersResponse, response)
    codes = {
        (t["topic"], p["partition_id"]): p["error_code"]
        for t in response["replica_election_results"]
        for p in t["partition_result"]
    }
    assert codes == {
        ("t", 0): ErrorCode.election_not_needed,
        ("t", 7): ErrorCode.unknown_topic_or_partition,
        ("t", -1): ErrorCode.unknown_topic_or_partition,
    }
    # v0 has no election type: a preferred election of every partition (none needed one).
    response = await handlers_reassign.handle_elect_leaders(
        context(backend, ApiKey.ELECT_LEADERS, 0),
        codec.build(ElectLeadersV0, {"timeout": 1000, "topic_partitions": None}),
    )
    codec.build(ElectLeadersV0Response, response)
    assert response["replica_election_results"] == []


async def test_refused_without_alter_or_describe_on_the_cluster(backend: ControllerBackend) -> None:
    nobody = Authorizer([])
    before = backend.image
    response = await handlers_reassign.handle_alter_partition_reassignments(
        context(backend, ApiKey.ALTER_PARTITION_REASSIGNMENTS, 1, nobody),
        alter_request(("t", 0, [3, 4])),
    )
    assert response["error_code"] == ErrorCode.cluster_authorization_failed
    assert result_codes(response) == {("t", 0): ErrorCode.cluster_authorization_failed}
    assert backend.image is before  # nothing reached the controller
    listed = await handlers_reassign.handle_list_partition_reassignments(
        context(backend, ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, nobody),
        codec.build(ListPartitionReassignmentsRequest, {"timeout": 1000, "topics": None}),
    )
    assert listed["error_code"] == ErrorCode.cluster_authorization_failed
    elected = await handlers_reassign.handle_elect_leaders(
        context(backend, ApiKey.ELECT_LEADERS, 2, nobody),
        codec.build(
            ElectLeadersRequest,
            {
                "election_type": 0,
                "timeout": 1000,
                "topic_partitions": [{"topic": "t", "partitions": [0]}],
            },
        ),
    )
    assert elected["error_code"] == ErrorCode.cluster_authorization_failed
    # DESCRIBE on the cluster lets alice list, and only list.
    describe = Authorizer(
        [
            AclBinding(
                ResourceType.CLUSTER,
                "kafka-cluster",
                PatternType.LITERAL,
                "User:alice",
                "*",
                AclOperation.DESCRIBE,
                AclPermissionType.ALLOW,
            )
        ]
    )
    listed = await handlers_reassign.handle_list_partition_reassignments(
        context(backend, ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, describe),
        codec.build(ListPartitionReassignmentsRequest, {"timeout": 1000, "topics": None}),
    )
    assert listed["error_code"] == ErrorCode.none


async def test_hostile_requests(backend: ControllerBackend) -> None:
    ctx = context(backend, ApiKey.ALTER_PARTITION_REASSIGNMENTS, 1)
    huge = codec.build(
        AlterPartitionReassignmentsRequest,
        {
            "timeout": 1000,
            "topics": [
                {
                    "name": "t",
                    "partitions": [
                        {"partition_index": i, "replicas": [1]}
                        for i in range(handlers_reassign.MAX_PARTITIONS_PER_REQUEST + 1)
                    ],
                }
            ],
        },
    )
    before = backend.image
    response = await handlers_reassign.handle_alter_partition_reassignments(ctx, huge)
    assert response["error_code"] == ErrorCode.invalid_request
    assert backend.image is before
    response = await handlers_reassign.handle_alter_partition_reassignments(
        ctx,
        alter_request(
            ("t", -3, [1, 2]), ("t", 2**31 - 1, [1]), ("t", 0, [-1, 2]), ("t", 1, [2, 2])
        ),
    )
    assert result_codes(response) == {
        ("t", -3): ErrorCode.unknown_topic_or_partition,
        ("t", 2**31 - 1): ErrorCode.unknown_topic_or_partition,
        ("t", 0): ErrorCode.invalid_replica_assignment,
        ("t", 1): ErrorCode.invalid_replica_assignment,
    }
    assert backend.image is before


async def test_a_backend_without_a_controller_answers_an_error() -> None:
    ctx = context(object(), ApiKey.ALTER_PARTITION_REASSIGNMENTS, 1)
    response = await handlers_reassign.handle_alter_partition_reassignments(
        ctx, alter_request(("t", 0, [1]))
    )
    assert result_codes(response) == {("t", 0): ErrorCode.unknown_server_error}
