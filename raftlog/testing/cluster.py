"""Real node processes on loopback, for tests and benchmarks.

Each node is a `python -m raftlog_cli.main node --config FILE` subprocess with its own data
directory and log file, so what is tested is exactly what a user runs. Readiness is observed
through the Kafka protocol (metadata from every node, all brokers unfenced), never by sleeping.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raftlog.config import NodeConfig

# Timings that make elections and fencing take well under a second on loopback.
FAST_TIMINGS: dict[str, Any] = {
    "election_timeout_ms": 300,
    "fetch_timeout_ms": 600,
    "election_backoff_max_ms": 200,
    "raft_fetch_max_wait_ms": 100,
    "broker_session_timeout_ms": 2000,
    "broker_heartbeat_interval_ms": 200,
    "replica_lag_time_max_ms": 3000,
    "replica_fetch_wait_max_ms": 200,
}
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


# Ports for test nodes come from below Linux's ephemeral range (32768-60999): a port the OS
# handed out with bind(0) is free now but may be given to some outgoing connection before the
# node binds it; ports below that range are only ever taken by an explicit bind.
TEST_PORT_RANGE = (20000, 32700)


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that are bindable right now, outside the ephemeral range."""
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randrange(*TEST_PORT_RANGE)
        if port in ports:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports


