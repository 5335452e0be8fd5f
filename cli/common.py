"""Options every command shares (--bootstrap-server, --json) and the async runner.

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


def local_bootstrap(cluster_dir: str | Path = DEFAULT_CLUSTER_DIR) -> str | None:
    """Bootstrap servers of the cluster `raftlog cluster up` started in cluster_dir, if any."""
    path = Path(cluster_dir) / CLUSTER_FILE
    try:
        data = json.loads(path.read_text())
        return str(data["bootstrap_servers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def resolve_bootstrap(value: str | None) -> str:
    return value or local_bootstrap() or DEFAULT_BOOTSTRAP


@dataclass
class Options:
    bootstrap_server: str
    json: bool
    # False when the address came from the default (local cluster file or 127.0.0.1:9092).
    explicit_bootstrap: bool = True

    @property
    def out(self) -> Renderer:
        return Renderer(json_mode=self.json)


def common_options(func: F) -> F:
    """Add --bootstrap-server and --json; the command receives `opts: Options`."""

    @click.option(
        "--bootstrap-server",
        "bootstrap_server",
        envvar="RAFTLOG_BOOTSTRAP_SERVER",
        default=None,
        metavar="HOST:PORT[,...]",
        help=f"Brokers to contact (default: the local cluster in {DEFAULT_CLUSTER_DIR}/, "
        f"else {DEFAULT_BOOTSTRAP}).",
    )
    @click.option("--json", "json_mode", is_flag=True, help="Print JSON instead of tables.")
    @wraps(func)
    def wrapper(*args: Any, bootstrap_server: str | None, json_mode: bool, **kwargs: Any) -> Any:
        opts = Options(resolve_bootstrap(bootstrap_server), json_mode, bootstrap_server is not None)
        return func(*args, opts=opts, **kwargs)

    return wrapper  # type: ignore[return-value]


@asynccontextmanager
async def connect(opts: Options) -> AsyncIterator[Cluster]:
    """open_cluster with the CLI's short timeouts (errors are mapped by run_async)."""
    async with open_cluster(
        opts.bootstrap_server, client_id="raftlog-cli", limits=CLI_LIMITS
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
