"""AddRaftVoter, RemoveRaftVoter and DescribeQuorum v2 on the Kafka listener (KIP-853),
through raftlog's own client (raftlog.client.quorum) against a scripted quorum."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest
import trio

from raftlog.client import open_cluster
from raftlog.client.cluster import Cluster
from raftlog.client.connection import call_negotiated
from raftlog.client.quorum import QUORUM_API_VERSIONS, QuorumAdmin
from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode, KafkaError
from raftlog.metadata.raft.describe import QuorumDescription, ReplicaProgress
from raftlog.metadata.raft.membership import MembershipRefused
from raftlog.metadata.raft.types import NotLeader
from raftlog.metadata.raft.voters import NO_DIRECTORY_ID, Endpoint, Voter
from raftlog.net.kafka.apis import default_registry
from raftlog.net.kafka.handlers_quorum import register_quorum_apis
from raftlog.net.kafka.server import serve
from tests.kafka.memory_backend import MemoryBackend

CLUSTER_ID = "quorum-test"


class ScriptedQuorum:
    """A leader whose voter changes succeed unless `refuse` says otherwise."""

    def __init__(self) -> None:
        self.voters = {
            1: Voter(1, NO_DIRECTORY_ID, (Endpoint("CONTROLLER", "h1", 9001),)),
            2: Voter(2, NO_DIRECTORY_ID, (Endpoint("CONTROLLER", "h2", 9002),)),
        }
        self.refuse: Exception | None = None
        self.describe_refusal: Exception | None = None
        self.calls: list[tuple[str, Any]] = []

    async def add_voter(self, voter: Voter, *, timeout_ms: int) -> None:
        self.calls.append(("add", (voter, timeout_ms)))
        if self.refuse is not None:
            raise self.refuse
        self.voters[voter.voter_id] = voter

    async def remove_voter(
        self, voter_id: int, directory_id: uuid.UUID, *, timeout_ms: int
    ) -> None:
        self.calls.append(("remove", (voter_id, directory_id)))
        if self.refuse is not None:
            raise self.refuse
        del self.voters[voter_id]

    async def update_voter(self, voter: Voter, *, timeout_ms: int) -> None:
        self.calls.append(("update", voter))

    async def describe(self) -> QuorumDescription:
        if self.describe_refusal is not None:
            raise self.describe_refusal
        voters = tuple(
            ReplicaProgress(v, 10, 1_700_000_000_000, 1_700_000_000_000) for v in self.voters
        )
        observers = (ReplicaProgress(7, 4, 1_700_000_000_000, -1),)
        return QuorumDescription(
            1, 3, 10, voters, observers, tuple(self.voters[v] for v in sorted(self.voters))
        )


@pytest.fixture
async def quorum() -> ScriptedQuorum:
    return ScriptedQuorum()


@pytest.fixture
async def cluster(
    nursery: trio.Nursery, tmp_path: Any, quorum: ScriptedQuorum
) -> AsyncIterator[Cluster]:
    backend = MemoryBackend(tmp_path)
    registry = default_registry()
    register_quorum_apis(registry, quorum, quorum.describe, CLUSTER_ID)
    listeners = await nursery.start(
        partial(serve, backend, "127.0.0.1", 0, NodeConfig(), registry=registry)
    )
    port = backend.port = listeners[0].socket.getsockname()[1]
    async with open_cluster(f"127.0.0.1:{port}", client_id="quorum-test") as cluster:
        yield cluster
    backend.close()


async def test_describe_quorum_v2_names_voter_endpoints_and_observers(cluster: Cluster) -> None:
    described = await QuorumAdmin(cluster).describe_quorum()
    assert (described.leader_id, described.leader_epoch, described.high_watermark) == (1, 3, 10)
    assert [v.replica_id for v in described.voters] == [1, 2]
    assert [o.replica_id for o in described.observers] == [7]
    assert [(n.node_id, n.listeners) for n in described.nodes] == [
        (1, (("CONTROLLER", "h1", 9001),)),
        (2, (("CONTROLLER", "h2", 9002),)),
    ]


async def test_add_and_remove_voter(cluster: Cluster, quorum: ScriptedQuorum) -> None:
    admin = QuorumAdmin(cluster, timeout_ms=5_000)
    directory = uuid.uuid4()
    await admin.add_voter(4, [("CONTROLLER", "h4", 9004)], directory_id=directory)
    assert quorum.voters[4] == Voter(4, directory, (Endpoint("CONTROLLER", "h4", 9004),))
    assert quorum.calls[0][1][1] == 5_000
    await admin.remove_voter(2)
    assert sorted(quorum.voters) == [1, 4]
    described = await admin.describe_quorum()
    assert [n.node_id for n in described.nodes] == [1, 4]


async def test_refusals_carry_kafka_codes(cluster: Cluster, quorum: ScriptedQuorum) -> None:
    admin = QuorumAdmin(cluster)
    quorum.refuse = MembershipRefused(ErrorCode.request_timed_out, "a change is pending")
    with pytest.raises(KafkaError) as caught:
        await admin.add_voter(4, [("CONTROLLER", "h4", 9004)])
    assert caught.value.code == ErrorCode.request_timed_out
    assert "a change is pending" in str(caught.value)
    quorum.refuse = MembershipRefused(ErrorCode.voter_not_found, "no voter 9")
    with pytest.raises(KafkaError) as caught:
        await admin.remove_voter(9)
    assert caught.value.code == ErrorCode.voter_not_found


async def test_not_the_leader_is_not_controller(cluster: Cluster, quorum: ScriptedQuorum) -> None:
    cluster.limits = dataclasses.replace(cluster.limits, max_retries=0)
    quorum.refuse = NotLeader(2, 3)
    with pytest.raises(KafkaError) as caught:
        await QuorumAdmin(cluster).remove_voter(1)
    assert caught.value.code == ErrorCode.not_controller


async def test_fields_are_range_checked_and_the_cluster_id_must_match(
    cluster: Cluster, quorum: ScriptedQuorum
) -> None:
    admin = QuorumAdmin(cluster)
    with pytest.raises(KafkaError) as caught:
        await admin.add_voter(-5, [("CONTROLLER", "h4", 9004)])
    assert caught.value.code == ErrorCode.invalid_request
    with pytest.raises(KafkaError) as caught:
        await admin.add_voter(4, [("CONTROLLER", "h" * 300, 9004)])
    assert caught.value.code == ErrorCode.invalid_request
    with pytest.raises(KafkaError) as caught:
        await admin.add_voter(4, [])
    assert caught.value.code == ErrorCode.invalid_request
    with pytest.raises(KafkaError) as caught:
        await admin.add_voter(4, [("CONTROLLER", f"h{i}", 9000 + i) for i in range(40)])
    assert caught.value.code == ErrorCode.invalid_request
    with pytest.raises(KafkaError) as caught:
        await admin.remove_voter(1, cluster_id="another-cluster")
    assert caught.value.code == ErrorCode.inconsistent_cluster_id
    assert quorum.calls == []  # nothing out of range reached the quorum


async def test_update_raft_voter(cluster: Cluster, quorum: ScriptedQuorum) -> None:
    connection = await cluster.controller()
    values = {
        "cluster_id": CLUSTER_ID,
        "current_leader_epoch": 3,
        "voter_id": 2,
        "voter_directory_id": None,
        "listeners": [{"name": "CONTROLLER", "host": "h2-new", "port": 9102}],
        "k_raft_version_feature": {"min_supported_version": 0, "max_supported_version": 1},
    }
    response = await call_negotiated(connection, "update_raft_voter", values, QUORUM_API_VERSIONS)
    assert response.error_code == ErrorCode.none
    assert quorum.calls == [
        ("update", Voter(2, NO_DIRECTORY_ID, (Endpoint("CONTROLLER", "h2-new", 9102),)))
    ]
    values["listeners"] = []
    response = await call_negotiated(connection, "update_raft_voter", values, QUORUM_API_VERSIONS)
    assert response.error_code == ErrorCode.invalid_request


async def test_describe_quorum_without_a_leader_is_retriable(
    cluster: Cluster, quorum: ScriptedQuorum
) -> None:
    quorum.describe_refusal = NotLeader(None, -1)
    connection = await cluster.controller()
    values = {
        "topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]
    }
    response = await call_negotiated(connection, "describe_quorum", values, QUORUM_API_VERSIONS)
    # A client retries NOT_LEADER_OR_FOLLOWER; UNKNOWN_SERVER_ERROR it would give up on.
    assert response.error_code == ErrorCode.none
    assert response.topics[0].partitions[0].error_code == ErrorCode.not_leader_or_follower
