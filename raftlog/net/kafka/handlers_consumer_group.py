"""The consumer group protocol's APIs (KIP-848): ConsumerGroupHeartbeat (68) and
ConsumerGroupDescribe (69).

Each request is range-checked here before the coordinator sees it (INVALID_REQUEST with a
message, as Kafka's KafkaApis/GroupCoordinatorService validate): a non-empty group id and
member id (v1: the client names itself), an epoch of -2, -1, 0 or a positive one, a join
stating its subscription and a rebalance timeout within bounds, topic names that are legal,
counts under named limits, a regex subscription that RE2 compiles within its limits
(INVALID_REGULAR_EXPRESSION otherwise, as Kafka). Topics travel by id on the wire and by
name in the coordinator: owned partitions of unknown ids are dropped (a deleted topic is
owned by nobody), the assignment is answered with the ids of the metadata image. A group
subscribing by regex gets the cluster's non-internal topic names with each heartbeat, from a
listing at most TOPIC_LISTING_MAX_AGE_S old (one listing per node serves every heartbeat
meanwhile): a topic created or deleted is seen by the next heartbeat after that.

Authorization as Kafka: READ on the group to heartbeat, DESCRIBE on it to describe; and, as
Kafka since KAFKA-18813, DESCRIBE on each topic: a heartbeat naming one it may not see is
refused (TOPIC_AUTHORIZATION_FAILED), a regex matches only topics the heartbeating member may
see, and a group whose members name or hold such a topic is not described to the caller.
`register_consumer_group_apis(registry, service)` adds both to an ApiRegistry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import trio
from kio.schema.index import api_key_map

from raftlog.constants import NO_AUTHORIZED_OPERATIONS
from raftlog.errors import ErrorCode, RemoteError
from raftlog.groups import messages as m
from raftlog.groups.topic_regex import InvalidRegex, check_regex
from raftlog.net.kafka import authz
from raftlog.net.kafka.apis import ApiRegistry
from raftlog.net.kafka.handlers_util import to_ms
from raftlog.security.acl import ResourceType

if TYPE_CHECKING:
    from raftlog.groups.service import GroupService
    from raftlog.net.kafka.context import RequestContext

log = logging.getLogger("raftlog.kafka")

_KEY_BY_NAME = {name: key for key, name in api_key_map.items()}
CONSUMER_GROUP_HEARTBEAT = _KEY_BY_NAME["consumer_group_heartbeat"]
CONSUMER_GROUP_DESCRIBE = _KEY_BY_NAME["consumer_group_describe"]

# api key -> (min, max): v0 lets the coordinator name a member; v1 (KIP-1082) has the
# client name itself. Both describe versions differ only in member_type.
CONSUMER_GROUP_VERSION_TABLE: dict[int, tuple[int, int]] = {
    CONSUMER_GROUP_HEARTBEAT: (0, 1),
    CONSUMER_GROUP_DESCRIBE: (0, 1),
}

# Bounds on what one heartbeat may carry (Kafka names none; real clients send a handful).
MAX_ID_CHARS = 255  # member, instance and rack ids (clients use 22-36 character UUIDs)
MAX_GROUP_ID_CHARS = 32_767
MAX_SUBSCRIBED_TOPICS = 10_000
MAX_OWNED_PARTITIONS = 100_000
MAX_GROUPS_PER_DESCRIBE = 10_000
# A member may take this long to revoke (Java's max.poll.interval.ms defaults to 5 min).
MAX_REBALANCE_TIMEOUT_MS = 24 * 3600 * 1000
# Longer than any topic may be named: refused (bounded memory per member). A name that is
# not a legal topic name is kept, as Kafka keeps it: it never matches a topic (librdkafka's
# 0033 subscribes to "..._IV#!" and expects no error).
MAX_TOPIC_NAME_CHARS = 249
CONSUMER_MEMBER_TYPE = 1  # ConsumerGroupDescribe v1's member_type of a consumer member
# How stale the topic listing regexes are resolved against may be: listing every topic costs
# O(partitions), and every member of a regex-subscribed group heartbeats every few seconds.
TOPIC_LISTING_MAX_AGE_S = 1.0


class BadRequest(RemoteError):
    """A field out of range: answered INVALID_REQUEST (or `code`) with the message."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.invalid_request) -> None:
        super().__init__(message)
        self.code = code


