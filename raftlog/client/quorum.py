"""Controller membership of the metadata quorum (KIP-853) from the client: DescribeQuorum v2,
AddRaftVoter and RemoveRaftVoter, as Kafka's Admin.describeMetadataQuorum / addRaftVoter /
removeRaftVoter and the kafka-metadata-quorum tool use them.

    admin = QuorumAdmin(cluster)
    quorum = await admin.describe_quorum()
    await admin.add_voter(4, [("CONTROLLER", "host4", 19096)])
    await admin.remove_voter(1)

Requests go to the controller (the metadata quorum's leader); NOT_CONTROLLER makes the
cluster refresh its metadata and try again. Any other error is raised as KafkaError with the
broker's message.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from raftlog.client.cluster import Cluster, raise_for
from raftlog.client.connection import call_negotiated
from raftlog.client.protocol import error_of
from raftlog.errors import ErrorCode, KafkaError

__all__ = [
    "QUORUM_API_VERSIONS",
    "QuorumAdmin",
    "QuorumDescription",
    "QuorumNode",
    "QuorumReplica",
]

# The versions this module speaks (kio models all of them).
QUORUM_API_VERSIONS: dict[str, tuple[int, int]] = {
    "describe_quorum": (0, 2),
    "add_raft_voter": (0, 0),
    "remove_raft_voter": (0, 0),
    "update_raft_voter": (0, 0),
}
METADATA_TOPIC = "__cluster_metadata"
# How long the controller may wait for a voter change to commit (AddRaftVoter's TimeoutMs).
DEFAULT_VOTER_CHANGE_TIMEOUT_MS = 30_000


@dataclass(frozen=True)
class QuorumReplica:
    """One replica of the metadata log as the leader sees it; times are wall-clock ms."""

    replica_id: int
    directory_id: uuid.UUID | None
    log_end_offset: int
    last_fetch_timestamp: int
    last_caught_up_timestamp: int


@dataclass(frozen=True)
class QuorumNode:
    """A voter's endpoints (DescribeQuorum v2's Nodes): (listener name, host, port)."""

    node_id: int
    listeners: tuple[tuple[str, str, int], ...]


@dataclass(frozen=True)
class QuorumDescription:
    leader_id: int
    leader_epoch: int
    high_watermark: int
    voters: tuple[QuorumReplica, ...]
    observers: tuple[QuorumReplica, ...]
    nodes: tuple[QuorumNode, ...]


def _replicas(states: Sequence[Any]) -> tuple[QuorumReplica, ...]:
    return tuple(
        QuorumReplica(
            int(s.replica_id),
            getattr(s, "replica_directory_id", None),
            int(s.log_end_offset),
            int(getattr(s, "last_fetch_timestamp", -1)),
            int(getattr(s, "last_caught_up_timestamp", -1)),
        )
        for s in states
    )


class QuorumAdmin:
    """DescribeQuorum, AddRaftVoter and RemoveRaftVoter against a cluster's controller."""

    def __init__(self, cluster: Cluster, *, timeout_ms: int = DEFAULT_VOTER_CHANGE_TIMEOUT_MS):
        self.cluster = cluster
        self.timeout_ms = timeout_ms

    async def _controller_call(self, api: str, values: dict[str, Any]) -> Any:
        async def attempt() -> Any:
            connection = await self.cluster.controller()
            response = await call_negotiated(
                connection, api, values, QUORUM_API_VERSIONS, timeout_ms=self.timeout_ms + 5_000
            )
            if error_of(response.error_code) == ErrorCode.not_controller:
                raise KafkaError(ErrorCode.not_controller, api)
            return response

        return await self.cluster.retrying(attempt)

    async def describe_quorum(self) -> QuorumDescription:
        values = {
            "topics": [{"topic_name": METADATA_TOPIC, "partitions": [{"partition_index": 0}]}]
        }
        response = await self._controller_call("describe_quorum", values)
        raise_for(response.error_code, "describe_quorum", response.error_message)
        partition = response.topics[0].partitions[0]
        raise_for(partition.error_code, "describe_quorum __cluster_metadata-0")
        nodes = tuple(
            QuorumNode(
                int(n.node_id),
                tuple((str(x.name), str(x.host), int(x.port)) for x in n.listeners),
            )
            for n in getattr(response, "nodes", ())
        )
        return QuorumDescription(
            int(partition.leader_id),
            int(partition.leader_epoch),
            int(partition.high_watermark),
            _replicas(partition.current_voters),
            _replicas(partition.observers),
            nodes,
        )

    async def add_voter(
        self,
        voter_id: int,
        listeners: Sequence[tuple[str, str, int]],
        *,
        directory_id: uuid.UUID | None = None,
        cluster_id: str | None = None,
    ) -> None:
        """Make voter_id (an observer that has caught up) a voter; returns once committed."""
        values = {
            "cluster_id": cluster_id,
            "timeout": self.timeout_ms,
            "voter_id": voter_id,
            "voter_directory_id": directory_id,
            "listeners": [{"name": n, "host": h, "port": p} for n, h, p in listeners],
        }
        response = await self._controller_call("add_raft_voter", values)
        raise_for(response.error_code, f"add_raft_voter {voter_id}", response.error_message)

    async def remove_voter(
        self,
        voter_id: int,
        *,
        directory_id: uuid.UUID | None = None,
        cluster_id: str | None = None,
    ) -> None:
        """Remove voter_id from the voters (the leader too); returns once committed."""
        values = {
            "cluster_id": cluster_id,
            "voter_id": voter_id,
            "voter_directory_id": directory_id,
        }
        response = await self._controller_call("remove_raft_voter", values)
        raise_for(response.error_code, f"remove_raft_voter {voter_id}", response.error_message)
