"""CreateAcls, DescribeAcls, DeleteAcls, DescribeUserScramCredentials and
AlterUserScramCredentials.

Writes go through the backend to the active controller and are answered once committed;
reads come from this node's image. Each handler first asks the authorizer what Kafka asks
(authz.API_RULES: ALTER on the CLUSTER resource for the three writes, DESCRIBE on it for
the two reads); a refusal is CLUSTER_AUTHORIZATION_FAILED for every item of the request.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from itertools import groupby
from typing import Any, TypeVar

from kio.schema.index import api_key_map

from raftlog.errors import ErrorCode, KafkaError
from raftlog.metadata.controller.messages import ScramCredentialDeletion, ScramCredentialUpsertion
from raftlog.net.kafka import authz
from raftlog.net.kafka.apis import ApiRegistry
from raftlog.net.kafka.backend import AclCreateResult, AclDeleteResult, ScramAlterResult
from raftlog.net.kafka.context import RequestContext
from raftlog.net.kafka.handlers_util import log
from raftlog.security.acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)

__all__ = [
    "handle_alter_user_scram_credentials",
    "handle_create_acls",
    "handle_delete_acls",
    "handle_describe_acls",
    "handle_describe_user_scram_credentials",
    "register",
]

_KEY_BY_NAME = {name: key for key, name in api_key_map.items()}
E = TypeVar("E", bound=enum.IntEnum)
T = TypeVar("T")
R = TypeVar("R")


def _code(cls: type[E], value: int) -> E:
    """A client's INT8 code as the enum; a code this version does not know is UNKNOWN, which
    validation refuses (Kafka's fromCode does the same)."""
    try:
        return cls(value)
    except ValueError:
        return cls(0)  # every ACL enum's UNKNOWN


def _filter(f: Any) -> AclBindingFilter:
    """DescribeAcls' request and DeleteAcls' filters share these field names."""
    return AclBindingFilter(
        resource_type=_code(ResourceType, f.resource_type_filter),
        resource_name=f.resource_name_filter,
        pattern_type=_code(PatternType, f.pattern_type_filter),
        principal=f.principal_filter,
        host=f.host_filter,
        operation=_code(AclOperation, f.operation),
        permission=_code(AclPermissionType, f.permission_type),
    )


async def _guarded(
    what: str,
    items: Sequence[T],
    call: Callable[[], Awaitable[Sequence[R]]],
    failed: Callable[[T, ErrorCode, str | None], R],
) -> Sequence[R]:
    """The backend's results, or one `failed(item, code, message)` per item when the whole
    call fails (no controller, a timeout, a bug)."""
    try:
        return await call()
    except KafkaError as exc:
        return [failed(item, exc.code, exc.message or None) for item in items]
    except Exception:
        log.exception("%s failed", what)
        return [failed(item, ErrorCode.unknown_server_error, None) for item in items]


def _refuse_unless(ctx: RequestContext, rule: authz.Rule) -> None:
    """Raise the rule's error (answered as the response's top-level error) when refused."""
    refusal = authz.cluster_refusal(ctx, rule)
    if refusal is not None:
        raise KafkaError(refusal, authz.AUTHORIZATION_FAILED_MESSAGE)


# ---------------------------------------------------------------- ACLs
async def handle_create_acls(ctx: RequestContext, request: Any) -> dict[str, Any]:
    creations = [
        AclBinding(
            _code(ResourceType, c.resource_type),
            c.resource_name,
            _code(PatternType, c.resource_pattern_type),
            c.principal,
            c.host,
            _code(AclOperation, c.operation),
            _code(AclPermissionType, c.permission_type),
        )
        for c in request.creations
    ]
    refusal = authz.cluster_refusal(ctx, authz.ALTER_CLUSTER)
    results: Sequence[AclCreateResult]
    if refusal is not None:
        results = [AclCreateResult(refusal, authz.AUTHORIZATION_FAILED_MESSAGE)] * len(creations)
    else:
        results = await _guarded(
            "create_acls",
            creations,
            lambda: ctx.backend.create_acls(creations),
            lambda _binding, code, message: AclCreateResult(code, message),
        )
    return {
        "throttle_time": 0,
        "results": [{"error_code": r.error, "error_message": r.message} for r in results],
    }


def _resource_key(b: AclBinding) -> tuple[int, str, int]:
    return int(b.resource_type), b.resource_name, int(b.pattern_type)


async def handle_describe_acls(ctx: RequestContext, request: Any) -> dict[str, Any]:
    try:
        _refuse_unless(ctx, authz.DESCRIBE_CLUSTER)
        bindings = await ctx.backend.describe_acls(_filter(request))
    except KafkaError as exc:
        return {
            "throttle_time": 0,
            "error_code": exc.code,
            "error_message": exc.message or None,
            "resources": [],
        }
    # Kafka's response groups the ACLs by resource pattern.
    resources = []
    for (resource_type, name, pattern_type), group in groupby(
        sorted(bindings, key=lambda b: (_resource_key(b), b.principal, b.host, b.operation)),
        key=_resource_key,
    ):
        resources.append(
            {
                "resource_type": resource_type,
                "resource_name": name,
                "pattern_type": pattern_type,
                "acls": [
                    {
                        "principal": b.principal,
                        "host": b.host,
                        "operation": int(b.operation),
                        "permission_type": int(b.permission),
                    }
                    for b in group
                ],
            }
        )
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "error_message": None,
        "resources": resources,
    }


