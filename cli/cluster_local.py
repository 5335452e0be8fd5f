"""A local cluster on disk and its node processes: layout, configs, pid files, signals.

Layout of a cluster directory (default .raftlog/):

    cluster.json           bootstrap servers and one entry per node (what `status` reads),
                           and the client properties file of a secure cluster
                           (cluster_secure.py adds tls/ and client.properties)
    node-N/node.toml       the node's NodeConfig
    node-N/node.log        its stdout and stderr
    node-N/node.pid        its process id while it runs
    node-N/data/           its data_dir (metadata log, partition logs, checkpoints)

Pids are checked against /proc/PID/cmdline before any signal, so a stale pid file whose
number now belongs to another program is never signalled.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from raftlog.config import NodeConfig

CLUSTER_FILE = "cluster.json"
DEFAULT_BASE_PORT = 9092
# Internal (Raft and replication) ports sit this far above the client ports: 9092 -> 19092.
INTERNAL_PORT_OFFSET = 10_000
# Prometheus metrics (GET /metrics) this far above the client ports: 9092 -> 9644.
METRICS_PORT_OFFSET = 552
LOOPBACK = "127.0.0.1"
MAX_LOCAL_NODES = 9
# A node doing a controlled shutdown hands off leadership first; give it time.
SHUTDOWN_TIMEOUT_S = 30.0
PROCESS_POLL_INTERVAL_S = 0.05
LOG_TAIL_LINES = 5


@dataclass(frozen=True)
class LocalNode:
    node_id: int
    client_port: int
    internal_port: int
    node_dir: Path

    @property
    def config_path(self) -> Path:
        return self.node_dir / "node.toml"

    @property
    def log_path(self) -> Path:
        return self.node_dir / "node.log"

    @property
    def pid_path(self) -> Path:
        return self.node_dir / "node.pid"

    @property
    def client_address(self) -> str:
        return f"{LOOPBACK}:{self.client_port}"

    @property
    def metrics_port(self) -> int:
        return self.client_port + METRICS_PORT_OFFSET

    @property
    def metrics_address(self) -> str:
        return f"{LOOPBACK}:{self.metrics_port}"

    @property
    def ports(self) -> tuple[int, int, int]:
        """Every port the node listens on."""
        return (self.client_port, self.internal_port, self.metrics_port)

    def to_json(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "client_port": self.client_port,
            "internal_port": self.internal_port,
            "dir": str(self.node_dir),
        }


@dataclass(frozen=True)
class LocalCluster:
    root: Path
    cluster_id: str
    nodes: tuple[LocalNode, ...]
    # Set for a cluster started with --secure (SASL_SSL): how clients connect to it.
    client_properties: Path | None = None

    @property
    def secure(self) -> bool:
        return self.client_properties is not None

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.client_address for n in self.nodes)

    def node(self, node_id: int) -> LocalNode:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        known = ", ".join(str(n.node_id) for n in self.nodes)
        raise LookupError(f"no node {node_id} in the cluster in {self.root} (nodes: {known})")

    def to_json(self) -> dict[str, Any]:
        out = {
            "cluster_id": self.cluster_id,
            "bootstrap_servers": self.bootstrap_servers,
            "nodes": [n.to_json() for n in self.nodes],
        }
        if self.client_properties is not None:
            out["client_properties"] = str(self.client_properties)
        return out


def plan_cluster(root: Path, nodes: int, base_port: int) -> LocalCluster:
    """The cluster `up` would create (nothing is written)."""
    root = root.resolve()
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    members = tuple(
        LocalNode(
            node_id=i,
            client_port=base_port + i - 1,
            internal_port=base_port + INTERNAL_PORT_OFFSET + i - 1,
            node_dir=root / f"node-{i}",
        )
        for i in range(1, nodes + 1)
    )
    return LocalCluster(root, cluster_id, members)


def node_config(
    cluster: LocalCluster, node: LocalNode, overrides: dict[str, Any] | None = None
) -> NodeConfig:
    """Combined controller+broker config; every node is a voter. Overrides are validated
    like a config file's keys (ConfigError names the bad one)."""
    voters = ",".join(f"{n.node_id}@{LOOPBACK}:{n.internal_port}" for n in cluster.nodes)
    replication = min(3, len(cluster.nodes))
    values: dict[str, Any] = dict(
        node_settings(node),
        roles=["controller", "broker"],
        cluster_id=cluster.cluster_id,
        controller_quorum_voters=voters,
        default_replication_factor=replication,
        offsets_topic_replication_factor=replication,
        min_insync_replicas=1,
    )
    values.update(overrides or {})
    return NodeConfig.from_dict(values, source="--node-config")


def node_settings(node: LocalNode) -> dict[str, Any]:
    """The config keys that differ from node to node: its id, data directory and listeners."""
    return dict(
        node_id=node.node_id,
        data_dir=str(node.node_dir / "data"),
        client_listener=f"{LOOPBACK}:{node.client_port}",
        internal_listener=f"{LOOPBACK}:{node.internal_port}",
        metrics_listener=node.metrics_address,
    )