def register_consumer_group_apis(registry: ApiRegistry, service: GroupService) -> None:
    handlers = ConsumerGroupHandlers(service)
    registry.register(
        CONSUMER_GROUP_HEARTBEAT, *CONSUMER_GROUP_VERSION_TABLE[CONSUMER_GROUP_HEARTBEAT],
        handlers.heartbeat,
    )  # fmt: skip
    registry.register(
        CONSUMER_GROUP_DESCRIBE, *CONSUMER_GROUP_VERSION_TABLE[CONSUMER_GROUP_DESCRIBE],
        handlers.describe,
    )  # fmt: skip


def _check_id(what: str, value: str | None, limit: int = MAX_ID_CHARS) -> None:
    if value is not None and len(value) > limit:
        raise BadRequest(f"{what} is {len(value)} characters, the limit is {limit}")


def _client_host(ctx: RequestContext) -> str:
    return "/" + ctx.connection.peer.rsplit(":", 1)[0]


def decode_heartbeat(ctx: RequestContext, request: Any) -> m.ConsumerHeartbeatRequest:
    """The version-neutral request, every field range-checked (raises BadRequest)."""
    group_id = request.group_id
    if not group_id:
        raise BadRequest("GroupId can't be empty.", ErrorCode.invalid_group_id)
    _check_id("GroupId", group_id, MAX_GROUP_ID_CHARS)
    member_id = request.member_id
    epoch = int(request.member_epoch)
    _check_id("MemberId", member_id)
    _check_id("InstanceId", request.instance_id)
    _check_id("RackId", request.rack_id)
    if ctx.api_version >= 1 and not member_id:
        raise BadRequest("MemberId can't be empty.")
    if epoch < -2:
        raise BadRequest(f"MemberEpoch {epoch} is invalid.")
    if epoch == -2 and request.instance_id is None:
        raise BadRequest("InstanceId can't be null when leaving a group as a static member.")
    if epoch != 0 and not member_id:
        raise BadRequest("MemberId can't be empty.")
    rebalance_timeout_ms = to_ms(request.rebalance_timeout, -1)
    if rebalance_timeout_ms != -1 and not 0 < rebalance_timeout_ms <= MAX_REBALANCE_TIMEOUT_MS:
        raise BadRequest(f"RebalanceTimeoutMs {rebalance_timeout_ms} is out of range.")
    # None: unchanged since the last heartbeat; "" (what librdkafka sends beside topic names
    # when it has no regex): none, as Kafka reads it. kio's v0 has no such field.
    regex: str | None = getattr(request, "subscribed_topic_regex", None)
    if regex:
        try:
            check_regex(regex)
        except InvalidRegex as exc:
            raise BadRequest(str(exc), ErrorCode.invalid_regular_expression) from None
    names = request.subscribed_topic_names
    if names is not None:
        if len(names) > MAX_SUBSCRIBED_TOPICS:
            raise BadRequest(f"more than {MAX_SUBSCRIBED_TOPICS} subscribed topics")
        long = [n for n in names if len(n) > MAX_TOPIC_NAME_CHARS]
        if long:
            raise BadRequest(
                f"SubscribedTopicNames has a name of {len(long[0])} characters "
                f"(a topic name has at most {MAX_TOPIC_NAME_CHARS})."
            )
    owned: frozenset[m.TopicPartition] | None = None
    if request.topic_partitions is not None:
        owned = _owned(ctx, request.topic_partitions)
    if epoch == 0:
        if rebalance_timeout_ms == -1:
            raise BadRequest("RebalanceTimeoutMs must be provided in first request.")
        if names is None and regex is None:
            raise BadRequest(
                "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
            )
        if owned:
            raise BadRequest("TopicPartitions must be empty when (re-)joining.")
    return m.ConsumerHeartbeatRequest(
        group_id=group_id,
        member_id=member_id,
        member_epoch=epoch,
        instance_id=request.instance_id,
        rack_id=request.rack_id,
        rebalance_timeout_ms=rebalance_timeout_ms,
        subscribed_topic_names=None if names is None else tuple(names),
        subscribed_topic_regex=regex,
        server_assignor=request.server_assignor,
        owned=owned,
        client_id=ctx.client_id or "",
        client_host=_client_host(ctx),
    )


