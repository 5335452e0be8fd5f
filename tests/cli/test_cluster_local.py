"""`raftlog cluster up|down|kill` bookkeeping without real nodes: configs, pid checks,
"already running", port conflicts and bad overrides."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import trio
from raftlog_cli import cluster_local as local

from raftlog.config import NodeConfig
from tests.cli.conftest import invoke


def test_planned_configs_are_valid_and_consistent(tmp_path: Path) -> None:
    cluster = local.plan_cluster(tmp_path / ".raftlog", 3, 9092)
    local.write_cluster(cluster, {"broker_session_timeout_ms": 3000})
    configs = [NodeConfig.load(n.config_path) for n in cluster.nodes]
    assert [c.client_listener for c in configs] == [
        "127.0.0.1:9092",
        "127.0.0.1:9093",
        "127.0.0.1:9094",
    ]
    assert [c.internal_listener for c in configs] == [
        "127.0.0.1:19092",
        "127.0.0.1:19093",
        "127.0.0.1:19094",
    ]
    assert {c.controller_quorum_voters for c in configs} == {
        "1@127.0.0.1:19092,2@127.0.0.1:19093,3@127.0.0.1:19094"
    }
    assert {c.cluster_id for c in configs} == {cluster.cluster_id}
    assert all(c.roles == ["controller", "broker"] for c in configs)
    assert all(c.broker_session_timeout_ms == 3000 for c in configs)
    assert [c.data_path for c in configs] == [n.node_dir / "data" for n in cluster.nodes]
    saved = json.loads((tmp_path / ".raftlog" / "cluster.json").read_text())
    assert saved["bootstrap_servers"] == "127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094"
    assert local.load_cluster(tmp_path / ".raftlog") == cluster


def test_override_parsing() -> None:
    assert local.parse_override("retention_ms=5") == ("retention_ms", 5)
    assert local.parse_override("unclean_leader_election=true") == (
        "unclean_leader_election",
        True,
    )
    assert local.parse_override("flush_policy=interval") == ("flush_policy", "interval")


async def test_up_refuses_bad_override_and_busy_ports(tmp_path: Path) -> None:
    root = tmp_path / "c"
    r = await invoke(["cluster", "up", "--dir", str(root), "--node-config", "bogus_key=1"])
    assert (r.exit_code, r.stderr) == (1, "error: --node-config: unknown key 'bogus_key'\n")
    with socket.socket() as busy:
        # A port inside --base-port's range (an ephemeral port 0 pick may lie above it).
        for port in range(21_000 + os.getpid() % 1000, 30_000):
            try:
                busy.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
        busy.listen()
        r = await invoke(
            ["cluster", "up", "--dir", str(root), "--nodes", "1", "--base-port", str(port)]
        )
    assert r.exit_code == 1
    assert r.stderr == (
        f"error: ports {port} are in use (another cluster or program?); "
        "choose others with --base-port\n"
    )


async def test_second_up_and_down_with_a_running_node(tmp_path: Path) -> None:
    root = tmp_path / "c"
    cluster = local.plan_cluster(root, 1, 9092)
    local.write_cluster(cluster)
    node = cluster.nodes[0]
    # Stands in for a node: a process whose command line names the node's config, as
    # running_pid requires; it ends on SIGTERM like a node.
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", "import sys; sys.stdin.read()", str(node.config_path)],
        stdin=subprocess.PIPE,
    )
    node.pid_path.write_text(f"{process.pid}\n")
    try:
        # open_process returns after fork; the command line is the stand-in's once it execs.
        with trio.fail_after(10):
            while local.running_pid(node) != process.pid:  # noqa: ASYNC110
                await trio.sleep(0.01)
        r = await invoke(["cluster", "up", "--dir", str(root), "--nodes", "1"])
        assert r.exit_code == 1
        assert r.stderr == (
            f"error: a cluster is already running in {root} (nodes 1; bootstrap servers "
            "127.0.0.1:9092); stop it with: raftlog cluster down\n"
        )
        r = await invoke(["cluster", "down", "--dir", str(root)])
        assert (r.exit_code, r.stdout) == (0, "Cluster stopped: node 1 stopped\n")
        assert local.running_pid(node) is None
        r = await invoke(["cluster", "kill", "1", "--dir", str(root)])
        assert (r.exit_code, r.stderr) == (1, "error: node 1 is not running\n")
        r = await invoke(["cluster", "kill", "7", "--dir", str(root)])
        assert (r.exit_code, r.stderr) == (
            1,
            f"error: no node 7 in the cluster in {root.resolve()} (nodes: 1)\n",
        )
    finally:
        process.kill()
        await process.wait()


async def test_stale_pid_file_is_not_trusted(tmp_path: Path) -> None:
    cluster = local.plan_cluster(tmp_path, 1, 9092)
    local.write_cluster(cluster)
    node = cluster.nodes[0]
    # Our own pid: alive, but its command line does not name the node's config.
    node.pid_path.write_text(f"{os.getpid()}\n")
    assert local.running_pid(node) is None


async def test_commands_without_a_cluster(tmp_path: Path) -> None:
    r = await invoke(["cluster", "down", "--dir", str(tmp_path / "none")])
    assert (r.exit_code, r.stderr) == (
        1,
        f"error: no local cluster in {tmp_path / 'none'} (start one: raftlog cluster up)\n",
    )
