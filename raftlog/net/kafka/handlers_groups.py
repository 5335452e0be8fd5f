"""Consumer-group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, DeleteGroups (and OffsetDelete, from
handlers_offset_delete.py).

Each handler maps the kio request of whatever version the client spoke onto the
version-neutral types of raftlog.groups.messages, calls the node's GroupService, and maps the
answer back to a dict of kio field names (`codec.build` drops what the version lacks). The
group logic itself lives in raftlog.groups; nothing here decides membership or offsets.

Authorization (authz.API_RULES) is checked here, before the coordinator sees a request, as
Kafka's KafkaApis does: READ on the group for membership and commits (and READ on each
committed topic), DESCRIBE on the group for lookups, DELETE to delete it.

FindCoordinator for a transactional id (key type 1, KIP-98) asks the node's TxnService when
it has one (and TxnOffsetCommit, handlers_txn_offsets.py, is served then too); without one the
answer is COORDINATOR_NOT_AVAILABLE.

`register_group_apis(registry, service, txn_service)` adds them to an ApiRegistry;
`GROUP_VERSION_TABLE` is the advertised ranges (why each: docs/protocol.md, "Consumer groups").
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from raftlog.constants import NO_AUTHORIZED_OPERATIONS
from raftlog.errors import ErrorCode
from raftlog.groups import messages as m
from raftlog.groups.service import CoordinatorLocation, GroupService
from raftlog.net.kafka import authz
from raftlog.net.kafka.apis import ApiKey, ApiRegistry
from raftlog.net.kafka.context import Handler, RequestContext
from raftlog.net.kafka.handlers_consumer_group import register_consumer_group_apis
from raftlog.net.kafka.handlers_offset_delete import OffsetDeleteHandler
from raftlog.net.kafka.handlers_txn_offsets import register_txn_offset_commit
from raftlog.net.kafka.handlers_txn_partitions import valid_transactional_id
from raftlog.net.kafka.handlers_util import partition_counts, to_ms
from raftlog.security.acl import ResourceType

if TYPE_CHECKING:
    from raftlog.txn.service import TxnService

log = logging.getLogger("raftlog.kafka")

# FindCoordinator key types (KIP-98 transaction, KIP-932 share).
KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1
# ListGroups v5 reports and filters by group type: "classic" (JoinGroup/SyncGroup) or
# "consumer" (KIP-848, handlers_consumer_group.py).
CLASSIC_GROUP_TYPE = "classic"
# Bounds on one request's fan-out, so a single request cannot make the node do unbounded
# work (Kafka has no such limit; real clients send one group or a handful).
MAX_COORDINATOR_KEYS_PER_REQUEST = 10_000
MAX_GROUPS_PER_REQUEST = 10_000


# api key -> (min version, max version). Minimums are the oldest kio models (Kafka 4's);
# maximums are the newest that still name topics and use the classic protocol.
GROUP_VERSION_TABLE: dict[int, tuple[int, int]] = {
    # v0 must be in range: librdkafka enables LZ4 only when FindCoordinator v0 is.
    ApiKey.FIND_COORDINATOR: (0, 6),
    ApiKey.JOIN_GROUP: (0, 9),
    ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.HEARTBEAT: (0, 4),
    ApiKey.LEAVE_GROUP: (0, 5),
    # v10 addresses topics by id only.
    ApiKey.OFFSET_COMMIT: (2, 9),
    ApiKey.OFFSET_FETCH: (1, 9),
    ApiKey.LIST_GROUPS: (0, 5),
    ApiKey.DESCRIBE_GROUPS: (0, 6),
    ApiKey.DELETE_GROUPS: (0, 2),
    # KIP-496 (handlers_offset_delete.py); v0 is the only version.
    ApiKey.OFFSET_DELETE: (0, 0),
}


def register_group_apis(
    registry: ApiRegistry, service: GroupService, txn_service: TxnService | None = None
) -> None:
    """Add every group API, answered by `service`, to `registry` (call once per node). With
    `txn_service`, FindCoordinator locates transaction coordinators through it and
    TxnOffsetCommit is served."""
    handlers = GroupHandlers(service, txn_service)
    table: dict[int, Handler] = {
        ApiKey.FIND_COORDINATOR: handlers.find_coordinator,
        ApiKey.JOIN_GROUP: handlers.join_group,
        ApiKey.SYNC_GROUP: handlers.sync_group,
        ApiKey.HEARTBEAT: handlers.heartbeat,
        ApiKey.LEAVE_GROUP: handlers.leave_group,
        ApiKey.OFFSET_COMMIT: handlers.offset_commit,
        ApiKey.OFFSET_FETCH: handlers.offset_fetch,
        ApiKey.LIST_GROUPS: handlers.list_groups,
        ApiKey.DESCRIBE_GROUPS: handlers.describe_groups,
        ApiKey.DELETE_GROUPS: handlers.delete_groups,
        ApiKey.OFFSET_DELETE: OffsetDeleteHandler(service).offset_delete,
    }
    for api_key, (lo, hi) in GROUP_VERSION_TABLE.items():
        registry.register(api_key, lo, hi, table[api_key])
    if txn_service is not None:
        register_txn_offset_commit(registry, service)
    register_consumer_group_apis(registry, service)  # KIP-848 (handlers_consumer_group.py)


# FindCoordinator: what each key type needs (a transactional id is its own resource).
_COORDINATOR_RULES = {
    KEY_TYPE_GROUP: authz.DESCRIBE_GROUP,
    KEY_TYPE_TRANSACTION: authz.DESCRIBE_TRANSACTIONAL_ID,
}


def _client_host(ctx: RequestContext) -> str:
    # Kafka reports InetAddress.toString(): "/127.0.0.1".
    host = ctx.connection.peer.rsplit(":", 1)[0]
    return f"/{host}"


def _error_message(code: ErrorCode) -> str | None:
    return None if code is ErrorCode.none else code.name.upper()


class GroupHandlers:
    """The group API handlers, bound to one GroupService (and the node's TxnService, for
    FindCoordinator of transactional ids)."""

    def __init__(self, service: GroupService, txn_service: TxnService | None = None) -> None:
        self.service = service
        self.txn_service = txn_service

    # ------------------------------------------------------------------ FindCoordinator
    async def _locate(self, key_type: int, key: str) -> CoordinatorLocation:
        if key_type == KEY_TYPE_TRANSACTION:
            if self.txn_service is None:
                # No transaction coordinator: retriable for the client, which then fails
                # its transactional init with a clear timeout instead of a protocol error.
                return CoordinatorLocation(ErrorCode.coordinator_not_available)
            if not valid_transactional_id(key):
                return CoordinatorLocation(ErrorCode.invalid_request)
            return await self.txn_service.coordinator_for(key)
        if key_type != KEY_TYPE_GROUP:
            return CoordinatorLocation(ErrorCode.invalid_request)
        return await self.service.coordinator_for(key)

    async def _locate_for(
        self, ctx: RequestContext, key_type: int, key: str
    ) -> CoordinatorLocation:
        """The coordinator's endpoint on the listener this request came in on."""
        rule = _COORDINATOR_RULES.get(key_type)
        if rule is not None and not authz.allows(ctx, rule, key):
            return CoordinatorLocation(rule.error)
        location = await self._locate(key_type, key)
        code, node_id, host, port = location
        if code != ErrorCode.none:
            return location
        return CoordinatorLocation(code, node_id, *ctx.advertised(node_id, host, port))

    async def find_coordinator(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        key_type = getattr(request, "key_type", KEY_TYPE_GROUP)
        if ctx.api_version >= 4:
            keys = list(request.coordinator_keys)
            if len(keys) > MAX_COORDINATOR_KEYS_PER_REQUEST:
                coordinators = [
                    _coordinator_dict(k, CoordinatorLocation(ErrorCode.invalid_request))
                    for k in keys
                ]
            else:
                coordinators = [
                    _coordinator_dict(k, await self._locate_for(ctx, key_type, k)) for k in keys
                ]
            return {"coordinators": coordinators}
        code, node_id, host, port = await self._locate_for(ctx, key_type, request.key)
        return {
            "error_code": code,
            "error_message": _error_message(code),
            "node_id": node_id,
            "host": host,
            "port": port,
        }

    # ------------------------------------------------------------------ membership
    async def join_group(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        if not authz.allows(ctx, authz.READ_GROUP, request.group_id):
            return {
                "error_code": authz.READ_GROUP.error,
                "generation_id": -1,
                "protocol_type": None,
                "protocol_name": None if ctx.api_version >= 7 else "",
                "leader": "",
                "skip_assignment": False,
                "member_id": request.member_id,
                "members": [],
            }
        session_timeout_ms = to_ms(request.session_timeout)
        req = m.JoinGroupRequest(
            group_id=request.group_id,
            member_id=request.member_id,
            protocol_type=request.protocol_type,
            protocols=tuple((p.name, bytes(p.metadata)) for p in request.protocols),
            session_timeout_ms=session_timeout_ms,
            # v0 has no rebalance timeout: Kafka uses the session timeout for both.
            rebalance_timeout_ms=to_ms(
                getattr(request, "rebalance_timeout", None), session_timeout_ms
            ),
            group_instance_id=getattr(request, "group_instance_id", None),
            client_id=ctx.client_id,
            client_host=_client_host(ctx),
            # KIP-394: only v4+ clients know to retry with the member id we hand out.
            require_known_member_id=ctx.api_version >= 4,
            supports_skip_assignment=ctx.api_version >= 9,
        )
        reason = getattr(request, "reason", None)
        if reason:
            log.debug("JoinGroup %r from %r: %s", req.group_id, req.member_id, reason)
        resp = await self.service.shell.join_group(req)
        protocol_name = resp.protocol_name
        if protocol_name is None and ctx.api_version < 7:
            protocol_name = ""  # non-nullable before v7
        return {
            "error_code": resp.error_code,
            "generation_id": resp.generation_id,
            "protocol_type": resp.protocol_type,
            "protocol_name": protocol_name,
            "leader": resp.leader,
            "skip_assignment": resp.skip_assignment,
            "member_id": resp.member_id,
            "members": [
                {
                    "member_id": mem.member_id,
                    "group_instance_id": mem.group_instance_id,
                    "metadata": mem.metadata,
                }
                for mem in resp.members
            ],
        }

    async def sync_group(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        if not authz.allows(ctx, authz.READ_GROUP, request.group_id):
            return {
                "error_code": authz.READ_GROUP.error,
                "protocol_type": None,
                "protocol_name": None,
                "assignment": b"",
            }
        req = m.SyncGroupRequest(
            group_id=request.group_id,
            generation_id=request.generation_id,
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            protocol_type=getattr(request, "protocol_type", None),
            protocol_name=getattr(request, "protocol_name", None),
            assignments=tuple((a.member_id, bytes(a.assignment)) for a in request.assignments),
        )
        resp = await self.service.shell.sync_group(req)
        return {
            "error_code": resp.error_code,
            "protocol_type": resp.protocol_type,
            "protocol_name": resp.protocol_name,
            "assignment": resp.assignment,
        }

    async def heartbeat(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        if not authz.allows(ctx, authz.READ_GROUP, request.group_id):
            return {"error_code": authz.READ_GROUP.error}
        req = m.HeartbeatRequest(
            group_id=request.group_id,
            generation_id=request.generation_id,
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
        )
        resp = await self.service.shell.heartbeat(req)
        return {"error_code": resp.error_code}

    async def leave_group(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        if not authz.allows(ctx, authz.READ_GROUP, request.group_id):
            return {"error_code": authz.READ_GROUP.error, "members": []}
        if ctx.api_version >= 3:
            members = tuple(
                m.LeaveMember(x.member_id, x.group_instance_id) for x in request.members
            )
        else:
            members = (m.LeaveMember(request.member_id),)
        resp = await self.service.shell.leave_group(m.LeaveGroupRequest(request.group_id, members))
        code = resp.error_code
        if ctx.api_version < 3 and code is ErrorCode.none and resp.members:
            # v0-2 have only the top-level code: it carries the one member's result.
            code = resp.members[0].error_code
        return {
            "error_code": code,
            "members": [
                {
                    "member_id": r.member_id,
                    "group_instance_id": r.group_instance_id,
                    "error_code": r.error_code,
                }
                for r in resp.members
            ],
        }

    # ------------------------------------------------------------------ offsets
    async def offset_commit(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        req = m.OffsetCommitRequest(
            group_id=request.group_id,
            topics=tuple(
                m.OffsetCommitTopic(
                    t.name,
                    tuple(
                        m.OffsetCommitPartition(
                            p.partition_index,
                            p.committed_offset,
                            getattr(p, "committed_leader_epoch", -1),
                            p.committed_metadata,
                        )
                        for p in t.partitions
                    ),
                )
                for t in request.topics
            ),
            generation_id=request.generation_id_or_member_epoch,
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
        )
        refused: tuple[m.TopicErrors, ...] = ()
        if ctx.authorizer is not None:
            req, refused = _authorized_commit(ctx, req)
        req, unknown = _existing_commit(ctx, req)
        refused += unknown
        # v2-4 carry a retention time; offsets do not expire yet (docs/groups.md).
        if req.topics or not refused:
            resp = await self.service.shell.offset_commit(req)
        else:
            resp = m.OffsetCommitResponse(())
        # One entry per topic, as Kafka answers, whichever check answered its partitions.
        answered: dict[str, list[dict[str, Any]]] = {}
        for t in refused + resp.topics:
            answered.setdefault(t.name, []).extend(
                {"partition_index": p.partition, "error_code": p.error_code} for p in t.partitions
            )
        return {
            "topics": [
                {"name": name, "partitions": partitions} for name, partitions in answered.items()
            ]
        }

    async def _fetch_one(
        self,
        ctx: RequestContext,
        group_id: str,
        topics: Iterable[Any] | None,
        require_stable: bool,
    ) -> tuple[m.OffsetFetchResponse, m.OffsetFetchRequest]:
        req = m.OffsetFetchRequest(
            group_id=group_id,
            topics=None
            if topics is None
            else tuple(m.OffsetFetchTopic(t.name, tuple(t.partition_indexes)) for t in topics),
            # KIP-447: partitions with undecided transactional offsets answer
            # UNSTABLE_OFFSET_COMMIT instead of an offset the transaction may still move.
            require_stable=require_stable,
        )
        if ctx.authorizer is None:
            return await self.service.shell.offset_fetch(req), req
        return await self._authorized_fetch(ctx, req), req

    async def _authorized_fetch(
        self, ctx: RequestContext, req: m.OffsetFetchRequest
    ) -> m.OffsetFetchResponse:
        """Kafka's OffsetFetch checks: DESCRIBE on the group (else GROUP_AUTHORIZATION_FAILED);
        named topics without DESCRIBE answer TOPIC_AUTHORIZATION_FAILED per partition; when
        all topics are asked for, those without DESCRIBE are left out."""
        if not authz.allows(ctx, authz.DESCRIBE_GROUP, req.group_id):
            return m.OffsetFetchResponse(authz.DESCRIBE_GROUP.error)
        if req.topics is None:
            resp = await self.service.shell.offset_fetch(req)
            describable = authz.allowed_names(
                ctx, authz.DESCRIBE_TOPIC, (t.name for t in resp.topics), log_denied=False
            )
            return m.OffsetFetchResponse(
                resp.error_code, tuple(t for t in resp.topics if t.name in describable)
            )
        describable = authz.allowed_names(ctx, authz.DESCRIBE_TOPIC, (t.name for t in req.topics))
        refused = tuple(
            m.FetchedTopic(
                t.name,
                tuple(
                    m.FetchedOffset(p, -1, error_code=authz.DESCRIBE_TOPIC.error)
                    for p in t.partitions
                ),
            )
            for t in req.topics
            if t.name not in describable
        )
        allowed = tuple(t for t in req.topics if t.name in describable)
        if not allowed and refused:
            return m.OffsetFetchResponse(ErrorCode.none, refused)
        resp = await self.service.shell.offset_fetch(
            m.OffsetFetchRequest(req.group_id, allowed, req.require_stable)
        )
        return m.OffsetFetchResponse(resp.error_code, resp.topics + refused)

    async def offset_fetch(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        require_stable = bool(getattr(request, "require_stable", False))
        if ctx.api_version >= 8:
            groups = list(request.groups)
            if len(groups) > MAX_GROUPS_PER_REQUEST:
                return {
                    "groups": [
                        {
                            "group_id": g.group_id,
                            "topics": [],
                            "error_code": ErrorCode.invalid_request,
                        }
                        for g in groups
                    ]
                }
            out = []
            for group in groups:
                resp, _ = await self._fetch_one(ctx, group.group_id, group.topics, require_stable)
                out.append(
                    {
                        "group_id": group.group_id,
                        "topics": _fetched_topics(resp.topics),
                        "error_code": resp.error_code,
                    }
                )
            return {"groups": out}
        resp, req = await self._fetch_one(ctx, request.group_id, request.topics, require_stable)
        if ctx.api_version < 2 and resp.error_code is not ErrorCode.none:
            # v1 has no top-level error: every requested partition carries it (as Kafka).
            topics = [
                {
                    "name": t.name,
                    "partitions": [
                        _fetched_partition(m.FetchedOffset(p, -1, error_code=resp.error_code))
                        for p in t.partitions
                    ],
                }
                for t in req.topics or ()
            ]
            return {"topics": topics, "error_code": resp.error_code}
        return {"topics": _fetched_topics(resp.topics), "error_code": resp.error_code}

    # ------------------------------------------------------------------ admin
    async def list_groups(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        states_filter = tuple(getattr(request, "states_filter", ()))
        types_filter = {t.lower() for t in getattr(request, "types_filter", ())}
        resp = await self.service.shell.list_groups(states_filter)
        groups = resp.groups
        if ctx.authorizer is not None and not authz.allows(
            ctx, authz.DESCRIBE_CLUSTER, log_denied=False
        ):
            # Without DESCRIBE on the cluster, only the groups the principal may DESCRIBE
            # are listed (a filter, not a refusal: nothing is logged, as in Kafka).
            describable = authz.allowed_names(
                ctx, authz.DESCRIBE_GROUP, (g.group_id for g in groups), log_denied=False
            )
            groups = tuple(g for g in groups if g.group_id in describable)
        if types_filter:
            groups = tuple(g for g in groups if g.group_type in types_filter)
        return {
            "error_code": resp.error_code,
            "groups": [
                {
                    "group_id": g.group_id,
                    "protocol_type": g.protocol_type,
                    "group_state": g.state,
                    "group_type": g.group_type,
                }
                for g in groups
            ],
        }

    async def describe_groups(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        group_ids = list(request.groups)
        if len(group_ids) > MAX_GROUPS_PER_REQUEST:
            described = [m.DescribedGroup(g, ErrorCode.invalid_request, "") for g in group_ids]
        elif ctx.authorizer is None:
            described = list(await self.service.shell.describe_groups(group_ids))
        else:
            allowed = authz.allowed_names(ctx, authz.DESCRIBE_GROUP, group_ids)
            found = iter(
                await self.service.shell.describe_groups([g for g in group_ids if g in allowed])
            )
            # The coordinator answers the allowed groups in order; the rest are refused.
            refused = authz.DESCRIBE_GROUP.error
            described = [
                next(found) if g in allowed else m.DescribedGroup(g, refused, "") for g in group_ids
            ]
            # A KIP-848 group's members carry the topics the server resolved for them: as
            # ConsumerGroupDescribe (KAFKA-18813), none the caller may not DESCRIBE.
            hidden = authz.DESCRIBE_TOPIC.error
            described = [
                m.DescribedGroup(g.group_id, hidden, "")
                if g.topics
                and len(authz.allowed_names(ctx, authz.DESCRIBE_TOPIC, g.topics)) < len(g.topics)
                else g
                for g in described
            ]
        with_operations = bool(getattr(request, "include_authorized_operations", False))
        return {
            "groups": [
                _described_dict(
                    ctx.api_version,
                    g,
                    authz.authorized_operations(ctx, ResourceType.GROUP, g.group_id)
                    if with_operations and g.error_code is ErrorCode.none
                    else NO_AUTHORIZED_OPERATIONS,
                )
                for g in described
            ]
        }

    async def delete_groups(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        names = list(request.groups_names)
        if len(names) > MAX_GROUPS_PER_REQUEST:
            results = [m.DeleteGroupResult(g, ErrorCode.invalid_request) for g in names]
        else:
            deletable = authz.allowed_names(ctx, authz.DELETE_GROUP, names)
            results = [
                m.DeleteGroupResult(g, authz.DELETE_GROUP.error)
                for g in names
                if g not in deletable
            ]
            if any(g in deletable for g in names):
                results += await self.service.shell.delete_groups(
                    [g for g in names if g in deletable]
                )
        return {"results": [{"group_id": r.group_id, "error_code": r.error_code} for r in results]}


def _coordinator_dict(key: str, location: CoordinatorLocation) -> dict[str, Any]:
    code, node_id, host, port = location
    return {
        "key": key,
        "node_id": node_id,
        "host": host,
        "port": port,
        "error_code": code,
        "error_message": _error_message(code),
    }


def _fetched_partition(p: m.FetchedOffset) -> dict[str, Any]:
    return {
        "partition_index": p.partition,
        "committed_offset": p.offset,
        "committed_leader_epoch": p.leader_epoch,
        "metadata": p.metadata,
        "error_code": p.error_code,
    }


def _fetched_topics(topics: Iterable[m.FetchedTopic]) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "partitions": [_fetched_partition(p) for p in t.partitions]}
        for t in topics
    ]


def _authorized_commit(
    ctx: RequestContext, req: m.OffsetCommitRequest
) -> tuple[m.OffsetCommitRequest, tuple[m.TopicErrors, ...]]:
    """Kafka's OffsetCommit checks: READ on the group (else every partition is
    GROUP_AUTHORIZATION_FAILED), then READ on each topic (else its partitions are
    TOPIC_AUTHORIZATION_FAILED and the rest are committed). Returns what may be committed
    and the refused topics' answers."""

    def refused(topic: m.OffsetCommitTopic, code: ErrorCode) -> m.TopicErrors:
        return m.TopicErrors(
            topic.name, tuple(m.PartitionError(p.partition, code) for p in topic.partitions)
        )

    if not authz.allows(ctx, authz.READ_GROUP, req.group_id):
        code = authz.READ_GROUP.error
        return dataclasses.replace(req, topics=()), tuple(refused(t, code) for t in req.topics)
    readable = authz.allowed_names(ctx, authz.READ_TOPIC, (t.name for t in req.topics))
    return (
        dataclasses.replace(req, topics=tuple(t for t in req.topics if t.name in readable)),
        tuple(refused(t, authz.READ_TOPIC.error) for t in req.topics if t.name not in readable),
    )


def _existing_commit(
    ctx: RequestContext, req: m.OffsetCommitRequest
) -> tuple[m.OffsetCommitRequest, tuple[m.TopicErrors, ...]]:
    """Kafka answers UNKNOWN_TOPIC_OR_PARTITION for a partition the cluster does not have and
    commits the rest: offsets of a topic that does not exist would otherwise be stored for
    ever and handed back to a consumer of a topic created later under that name."""
    counts = partition_counts(ctx, (t.name for t in req.topics))
    kept: list[m.OffsetCommitTopic] = []
    unknown: list[m.TopicErrors] = []
    for topic in req.topics:
        count = counts.get(topic.name, 0)
        known = tuple(p for p in topic.partitions if 0 <= p.partition < count)
        missing = tuple(
            m.PartitionError(p.partition, ErrorCode.unknown_topic_or_partition)
            for p in topic.partitions
            if not 0 <= p.partition < count
        )
        if known:
            kept.append(m.OffsetCommitTopic(topic.name, known))
        if missing:
            unknown.append(m.TopicErrors(topic.name, missing))
    return dataclasses.replace(req, topics=tuple(kept)), tuple(unknown)


def _described_dict(
    version: int, g: m.DescribedGroup, authorized_operations: int = NO_AUTHORIZED_OPERATIONS
) -> dict[str, Any]:
    code, message = g.error_code, None
    if version >= 6 and code is ErrorCode.none and g.state == "Dead":
        # KIP-1043: v6 reports an unknown group as an error instead of a Dead group.
        code, message = ErrorCode.group_id_not_found, f"group {g.group_id!r} not found"
    return {
        "error_code": code,
        "error_message": message,
        "group_id": g.group_id,
        "group_state": g.state,
        "protocol_type": g.protocol_type,
        "protocol_data": g.protocol_data,
        "members": [
            {
                "member_id": mem.member_id,
                "group_instance_id": mem.group_instance_id,
                "client_id": mem.client_id,
                "client_host": mem.client_host,
                "member_metadata": mem.metadata,
                "member_assignment": mem.assignment,
            }
            for mem in g.members
        ],
        "authorized_operations": authorized_operations,
    }