def _owned(ctx: RequestContext, topics: Iterable[Any]) -> frozenset[m.TopicPartition]:
    out: set[m.TopicPartition] = set()
    count = 0
    for t in topics:
        count += len(t.partitions)
        if count > MAX_OWNED_PARTITIONS:
            raise BadRequest(f"more than {MAX_OWNED_PARTITIONS} owned partitions")
        if any(p < 0 for p in t.partitions):
            raise BadRequest("TopicPartitions has a negative partition.")
        name = None if t.topic_id is None else ctx.backend.topic_name(t.topic_id)
        if name is None:
            continue  # a topic deleted since: nobody can own it
        out.update((name, int(p)) for p in t.partitions)
    return frozenset(out)


def _topic_partitions(
    ctx: RequestContext, tps: Iterable[m.TopicPartition], *, with_names: bool = False
) -> list[dict[str, Any]]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(tps):
        by_topic.setdefault(topic, []).append(partition)
    ids = {t.name: t.topic_id for t in ctx.backend.topics(list(by_topic))}
    out = []
    for topic, partitions in by_topic.items():
        if topic not in ids:
            continue  # deleted meanwhile
        entry: dict[str, Any] = {"topic_id": ids[topic], "partitions": partitions}
        if with_names:
            entry["topic_name"] = topic
        out.append(entry)
    return out


def _error(code: ErrorCode, message: str | None = None) -> dict[str, Any]:
    return {
        "error_code": code,
        "error_message": message,
        "member_id": None,
        "member_epoch": -1,
        "heartbeat_interval": 0,
        "assignment": None,
    }


