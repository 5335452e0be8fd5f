"""Controlled shutdown moves leadership away before a node stops; preferred leaders return
after it comes back (the controller's periodic rebalancing)."""

import signal

import pytest
from kafka.admin import KafkaAdminClient, NewTopic

from raftlog.testing.cluster import ProcessCluster

pytestmark = pytest.mark.cluster


def _leaders(cluster, node_id=None):
    partitions = cluster.describe(node_id)["topics"].get("t", [])
    return {p["partition"]: (p["leader_id"], p["leader_epoch"]) for p in partitions}


def test_controlled_shutdown_and_preferred_leader_return(tmp_path):
    overrides = {"leader_imbalance_check_interval_ms": 500}
    with ProcessCluster(tmp_path / "c", 3, overrides) as cluster:
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topics([NewTopic("t", 3, 3)])
        admin.close()
        before = cluster.wait_for(
            lambda: (leaders := _leaders(cluster)) and len(leaders) == 3 and leaders,
            "topic t has leaders",
        )
        preferred = {p: leader for p, (leader, _) in before.items()}
        victim = preferred[0]

        cluster.kill(victim, signal.SIGTERM)  # controlled shutdown, then exit
        assert cluster.nodes[victim].process.returncode == 0
        survivor = next(n for n in cluster.nodes if n != victim)
        moved = _leaders(cluster, survivor)
        for partition, (leader, epoch) in moved.items():
            if preferred[partition] == victim:
                # Moved while the victim was still up: a bumped epoch, a live leader.
                assert leader not in (victim, -1), moved
                assert epoch > before[partition][1], moved
        assert "controlled shutdown" in cluster.nodes[victim].log_path.read_text()

        cluster.start(victim)
        cluster.wait_ready()
        cluster.wait_for(
            lambda: {p: leader for p, (leader, _) in _leaders(cluster).items()} == preferred,
            "preferred leaders restored",
            timeout_s=30,
        )
