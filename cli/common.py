"""Options every command shares (--bootstrap-server, --command-config, --json) and the
async runner.

--command-config is Kafka's tools' flag: a client properties file (security.protocol,
sasl.*, ssl.*) that kcat and confluent-kafka read too. Without it, a local cluster started
with `raftlog cluster up --secure` is reached with the properties file `up` wrote.

`run_async` is the single bridge from click to trio: it runs the command's coroutine and
turns whatever escapes into a one-line error (cli/errors.py) and a non-zero exit code.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
import trio
from raftlog_cli.cluster_local import CLUSTER_FILE
from raftlog_cli.errors import CliError, explain, one_line
from raftlog_cli.render import Renderer

from raftlog.client import Cluster, ClusterLimits, ConnectionLimits, open_cluster
from raftlog.client.properties import (
    PLAINTEXT,
    ClientProperties,
    ClientPropertiesError,
    ClientSecurity,
    load_client_properties,
)

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_CLUSTER_DIR = ".raftlog"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
# A CLI command should fail fast when nothing answers, not sit in 30 s connect timeouts.
CLI_CONNECT_TIMEOUT_MS = 3_000
CLI_REQUEST_TIMEOUT_MS = 30_000
CLI_LIMITS = ClusterLimits(
    max_retries=6,
    connection=ConnectionLimits(
        connect_timeout_ms=CLI_CONNECT_TIMEOUT_MS, request_timeout_ms=CLI_REQUEST_TIMEOUT_MS
    ),
)


def _local_cluster_entry(cluster_dir: str | Path, key: str) -> str | None:
    path = Path(cluster_dir) / CLUSTER_FILE
    try:
        data = json.loads(path.read_text())
        value = data[key]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return str(value) if value else None


def local_bootstrap(cluster_dir: str | Path = DEFAULT_CLUSTER_DIR) -> str | None:
    """Bootstrap servers of the cluster `raftlog cluster up` started in cluster_dir, if any."""
    return _local_cluster_entry(cluster_dir, "bootstrap_servers")


def local_client_properties(cluster_dir: str | Path = DEFAULT_CLUSTER_DIR) -> str | None:
    """The client properties file of a secure local cluster in cluster_dir, if any."""
    return _local_cluster_entry(cluster_dir, "client_properties")


def resolve_bootstrap(value: str | None) -> str:
    return value or local_bootstrap() or DEFAULT_BOOTSTRAP


@dataclass
class Options:
    bootstrap_server: str
    json: bool
    # False when the address came from the default (local cluster file or 127.0.0.1:9092).
    explicit_bootstrap: bool = True
    security: ClientSecurity = PLAINTEXT
    client_id: str = "raftlog-cli"

    @property
    def out(self) -> Renderer:
        return Renderer(json_mode=self.json)


def load_command_config(path: str) -> ClientProperties:
    """The --command-config file, or a usage error naming the flag and the bad key."""
    try:
        properties = load_client_properties(path)
    except ClientPropertiesError as exc:
        raise click.BadParameter(str(exc), param_hint="'--command-config'") from None
    if properties.ignored_keys:
        shown = ", ".join(properties.ignored_keys[:10])
        more = len(properties.ignored_keys) - 10
        click.echo(
            f"warning: {path}: raftlog ignores {shown}" + (f" and {more} more" if more > 0 else ""),
            err=True,
        )
    return properties


def _local_cluster_addressed(bootstrap_server: str | None) -> bool:
    """Whether the command talks to the local cluster: no address given, or only addresses
    of the local cluster's nodes (a script that names them keeps working when it is secure)."""
    if bootstrap_server is None:
        return True
    local = local_bootstrap()
    if local is None:
        return False
    wanted = {item.strip() for item in bootstrap_server.split(",") if item.strip()}
    return bool(wanted) and wanted <= {item.strip() for item in local.split(",")}


def make_options(
    bootstrap_server: str | None, command_config: str | None, json_mode: bool
) -> Options:
    """Options from the flags: --bootstrap-server, else the properties file's
    bootstrap.servers, else the local cluster, else 127.0.0.1:9092."""
    path = command_config
    if path is None and _local_cluster_addressed(bootstrap_server):
        path = local_client_properties()
    properties = load_command_config(path) if path else None
    explicit = bootstrap_server is not None
    if bootstrap_server is None and properties is not None and command_config is not None:
        bootstrap_server = properties.bootstrap_servers
        explicit = bootstrap_server is not None
    opts = Options(resolve_bootstrap(bootstrap_server), json_mode, explicit)
    if properties is not None:
        opts.security = properties.security
        opts.client_id = properties.client_id or opts.client_id
    return opts


def common_options(func: F) -> F:
    """Add --bootstrap-server, --command-config and --json; the command receives
    `opts: Options`."""

    @click.option(
        "--bootstrap-server",
        "bootstrap_server",
        envvar="RAFTLOG_BOOTSTRAP_SERVER",
        default=None,
        metavar="HOST:PORT[,...]",
        help=f"Brokers to contact (default: the local cluster in {DEFAULT_CLUSTER_DIR}/, "
        f"else {DEFAULT_BOOTSTRAP}).",
    )
    @click.option(
        "--command-config",
        "command_config",
        envvar="RAFTLOG_COMMAND_CONFIG",
        default=None,
        metavar="FILE",
        help="Client properties file (security.protocol, sasl.*, ssl.*), as for Kafka's "
        "tools, kcat -F and confluent-kafka (default: the secure local cluster's).",
    )
    @click.option("--json", "json_mode", is_flag=True, help="Print JSON instead of tables.")
    @wraps(func)
    def wrapper(
        *args: Any,
        bootstrap_server: str | None,
        command_config: str | None,
        json_mode: bool,
        **kwargs: Any,
    ) -> Any:
        opts = make_options(bootstrap_server, command_config, json_mode)
        return func(*args, opts=opts, **kwargs)

    return wrapper  # type: ignore[return-value]


@asynccontextmanager
async def connect(opts: Options) -> AsyncIterator[Cluster]:
    """open_cluster with the CLI's short timeouts (errors are mapped by run_async)."""
    async with open_cluster(
        opts.bootstrap_server, client_id=opts.client_id, limits=CLI_LIMITS, security=opts.security
    ) as cluster:
        yield cluster


def run_async(opts_or_bootstrap: Options | str | None, fn: Callable[[], Awaitable[T]]) -> T:
    """trio.run(fn) with the CLI's error mapping; the only place commands enter trio."""
    bootstrap = (
        opts_or_bootstrap.bootstrap_server
        if isinstance(opts_or_bootstrap, Options)
        else opts_or_bootstrap
    )
    try:
        return trio.run(fn)
    except KeyboardInterrupt:
        raise click.Abort() from None
    except Exception as exc:
        if os.environ.get("RAFTLOG_DEBUG"):
            raise
        message = explain(exc, bootstrap)
        if message is None:
            message = f"unexpected {type(exc).__name__}: {exc} (RAFTLOG_DEBUG=1 shows details)"
        raise CliError(one_line(message)) from None


def parse_key_values(items: tuple[str, ...], what: str) -> dict[str, str]:
    """k=v pairs from repeated options, refusing anything without '='."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint=what)
        out[key.strip()] = value.strip()
    return out
