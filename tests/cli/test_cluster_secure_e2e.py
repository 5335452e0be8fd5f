"""End to end: `raftlog cluster up --secure --detach` starts a real SASL_SSL-only node; the
CLI, run in the same directory, finds the client properties file by itself and manages
topics, SCRAM users and ACLs; a plaintext client is turned away; the cluster stops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from raftlog.client.properties import load_client_properties
from tests.cli.test_cluster_e2e import free_base_port, node_serves_kafka, run

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        not node_serves_kafka(), reason="raftlog.node does not serve the Kafka protocol yet"
    ),
]


async def test_secure_cluster_lifecycle(tmp_path: Path) -> None:
    base = await _base_port()
    try:
        up = await run(tmp_path, "cluster", "up", "--secure", "--detach", "--nodes", "1",
                       "--base-port", str(base), "--json")  # fmt: skip
        info = json.loads(up.stdout.decode().strip().splitlines()[-1])
        properties = Path(info["client_properties"])
        assert info["security_protocol"] == "SASL_SSL" and info["admin_user"] == "admin"
        security = load_client_properties(properties).security
        assert security.protocol.value == "SASL_SSL"
        assert ((await trio.Path(properties).stat()).st_mode & 0o777) == 0o600

        created = await run(tmp_path, "topics", "create", "events", "--partitions", "1")
        assert created.stdout == b"Created topic events (1 partitions, replication factor 1)\n"
        await run(tmp_path, "users", "create", "--user", "bob", "--password-stdin",
                  input="bob-secret\n")  # fmt: skip
        users = json.loads((await run(tmp_path, "users", "list", "--json")).stdout)
        assert {u["user"] for u in users} == {"admin", "bob"}
        await run(tmp_path, "acls", "create", "--allow-principal", "User:bob",
                  "--operation", "Read", "--topic", "events")  # fmt: skip
        acls = json.loads((await run(tmp_path, "acls", "list", "--json")).stdout)
        assert [(a["principal"], a["operation"]) for a in acls] == [("User:bob", "READ")]

        # Naming the local nodes explicitly still uses the cluster's properties file.
        named = await run(tmp_path, "topics", "list", "--bootstrap-server",
                          info["bootstrap_servers"], "--json")  # fmt: skip
        assert [t["name"] for t in json.loads(named.stdout)] == ["events"]
        # Without the properties file (another directory): the listener hangs up.
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        plain = await run(elsewhere, "topics", "list", "--bootstrap-server",
                          info["bootstrap_servers"], check=False)  # fmt: skip
        assert plain.returncode == 1
        assert b"if it is secured, pass --command-config" in plain.stderr
        # With it, from anywhere.
        listed = await run(elsewhere, "topics", "list", "--command-config", str(properties),
                           "--json")  # fmt: skip
        assert [t["name"] for t in json.loads(listed.stdout)] == ["events"]
        # cluster status from elsewhere, naming the cluster's directory: its properties too.
        status = await run(elsewhere, "cluster", "status", "--dir", str(tmp_path / ".raftlog"),
                           "--json")  # fmt: skip
        assert json.loads(status.stdout)["healthy"] is True
    finally:
        down = await run(tmp_path, "cluster", "down", check=False)
    assert down.returncode == 0, down.stderr


async def _base_port() -> int:
    return free_base_port(1)
