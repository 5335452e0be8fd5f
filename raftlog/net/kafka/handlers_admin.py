"""Topic and config administration: CreateTopics, DeleteTopics, CreatePartitions,
DescribeConfigs, AlterConfigs, IncrementalAlterConfigs."""

from __future__ import annotations

from functools import partial
from typing import Any

from raftlog.errors import ErrorCode, KafkaError
from raftlog.net.kafka.backend import (
    AlterConfigOp,
    ConfigEntry,
    ConfigResourceType,
    ConfigsResult,
    CreateTopicResult,
    DeleteTopicResult,
    NewTopic,
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


# ------------------------------------------------------------------------------ topics
async def handle_create_topics(ctx: RequestContext, request: Any) -> dict[str, Any]:
    new_topics = [
        NewTopic(
            name=t.name,
            num_partitions=t.num_partitions,
            replication_factor=t.replication_factor,
            assignments={a.partition_index: list(a.broker_ids) for a in t.assignments},
            configs={c.name: c.value for c in t.configs},
        )
        for t in request.topics
    ]
    try:
        results = list(
            await ctx.backend.create_topics(
                new_topics, to_ms(request.timeout, 30_000), bool(request.validate_only)
            )
        )
    except KafkaError as exc:
        results = [CreateTopicResult(t.name, exc.code, exc.message) for t in new_topics]
    by_name = {r.name: r for r in results}
    topics = []
    for t in new_topics:
        r = by_name.get(t.name) or CreateTopicResult(t.name, ErrorCode.unknown_server_error)
        topics.append(
            {
                "name": t.name,
                "topic_id": r.topic_id,
                "error_code": r.error,
                "error_message": r.message,
                "num_partitions": r.num_partitions,
                "replication_factor": r.replication_factor,
                "configs": [_config_entry_dict(c) for c in r.configs],
            }
        )
    return {"throttle_time": 0, "topics": topics}


async def handle_delete_topics(ctx: RequestContext, request: Any) -> dict[str, Any]:
    # v0-5 send topic_names; v6 sends topics with a name or an id.
    if hasattr(request, "topic_names"):
        targets: list[str | Any] = list(request.topic_names)
    else:
        targets = [t.name if t.name is not None else t.topic_id for t in request.topics]
    try:
        results = list(await ctx.backend.delete_topics(targets, to_ms(request.timeout)))
    except KafkaError as exc:
        results = [DeleteTopicResult(str(t), None, exc.code, exc.message) for t in targets]
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


async def handle_create_partitions(ctx: RequestContext, request: Any) -> dict[str, Any]:
    results = []
    for t in request.topics:
        assignments = None if t.assignments is None else [list(a.broker_ids) for a in t.assignments]
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
        if rtype is None:
            result = ConfigsResult(ErrorCode.invalid_request, "unsupported resource type")
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
        if rtype is None:
            code, message = ErrorCode.invalid_request, "unsupported resource type"
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
        if rtype is None or ops is None:
            code, message = ErrorCode.invalid_request, "unsupported resource type or operation"
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
