"""KIP-853 with real processes: three voters and a fourth node that starts as an observer
(its config names the three existing voters); it is added (3 -> 4 voters), then the leader
is removed (4 -> 3), and the cluster keeps committing metadata throughout."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import trio

from raftlog.client import Admin, NewTopic, open_cluster
from raftlog.client.quorum import QuorumAdmin, QuorumDescription
from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode, KafkaError
from raftlog.testing.cluster import NodeProcess, ProcessCluster

pytestmark = pytest.mark.cluster

NEW_NODE = 4
# A voter change is retried while it is refused for a reason that passes (a change pending,
# the observer not caught up yet, a leader that has not committed in its epoch yet).
RETRIED = (ErrorCode.request_timed_out, ErrorCode.not_controller)
CHANGE_DEADLINE_S = 60


def _observer_cluster(root: Path) -> ProcessCluster:
    """Four nodes; only 1-3 are voters. Node 4 is broker-only: config.py refuses a controller
    role for a node outside controller_quorum_voters, so a new controller starts this way."""
    cluster = ProcessCluster(root, 4)
    first = cluster.nodes[1].config
    voters = ",".join(
        item for item in first.controller_quorum_voters.split(",") if not item.startswith("4@")
    )
    for node_id, node in list(cluster.nodes.items()):
        roles = ["broker"] if node_id == NEW_NODE else list(node.config.roles)
        config = dataclasses.replace(node.config, controller_quorum_voters=voters, roles=roles)
        config.validate()
        node.config_path.write_text(config.to_toml())
        cluster.nodes[node_id] = NodeProcess(node_id, config, node.config_path, node.log_path)
    return cluster


async def _describe(bootstrap: str) -> QuorumDescription:
    async with open_cluster(bootstrap, client_id="membership-test") as cluster:
        return await QuorumAdmin(cluster).describe_quorum()


async def _change(bootstrap: str, *, add: NodeConfig | None = None, remove: int = -1) -> None:
    with trio.fail_after(CHANGE_DEADLINE_S):
        while True:
            try:
                async with open_cluster(bootstrap, client_id="membership-test") as cluster:
                    admin = QuorumAdmin(cluster, timeout_ms=10_000)
                    if add is not None:
                        host, port = add.advertised_internal_address
                        await admin.add_voter(add.node_id, [("CONTROLLER", host, port)])
                    else:
                        await admin.remove_voter(remove)
                return
            except KafkaError as exc:
                if exc.code not in RETRIED:
                    raise
            await trio.sleep(0.2)  # a retry pace, not a wait for state: the loop re-checks


async def _create_topic(bootstrap: str, name: str) -> None:
    with trio.fail_after(CHANGE_DEADLINE_S):
        async with open_cluster(bootstrap, client_id="membership-test") as cluster:
            results = await Admin(cluster).create_topics([NewTopic(name, 1, 2)])
    assert results[name].error == ErrorCode.none, results


def test_grow_to_four_voters_then_remove_the_leader(tmp_path: Path) -> None:
    with _observer_cluster(tmp_path / "c") as cluster:
        bootstrap = cluster.bootstrap_servers

        def voters() -> set[int]:
            return {v.replica_id for v in trio.run(_describe, bootstrap).voters}

        def observer_caught_up() -> bool:
            quorum = trio.run(_describe, bootstrap)
            return any(
                o.replica_id == NEW_NODE and o.log_end_offset >= quorum.high_watermark
                for o in quorum.observers
            )

        assert voters() == {1, 2, 3}
        cluster.wait_for(observer_caught_up, "node 4 to catch up as an observer")
        trio.run(lambda: _change(bootstrap, add=cluster.nodes[NEW_NODE].config))
        quorum = trio.run(_describe, bootstrap)
        assert {v.replica_id for v in quorum.voters} == {1, 2, 3, 4}
        assert {n.node_id for n in quorum.nodes} == {1, 2, 3, 4}
        # The leader recorded the directory node 4 fetched with (KIP-853's replica key).
        assert next(v for v in quorum.voters if v.replica_id == NEW_NODE).directory_id
        trio.run(_create_topic, bootstrap, "after-add")

        leader = quorum.leader_id
        trio.run(lambda: _change(bootstrap, remove=leader))
        cluster.wait_for(
            lambda: (
                voters() == {1, 2, 3, 4} - {leader}
                and trio.run(_describe, bootstrap).leader_id not in (-1, leader)
            ),
            f"a new leader among the voters without node {leader}",
        )
        trio.run(_create_topic, bootstrap, "after-remove")
        # The removed node still follows the log as an observer.
        cluster.wait_for(
            lambda: any(o.replica_id == leader for o in trio.run(_describe, bootstrap).observers),
            f"node {leader} to fetch as an observer",
        )
