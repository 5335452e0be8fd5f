"""`raftlog acls create|list|delete`: ACLs, with kafka-acls.sh's flags.

A principal is `User:<name>`; hosts default to `*`; --operation repeats and defaults to All,
as in kafka-acls.sh. Creating takes a literal or prefixed pattern; listing and deleting also
take `match` (every ACL that applies to the named resource) and `any`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from itertools import product
from typing import Any, TypeVar

import click
from raftlog_cli.common import Options, common_options, connect, run_async
from raftlog_cli.errors import CliError, kafka_message
from raftlog_cli.render_security import acl_json, render_acls

from raftlog.client import Admin
from raftlog.errors import ErrorCode
from raftlog.security.acl import (
    CLUSTER_RESOURCE_NAME,
    WILDCARD_HOST,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    InvalidAclError,
    PatternType,
    ResourceType,
)

F = TypeVar("F", bound=Callable[..., Any])
Resource = tuple[ResourceType, str]

# kafka-acls.sh's operation names (Read, DescribeConfigs, ...), matched without case,
# '-' or '_', so DESCRIBE_CONFIGS and describe-configs work too.
_OPERATIONS = {
    op.name.replace("_", "").lower(): op
    for op in AclOperation
    if op not in (AclOperation.UNKNOWN, AclOperation.ANY)
}
_PATTERN_TYPES = ("literal", "prefixed", "match", "any")


@click.group("acls")
def acls_group() -> None:
    """Create, list and delete ACLs (the authorizer must be on: authorizer_class_name)."""


def _operation(text: str) -> AclOperation:
    key = text.replace("-", "").replace("_", "").lower()
    if key not in _OPERATIONS:
        names = ", ".join(_display_operation(op) for op in _OPERATIONS.values())
        raise click.BadParameter(
            f"{text!r} is not an operation ({names})", param_hint="--operation"
        )
    return _OPERATIONS[key]


def _display_operation(op: AclOperation) -> str:
    return "".join(part.capitalize() for part in op.name.split("_"))


def _principal(text: str, flag: str) -> str:
    kind, colon, name = text.partition(":")
    if not colon or not kind or not name:
        raise click.BadParameter(f"expected User:NAME, got {text!r}", param_hint=flag)
    return text


def resource_options(func: F) -> F:
    """--topic/--group/--transactional-id (repeatable), --cluster -> `resources`."""

    @click.option("--topic", "topics", multiple=True, metavar="NAME", help="A topic ('*': all).")
    @click.option("--group", "groups", multiple=True, metavar="NAME", help="A consumer group.")
    @click.option(
        "--transactional-id", "transactional_ids", multiple=True, metavar="ID",
        help="A transactional id.",
    )  # fmt: skip
    @click.option("--cluster", is_flag=True, help="The cluster (kafka-cluster).")
    @click.option(
        "--resource-pattern-type",
        "pattern",
        type=click.Choice(_PATTERN_TYPES, case_sensitive=False),
        default=None,
        help="How names match: literal (default for create/delete), prefixed, match, any "
        "(default for list).",
    )
    @wraps(func)
    def wrapper(
        *args: Any,
        topics: tuple[str, ...],
        groups: tuple[str, ...],
        transactional_ids: tuple[str, ...],
        cluster: bool,
        pattern: str | None,
        **kwargs: Any,
    ) -> Any:
        resources: list[Resource] = [
            *((ResourceType.TOPIC, t) for t in topics),
            *((ResourceType.GROUP, g) for g in groups),
            *((ResourceType.TRANSACTIONAL_ID, t) for t in transactional_ids),
        ]
        if cluster:
            resources.append((ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME))
        for kind, name in resources:
            if not name:
                raise click.UsageError(f"an empty {kind.name.lower()} name")
        pattern_type = PatternType[pattern.upper()] if pattern else None
        return func(*args, resources=resources, pattern_type=pattern_type, **kwargs)

    return wrapper  # type: ignore[return-value]


def entry_options(func: F) -> F:
    """--allow-principal/--deny-principal/--allow-host/--deny-host/--operation."""

    @click.option("--allow-principal", "allow", multiple=True, metavar="User:NAME")
    @click.option("--deny-principal", "deny", multiple=True, metavar="User:NAME")
    @click.option(
        "--allow-host", "allow_hosts", multiple=True, metavar="HOST",
        help="Hosts the allow principals may connect from (default: *).",
    )  # fmt: skip
    @click.option(
        "--deny-host", "deny_hosts", multiple=True, metavar="HOST",
        help="Hosts the deny principals are denied from (default: *).",
    )  # fmt: skip
    @click.option(
        "--operation", "operations", multiple=True, metavar="OPERATION",
        help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, "
        "AlterConfigs, IdempotentWrite, All (repeatable).",
    )  # fmt: skip
    @wraps(func)
    def wrapper(
        *args: Any,
        allow: tuple[str, ...],
        deny: tuple[str, ...],
        allow_hosts: tuple[str, ...],
        deny_hosts: tuple[str, ...],
        operations: tuple[str, ...],
        **kwargs: Any,
    ) -> Any:
        entries = [
            (_principal(p, "--allow-principal"), AclPermissionType.ALLOW, host)
            for p, host in product(allow, allow_hosts or (WILDCARD_HOST,))
        ] + [
            (_principal(p, "--deny-principal"), AclPermissionType.DENY, host)
            for p, host in product(deny, deny_hosts or (WILDCARD_HOST,))
        ]
        if allow_hosts and not allow:
            raise click.UsageError("--allow-host needs --allow-principal")
        if deny_hosts and not deny:
            raise click.UsageError("--deny-host needs --deny-principal")
        ops = list(dict.fromkeys(_operation(o) for o in operations))
        return func(*args, entries=entries, operations=ops, **kwargs)

    return wrapper  # type: ignore[return-value]


Entry = tuple[str, AclPermissionType, str]


@acls_group.command("create")
@resource_options
@entry_options
@common_options
def create(
    resources: list[Resource],
    pattern_type: PatternType | None,
    entries: list[Entry],
    operations: list[AclOperation],
    opts: Options,
) -> None:
    """Add ACLs: each principal and host x each operation x each resource."""
    if not resources:
        raise click.UsageError("name a resource: --topic, --group, --transactional-id or --cluster")
    if not entries:
        raise click.UsageError("name a principal: --allow-principal or --deny-principal")
    pattern = pattern_type or PatternType.LITERAL
    if pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise click.UsageError("create takes --resource-pattern-type literal or prefixed")
    bindings = []
    for (kind, name), (principal, permission, host), op in product(
        resources, entries, operations or [AclOperation.ALL]
    ):
        binding = AclBinding(kind, name, pattern, principal, host, op, permission)
        try:
            bindings.append(binding.validate())
        except InvalidAclError as exc:
            raise click.UsageError(str(exc)) from None

    async def go() -> list[AclBinding]:
        async with connect(opts) as cluster:
            results = await Admin(cluster).create_acls(bindings)
        for binding, result in zip(bindings, results, strict=True):
            if result.error != ErrorCode.none:
                raise CliError(
                    "ACL not created: "
                    + kafka_message(result.error, result.message or _describe(binding))
                )
        return bindings

    created = run_async(opts, go)
    render_acls(
        opts.out,
        created,
        title=f"Created {_count(len(created))}:",
        json_doc={"created": [acl_json(b) for b in created]},
    )


@acls_group.command("list")
@resource_options
@click.option("--principal", "principals", multiple=True, metavar="User:NAME")
@common_options
def list_acls(
    resources: list[Resource],
    pattern_type: PatternType | None,
    principals: tuple[str, ...],
    opts: Options,
) -> None:
    """List ACLs (all, or those of the named resources and principals)."""
    pattern = pattern_type or PatternType.ANY
    filters = _filters(resources, pattern, [(_principal(p, "--principal"), None, None)
                                            for p in principals])  # fmt: skip

    async def go() -> list[AclBinding]:
        async with connect(opts) as cluster:
            admin = Admin(cluster)
            found: dict[AclBinding, None] = {}
            for acl_filter in filters:
                found.update(dict.fromkeys(await admin.describe_acls(acl_filter)))
            return sorted(found, key=_sort_key)

    bindings = run_async(opts, go)
    render_acls(opts.out, bindings, json_doc=[acl_json(b) for b in bindings])


@acls_group.command("delete")
@resource_options
@entry_options
@common_options
def delete(
    resources: list[Resource],
    pattern_type: PatternType | None,
    entries: list[Entry],
    operations: list[AclOperation],
    opts: Options,
) -> None:
    """Remove the ACLs that match: of the named resources, principals, hosts, operations."""
    if not resources and not entries:
        raise click.UsageError(
            "name what to delete: a resource (--topic, --group, --transactional-id, --cluster) "
            "and/or a principal (--allow-principal, --deny-principal)"
        )
    pattern = pattern_type or PatternType.LITERAL
    filters = _filters(resources, pattern, entries, operations)

    async def go() -> list[AclBinding]:
        async with connect(opts) as cluster:
            outcome = await Admin(cluster).delete_acls(filters)
        deleted: dict[AclBinding, None] = {}
        for result in outcome:
            if result.error != ErrorCode.none:
                raise CliError(
                    "ACLs not deleted: " + kafka_message(result.error, result.message or "")
                )
            for item in result.deleted:
                if item.error != ErrorCode.none:
                    raise CliError(
                        "ACL not deleted: "
                        + kafka_message(item.error, item.message or _describe(item.binding))
                    )
                deleted[item.binding] = None
        return sorted(deleted, key=_sort_key)

    removed = run_async(opts, go)
    render_acls(
        opts.out,
        removed,
        title=f"Deleted {_count(len(removed))}:",
        json_doc={"deleted": [acl_json(b) for b in removed]},
        empty="(no ACL matched)",
    )


def _filters(
    resources: list[Resource],
    pattern: PatternType,
    entries: list[tuple[str, AclPermissionType, str]] | list[tuple[str, None, None]],
    operations: list[AclOperation] | None = None,
) -> list[AclBindingFilter]:
    targets: list[tuple[ResourceType, str | None]] = list(resources) or [(ResourceType.ANY, None)]
    who: list[tuple[str | None, AclPermissionType | None, str | None]] = list(entries) or [
        (None, None, None)
    ]
    return [
        AclBindingFilter(
            resource_type=kind,
            resource_name=name,
            pattern_type=pattern,
            principal=principal,
            host=host,
            operation=op,
            permission=permission or AclPermissionType.ANY,
        )
        for (kind, name), (principal, permission, host), op in product(
            targets, who, operations or [AclOperation.ANY]
        )
    ]


def _sort_key(b: AclBinding) -> tuple[Any, ...]:
    return (
        int(b.resource_type), b.resource_name, int(b.pattern_type), b.principal,
        int(b.permission), b.host, int(b.operation),
    )  # fmt: skip


def _count(n: int) -> str:
    return f"{n} ACL" if n == 1 else f"{n} ACLs"


def _describe(b: AclBinding) -> str:
    return (
        f"{b.permission.name} {b.principal} {b.operation.name} on "
        f"{b.resource_type.name} {b.resource_name!r}"
    )