def _matching_acl(b: AclBinding) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none,
        "error_message": None,
        "resource_type": int(b.resource_type),
        "resource_name": b.resource_name,
        "pattern_type": int(b.pattern_type),
        "principal": b.principal,
        "host": b.host,
        "operation": int(b.operation),
        "permission_type": int(b.permission),
    }


async def handle_delete_acls(ctx: RequestContext, request: Any) -> dict[str, Any]:
    filters = [_filter(f) for f in request.filters]
    refusal = authz.cluster_refusal(ctx, authz.ALTER_CLUSTER)
    results: Sequence[AclDeleteResult]
    if refusal is not None:
        results = [AclDeleteResult(refusal, authz.AUTHORIZATION_FAILED_MESSAGE)] * len(filters)
    else:
        results = await _guarded(
            "delete_acls",
            filters,
            lambda: ctx.backend.delete_acls(filters),
            lambda _filter, code, message: AclDeleteResult(code, message),
        )
    return {
        "throttle_time": 0,
        "filter_results": [
            {
                "error_code": r.error,
                "error_message": r.message,
                "matching_acls": [_matching_acl(b) for b in r.matching],
            }
            for r in results
        ],
    }


# ---------------------------------------------------------------- SCRAM credentials
async def handle_describe_user_scram_credentials(
    ctx: RequestContext, request: Any
) -> dict[str, Any]:
    users = None if request.users is None else [u.name for u in request.users]
    try:
        _refuse_unless(ctx, authz.DESCRIBE_CLUSTER)
        described = await ctx.backend.describe_user_scram_credentials(users)
    except KafkaError as exc:
        return {
            "throttle_time": 0,
            "error_code": exc.code,
            "error_message": exc.message or None,
            "results": [],
        }
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "error_message": None,
        "results": [
            {
                "user": d.user,
                "error_code": d.error,
                "error_message": d.message,
                "credential_infos": [
                    {"mechanism": int(mechanism), "iterations": iterations}
                    for mechanism, iterations in d.credentials
                ],
            }
            for d in described
        ],
    }


async def handle_alter_user_scram_credentials(ctx: RequestContext, request: Any) -> dict[str, Any]:
    deletions = [ScramCredentialDeletion(d.name, int(d.mechanism)) for d in request.deletions]
    upsertions = [
        ScramCredentialUpsertion(
            u.name, int(u.mechanism), int(u.iterations), bytes(u.salt), bytes(u.salted_password)
        )
        for u in request.upsertions
    ]
    users = list(dict.fromkeys([d.name for d in deletions] + [u.name for u in upsertions]))
    refusal = authz.cluster_refusal(ctx, authz.ALTER_CLUSTER)
    results: Sequence[ScramAlterResult]
    if refusal is not None:
        results = [
            ScramAlterResult(user, refusal, authz.AUTHORIZATION_FAILED_MESSAGE) for user in users
        ]
    else:
        results = await _guarded(
            "alter_user_scram_credentials",
            users,
            lambda: ctx.backend.alter_user_scram_credentials(deletions, upsertions),
            ScramAlterResult,
        )
    return {
        "throttle_time": 0,
        "results": [
            {"user": r.user, "error_code": r.error, "error_message": r.message} for r in results
        ],
    }


# ---------------------------------------------------------------- registration
# api name -> (min version, max version, handler). CreateAcls/DescribeAcls/DeleteAcls v0
# (no pattern type, before KIP-290) is left out, as Kafka 4 does; v2 is the first
# flexible version and v3 adds nothing on the wire (it marks the USER resource type).
HANDLERS: dict[str, tuple[int, int, Any]] = {
    "create_acls": (1, 3, handle_create_acls),
    "describe_acls": (1, 3, handle_describe_acls),
    "delete_acls": (1, 3, handle_delete_acls),
    "describe_user_scram_credentials": (0, 0, handle_describe_user_scram_credentials),
    "alter_user_scram_credentials": (0, 0, handle_alter_user_scram_credentials),
}


def register(registry: ApiRegistry) -> None:
    """Add the ACL and SCRAM credential APIs to a server's registry."""
    for name, (low, high, handler) in HANDLERS.items():
        registry.register(_KEY_BY_NAME[name], low, high, handler)
