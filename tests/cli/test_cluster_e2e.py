"""End to end: `raftlog cluster up --detach` starts three real node processes; the CLI
creates a topic, produces, consumes, describes, kills a node, sees it fenced and the
partitions under-replicated, restarts it, sees the cluster healthy, and stops it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from raftlog_cli import cluster_local as local

RAFTLOG = [sys.executable, "-m", "raftlog_cli.main"]
STATUS_DEADLINE_S = 90
COMMAND_DEADLINE_S = 120


def node_serves_kafka() -> bool:
    """The node can run a cluster this test can talk to: run_node exists and the node
    wires the Kafka protocol server (its client listener)."""
    try:
        import raftlog.node as node
    except ImportError:
        return False
    if not hasattr(node, "run_node") or node.__file__ is None:
        return False
    # Other tests import the server module too, so sys.modules says nothing; the node's own
    # source has to use it (until then its client port never opens).
    return "raftlog.net.kafka" in Path(node.__file__).read_text()


pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        not node_serves_kafka(), reason="raftlog.node does not serve the Kafka protocol yet"
    ),
]


# Every port a local cluster uses (client, internal = client + 10000, metrics = client + 552)
# stays below Linux's ephemeral range (32768 and up), where the other tests' client sockets
# and bind(0) listeners come from: a free port checked here cannot be taken a moment later by
# an outgoing connection.
BASE_PORT_LOW = 12_000
BASE_PORT_HIGH = 32_000 - local.INTERNAL_PORT_OFFSET - local.MAX_LOCAL_NODES


def free_base_port(nodes: int) -> int:
    # Seeded by pid so parallel runs on one machine rarely collide; checked below anyway.
    span = BASE_PORT_HIGH - BASE_PORT_LOW
    start = BASE_PORT_LOW + (os.getpid() * 10) % span
    for offset in range(0, span, 10):
        base = BASE_PORT_LOW + (start - BASE_PORT_LOW + offset) % span
        planned = local.plan_cluster(Path("."), nodes, base)
        if not any(local.port_in_use(p) for n in planned.nodes for p in n.ports):
            return base
    raise RuntimeError("no free port range")


async def run(
    cwd: Path, *args: str, input: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(COMMAND_DEADLINE_S):
        result = await trio.run_process(
            [*RAFTLOG, *args],
            cwd=cwd,
            stdin=input.encode() if input is not None else b"",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    if check and result.returncode != 0:
        raise AssertionError(f"raftlog {' '.join(args)} failed: {result.stderr.decode()}")
    return result


async def wait_status(cwd: Path, healthy: bool, predicate) -> dict:  # type: ignore[no-untyped-def]
    status: dict = {}
    with trio.move_on_after(STATUS_DEADLINE_S):
        while True:
            result = await run(cwd, "cluster", "status", "--json", check=False)
            if result.stdout:
                status = json.loads(result.stdout)
                if (result.returncode == 0) == healthy and predicate(status):
                    return status
            await trio.sleep(0.5)
    raise AssertionError(f"status never became {'healthy' if healthy else 'degraded'}: {status}")


async def test_cluster_lifecycle(tmp_path: Path) -> None:
    base = free_base_port(3)
    try:
        await run(
            tmp_path,
            "cluster",
            "up",
            "--detach",
            "--nodes",
            "3",
            "--base-port",
            str(base),
            "--node-config",
            "broker_session_timeout_ms=3000",
            "--node-config",
            "broker_heartbeat_interval_ms=500",
            "--node-config",
            "replica_lag_time_max_ms=2000",
        )
        again = await run(tmp_path, "cluster", "up", "--detach", check=False)
        assert again.returncode == 1 and b"already running" in again.stderr

        await run(
            tmp_path, "topics", "create", "events", "--partitions", "3", "--replication-factor", "3"
        )
        produced = await run(
            tmp_path, "produce", "events", "--partition", "0", input="one\ntwo\nthree\n"
        )
        assert produced.stdout == b"Produced 3 records to events (partition 0: offsets 0-2)\n"
        consumed = await run(
            tmp_path, "consume", "events", "--partition", "0", "--from-beginning", "-n", "3"
        )
        assert consumed.stdout == b"one\ntwo\nthree\n"
        described = json.loads(
            (await run(tmp_path, "topics", "describe", "events", "--json")).stdout
        )
        p0 = described["partitions"][0]
        assert sorted(p0["replicas"]) == [1, 2, 3] and sorted(p0["isr"]) == [1, 2, 3]
        assert p0["high_watermark"] == 3

        await wait_status(tmp_path, True, lambda s: True)
        await run(tmp_path, "cluster", "kill", "3")
        status = await wait_status(
            tmp_path,
            False,
            lambda s: (
                any(n["node_id"] == 3 and n["broker"] == "fenced" for n in s["nodes"])
                and s["under_replicated"]
            ),
        )
        assert "events-0" in status["under_replicated"]

        await run(tmp_path, "cluster", "restart", "3")
        await wait_status(tmp_path, True, lambda s: not s["under_replicated"])
    finally:
        down = await run(tmp_path, "cluster", "down", check=False)
    assert down.returncode == 0, down.stderr
