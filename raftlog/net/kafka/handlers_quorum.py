"""KIP-853 controller membership on the Kafka listener: AddRaftVoter (80), RemoveRaftVoter
(81), UpdateRaftVoter (82), and DescribeQuorum v0-2 with the voters' endpoints and the
observers.

The handlers check, in this order: authorization as Kafka does (ALTER on the cluster for Add
and Remove, CLUSTER_ACTION for Update, which controllers send, DESCRIBE on the cluster for
DescribeQuorum); the cluster id when the request names one (INCONSISTENT_CLUSTER_ID); every
field's range, by decoding the voter through the Raft layer's declared codec (INVALID_REQUEST
otherwise). Then the node's metadata quorum is asked. Only the Raft leader changes
membership: any other node answers NOT_CONTROLLER and the client goes to the controller (the
Raft leader) itself. No internal RPC changes membership, so nothing on the internal listener
can forge a change: the voter set only ever comes from the leader's log.

`register_quorum_apis(registry, quorum, cluster_id)` serves them on a node with a metadata
quorum; `QuorumAccess` is what it needs of the quorum (the Raft driver provides it).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from raftlog.codec import Codec, DecodeError
from raftlog.constants import METADATA_TOPIC
from raftlog.errors import ErrorCode
from raftlog.metadata.raft.describe import QuorumDescription, ReplicaProgress
from raftlog.metadata.raft.membership import MembershipRefused
from raftlog.metadata.raft.types import NotLeader
from raftlog.metadata.raft.voters import NO_DIRECTORY_ID, Endpoint, Voter
from raftlog.net.kafka import authz
from raftlog.net.kafka.apis import ApiKey, ApiRegistry
from raftlog.net.kafka.context import RequestContext
from raftlog.net.kafka.handlers_util import log, to_ms

__all__ = [
    "DEFAULT_VOTER_CHANGE_TIMEOUT_MS",
    "MAX_VOTER_CHANGE_TIMEOUT_MS",
    "QuorumAccess",
    "register_quorum_apis",
]

# AddRaftVoter names its own timeout; the others wait this long for the change to commit.
DEFAULT_VOTER_CHANGE_TIMEOUT_MS = 30_000
# A request may not hold its handler (and a connection slot) longer than this.
MAX_VOTER_CHANGE_TIMEOUT_MS = 120_000

_CODEC = Codec()


class QuorumAccess(Protocol):
    """What the handlers need of the node's metadata quorum (raft.driver.QuorumDriver)."""

    async def add_voter(self, voter: Voter, *, timeout_ms: int) -> None: ...

    async def remove_voter(
        self, voter_id: int, directory_id: uuid.UUID, *, timeout_ms: int
    ) -> None: ...

    async def update_voter(self, voter: Voter, *, timeout_ms: int) -> None: ...


# DescribeQuorum's source: the leader's description, asked of the leader when this node is
# not it; raises NotLeader when there is no leader to ask.
Describer = Callable[[], Awaitable[QuorumDescription]]


def _voter_from_request(request: Any) -> Voter:
    """The voter a request names, range-checked by the Raft layer's own declaration (ids,
    host and listener name lengths, port, endpoint count): DecodeError if out of range."""
    directory_id = request.voter_directory_id or NO_DIRECTORY_ID
    endpoints = tuple(Endpoint(str(x.name), str(x.host), int(x.port)) for x in request.listeners)
    unchecked = Voter(int(request.voter_id), directory_id, endpoints)
    # Encoding trusts its input; decoding checks every bound of the declaration.
    voter: Voter = _CODEC.from_wire(Voter, _CODEC.to_wire(unchecked))
    return voter


def _change_error(exc: Exception) -> tuple[ErrorCode, str | None]:
    if isinstance(exc, MembershipRefused):
        return exc.error_code, exc.message
    if isinstance(exc, NotLeader):
        return ErrorCode.not_controller, "this node is not the metadata quorum leader"
    raise exc


def _cluster_mismatch(request: Any, cluster_id: str) -> bool:
    named = getattr(request, "cluster_id", None)
    return named is not None and named != cluster_id


