"""Consumer-group admin and offset look-ups: list/describe groups, committed offsets, lag.

The group APIs (FindCoordinator, ListGroups, DescribeGroups, OffsetFetch, OffsetCommit,
DeleteGroups, and the membership APIs group_member.py uses) and OffsetForLeaderEpoch are
negotiated here, per connection, from the versions the broker announced in ApiVersions, so
the shared client table does not have to know about them. A
broker that serves no group API gets a clear UnsupportedVersion rather than a wire error.

Group requests go to the group's coordinator (FindCoordinator first); coordinator moves and
loads are retried a bounded number of times, like leadership errors in Cluster.retrying.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio

from raftlog.client.admin import Admin
from raftlog.client.cluster import Cluster, raise_for
from raftlog.client.connection import (
    BrokerConnection,
    ConnectionClosed,
    UnsupportedVersion,
    call_negotiated,
)
from raftlog.client.consumer_protocol import ConsumerProtocolError, decode_assignment
from raftlog.client.coordinator import (
    COORDINATOR_RETRIABLE,
    GROUP_KEY_TYPE,
    CoordinatorRetries,
    find_coordinator,
    with_coordinator,
)
from raftlog.client.protocol import error_of
from raftlog.errors import ErrorCode, KafkaError

T = TypeVar("T")

# api name -> (min, max) version this module speaks (FindCoordinator: coordinator.py). The
# upper ends stop before the batched (multi-group) forms, which need nothing this client uses.
GROUP_API_VERSIONS: dict[str, tuple[int, int]] = {
    "list_groups": (1, 4),
    "describe_groups": (1, 5),
    "offset_fetch": (1, 7),
    "offset_commit": (2, 8),
    "offset_for_leader_epoch": (2, 4),
    "delete_groups": (0, 2),
    # Membership (raftlog.client.group_member). JoinGroup v4+ has KIP-394's
    # MEMBER_ID_REQUIRED round trip, which the member handles; LeaveGroup v3+ names members
    # in a list, and build() drops whichever form a version lacks.
    "join_group": (1, 9),
    "sync_group": (1, 5),
    "heartbeat": (1, 4),
    "leave_group": (1, 5),
}
# Group requests retry a moved or loading coordinator this often, this far apart.
GROUP_RETRIES = CoordinatorRetries()
MAX_COORDINATOR_RETRIES = GROUP_RETRIES.max_retries
COORDINATOR_BACKOFF_MS = GROUP_RETRIES.backoff_ms
# Groups named in one DeleteGroups call; the broker refuses a longer list as a whole.
MAX_DELETE_GROUPS = 1_000
NO_OFFSET = -1


async def call(
    connection: BrokerConnection,
    api: str,
    values: dict[str, Any],
    *,
    timeout_ms: int | None = None,
) -> Any:
    """Send api at the version negotiated with GROUP_API_VERSIONS; timeout_ms overrides the
    connection's (JoinGroup is parked by the coordinator for up to the rebalance timeout)."""
    return await call_negotiated(connection, api, values, GROUP_API_VERSIONS, timeout_ms=timeout_ms)


def offset_commit_values(
    group_id: str,
    offsets: dict[tuple[str, int], int],
    *,
    generation_id: int = -1,
    member_id: str = "",
    group_instance_id: str | None = None,
) -> dict[str, Any]:
    """OffsetCommit request fields; generation -1 with no member id is a standalone commit."""
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        by_topic.setdefault(topic, []).append(
            {
                "partition_index": partition,
                "committed_offset": offset,
                "committed_leader_epoch": -1,
                "commit_timestamp": -1,
                "committed_metadata": "",
            }
        )
    return {
        "group_id": group_id,
        "generation_id_or_member_epoch": generation_id,
        "member_id": member_id,
        "group_instance_id": group_instance_id,
        "retention_time_ms": -1,
        "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()],
    }


def raise_for_commit(response: Any, group_id: str) -> None:
    """Raise the first partition error of an OffsetCommit response (KafkaError)."""
    for t in response.topics:
        for p in t.partitions:
            raise_for(p.error_code, f"offset_commit {group_id} {t.name}-{p.partition_index}")