def joining_node_config(template: dict[str, Any], node: LocalNode) -> NodeConfig:
    """The config of a node joining a running cluster (`cluster add-node`): a member's
    config keys (`template`, read from its node.toml: the cluster id, bootstrap voters,
    --node-config settings) with the new node's own keys. It is a broker only: config.py
    refuses the controller role to a node outside controller_quorum_voters, so it joins the
    metadata quorum as an observer and becomes a voter through AddRaftVoter (KIP-853)."""
    return NodeConfig.from_dict(
        {**template, **node_settings(node), "roles": ["broker"]},
        source=f"node {node.node_id}",
    )


def write_node(cluster: LocalCluster, node: LocalNode, config_toml: str) -> None:
    """One node's data directory and config. A secure cluster's configs are private
    (0600): they seed the admin user's credential."""
    (node.node_dir / "data").mkdir(parents=True, exist_ok=True)
    if cluster.secure:
        _write_private(node.config_path, config_toml)
    else:
        node.config_path.write_text(config_toml)


def save_cluster(cluster: LocalCluster) -> None:
    """Rewrite cluster.json (after a node was added or removed)."""
    _write_atomically(cluster.root / CLUSTER_FILE, json.dumps(cluster.to_json(), indent=2) + "\n")


def parse_override(item: str) -> tuple[str, Any]:
    """KEY=VALUE with VALUE read as a TOML value (3000, true, "x"), else as a plain string."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--node-config: expected KEY=VALUE, got {item!r}")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    return key.strip(), value


def write_cluster(
    cluster: LocalCluster,
    overrides: dict[str, Any] | None = None,
    node_overrides: Callable[[LocalNode], dict[str, Any]] | None = None,
) -> None:
    """Write every node's config and cluster.json (configs first: cluster.json marks done).

    node_overrides(node): keys of one node (a secure cluster's certificates); `overrides`
    (the user's --node-config) win over them.
    """
    configs = {}
    for n in cluster.nodes:
        values = dict(node_overrides(n)) if node_overrides else {}
        values.update(overrides or {})
        configs[n.node_id] = node_config(cluster, n, values).to_toml()
    for node in cluster.nodes:
        write_node(cluster, node, configs[node.node_id])
    save_cluster(cluster)


def load_cluster(root: Path) -> LocalCluster | None:
    path = root / CLUSTER_FILE
    try:
        data = json.loads(path.read_text())
        nodes = tuple(
            LocalNode(
                int(n["node_id"]), int(n["client_port"]), int(n["internal_port"]), Path(n["dir"])
            )
            for n in data["nodes"]
        )
        properties = data.get("client_properties")
        return LocalCluster(
            root.resolve(),
            str(data["cluster_id"]),
            nodes,
            Path(properties) if properties else None,
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is damaged ({exc}); remove {root} to start afresh") from None


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------- processes
def node_command(node: LocalNode) -> list[str]:
    return [sys.executable, "-m", "raftlog_cli.main", "node", "--config", str(node.config_path)]


def _reap(pid: int) -> None:
    """Collect the exit status if pid is our own child (tests start nodes in-process)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def running_pid(node: LocalNode) -> int | None:
    """The node's pid if its process is alive and really is this node."""
    try:
        pid = int(node.pid_path.read_text().strip())
    except (OSError, ValueError):
        return None
    _reap(pid)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
    if state == "Z" or str(node.config_path).encode() not in cmdline:
        return None
    return pid


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((LOOPBACK, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def start_node(node: LocalNode) -> subprocess.Popen[bytes]:
    """Start the node detached from our session (it outlives `up --detach` and is not hit
    by the terminal's Ctrl-C; `up` in the foreground forwards SIGTERM itself)."""
    with node.log_path.open("ab") as log:
        process = subprocess.Popen(
            node_command(node),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    _write_atomically(node.pid_path, f"{process.pid}\n")
    return process


def log_tail(node: LocalNode, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = node.log_path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


async def wait_exited(pid_of: dict[LocalNode, int], timeout_s: float) -> list[LocalNode]:
    """Wait (polling, with a deadline) until the processes exit; return those still alive."""
    with trio.move_on_after(timeout_s):
        # Polling is the only way: these processes are usually not our children (`down` runs
        # in a later process), so there is nothing to wait on.
        while any(running_pid(n) == pid for n, pid in pid_of.items()):  # noqa: ASYNC110
            await trio.sleep(PROCESS_POLL_INTERVAL_S)
    return [n for n, pid in pid_of.items() if running_pid(n) == pid]


def signal_node(node: LocalNode, signum: signal.Signals) -> int | None:
    pid = running_pid(node)
    if pid is None:
        return None
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return None
    return pid


async def stop_nodes(
    nodes: list[LocalNode], timeout_s: float = SHUTDOWN_TIMEOUT_S
) -> dict[int, str]:
    """SIGTERM each node (controlled shutdown), wait with a deadline, then SIGKILL.

    Returns node id -> how it ended: "stopped", "killed" or "not running".
    """
    outcome: dict[int, str] = {}
    pid_of: dict[LocalNode, int] = {}
    for node in nodes:
        pid = signal_node(node, signal.SIGTERM)
        if pid is None:
            outcome[node.node_id] = "not running"
        else:
            pid_of[node] = pid
    for node in await wait_exited(pid_of, timeout_s):
        signal_node(node, signal.SIGKILL)
        outcome[node.node_id] = "killed"
    await wait_exited(pid_of, timeout_s)
    for node in pid_of:
        outcome.setdefault(node.node_id, "stopped")
        node.pid_path.unlink(missing_ok=True)
    return dict(sorted(outcome.items()))
