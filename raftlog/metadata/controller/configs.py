"""Config schema and validation, AlterConfigs / IncrementalAlterConfigs, AlterClientQuotas.

Config values are stored as strings, exactly as Kafka clients send them; the schema here says
which keys exist for each resource type and how to parse and bound them, so a bad value is
refused with INVALID_CONFIG at the controller instead of breaking a broker later.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

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

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


class ConfigValueError(ValueError):
    pass


def _int(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ConfigValueError(f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise ConfigValueError(f"{value} is outside {lo}..{hi}")
        return value

    return parse


def _double(lo: float, hi: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise ConfigValueError(f"{text!r} is not a number") from None
        if not (math.isfinite(value) and lo <= value <= hi):
            raise ConfigValueError(f"{value} is outside {lo}..{hi}")
        return value

    return parse


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ConfigValueError(f"{text!r} is not true or false")
    return lowered == "true"


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.strip() not in choices:
            raise ConfigValueError(f"{text!r} is not one of {list(choices)}")
        return text.strip()

    return parse


def _choice_list(*choices: str) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        bad = [item for item in items if item not in choices]
        if bad or not items:
            raise ConfigValueError(f"{text!r} must be a list of {list(choices)}")
        return items

    return parse


_COMPRESSION = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
_CLEANUP = _choice_list("delete", "compact")
LIST_KEYS = frozenset({"cleanup.policy", "log.cleanup.policy"})

# Topic-level configs (Kafka's names and bounds).
TOPIC_CONFIGS: dict[str, Callable[[str], Any]] = {
    "cleanup.policy": _CLEANUP,
    "compression.type": _choice(*_COMPRESSION),
    "delete.retention.ms": _int(0, INT64_MAX),
    "file.delete.delay.ms": _int(0, INT64_MAX),
    "flush.messages": _int(1, INT64_MAX),
    "flush.ms": _int(0, INT64_MAX),
    "index.interval.bytes": _int(0, INT32_MAX),
    "max.compaction.lag.ms": _int(1, INT64_MAX),
    "max.message.bytes": _int(0, INT32_MAX),
    "message.timestamp.type": _choice("CreateTime", "LogAppendTime"),
    "message.timestamp.difference.max.ms": _int(0, INT64_MAX),
    "min.cleanable.dirty.ratio": _double(0.0, 1.0),
    "min.compaction.lag.ms": _int(0, INT64_MAX),
    "min.insync.replicas": _int(1, INT32_MAX),
    "preallocate": _bool,
    "retention.bytes": _int(-1, INT64_MAX),
    "retention.ms": _int(-1, INT64_MAX),
    "segment.bytes": _int(14, INT32_MAX),
    "segment.index.bytes": _int(4, INT32_MAX),
    "segment.jitter.ms": _int(0, INT64_MAX),
    "segment.ms": _int(1, INT64_MAX),
    "unclean.leader.election.enable": _bool,
}

# Dynamic broker configs, settable per broker or as cluster defaults.
BROKER_CONFIGS: dict[str, Callable[[str], Any]] = {
    "auto.create.topics.enable": _bool,
    "compression.type": _choice(*_COMPRESSION),
    "follower.replication.throttled.rate": _int(0, INT64_MAX),
    "leader.replication.throttled.rate": _int(0, INT64_MAX),
    "log.cleanup.policy": _CLEANUP,
    "log.retention.bytes": _int(-1, INT64_MAX),
    "log.retention.ms": _int(-1, INT64_MAX),
    "log.segment.bytes": _int(14, INT32_MAX),
    "message.max.bytes": _int(0, INT32_MAX),
    "min.insync.replicas": _int(1, INT32_MAX),
    "num.partitions": _int(1, 100_000),
    "unclean.leader.election.enable": _bool,
}

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


def parse_topic_config(key: str, value: str) -> Any:
    """Parse a stored topic config value to its type; unknown keys come back as strings."""
    parse = TOPIC_CONFIGS.get(key)
    return value if parse is None else parse(value)


def validate_configs(
    schema: Mapping[str, Callable[[str], Any]], configs: Mapping[str, Any]
) -> str | None:
    """None when every key is known and every value parses, else the message for INVALID_CONFIG."""
    for key, value in configs.items():
        parse = schema.get(key)
        if parse is None:
            return f"unknown config key {key!r}"
        if not isinstance(value, str):
            return f"config {key} must be a string, got {value!r}"
        try:
            parse(value)
        except ConfigValueError as exc:
            return f"invalid value for {key}: {exc}"
    return None


def _resource(
    image: MetadataImage, resource_type: str, name: str
) -> tuple[tuple[str, str] | None, dict[str, Callable[[str], Any]], ErrorCode, str]:
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
    current: dict[str, str], ops: tuple[Any, ...], schema: Mapping[str, Any]
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