@dataclass(frozen=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str


@dataclass(frozen=True)
class GroupMember:
    member_id: str
    client_id: str
    client_host: str
    group_instance_id: str | None
    # (topic, partition) pairs from the consumer protocol assignment.
    assignment: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    coordinator_id: int
    members: tuple[GroupMember, ...]


@dataclass(frozen=True)
class CommittedOffset:
    topic: str
    partition: int
    offset: int  # -1: nothing committed
    high_watermark: int  # -1 when unknown (the partition has no leader)
    metadata: str | None = None

    @property
    def lag(self) -> int | None:
        if self.offset < 0 or self.high_watermark < 0:
            return None
        return max(0, self.high_watermark - self.offset)


@dataclass(frozen=True)
class PartitionOffsets:
    """A partition's high watermark and its leader's log end offset."""

    high_watermark: int
    log_end_offset: int
    log_start_offset: int = field(default=0)


def described_assignment(data: bytes | None) -> tuple[tuple[str, int], ...]:
    """The sorted (topic, partition) pairs of a member's ConsumerProtocolAssignment, as
    DescribeGroups shows them.

    An empty assignment gives (); so do bytes that do not decode, because a describe must not
    fail on one member's odd bytes.
    """
    try:
        return tuple(sorted(decode_assignment(data or b"")))
    except ConsumerProtocolError:
        return ()


class GroupAdmin:
    """Group listing, description and committed offsets over a Cluster."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def find_coordinator(self, group_id: str) -> tuple[int, tuple[str, int]]:
        """FindCoordinator once: the coordinator's node id and address (KafkaError if the
        answer is an error, e.g. COORDINATOR_NOT_AVAILABLE while it loads)."""
        return await find_coordinator(self.cluster, group_id, GROUP_KEY_TYPE)

    async def _with_coordinator(
        self, group_id: str, operation: Callable[[int, BrokerConnection], Awaitable[T]]
    ) -> T:
        return await with_coordinator(
            self.cluster, group_id, GROUP_KEY_TYPE, operation, GROUP_RETRIES
        )

    async def list_groups(self) -> list[GroupListing]:
        """Groups of every broker (each lists the groups it coordinates), sorted by id."""
        await self.cluster.refresh_metadata([])
        addresses = list(self.cluster.brokers.values()) or self.cluster.bootstrap
        found: dict[str, GroupListing] = {}
        for address in addresses:
            connection = await self.cluster.connect(address)
            response = await call(connection, "list_groups", {"states_filter": []})
            raise_for(response.error_code, "list_groups")
            for g in response.groups:
                found[g.group_id] = GroupListing(
                    group_id=g.group_id,
                    protocol_type=g.protocol_type,
                    state=getattr(g, "group_state", "") or "",
                )
        return [found[name] for name in sorted(found)]

    async def describe_group(self, group_id: str) -> GroupDescription:
        async def describe(node_id: int, connection: BrokerConnection) -> GroupDescription:
            response = await call(
                connection,
                "describe_groups",
                {"groups": [group_id], "include_authorized_operations": False},
            )
            g = response.groups[0]
            raise_for(g.error_code, f"describe_groups {group_id}")
            members = tuple(
                GroupMember(
                    member_id=m.member_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    group_instance_id=getattr(m, "group_instance_id", None),
                    assignment=(
                        described_assignment(m.member_assignment)
                        if g.protocol_type == "consumer"
                        else ()
                    ),
                )
                for m in g.members
            )
            return GroupDescription(
                group_id=g.group_id,
                state=g.group_state,
                protocol_type=g.protocol_type,
                protocol=g.protocol_data,
                coordinator_id=node_id,
                members=tuple(sorted(members, key=lambda m: m.member_id)),
            )

        return await self._with_coordinator(group_id, describe)

    async def committed_positions(
        self, group_id: str, partitions: Sequence[tuple[str, int]] | None
    ) -> dict[tuple[str, int], int]:
        """The committed offset of each partition that has one, of those given (None: of all
        the group has committed); no high watermark look-ups: what a consumer needs to start."""
        response = await self._offset_fetch(group_id, partitions)
        out: dict[tuple[str, int], int] = {}
        for t in response.topics:
            for p in t.partitions:
                raise_for(p.error_code, f"offset_fetch {group_id} {t.name}-{p.partition_index}")
                if int(p.committed_offset) >= 0:
                    out[(t.name, int(p.partition_index))] = int(p.committed_offset)
        return out

    async def committed_offsets(
        self, group_id: str, partitions: Sequence[tuple[str, int]] | None = None
    ) -> list[CommittedOffset]:
        """Committed offset, high watermark and lag per partition (None: all committed)."""
        response = await self._offset_fetch(group_id, partitions)
        out = []
        for t in response.topics:
            for p in t.partitions:
                raise_for(p.error_code, f"offset_fetch {group_id} {t.name}-{p.partition_index}")
                partition = int(p.partition_index)
                out.append(
                    CommittedOffset(
                        topic=t.name,
                        partition=partition,
                        offset=int(p.committed_offset),
                        high_watermark=await self._high_watermark(t.name, partition),
                        metadata=p.metadata,
                    )
                )
        return sorted(out, key=lambda c: (c.topic, c.partition))

    async def _offset_fetch(
        self, group_id: str, partitions: Sequence[tuple[str, int]] | None
    ) -> Any:
        async def fetch(node_id: int, connection: BrokerConnection) -> Any:
            topics: list[dict[str, Any]] | None = None
            if partitions is not None:
                by_topic: dict[str, list[int]] = {}
                for topic, partition in partitions:
                    by_topic.setdefault(topic, []).append(partition)
                topics = [
                    {"name": t, "partition_indexes": sorted(ps)} for t, ps in by_topic.items()
                ]
            response = await call(
                connection,
                "offset_fetch",
                {"group_id": group_id, "topics": topics, "require_stable": False},
            )
            raise_for(getattr(response, "error_code", 0), f"offset_fetch {group_id}")
            return response

        return await self._with_coordinator(group_id, fetch)

    async def commit_offsets(self, group_id: str, offsets: dict[tuple[str, int], int]) -> None:
        """Commit as a standalone (simple) consumer: generation -1, no member id.

        Kafka accepts such commits only while the group has no active members (a group
        member commits through raftlog.client.group_member instead).
        """
        values = offset_commit_values(group_id, offsets)

        async def commit(node_id: int, connection: BrokerConnection) -> None:
            raise_for_commit(await call(connection, "offset_commit", values), group_id)

        await self._with_coordinator(group_id, commit)

    async def delete_groups(self, group_ids: Sequence[str]) -> dict[str, ErrorCode]:
        """DeleteGroups, one request per coordinator: each group's result code (NONE: deleted;
        NON_EMPTY_GROUP: it has members; GROUP_ID_NOT_FOUND: no such group).

        A group whose coordinator moved or is loading is located again and retried, a bounded
        number of times; after that its last code is returned, not raised, so one group's
        trouble does not hide the others' results.
        """
        wanted = list(dict.fromkeys(group_ids))
        if len(wanted) > MAX_DELETE_GROUPS:
            raise ValueError(f"at most {MAX_DELETE_GROUPS} groups per delete, got {len(wanted)}")
        results: dict[str, ErrorCode] = {}
        pending = wanted
        attempt = 0
        while pending:
            by_coordinator: dict[tuple[str, int], list[str]] = {}
            for group_id in pending:
                try:
                    _, address = await self.find_coordinator(group_id)
                except KafkaError as exc:
                    results[group_id] = exc.code
                    continue
                by_coordinator.setdefault(address, []).append(group_id)
            for address, ids in by_coordinator.items():
                try:
                    connection = await self.cluster.connect(address)
                    response = await call(connection, "delete_groups", {"groups_names": ids})
                except (ConnectionClosed, OSError):
                    if attempt >= MAX_COORDINATOR_RETRIES:
                        raise
                    for group_id in ids:
                        results[group_id] = ErrorCode.coordinator_not_available
                    continue
                answered = {r.group_id: error_of(r.error_code) for r in response.results}
                for group_id in ids:
                    # A group the answer leaves out was not acted on: ask again.
                    results[group_id] = answered.get(group_id, ErrorCode.coordinator_not_available)
            pending = [g for g in pending if results[g] in COORDINATOR_RETRIABLE]
            if not pending or attempt >= MAX_COORDINATOR_RETRIES:
                break
            attempt += 1
            # A back-off between attempts, not a wait for state: the next attempt re-checks.
            await trio.sleep(COORDINATOR_BACKOFF_MS * attempt / 1000)
        return {group_id: results[group_id] for group_id in wanted}

    async def _high_watermark(self, topic: str, partition: int) -> int:
        try:
            return (await Admin(self.cluster).list_offsets(topic, partition, "latest")).offset
        except KafkaError:
            return -1


async def partition_offsets(cluster: Cluster, topic: str, partition: int) -> PartitionOffsets:
    """High watermark (ListOffsets latest) and log end offset (OffsetForLeaderEpoch at the
    current leader epoch, which the leader answers with its LEO) of one partition."""
    admin = Admin(cluster)
    high_watermark = (await admin.list_offsets(topic, partition, "latest")).offset
    log_start = (await admin.list_offsets(topic, partition, "earliest")).offset

    async def attempt() -> int:
        connection, info = await cluster.leader(topic, partition)
        response = await call(
            connection,
            "offset_for_leader_epoch",
            {
                "replica_id": -1,
                "topics": [
                    {
                        "topic": topic,
                        "partitions": [
                            {
                                "partition": partition,
                                "current_leader_epoch": info.leader_epoch,
                                "leader_epoch": max(info.leader_epoch, 0),
                            }
                        ],
                    }
                ],
            },
        )
        result = response.topics[0].partitions[0]
        raise_for(result.error_code, f"offset_for_leader_epoch {topic}-{partition}")
        return int(result.end_offset)

    try:
        log_end = await cluster.retrying(attempt, refresh_topics=[topic])
    except UnsupportedVersion:
        log_end = high_watermark
    return PartitionOffsets(high_watermark, max(log_end, high_watermark), log_start)


__all__ = [
    "GROUP_API_VERSIONS",
    "MAX_DELETE_GROUPS",
    "CommittedOffset",
    "GroupAdmin",
    "GroupDescription",
    "GroupListing",
    "GroupMember",
    "PartitionOffsets",
    "described_assignment",
    "offset_commit_values",
    "partition_offsets",
    "raise_for_commit",
]
