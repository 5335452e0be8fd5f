"""Issue 3 with real processes: elect, commit controller writes, kill -9 the leader and keep
committing, restart it and catch up (through a snapshot when behind), clean shutdown."""

import signal

import pytest
from kafka.admin import KafkaAdminClient, NewTopic

from raftlog.testing.cluster import ProcessCluster

pytestmark = pytest.mark.cluster


def _admin(cluster):
    return KafkaAdminClient(
        bootstrap_servers=cluster.live_bootstrap_servers(), request_timeout_ms=20_000
    )


def _quorum(cluster):
    admin = _admin(cluster)
    try:
        return admin.describe_metadata_quorum()
    finally:
        admin.close()


def _leader_id(cluster):
    return cluster.wait_for(lambda: _quorum_leader(cluster), "a metadata quorum leader")


def _quorum_leader(cluster):
    partition = _quorum(cluster)["topics"][0]["partitions"][0]
    return partition["leader_id"] if partition["leader_id"] > 0 else None


def _create(cluster, *names, rf=3):
    admin = _admin(cluster)
    try:
        admin.create_topics([NewTopic(n, 1, rf) for n in names])
    finally:
        admin.close()


def _topics(cluster, node_id):
    return set(cluster.describe(node_id)["topics"])


def test_kill_leader_keep_committing_restart_catch_up(tmp_path):
    with ProcessCluster(tmp_path / "c", 3, {"metadata_snapshot_max_records": 20}) as cluster:
        _create(cluster, "before")
        leader = _leader_id(cluster)
        cluster.kill(leader, signal.SIGKILL)
        # Enough writes that the survivors snapshot and drop the prefix the dead node lacks.
        names = [f"after-{i}" for i in range(12)]
        for name in names:
            cluster.wait_for(
                lambda name=name: _create(cluster, name, rf=2) or True,
                f"creating {name} without node {leader}",
                timeout_s=30,
            )
        new_leader = _leader_id(cluster)
        assert new_leader != leader
        cluster.start(leader)
        cluster.wait_for(
            lambda: set(names) | {"before"} <= _topics(cluster, leader), f"node {leader} caught up"
        )
        cluster.wait_ready()
        log = cluster.nodes[leader].log_path.read_text()
        assert "metadata log loaded" in log
    # Clean shutdown: every node exited on SIGTERM with code 0.
    assert all(n.process.returncode == 0 for n in cluster.nodes.values()), [
        (n.node_id, n.process.returncode) for n in cluster.nodes.values()
    ]


def test_metadata_names_the_active_controller(cluster):
    """Admin clients go straight to the active controller (no forwarding hop)."""
    leader = _leader_id(cluster)
    admin = _admin(cluster)
    try:
        cluster.wait_for(
            lambda: admin.describe_cluster()["controller_id"] == leader,
            "DescribeCluster names the quorum leader",
            timeout_s=20,
        )
    finally:
        admin.close()
    for node_id in cluster.nodes:
        assert cluster.describe(node_id)["controller_id"] == leader