@dataclass
class NodeProcess:
    node_id: int
    config: NodeConfig
    config_path: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    # Set when the harness itself stopped the process: a node that handles SIGTERM exits
    # with 0, and that exit is not a failure to report.
    stopped_on_purpose: bool = False

    @property
    def client_address(self) -> str:
        """The first listener's advertised HOST:PORT (what the node's Metadata names)."""
        first = self.config.advertised_client_listeners[0]
        return f"{first.host}:{first.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class ProcessCluster:
    """N combined controller+broker nodes in `root`; use as a context manager."""

    root: Path
    size: int = 3
    overrides: dict[str, Any] = field(default_factory=dict)
    nodes: dict[int, NodeProcess] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        ports = free_ports(2 * self.size)
        client_ports, internal_ports = ports[: self.size], ports[self.size :]
        voters = ",".join(f"{i + 1}@127.0.0.1:{internal_ports[i]}" for i in range(self.size))
        cluster_id = uuid.uuid4().hex
        for i in range(self.size):
            node_id = i + 1
            values = {
                "node_id": node_id,
                "data_dir": str(self.root / f"node-{node_id}" / "data"),
                "cluster_id": cluster_id,
                "client_listener": f"127.0.0.1:{client_ports[i]}",
                "internal_listener": f"127.0.0.1:{internal_ports[i]}",
                "controller_quorum_voters": voters,
                "default_replication_factor": min(3, self.size),
                **FAST_TIMINGS,
                **self.overrides,
            }
            config = NodeConfig.from_dict(values)
            node_dir = self.root / f"node-{node_id}"
            node_dir.mkdir(parents=True, exist_ok=True)
            config_path = node_dir / "node.toml"
            config_path.write_text(config.to_toml())
            self.nodes[node_id] = NodeProcess(node_id, config, config_path, node_dir / "node.log")

    def make_observers(self, node_ids: Collection[int]) -> None:
        """Make `node_ids` broker-only nodes outside every node's controller_quorum_voters, so
        they follow the metadata log as observers until AddRaftVoter (KIP-853) makes them
        voters; this is how a node joins a running cluster (config.py refuses the controller
        role to a node outside the static voters). Call it before the nodes first start."""
        observers = set(node_ids)
        if not observers <= set(self.nodes) or not set(self.nodes) - observers:
            raise ValueError(f"observers {sorted(observers)} must be some of {sorted(self.nodes)}")
        first = next(iter(self.nodes.values())).config
        voters = ",".join(
            item
            for item in first.controller_quorum_voters.split(",")
            if int(item.split("@", 1)[0]) not in observers
        )
        for node_id, node in list(self.nodes.items()):
            roles = ["broker"] if node_id in observers else list(node.config.roles)
            config = dataclasses.replace(node.config, controller_quorum_voters=voters, roles=roles)
            config.validate()
            node.config_path.write_text(config.to_toml())
            node.config = config

    def partition_log_dir(self, node_id: int, topic: str, partition: int) -> Path:
        """Where node_id keeps its replica of topic-partition (its segment files)."""
        return Path(self.nodes[node_id].config.data_dir) / "logs" / f"{topic}-{partition}"

    # ---------------------------------------------------------------- lifecycle
    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.client_address for n in self.nodes.values())

    def live_bootstrap_servers(self) -> str:
        return ",".join(n.client_address for n in self.nodes.values() if n.running)

    def start(self, node_id: int | None = None) -> None:
        for node in [self.nodes[node_id]] if node_id else list(self.nodes.values()):
            if node.running:
                continue
            log_file = node.log_path.open("ab")
            node.stopped_on_purpose = False
            node.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "raftlog_cli.main",
                    "node",
                    "--config",
                    str(node.config_path),
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            log_file.close()

    def kill(self, node_id: int, sig: signal.Signals = signal.SIGKILL) -> None:
        node = self.nodes[node_id]
        if node.process is None:
            return
        if sig in (signal.SIGKILL, signal.SIGTERM):
            node.stopped_on_purpose = True
        node.process.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            node.process.wait(STOP_TIMEOUT_S)

    def pause(self, node_id: int) -> None:
        self.kill(node_id, signal.SIGSTOP)

    def resume(self, node_id: int) -> None:
        self.kill(node_id, signal.SIGCONT)

    def restart(self, node_id: int) -> None:
        self.kill(node_id)
        self.start(node_id)

    def stop(self) -> None:
        """SIGTERM every node (controlled shutdown), SIGKILL what does not stop in time."""
        for node in self.nodes.values():
            if node.process is not None and node.running:
                node.stopped_on_purpose = True
                with contextlib.suppress(ProcessLookupError):
                    node.process.send_signal(signal.SIGCONT)
                    node.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for node in self.nodes.values():
            if node.process is None:
                continue
            try:
                node.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait()

    def __enter__(self) -> ProcessCluster:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- observation
    def describe(self, node_id: int | None = None, timeout_s: float = 5.0) -> dict[str, Any]:
        """Metadata as one node sees it: brokers, controller, topics (kafka-python-free)."""
        from raftlog.testing.probe import probe_metadata

        node = self.nodes[node_id] if node_id else next(n for n in self.nodes.values() if n.running)
        return probe_metadata(node.client_address, timeout_s)

    def wait_for(self, predicate: Any, what: str, timeout_s: float = READY_TIMEOUT_S) -> Any:
        """Poll `predicate()` until it returns a truthy value; fail with the node logs."""
        deadline = time.monotonic() + timeout_s
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                value = predicate()
                if value:
                    return value
            except Exception as exc:  # a node still starting refuses connections
                last_error = exc
            self._check_unexpected_exits()
            self._pause_s(0.05)
        logs = "\n".join(f"--- node {n.node_id}\n{n.log_tail()}" for n in self.nodes.values())
        raise TimeoutError(
            f"timed out after {timeout_s}s waiting for {what} (last error: {last_error})\n{logs}"
        )

    def _check_unexpected_exits(self) -> None:
        for node in self.nodes.values():
            if node.process is None or node.stopped_on_purpose:
                continue
            if node.process.poll() not in (None, -9, -15):
                raise RuntimeError(
                    f"node {node.node_id} exited with {node.process.returncode}:\n{node.log_tail()}"
                )

    def _pause_s(self, seconds: float) -> None:
        """The poll interval: wait on a running node, so an exit is noticed at once."""
        running = [n.process for n in self.nodes.values() if n.process is not None and n.running]
        if not running:
            time.sleep(seconds)  # nothing to wait on (every node stopped): still pace the poll
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            running[0].wait(seconds)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Every running node answers metadata listing every running broker as live."""
        running = {n.node_id for n in self.nodes.values() if n.running}

        def ready() -> bool:
            for node_id in running:
                brokers = {b["node_id"] for b in self.describe(node_id)["brokers"]}
                if not running <= brokers:
                    return False
            return True

        self.wait_for(ready, f"brokers {sorted(running)} to be up and unfenced", timeout_s)
