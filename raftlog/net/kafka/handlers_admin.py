"""Topic and config administration: CreateTopics, DeleteTopics, CreatePartitions,
DescribeConfigs, AlterConfigs, IncrementalAlterConfigs."""

from __future__ import annotations

from functools import partial
from typing import Any

from raftlog.errors import ErrorCode, KafkaError
from raftlog.metadata.controller.messages import NewTopic
from raftlog.net.kafka import authz
from raftlog.net.kafka.backend import (
    AlterConfigOp,
    ConfigEntry,
    ConfigResourceType,
    ConfigsResult,
    CreateTopicResult,
    DeleteTopicResult,
)
from raftlog.net.kafka.context import RequestContext
from raftlog.net.kafka.handlers_util import guarded, log, to_ms


def _config_entry_dict(entry: ConfigEntry) -> dict[str, Any]:
    return {
        "name": entry.name,
        "value": None if entry.sensitive else entry.value,
        "read_only": entry.read_only,
        "is_default": entry.is_default,
        "config_source": int(entry.source),
        "is_sensitive": entry.sensitive,
        "synonyms": [],
        "config_type": 0,
        "documentation": entry.doc,
    }


# ------------------------------------------------------------------------------ quotas
# KIP-599: from these versions on a request over controller_mutation_rate is refused with
# THROTTLING_QUOTA_EXCEEDED; older clients cannot handle that error and are only delayed.
STRICT_MUTATION_VERSIONS = {"create_topics": 6, "delete_topics": 5, "create_partitions": 3}
_THROTTLED_MESSAGE = "controller_mutation_rate quota exceeded; retry after throttle_time_ms"


def _admit_mutations(ctx: RequestContext, api: str, count: int) -> bool:
    """Charge `count` partition mutations to the client; False: refuse this item."""
    if count <= 0:
        return True
    strict = ctx.api_version >= STRICT_MUTATION_VERSIONS[api]
    accepted, throttle_ms = ctx.quotas.record_mutations(
        ctx.client_id, ctx.connection.user, count, strict
    )
    ctx.throttle(throttle_ms)
    return accepted


def _partition_count(ctx: RequestContext, name: str) -> int:
    """Current partitions of a topic, 0 when it does not exist."""
    topics = ctx.backend.topics([name])
    return len(topics[0].partitions) if topics else 0


# ------------------------------------------------------------------------------ topics
async def handle_create_topics(ctx: RequestContext, request: Any) -> dict[str, Any]:
    new_topics = [
        NewTopic(
            name=t.name,
            num_partitions=t.num_partitions,
            replication_factor=t.replication_factor,
            assignments={a.partition_index: tuple(a.broker_ids) for a in t.assignments} or None,
            configs={c.name: c.value for c in t.configs},
        )
        for t in request.topics
    ]
    validate_only = bool(request.validate_only)
    throttled = []
    admitted = []
    refused: list[CreateTopicResult] = []
    describable: set[str] | None = None  # None: every topic's configs may be shown
    if ctx.authorizer is not None:
        new_topics, refused = _creatable(ctx, new_topics)
        describable = authz.allowed_names(
            ctx, authz.DESCRIBE_CONFIGS_TOPIC, (t.name for t in new_topics), log_denied=False
        )
    for t in new_topics:
        partitions = len(t.assignments or ()) or (
            t.num_partitions if t.num_partitions > 0 else ctx.config.num_partitions
        )
        if _partition_count(ctx, t.name):
            partitions = 0  # TOPIC_ALREADY_EXISTS mutates nothing, so it costs nothing
        if validate_only or _admit_mutations(ctx, "create_topics", partitions):
            admitted.append(t)
        else:
            throttled.append(
                CreateTopicResult(t.name, ErrorCode.throttling_quota_exceeded, _THROTTLED_MESSAGE)
            )
    try:
        results = throttled + list(
            await ctx.backend.create_topics(admitted, to_ms(request.timeout, 30_000), validate_only)
            if admitted
            else []
        )
    except KafkaError as exc:
        results = throttled + [CreateTopicResult(t.name, exc.code, exc.message) for t in admitted]
    by_name = {r.name: r for r in refused + results}
    topics = []
    for name in (t.name for t in request.topics):
        r = by_name.get(name) or CreateTopicResult(name, ErrorCode.unknown_server_error)
        topic: dict[str, Any] = {
            "name": name,
            "topic_id": r.topic_id,
            "error_code": r.error,
            "error_message": r.message,
            "num_partitions": r.num_partitions,
            "replication_factor": r.replication_factor,
            "configs": [_config_entry_dict(c) for c in r.configs],
        }
        if describable is not None and name not in describable and r.error == ErrorCode.none:
            # Created, but the principal may not see its configs (as Kafka answers).
            topic["configs"] = []
            topic["topic_config_error_code"] = ErrorCode.topic_authorization_failed
        topics.append(topic)
    return {"throttle_time": 0, "topics": topics}


