"""Config schema and validation, AlterConfigs / IncrementalAlterConfigs, AlterClientQuotas.

Config values are stored as strings, exactly as Kafka clients send them; raftlog.config_keys
says which keys exist for each resource type and how to parse and bound them, so a bad value is
refused with INVALID_CONFIG at the controller instead of breaking a broker later.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from raftlog.config_keys import (
    BROKER_CONFIGS,
    LIST_KEYS,
    TOPIC_CONFIGS,
    ConfigKey,
    validate_configs,
)
from raftlog.errors import ErrorCode
from raftlog.metadata import records as r
from raftlog.metadata.controller.elections import Batch
from raftlog.metadata.controller.messages import (
    CONFIG_OPS,
    AlterClientQuotas,
    AlterClientQuotasReply,
    AlterConfigs,
    AlterConfigsReply,
    AlterConfigsResource,
    ConfigResourceResult,
    IncrementalAlterConfigs,
    QuotaEntryResult,
)
from raftlog.metadata.image import MetadataImage

QUOTA_KEYS: dict[str, bool] = {
    # key -> value must be a whole number (Kafka types the byte rates as long)
    "producer_byte_rate": True,
    "consumer_byte_rate": True,
    "request_percentage": False,
    "controller_mutation_rate": False,
}
QUOTA_ENTITY_TYPES = frozenset({"user", "client-id"})
# Bounds what one request can make the controller write.
MAX_CONFIG_OPS_PER_RESOURCE = 1000


def _resource(
    image: MetadataImage, resource_type: str, name: str
) -> tuple[tuple[str, str] | None, Mapping[str, ConfigKey], ErrorCode, str]:
    """Normalise a resource; Kafka's BROKER resource with an empty name is the cluster default."""
    if resource_type == "broker" and name == "":
        resource_type = "cluster"
    if resource_type == "topic":
        if image.topic(name) is None:
            return None, {}, ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist"
        return ("topic", name), TOPIC_CONFIGS, ErrorCode.none, ""
    if resource_type == "broker":
        if not name.isdigit():
            return None, {}, ErrorCode.invalid_request, f"broker name {name!r} is not a broker id"
        return ("broker", str(int(name))), BROKER_CONFIGS, ErrorCode.none, ""
    if resource_type == "cluster":
        if name:
            return None, {}, ErrorCode.invalid_request, "the cluster resource has an empty name"
        return ("cluster", ""), BROKER_CONFIGS, ErrorCode.none, ""
    return None, {}, ErrorCode.invalid_request, f"unsupported resource type {resource_type!r}"


def alter_configs(batch: Batch, req: AlterConfigs | IncrementalAlterConfigs) -> AlterConfigsReply:
    results = []
    seen: set[tuple[str, str]] = set()
    for res in req.resources:
        resource, schema, code, message = _resource(
            batch.image, res.resource_type, res.resource_name
        )
        if resource is not None and resource in seen:
            code, message = ErrorCode.invalid_request, "resource named twice in one request"
        if resource is not None and code is ErrorCode.none:
            seen.add(resource)
            current = dict(batch.image.configs.get(resource, {}))
            if isinstance(res, AlterConfigsResource):
                target = dict(res.configs)
                code, message = ErrorCode.none, ""
                if len(target) > MAX_CONFIG_OPS_PER_RESOURCE:
                    code = ErrorCode.invalid_request
                    message = f"more than {MAX_CONFIG_OPS_PER_RESOURCE} configs in one resource"
            else:
                target, code, message = _incremental(current, res.ops, schema)
            if code is ErrorCode.none:
                invalid = validate_configs(schema, target)
                if invalid is not None:
                    code, message = ErrorCode.invalid_config, invalid
            if code is ErrorCode.none:
                records = [
                    r.Config(resource[0], resource[1], key, None)
                    for key in sorted(current.keys() - target.keys())
                ] + [
                    r.Config(resource[0], resource[1], key, value)
                    for key, value in sorted(target.items())
                    if current.get(key) != value
                ]
                if not req.validate_only:
                    batch.add(*records)
        results.append(
            ConfigResourceResult(res.resource_type, res.resource_name, code, message or None)
        )
    return AlterConfigsReply(tuple(results))


