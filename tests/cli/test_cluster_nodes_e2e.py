"""End to end with real node processes: `raftlog cluster up` (three nodes), a topic of
replication factor 3 with records produced at acks=all, `cluster add-node --voter`, then
`cluster remove-node 1`: every record is still readable, node 1 is in no replica set, and
the quorum has three voters (2, 3 and the new node 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cluster_e2e import free_base_port, node_serves_kafka, run, wait_status

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.skipif(
        not node_serves_kafka(), reason="raftlog.node does not serve the Kafka protocol yet"
    ),
]

RECORDS = [f"record-{i}" for i in range(20)]


async def test_add_a_voter_then_remove_an_original_node(tmp_path: Path) -> None:
    base = free_base_port(4)
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
        )
        await run(
            tmp_path, "topics", "create", "events", "--partitions", "2", "--replication-factor", "3"
        )
        for partition in ("0", "1"):
            await run(
                tmp_path,
                "produce",
                "events",
                "--partition",
                partition,
                "--acks",
                "all",
                input="".join(f"{r}\n" for r in RECORDS),
            )

        # Refused while only three voters exist: node 1 is one of them.
        refused = await run(tmp_path, "cluster", "remove-node", "1", "--yes", check=False)
        assert refused.returncode == 1 and b"fewer than 3" in refused.stderr, refused.stderr

        added = json.loads((await run(tmp_path, "cluster", "add-node", "--voter", "--json")).stdout)
        assert added["node_id"] == 4 and added["voters"] == [1, 2, 3, 4]
        assert added["client_port"] == base + 3

        removed = json.loads(
            (await run(tmp_path, "cluster", "remove-node", "1", "--yes", "--json")).stdout
        )
        assert removed["was_voter"] and len(removed["moved"]) >= 2
        assert removed["unregistered"], removed

        for partition in ("0", "1"):
            consumed = await run(
                tmp_path,
                "consume",
                "events",
                "--partition",
                partition,
                "--from-beginning",
                "-n",
                str(len(RECORDS)),
            )
            assert consumed.stdout.decode().split() == RECORDS
        described = json.loads(
            (await run(tmp_path, "topics", "describe", "events", "--json")).stdout
        )
        for p in described["partitions"]:
            assert 1 not in p["replicas"] and len(p["replicas"]) == 3, p
        quorum = json.loads((await run(tmp_path, "cluster", "describe-quorum", "--json")).stdout)
        voters = sorted(r["replica_id"] for r in quorum["replicas"] if r["role"] != "observer")
        assert voters == [2, 3, 4]
        cluster = json.loads((tmp_path / ".raftlog" / "cluster.json").read_text())
        assert [n["node_id"] for n in cluster["nodes"]] == [2, 3, 4]
        # Healthy without node 1: nothing fenced, under-replicated or offline among the rest.
        await wait_status(tmp_path, True, lambda s: {n["node_id"] for n in s["nodes"]} == {2, 3, 4})
    finally:
        down = await run(tmp_path, "cluster", "down", check=False)
    assert down.returncode == 0, down.stderr