def _creatable(
    ctx: RequestContext, new_topics: list[NewTopic]
) -> tuple[list[NewTopic], list[CreateTopicResult]]:
    """CREATE on the cluster allows every topic; else each needs CREATE on itself."""
    if authz.allows(ctx, authz.CREATE_CLUSTER, log_denied=False):
        return new_topics, []
    allowed = authz.allowed_names(ctx, authz.CREATE_TOPIC, (t.name for t in new_topics))
    refused = [
        CreateTopicResult(t.name, authz.CREATE_TOPIC.error, authz.AUTHORIZATION_FAILED_MESSAGE)
        for t in new_topics
        if t.name not in allowed
    ]
    return [t for t in new_topics if t.name in allowed], refused


async def handle_delete_topics(ctx: RequestContext, request: Any) -> dict[str, Any]:
    # v0-5 send topic_names; v6 sends topics with a name or an id.
    if hasattr(request, "topic_names"):
        targets: list[str | Any] = list(request.topic_names)
    else:
        targets = [t.name if t.name is not None else t.topic_id for t in request.topics]
    throttled = []
    admitted: list[str | Any] = []
    for target in targets:
        name = target if isinstance(target, str) else ctx.backend.topic_name(target)
        refusal = _delete_refusal(ctx, target, name)
        if refusal is not None:
            throttled.append(refusal)
            continue
        count = _partition_count(ctx, name) if name is not None else 0
        if _admit_mutations(ctx, "delete_topics", count):
            admitted.append(target)
        else:
            topic_id = None if isinstance(target, str) else target
            throttled.append(
                DeleteTopicResult(
                    name, topic_id, ErrorCode.throttling_quota_exceeded, _THROTTLED_MESSAGE
                )
            )
    try:
        results = throttled + list(
            await ctx.backend.delete_topics(admitted, to_ms(request.timeout)) if admitted else []
        )
    except KafkaError as exc:
        results = throttled + [
            DeleteTopicResult(str(t), None, exc.code, exc.message) for t in admitted
        ]
    return {
        "throttle_time": 0,
        "responses": [
            {
                "name": r.name,
                "topic_id": r.topic_id,
                "error_code": r.error,
                "error_message": r.message,
            }
            for r in results
        ],
    }


def _delete_refusal(ctx: RequestContext, target: Any, name: str | None) -> DeleteTopicResult | None:
    """DELETE on the topic. A topic named by id that the principal may not DESCRIBE is
    UNKNOWN_TOPIC_ID, as if it did not exist (Kafka's ControllerApis)."""
    if ctx.authorizer is None:
        return None
    if isinstance(target, str):
        if authz.allows(ctx, authz.DELETE_TOPIC, target):
            return None
        return DeleteTopicResult(target, None, authz.DELETE_TOPIC.error)
    if name is None:
        return None  # an unknown id: the backend answers UNKNOWN_TOPIC_ID
    if not authz.allows(ctx, authz.DESCRIBE_TOPIC, name):
        return DeleteTopicResult(None, target, ErrorCode.unknown_topic_id)
    if not authz.allows(ctx, authz.DELETE_TOPIC, name):
        return DeleteTopicResult(None, target, authz.DELETE_TOPIC.error)
    return None


