"""`raftlog quotas alter|describe|delete`: client quotas per user and/or client id.

Values are validated before anything is sent, with the same helpers the controller uses
(raftlog.quotas.entity), so a bad value fails fast with the controller's own wording.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
import trio
from raftlog_cli.cluster_local import load_cluster
from raftlog_cli.common import DEFAULT_CLUSTER_DIR, Options, common_options, connect, run_async
from raftlog_cli.errors import CliError

from raftlog.client import Admin, QuotaMatch
from raftlog.config import parse_voters
from raftlog.errors import ConfigError
from raftlog.net.rpc import RpcError
from raftlog.quotas.entity import (
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    PRODUCER_BYTE_RATE,
    QUOTA_KEYS,
    REQUEST_PERCENTAGE,
    USER,
    QuotaEntity,
    QuotaValidationError,
    validate_alteration,
)
from raftlog.quotas.usage_rpc import UsageRow, fetch_usage

F = TypeVar("F", bound=Callable[..., Any])
Component = tuple[str, str | None]


@click.group("quotas")
def quotas_group() -> None:
    """Set, show and remove client quotas (per user, client id, or their defaults)."""


def entity_options(func: F) -> F:
    """--user/--client-id/--default-user/--default-client -> `components` argument."""

    @click.option("--user", default=None, help="Quota of this user.")
    @click.option("--client-id", default=None, help="Quota of this client id.")
    @click.option("--default-user", is_flag=True, help="The default quota of every user.")
    @click.option("--default-client", is_flag=True, help="The default quota of every client id.")
    @wraps(func)
    def wrapper(
        *args: Any,
        user: str | None,
        client_id: str | None,
        default_user: bool,
        default_client: bool,
        **kwargs: Any,
    ) -> Any:
        return func(
            *args,
            components=entity_components(user, client_id, default_user, default_client),
            **kwargs,
        )

    return wrapper  # type: ignore[return-value]


def entity_components(
    user: str | None, client_id: str | None, default_user: bool, default_client: bool
) -> list[Component]:
    if user is not None and default_user:
        raise click.UsageError("--user and --default-user exclude each other")
    if client_id is not None and default_client:
        raise click.UsageError("--client-id and --default-client exclude each other")
    components: list[Component] = []
    if user is not None or default_user:
        components.append((USER, user))
    if client_id is not None or default_client:
        components.append((CLIENT_ID, client_id))
    return components


def quota_key(text: str) -> str:
    key = text.strip().replace("-", "_")
    if key not in QUOTA_KEYS:
        raise CliError(f"unknown quota key {text!r}; expected one of {list(QUOTA_KEYS)}")
    return key


def _entity_json(entity: QuotaEntity, values: dict[str, float]) -> dict[str, Any]:
    return {
        "entity": entity.path,
        "components": {kind: name for kind, name in entity.components},
        "quotas": {k: int(v) if float(v).is_integer() else v for k, v in sorted(values.items())},
    }


def _checked(components: list[Component], ops: list[tuple[str, object, bool]]) -> QuotaEntity:
    if not components:
        raise click.UsageError(
            "name an entity: --user, --client-id, --default-user or --default-client"
        )
    try:
        entity, _ = validate_alteration(components, ops)
    except QuotaValidationError as exc:
        raise CliError(exc.message) from None
    return entity


def _send(opts: Options, entity: QuotaEntity, changes: dict[str, object]) -> None:
    async def go() -> None:
        async with connect(opts) as cluster:
            results = await Admin(cluster).alter_client_quotas([(entity, changes)])
            for result in results.values():
                if result.error.value != 0:
                    raise CliError(
                        f"quota change for {entity} refused: {result.error.name}"
                        + (f" ({result.message})" if result.message else "")
                    )

    run_async(opts, go)


@quotas_group.command("alter")
@entity_options
@click.option("--producer-byte-rate", default=None, metavar="BYTES/S")
@click.option("--consumer-byte-rate", default=None, metavar="BYTES/S")
@click.option("--request-percentage", default=None, metavar="PERCENT")
@click.option("--controller-mutation-rate", default=None, metavar="PER-SECOND")
@common_options
def alter(
    components: list[Component],
    producer_byte_rate: str | None,
    consumer_byte_rate: str | None,
    request_percentage: str | None,
    controller_mutation_rate: str | None,
    opts: Options,
) -> None:
    """Set quota values of one entity (keys not given keep their values)."""
    given = {
        PRODUCER_BYTE_RATE: producer_byte_rate,
        CONSUMER_BYTE_RATE: consumer_byte_rate,
        REQUEST_PERCENTAGE: request_percentage,
        CONTROLLER_MUTATION_RATE: controller_mutation_rate,
    }
    changes: dict[str, object] = {k: v for k, v in given.items() if v is not None}
    if not changes:
        raise click.UsageError("give at least one quota value, e.g. --producer-byte-rate 1048576")
    entity = _checked(components, [(k, v, False) for k, v in changes.items()])
    _send(opts, entity, changes)
    shown = ", ".join(f"{k}={v}" for k, v in changes.items())
    opts.out.message(
        f"Updated quotas of {entity}: {shown}",
        {"entity": entity.path, "set": {k: float(str(v)) for k, v in changes.items()}},
    )


@quotas_group.command("delete")
@entity_options
@click.option("--key", "keys", multiple=True, required=True, help="Quota key to remove.")
@common_options
def delete(components: list[Component], keys: tuple[str, ...], opts: Options) -> None:
    """Remove quota keys of one entity (the next less specific quota then applies)."""
    names = [quota_key(k) for k in keys]
    entity = _checked(components, [(k, None, True) for k in names])
    _send(opts, entity, dict.fromkeys(names))
    opts.out.message(
        f"Removed {', '.join(names)} from {entity}", {"entity": entity.path, "removed": names}
    )


@quotas_group.command("describe")
@entity_options
@click.option("--usage", is_flag=True, help="Show current usage and throttling per sensor.")
@click.option(
    "--internal-servers",
    default=None,
    metavar="ID@HOST:PORT,...",
    help="Internal listeners to ask for --usage (default: the local cluster's nodes).",
)
@common_options
def describe(
    components: list[Component], usage: bool, internal_servers: str | None, opts: Options
) -> None:
    """Show quotas: every entity, or the one named by the entity options."""
    if usage:
        _describe_usage(internal_servers, opts)
        return

    async def go() -> list[dict[str, Any]]:
        async with connect(opts) as cluster:
            filters = [
                (kind, QuotaMatch.DEFAULT if name is None else QuotaMatch.EXACT, name)
                for kind, name in components
            ]
            found = await Admin(cluster).describe_client_quotas(filters, strict=bool(components))
            return [
                _entity_json(entity, values)
                for entity, values in sorted(found.items(), key=lambda item: item[0].path)
            ]

    opts.out.quotas(run_async(opts, go))


def _internal_servers(value: str | None) -> dict[int, tuple[str, int]]:
    """Usage is per-broker memory, read over each node's internal listener (not Kafka)."""
    if value:
        try:
            return parse_voters(value)
        except ConfigError as exc:
            raise CliError(f"--internal-servers: {exc}") from None
    local = load_cluster(Path(DEFAULT_CLUSTER_DIR))
    if local is None:
        raise CliError(
            "--usage needs the nodes' internal listeners: pass --internal-servers "
            "ID@HOST:PORT,... (no local cluster in .raftlog)"
        )
    if local.secure:
        raise CliError(
            "--usage reads the nodes' internal listeners, which a secure cluster keeps to "
            "mutual TLS between its nodes"
        )
    return {n.node_id: ("127.0.0.1", n.internal_port) for n in local.nodes}


def _describe_usage(internal_servers: str | None, opts: Options) -> None:
    servers = _internal_servers(internal_servers)

    async def go() -> list[UsageRow]:
        rows: list[UsageRow] = []
        for node_id, (host, port) in sorted(servers.items()):
            try:
                rows.extend(await fetch_usage(node_id, host, port))
            except RpcError as exc:
                raise CliError(f"node {node_id} at {host}:{port}: {exc}") from None
        return rows

    opts.out.quota_usage(
        [
            {
                "node": row.node_id,
                "entity": row.entity.path,
                "key": row.quota_key,
                "client_id": row.client_id,
                "user": row.user,
                "quota": row.quota,
                "rate": round(row.rate, 1),
                "throttle_time_total_ms": row.throttle_time_total_ms,
            }
            for row in trio.run(go)
        ]
    )