def register_quorum_apis(
    registry: ApiRegistry, quorum: QuorumAccess, describe: Describer, cluster_id: str
) -> None:
    """Serve AddRaftVoter, RemoveRaftVoter, UpdateRaftVoter and DescribeQuorum v0-2."""

    async def handle_add_raft_voter(ctx: RequestContext, request: Any) -> dict[str, Any]:
        def answer(code: ErrorCode, message: str | None = None) -> dict[str, Any]:
            return {"throttle_time": 0, "error_code": code, "error_message": message}

        refusal = authz.cluster_refusal(ctx, authz.ALTER_CLUSTER)
        if refusal is not None:
            return answer(refusal)
        if _cluster_mismatch(request, cluster_id):
            return answer(ErrorCode.inconsistent_cluster_id)
        timeout_ms = to_ms(request.timeout, DEFAULT_VOTER_CHANGE_TIMEOUT_MS)
        try:
            voter = _voter_from_request(request)
        except DecodeError as exc:
            return answer(ErrorCode.invalid_request, f"AddRaftVoter: {exc}")
        if not 0 <= timeout_ms <= MAX_VOTER_CHANGE_TIMEOUT_MS:
            return answer(ErrorCode.invalid_request, "timeout out of range")
        if not voter.endpoints:
            return answer(ErrorCode.invalid_request, "a new voter needs a listener")
        try:
            await quorum.add_voter(voter, timeout_ms=timeout_ms)
        except (MembershipRefused, NotLeader) as exc:
            return answer(*_change_error(exc))
        log.info("AddRaftVoter: node %d is a voter (asked by %s)", voter.voter_id, ctx.client_id)
        return answer(ErrorCode.none)

    async def handle_remove_raft_voter(ctx: RequestContext, request: Any) -> dict[str, Any]:
        def answer(code: ErrorCode, message: str | None = None) -> dict[str, Any]:
            return {"throttle_time": 0, "error_code": code, "error_message": message}

        refusal = authz.cluster_refusal(ctx, authz.ALTER_CLUSTER)
        if refusal is not None:
            return answer(refusal)
        if _cluster_mismatch(request, cluster_id):
            return answer(ErrorCode.inconsistent_cluster_id)
        voter_id = int(request.voter_id)
        if voter_id < 0:
            return answer(ErrorCode.invalid_request, "voter_id out of range")
        directory_id = request.voter_directory_id or NO_DIRECTORY_ID
        try:
            await quorum.remove_voter(
                voter_id, directory_id, timeout_ms=DEFAULT_VOTER_CHANGE_TIMEOUT_MS
            )
        except (MembershipRefused, NotLeader) as exc:
            return answer(*_change_error(exc))
        log.info("RemoveRaftVoter: node %d is no longer a voter", voter_id)
        return answer(ErrorCode.none)

    async def handle_update_raft_voter(ctx: RequestContext, request: Any) -> dict[str, Any]:
        def answer(code: ErrorCode) -> dict[str, Any]:
            # current_leader is a hint; this node names no endpoint it cannot vouch for.
            leader = {"leader_id": -1, "leader_epoch": -1, "host": "", "port": 0}
            return {"throttle_time": 0, "error_code": code, "current_leader": leader}

        refusal = authz.cluster_refusal(ctx, authz.CLUSTER_ACTION)
        if refusal is not None:
            return answer(refusal)
        if _cluster_mismatch(request, cluster_id):
            return answer(ErrorCode.inconsistent_cluster_id)
        try:
            voter = _voter_from_request(request)
        except DecodeError:
            return answer(ErrorCode.invalid_request)
        if not voter.endpoints:
            return answer(ErrorCode.invalid_request)
        try:
            await quorum.update_voter(voter, timeout_ms=DEFAULT_VOTER_CHANGE_TIMEOUT_MS)
        except (MembershipRefused, NotLeader) as exc:
            return answer(_change_error(exc)[0])
        return answer(ErrorCode.none)

    async def handle_describe_quorum(ctx: RequestContext, request: Any) -> dict[str, Any]:
        refusal = authz.cluster_refusal(ctx, authz.DESCRIBE_CLUSTER)
        if refusal is not None:
            return {"error_code": refusal, "error_message": None, "topics": [], "nodes": []}
        described: QuorumDescription | None = None
        topics = []
        for topic in request.topics:
            partitions = []
            for p in topic.partitions:
                entry: dict[str, Any] = {
                    "partition_index": p.partition_index,
                    "error_code": ErrorCode.none,
                    "error_message": None,
                    "leader_id": -1,
                    "leader_epoch": -1,
                    "high_watermark": -1,
                    "current_voters": [],
                    "observers": [],
                }
                if topic.topic_name != METADATA_TOPIC or p.partition_index != 0:
                    entry["error_code"] = ErrorCode.unknown_topic_or_partition
                else:
                    try:
                        described = described or await describe()
                    except NotLeader:
                        # A client retries this (after refreshing metadata).
                        entry["error_code"] = ErrorCode.not_leader_or_follower
                    else:
                        entry.update(
                            leader_id=described.leader_id,
                            leader_epoch=described.leader_epoch,
                            high_watermark=described.high_watermark,
                            current_voters=[_replica(v) for v in described.voters],
                            observers=[_replica(o) for o in described.observers],
                        )
                partitions.append(entry)
            topics.append({"topic_name": topic.topic_name, "partitions": partitions})
        nodes = []
        if described is not None and ctx.api_version >= 2:
            nodes = [
                {
                    "node_id": v.voter_id,
                    "listeners": [
                        {"name": e.name, "host": e.host, "port": e.port} for e in v.endpoints
                    ],
                }
                for v in described.nodes
            ]
        return {
            "error_code": ErrorCode.none,
            "error_message": None,
            "topics": topics,
            "nodes": nodes,
        }

    registry.register(ApiKey.ADD_RAFT_VOTER, 0, 0, handle_add_raft_voter)
    registry.register(ApiKey.REMOVE_RAFT_VOTER, 0, 0, handle_remove_raft_voter)
    registry.register(ApiKey.UPDATE_RAFT_VOTER, 0, 0, handle_update_raft_voter)
    registry.register(ApiKey.DESCRIBE_QUORUM, 0, 2, handle_describe_quorum)


def _replica(progress: ReplicaProgress) -> dict[str, Any]:
    directory_id = progress.directory_id
    return {
        "replica_id": progress.replica_id,
        # v2 names the directory; a voter from the static config has none (Kafka's zero).
        "replica_directory_id": directory_id if directory_id != NO_DIRECTORY_ID else None,
        "log_end_offset": progress.log_end_offset,
        "last_fetch_timestamp": progress.last_fetch_timestamp_ms,
        "last_caught_up_timestamp": progress.last_caught_up_timestamp_ms,
    }