async def handle_create_partitions(ctx: RequestContext, request: Any) -> dict[str, Any]:
    results = []
    for t in request.topics:
        if not authz.allows(ctx, authz.ALTER_TOPIC, t.name):
            results.append(
                {
                    "name": t.name,
                    "error_code": authz.ALTER_TOPIC.error,
                    "error_message": authz.AUTHORIZATION_FAILED_MESSAGE,
                }
            )
            continue
        assignments = None if t.assignments is None else [list(a.broker_ids) for a in t.assignments]
        added = t.count - _partition_count(ctx, t.name)
        if not request.validate_only and not _admit_mutations(ctx, "create_partitions", added):
            results.append(
                {
                    "name": t.name,
                    "error_code": ErrorCode.throttling_quota_exceeded,
                    "error_message": _THROTTLED_MESSAGE,
                }
            )
            continue
        code, message = await guarded(
            f"create_partitions {t.name}",
            partial(
                ctx.backend.create_partitions,
                t.name,
                t.count,
                assignments,
                to_ms(request.timeout),
                bool(request.validate_only),
            ),
            lambda code, msg: (code, msg),
        )
        results.append({"name": t.name, "error_code": code, "error_message": message})
    return {"throttle_time": 0, "results": results}


# ------------------------------------------------------------------------------ configs
def _resource_type(value: int) -> ConfigResourceType | None:
    try:
        return ConfigResourceType(value)
    except ValueError:
        return None


async def handle_describe_configs(ctx: RequestContext, request: Any) -> dict[str, Any]:
    results = []
    for res in request.resources:
        rtype = _resource_type(res.resource_type)
        refusal = authz.config_refusal(ctx, res.resource_type, res.resource_name, alter=False)
        if rtype is None:
            result = ConfigsResult(ErrorCode.invalid_request, "unsupported resource type")
        elif refusal is not None:
            result = ConfigsResult(refusal, authz.AUTHORIZATION_FAILED_MESSAGE)
        else:
            keys = None if res.configuration_keys is None else list(res.configuration_keys)
            result = await guarded(
                f"describe_configs {res.resource_name}",
                partial(ctx.backend.describe_configs, rtype, res.resource_name, keys),
                lambda code, msg: ConfigsResult(code, msg),
            )
        results.append(
            {
                "error_code": result.error,
                "error_message": result.message,
                "resource_type": res.resource_type,
                "resource_name": res.resource_name,
                "configs": [_config_entry_dict(c) for c in result.configs],
            }
        )
    return {"throttle_time": 0, "results": results}


async def handle_alter_configs(ctx: RequestContext, request: Any) -> dict[str, Any]:
    responses = []
    for res in request.resources:
        rtype = _resource_type(res.resource_type)
        code: ErrorCode
        message: str | None  # null: no message (the backend has nothing to add)
        refusal = authz.config_refusal(ctx, res.resource_type, res.resource_name, alter=True)
        if rtype is None:
            code, message = ErrorCode.invalid_request, "unsupported resource type"
        elif refusal is not None:
            code, message = refusal, authz.AUTHORIZATION_FAILED_MESSAGE
        else:
            code, message = await guarded(
                f"alter_configs {res.resource_name}",
                partial(
                    ctx.backend.alter_configs,
                    rtype,
                    res.resource_name,
                    {c.name: c.value for c in res.configs},
                    bool(request.validate_only),
                ),
                lambda code, msg: (code, msg),
            )
        responses.append(
            {
                "error_code": code,
                "error_message": message,
                "resource_type": res.resource_type,
                "resource_name": res.resource_name,
            }
        )
    return {"throttle_time": 0, "responses": responses}


async def handle_incremental_alter_configs(ctx: RequestContext, request: Any) -> dict[str, Any]:
    responses = []
    for res in request.resources:
        rtype = _resource_type(res.resource_type)
        try:
            ops = [(c.name, AlterConfigOp(c.config_operation), c.value) for c in res.configs]
        except ValueError:
            log.info("incremental_alter_configs: unknown operation in %r", res)
            ops = None
        code: ErrorCode
        message: str | None
        refusal = authz.config_refusal(ctx, res.resource_type, res.resource_name, alter=True)
        if rtype is None or ops is None:
            code, message = ErrorCode.invalid_request, "unsupported resource type or operation"
        elif refusal is not None:
            code, message = refusal, authz.AUTHORIZATION_FAILED_MESSAGE
        else:
            code, message = await guarded(
                f"incremental_alter_configs {res.resource_name}",
                partial(
                    ctx.backend.incremental_alter_configs,
                    rtype,
                    res.resource_name,
                    ops,
                    bool(request.validate_only),
                ),
                lambda code, msg: (code, msg),
            )
        responses.append(
            {
                "error_code": code,
                "error_message": message,
                "resource_type": res.resource_type,
                "resource_name": res.resource_name,
            }
        )
    return {"throttle_time": 0, "responses": responses}