class ConsumerGroupHandlers:
    def __init__(self, service: GroupService) -> None:
        self.service = service
        # (taken at, in trio seconds; non-internal topic names; every topic's partitions)
        self._listing: tuple[float, frozenset[str], dict[str, int]] | None = None

    def _topic_listing(self, ctx: RequestContext) -> tuple[frozenset[str], dict[str, int]]:
        now_s = trio.current_time()
        if self._listing is None or now_s - self._listing[0] >= TOPIC_LISTING_MAX_AGE_S:
            topics = ctx.backend.topics(None)
            names = frozenset(t.name for t in topics if not t.is_internal)
            self._listing = (now_s, names, {t.name: len(t.partitions) for t in topics})
        return self._listing[1], self._listing[2]

    async def heartbeat(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        if not authz.allows(ctx, authz.READ_GROUP, request.group_id):
            return _error(authz.READ_GROUP.error)
        try:
            req = decode_heartbeat(ctx, request)
        except BadRequest as exc:
            log.debug("ConsumerGroupHeartbeat refused: %s", exc)
            return _error(exc.code, str(exc))
        # KAFKA-18813: a member learns of no topic it may not DESCRIBE, neither by naming it
        # (refused whole, as Kafka does) nor through a regex (matches only what it may see).
        named = set(req.subscribed_topic_names or ())
        if len(authz.allowed_names(ctx, authz.DESCRIBE_TOPIC, named)) < len(named):
            return _error(
                authz.DESCRIBE_TOPIC.error, "not authorized to describe every subscribed topic"
            )
        shell = self.service.shell
        topic_names: frozenset[str] | None = None
        may_describe: Callable[[str], bool] | None = None
        if req.subscribed_topic_regex or shell.consumer_uses_regex(req.group_id):
            topic_names, counts = self._topic_listing(ctx)
            if ctx.authorizer is not None:
                # Asked by the coordinator only when it resolves this member's regex.
                def may_describe(name: str) -> bool:
                    return authz.allows(ctx, authz.DESCRIBE_TOPIC, name, log_denied=False)
        else:
            wanted = shell.consumer_subscriptions(req.group_id)
            wanted |= set(req.subscribed_topic_names or ())
            counts = {t.name: len(t.partitions) for t in ctx.backend.topics(sorted(wanted))}
        resp = await shell.consumer_group_heartbeat(req, counts, topic_names, may_describe)
        if resp.error_code is not ErrorCode.none:
            out = _error(resp.error_code, resp.error_message)
            out["member_id"] = resp.member_id
            return out
        assignment = None
        if resp.assignment is not None:
            assignment = {"topic_partitions": _topic_partitions(ctx, resp.assignment)}
        return {
            "error_code": ErrorCode.none,
            "error_message": None,
            "member_id": resp.member_id,
            "member_epoch": resp.member_epoch,
            "heartbeat_interval": resp.heartbeat_interval_ms,
            "assignment": assignment,
        }

    async def describe(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        group_ids = list(request.group_ids)
        if len(group_ids) > MAX_GROUPS_PER_DESCRIBE:
            return {"groups": [_described_error(g, ErrorCode.invalid_request) for g in group_ids]}
        allowed = authz.allowed_names(ctx, authz.DESCRIBE_GROUP, group_ids)
        found = iter(
            await self.service.shell.consumer_group_describe([g for g in group_ids if g in allowed])
        )
        with_operations = bool(getattr(request, "include_authorized_operations", False))
        groups = []
        for group_id in group_ids:
            if group_id not in allowed:
                groups.append(_described_error(group_id, authz.DESCRIBE_GROUP.error))
                continue
            g = next(found)
            if g.error_code is not ErrorCode.none:
                groups.append(_described_error(group_id, g.error_code))
                continue
            # KAFKA-18813: a group whose members name or hold a topic the caller may not
            # DESCRIBE is not described to it.
            topics = {
                topic
                for mem in g.members
                for topic in (
                    *mem.subscribed_topic_names,
                    *(t for t, _ in mem.assignment),
                    *(t for t, _ in mem.target_assignment),
                )
            }
            if len(authz.allowed_names(ctx, authz.DESCRIBE_TOPIC, topics)) < len(topics):
                groups.append(_described_error(group_id, authz.DESCRIBE_TOPIC.error))
                continue
            groups.append(
                {
                    "error_code": ErrorCode.none,
                    "error_message": None,
                    "group_id": g.group_id,
                    "group_state": g.state,
                    "group_epoch": g.group_epoch,
                    "assignment_epoch": g.assignment_epoch,
                    "assignor_name": g.assignor_name,
                    "members": [
                        {
                            "member_id": mem.member_id,
                            "instance_id": mem.instance_id,
                            "rack_id": mem.rack_id,
                            "member_epoch": mem.member_epoch,
                            "client_id": mem.client_id,
                            "client_host": mem.client_host,
                            "subscribed_topic_names": list(mem.subscribed_topic_names),
                            "subscribed_topic_regex": mem.subscribed_topic_regex,
                            "assignment": {
                                "topic_partitions": _topic_partitions(
                                    ctx, mem.assignment, with_names=True
                                )
                            },
                            "target_assignment": {
                                "topic_partitions": _topic_partitions(
                                    ctx, mem.target_assignment, with_names=True
                                )
                            },
                            "member_type": CONSUMER_MEMBER_TYPE,
                        }
                        for mem in g.members
                    ],
                    "authorized_operations": authz.authorized_operations(
                        ctx, ResourceType.GROUP, group_id
                    )
                    if with_operations
                    else NO_AUTHORIZED_OPERATIONS,
                }
            )
        return {"groups": groups}


def _described_error(group_id: str, code: ErrorCode) -> dict[str, Any]:
    message = f"Group {group_id} not found." if code is ErrorCode.group_id_not_found else None
    return {
        "error_code": code,
        "error_message": message,
        "group_id": group_id,
        "group_state": "Dead" if code is ErrorCode.group_id_not_found else "",
        "group_epoch": -1,
        "assignment_epoch": -1,
        "assignor_name": "",
        "members": [],
        "authorized_operations": NO_AUTHORIZED_OPERATIONS,
    }