def _incremental(
    current: dict[str, str], ops: tuple[Any, ...], schema: Mapping[str, ConfigKey]
) -> tuple[dict[str, str], ErrorCode, str]:
    """Apply Kafka's SET/DELETE/APPEND/SUBTRACT ops to a copy of the current configs."""
    target = dict(current)

    def refuse(code: ErrorCode, message: str) -> tuple[dict[str, str], ErrorCode, str]:
        return target, code, message

    if len(ops) > MAX_CONFIG_OPS_PER_RESOURCE:
        return refuse(
            ErrorCode.invalid_request, f"more than {MAX_CONFIG_OPS_PER_RESOURCE} config operations"
        )
    keys = [op.key for op in ops]
    if len(set(keys)) != len(keys):
        return refuse(ErrorCode.invalid_request, "a config key is named twice in one resource")
    for op in ops:
        if op.op not in CONFIG_OPS:
            return refuse(ErrorCode.invalid_request, f"unknown config operation {op.op!r}")
        if op.key not in schema:
            return refuse(ErrorCode.invalid_config, f"unknown config key {op.key!r}")
        if op.op == "delete":
            target.pop(op.key, None)
            continue
        if op.value is None:
            return refuse(ErrorCode.invalid_request, f"operation {op.op} on {op.key} needs a value")
        if op.op == "set":
            target[op.key] = op.value
            continue
        if op.key not in LIST_KEYS:
            return refuse(
                ErrorCode.invalid_config, f"{op.op} only applies to list configs, not {op.key}"
            )
        items = [i for i in target.get(op.key, "").split(",") if i]
        values = [v.strip() for v in op.value.split(",") if v.strip()]
        if op.op == "append":
            items += [v for v in values if v not in items]
        else:
            items = [i for i in items if i not in values]
        if items:
            target[op.key] = ",".join(items)
        else:
            target.pop(op.key, None)
    return target, ErrorCode.none, ""


# ---------------------------------------------------------------- client quotas
def canonical_entity(
    entity: tuple[tuple[str, str | None], ...],
) -> tuple[tuple[str, str | None], ...]:
    return tuple(sorted((str(t), n) for t, n in entity))


def _quota_error(entity: Any, ops: Any) -> str | None:
    types = [t for t, _ in entity]
    if not types:
        return "the entity is empty"
    if len(set(types)) != len(types):
        return f"entity type named twice in {entity}"
    unknown = set(types) - QUOTA_ENTITY_TYPES
    if unknown:
        return f"unsupported entity types {sorted(unknown)}; use user and/or client-id"
    keys = [key for key, _ in ops]
    if len(set(keys)) != len(keys):
        return "a quota key is named twice for one entity"
    for key, value in ops:
        whole = QUOTA_KEYS.get(key)
        if whole is None:
            return f"unknown quota key {key!r}; known keys: {sorted(QUOTA_KEYS)}"
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"quota {key} must be a number, got {value!r}"
        if not math.isfinite(value) or value <= 0:
            # Zero would throttle forever; removing the key is how a quota is lifted.
            return f"quota {key} must be a finite number > 0, got {value}"
        if whole and value != int(value):
            return f"quota {key} must be a whole number of bytes per second, got {value}"
    return None


def alter_client_quotas(batch: Batch, req: AlterClientQuotas) -> AlterClientQuotasReply:
    results: list[QuotaEntryResult] = []
    seen: set[Any] = set()
    for entry in req.entries:
        entity = canonical_entity(entry.entity)
        message = _quota_error(entity, entry.ops)
        if message is None and entity in seen:
            message = "entity named twice in one request"
        if message is not None:
            results.append(QuotaEntryResult(entry.entity, ErrorCode.invalid_request, message))
            continue
        seen.add(entity)
        current = batch.image.client_quotas.get(entity, {})
        records = [
            r.ClientQuota(entity, key, None if value is None else float(value))
            for key, value in entry.ops
            if current.get(key) != (None if value is None else float(value))
        ]
        if not req.validate_only:
            batch.add(*records)
        results.append(QuotaEntryResult(entry.entity))
    return AlterClientQuotasReply(tuple(results))
