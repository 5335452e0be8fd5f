"""`raftlog cluster up|down|status|kill|restart|add-node|remove-node`: a local multi-node
cluster (add-node and remove-node: cluster_nodes.py).

`up` writes node configs under --dir, starts one process per node and waits (with a
deadline) until a controller is elected and every broker is unfenced. `up --secure` makes
the cluster SASL_SSL-only with an admin user (cluster_secure.py). In the foreground it
then waits for Ctrl-C/SIGTERM and stops every node cleanly; with --detach it returns and
`down` stops the nodes later.
"""

from __future__ import annotations

import dataclasses
import shutil
import signal
from pathlib import Path
from typing import Any

import click
import trio
from raftlog_cli import cluster_local as local
from raftlog_cli import cluster_secure as secure
from raftlog_cli.cluster_health import gather_status
from raftlog_cli.cluster_nodes import (
    DEFAULT_READY_TIMEOUT_S,
    add_node,
    dir_option,
    remove_node,
    require_cluster,
    wait_ready,
)
from raftlog_cli.common import Options, common_options, connect, run_async
from raftlog_cli.errors import CliError
from raftlog_cli.render import Renderer
from raftlog_cli.render_security import render_secure_cluster

from raftlog.client.properties import PLAINTEXT, ClientPropertiesError, load_client_properties
from raftlog.errors import ConfigError


@click.group("cluster")
def cluster_group() -> None:
    """Run a local cluster (one process per node) and check its health."""


def _require(cluster_dir: Path) -> local.LocalCluster:
    return require_cluster(cluster_dir)


def _running(cluster: local.LocalCluster) -> dict[int, int]:
    return {n.node_id: pid for n in cluster.nodes if (pid := local.running_pid(n)) is not None}


@cluster_group.command("up")
@click.option(
    "--nodes", type=click.IntRange(1, local.MAX_LOCAL_NODES), default=3, show_default=True
)
@dir_option
@click.option("--detach", is_flag=True, help="Return once the cluster is ready.")
@click.option(
    "--base-port",
    type=click.IntRange(1024, 65535 - local.INTERNAL_PORT_OFFSET - local.MAX_LOCAL_NODES),
    default=local.DEFAULT_BASE_PORT,
    show_default=True,
    help="Client port of node 1 (internal ports are 10000 higher).",
)
@click.option(
    "--timeout-s",
    type=click.FloatRange(min=1),
    default=DEFAULT_READY_TIMEOUT_S,
    show_default=True,
    help="How long to wait for the cluster to become ready.",
)
@click.option(
    "--node-config",
    "node_configs",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set a node config key on every node (see `raftlog node --help`).",
)
@click.option(
    "--secure",
    "secure_mode",
    is_flag=True,
    help="SASL_SSL only: a local CA and node certificates, mutual TLS between nodes, ACLs "
    "on, and an admin user whose client properties file is printed.",
)
@click.option("--json", "json_mode", is_flag=True, help="Print JSON.")
def up(
    nodes: int,
    cluster_dir: Path,
    detach: bool,
    base_port: int,
    timeout_s: float,
    node_configs: tuple[str, ...],
    secure_mode: bool,
    json_mode: bool,
) -> None:
    """Start a local cluster of combined controller+broker nodes."""
    out = Renderer(json_mode=json_mode)
    try:
        overrides = dict(local.parse_override(item) for item in node_configs)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    cluster = local.load_cluster(cluster_dir)
    if cluster is not None:
        running = _running(cluster)
        if running:
            raise CliError(
                f"a cluster is already running in {cluster_dir} (nodes "
                f"{', '.join(map(str, sorted(running)))}; bootstrap servers "
                f"{cluster.bootstrap_servers}); stop it with: raftlog cluster down"
            )
        if len(cluster.nodes) != nodes:
            raise CliError(
                f"{cluster_dir} holds a {len(cluster.nodes)}-node cluster; start it with "
                f"--nodes {len(cluster.nodes)} or remove it with: raftlog cluster down --purge"
            )
        if secure_mode and not cluster.secure:
            raise CliError(
                f"{cluster_dir} holds a plaintext cluster; remove it with "
                "raftlog cluster down --purge before starting a secure one"
            )
    else:
        cluster = local.plan_cluster(cluster_dir, nodes, base_port)
        if secure_mode:
            cluster = dataclasses.replace(
                cluster, client_properties=secure.client_properties_path(cluster)
            )
    busy = [port for n in cluster.nodes for port in n.ports if local.port_in_use(port)]
    if busy:
        raise CliError(
            f"ports {', '.join(map(str, busy))} are in use (another cluster or program?); "
            "choose others with --base-port"
        )
    try:
        if cluster.secure:
            material = secure.prepare(cluster)
            local.write_cluster(
                cluster, overrides, lambda node: secure.node_overrides(cluster, node, material)
            )
        else:
            local.write_cluster(cluster, overrides)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    # In the foreground, a SIGTERM or SIGHUP that comes while the nodes start is kept, not
    # fatal: killing `up` then would leave the nodes running with nobody to stop them. The
    # cluster is stopped as soon as it is up (Ctrl-C during start-up stops it at once).
    early_signals: list[int] = []
    if not detach:
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, lambda received, _frame: early_signals.append(received))
    started = {node.node_id: local.start_node(node) for node in cluster.nodes}

    async def start() -> str:
        try:
            return await wait_ready(cluster, started, timeout_s, out)
        except BaseException:
            with trio.CancelScope(shield=True):
                await local.stop_nodes(list(cluster.nodes))
            raise

    detail = run_async(None, start)
    info: dict[str, Any] = {
        "dir": str(cluster.root),
        "cluster_id": cluster.cluster_id,
        "bootstrap_servers": cluster.bootstrap_servers,
        "nodes": [n.to_json() for n in cluster.nodes],
        "ready": detail,
    }
    if cluster.secure:
        info["security_protocol"] = "SASL_SSL"
        info["admin_user"] = secure.ADMIN_USER
        info["client_properties"] = str(cluster.client_properties)
        info["ca_location"] = str(secure.ca_path(cluster))
        render_secure_cluster(out, info)
    else:
        out.cluster_started(info)
    if detach:
        return

    async def foreground() -> dict[int, str]:
        # SIGHUP: the terminal closed. The nodes run in their own sessions (Ctrl-C must not
        # reach them before the controlled shutdown), so nothing else would stop them.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            if not early_signals:
                async for _ in signals:
                    break
        click.echo("Stopping the cluster...", err=True)
        return await local.stop_nodes(list(cluster.nodes))

    _report_stopped(out, run_async(None, foreground))


