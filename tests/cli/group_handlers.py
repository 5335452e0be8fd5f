"""A test-only consumer-group coordinator on the wire, so the group commands are tested
against real FindCoordinator/ListGroups/DescribeGroups/OffsetFetch/OffsetCommit traffic
while the broker's own group handlers are not registered on the memory backend's server.

It keeps groups as plain data the tests fill in; it is not a group protocol implementation.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from raftlog.errors import ErrorCode
from raftlog.net.kafka.apis import ApiRegistry, default_registry
from raftlog.net.kafka.context import RequestContext

FIND_COORDINATOR = 10
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16


@dataclass
class Member:
    member_id: str
    client_id: str
    client_host: str
    assignment: list[tuple[str, int]]


@dataclass
class GroupState:
    state: str = "Empty"
    protocol_type: str = "consumer"
    protocol: str = ""
    members: list[Member] = field(default_factory=list)


@dataclass
class GroupStore:
    port: int = 0
    groups: dict[str, GroupState] = field(default_factory=dict)
    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)


def encode_assignment(pairs: list[tuple[str, int]]) -> bytes:
    """ConsumerProtocolAssignment v0."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in pairs:
        by_topic.setdefault(topic, []).append(partition)
    out = struct.pack(">hi", 0, len(by_topic))
    for topic, partitions in by_topic.items():
        name = topic.encode()
        out += struct.pack(">h", len(name)) + name + struct.pack(">i", len(partitions))
        out += b"".join(struct.pack(">i", p) for p in partitions)
    return out + struct.pack(">i", -1)


def group_registry(store: GroupStore) -> ApiRegistry:
    registry = default_registry()

    async def find_coordinator(ctx: RequestContext, request: Any) -> dict[str, Any]:
        keys = getattr(request, "coordinator_keys", None) or [getattr(request, "key", "")]
        coordinators = [
            {
                "key": key,
                "node_id": 1,
                "host": "127.0.0.1",
                "port": store.port,
                "error_code": ErrorCode.none,
                "error_message": None,
            }
            for key in keys
        ]
        return {"throttle_time": 0, **coordinators[0], "coordinators": coordinators}

    async def list_groups(ctx: RequestContext, request: Any) -> dict[str, Any]:
        groups = [
            {"group_id": gid, "protocol_type": g.protocol_type, "group_state": g.state}
            for gid, g in store.groups.items()
        ]
        return {"throttle_time": 0, "error_code": ErrorCode.none, "groups": groups}

    async def describe_groups(ctx: RequestContext, request: Any) -> dict[str, Any]:
        described = []
        for gid in request.groups:
            g = store.groups.get(gid, GroupState(state="Dead", protocol_type=""))
            described.append(
                {
                    "error_code": ErrorCode.none,
                    "group_id": gid,
                    "group_state": g.state,
                    "protocol_type": g.protocol_type,
                    "protocol_data": g.protocol,
                    "members": [
                        {
                            "member_id": m.member_id,
                            "group_instance_id": None,
                            "client_id": m.client_id,
                            "client_host": m.client_host,
                            "member_metadata": b"",
                            "member_assignment": encode_assignment(m.assignment),
                        }
                        for m in g.members
                    ],
                    "authorized_operations": -2147483648,
                }
            )
        return {"throttle_time": 0, "groups": described}

    async def offset_fetch(ctx: RequestContext, request: Any) -> dict[str, Any]:
        wanted: dict[str, list[int]] = {}
        if request.topics is None:
            for gid, topic, partition in sorted(store.offsets):
                if gid == request.group_id:
                    wanted.setdefault(topic, []).append(partition)
        else:
            wanted = {t.name: list(t.partition_indexes) for t in request.topics}
        topics = [
            {
                "name": topic,
                "partitions": [
                    {
                        "partition_index": p,
                        "committed_offset": store.offsets.get((request.group_id, topic, p), -1),
                        "committed_leader_epoch": -1,
                        "metadata": "",
                        "error_code": ErrorCode.none,
                    }
                    for p in partitions
                ],
            }
            for topic, partitions in wanted.items()
        ]
        return {"throttle_time": 0, "topics": topics, "error_code": ErrorCode.none}

    async def offset_commit(ctx: RequestContext, request: Any) -> dict[str, Any]:
        topics = []
        for t in request.topics:
            for p in t.partitions:
                store.offsets[(request.group_id, t.name, p.partition_index)] = int(
                    p.committed_offset
                )
            store.groups.setdefault(request.group_id, GroupState())
            topics.append(
                {
                    "name": t.name,
                    "partitions": [
                        {"partition_index": p.partition_index, "error_code": ErrorCode.none}
                        for p in t.partitions
                    ],
                }
            )
        return {"throttle_time": 0, "topics": topics}

    registry.register(FIND_COORDINATOR, 1, 4, find_coordinator)
    registry.register(LIST_GROUPS, 1, 4, list_groups)
    registry.register(DESCRIBE_GROUPS, 1, 5, describe_groups)
    registry.register(OFFSET_FETCH, 1, 7, offset_fetch)
    registry.register(OFFSET_COMMIT, 2, 8, offset_commit)
    return registry