def _report_stopped(out: Renderer, outcome: dict[int, str]) -> None:
    text = ", ".join(f"node {i} {how}" for i, how in outcome.items())
    out.message(f"Cluster stopped: {text}", {"stopped": {str(i): h for i, h in outcome.items()}})


@cluster_group.command("down")
@dir_option
@click.option("--purge", is_flag=True, help="Also delete the cluster directory and its data.")
@click.option("--json", "json_mode", is_flag=True, help="Print JSON.")
def down(cluster_dir: Path, purge: bool, json_mode: bool) -> None:
    """Stop every node of the local cluster (controlled shutdown, then SIGKILL)."""
    out = Renderer(json_mode=json_mode)
    cluster = _require(cluster_dir)
    outcome = run_async(None, lambda: local.stop_nodes(list(cluster.nodes)))
    if purge:
        shutil.rmtree(cluster.root)
    _report_stopped(out, outcome)


@cluster_group.command("status")
@dir_option
@common_options
def status(cluster_dir: Path, opts: Options) -> None:
    """Quorum leader and epoch, voter lag, fenced brokers, under-replicated and offline
    partitions. Exit code 0 when healthy, 1 when degraded."""
    cluster = local.load_cluster(cluster_dir)
    if cluster is not None and not opts.explicit_bootstrap:
        opts.bootstrap_server = (
            ",".join(n.client_address for n in cluster.nodes if local.running_pid(n) is not None)
            or cluster.bootstrap_servers
        )
        if cluster.client_properties is not None and opts.security is PLAINTEXT:
            # A secure local cluster named with --dir: its own client properties.
            try:
                opts.security = load_client_properties(cluster.client_properties).security
            except ClientPropertiesError as exc:
                raise CliError(str(exc)) from None

    async def go() -> dict[str, Any]:
        async with connect(opts) as client:
            return await gather_status(client, cluster)

    report = run_async(opts, go)
    opts.out.cluster_status(report)
    if not opts.out.json_mode and "metrics" in report:
        _render_metrics(opts, report)
    if not report["healthy"]:
        raise click.exceptions.Exit(1)


METRICS_COLUMNS = [
    ("node_id", "NODE"),
    ("leader_count", "LEADERS"),
    ("partition_count", "REPLICAS"),
    ("under_replicated_partitions", "UNDER-REPLICATED"),
    ("under_min_isr_partitions", "UNDER MIN ISR"),
    ("metadata_epoch", "METADATA EPOCH"),
]


def _render_metrics(opts: Options, report: dict[str, Any]) -> None:
    """The figures scraped from each node's /metrics: the numbers a dashboard shows."""
    counts = report["metrics"]
    opts.out.text(
        f"Metrics: {counts['under_replicated_partitions']} under-replicated, "
        f"{counts['under_min_isr_partitions']} under min ISR, "
        f"{counts['offline_partitions']} offline, "
        f"{counts['active_controller']} active controller(s)"
    )
    rows = [
        {"node_id": n["node_id"], **(n.get("metrics") or {})}
        for n in report["nodes"]
        if "metrics" in n
    ]
    opts.out.table(METRICS_COLUMNS, rows)


@cluster_group.command("kill")
@click.argument("node_id", metavar="NODE", type=int)
@dir_option
def kill(node_id: int, cluster_dir: Path) -> None:
    """SIGKILL one node (no controlled shutdown: a crash)."""
    node = _lookup(cluster_dir, node_id)
    pid = local.signal_node(node, signal.SIGKILL)
    if pid is None:
        raise CliError(f"node {node_id} is not running")
    run_async(None, lambda: local.wait_exited({node: pid}, local.SHUTDOWN_TIMEOUT_S))
    click.echo(f"Killed node {node_id} (pid {pid})")


@cluster_group.command("restart")
@click.argument("node_id", metavar="NODE", type=int)
@dir_option
@click.option(
    "--timeout-s", type=click.FloatRange(min=1), default=DEFAULT_READY_TIMEOUT_S, show_default=True
)
def restart(node_id: int, cluster_dir: Path, timeout_s: float) -> None:
    """Stop NODE if it runs (controlled shutdown), start it, wait until it is unfenced."""
    cluster = _require(cluster_dir)
    node = _lookup(cluster_dir, node_id)

    async def go() -> str:
        await local.stop_nodes([node])
        started = {node_id: local.start_node(node)}
        return await wait_ready(cluster, started, timeout_s, Renderer(json_mode=False))

    run_async(None, go)
    click.echo(f"Restarted node {node_id}")


def _lookup(cluster_dir: Path, node_id: int) -> local.LocalNode:
    cluster = _require(cluster_dir)
    try:
        return cluster.node(node_id)
    except LookupError as exc:
        raise CliError(str(exc)) from None


cluster_group.add_command(add_node)
cluster_group.add_command(remove_node)
