"""A broker that was down while its topics were deleted (and one name re-created) comes back
without the old data: the deleted topic's log is removed from its disk, and the re-created
name never serves the earlier topic's records. Real processes, real directories."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from raftlog.testing.cluster import ProcessCluster

pytestmark = pytest.mark.cluster

OLD_VALUE = b"written-before-the-delete"
NEW_VALUE = b"written-after-the-re-create"
FUTURE_TIMEOUT_S = 30


def _produce(cluster: ProcessCluster, topic: str, value: bytes) -> None:
    producer = Producer({"bootstrap.servers": cluster.live_bootstrap_servers(), "acks": "all"})
    failures: list[object] = []
    producer.produce(topic, value=value, on_delivery=lambda err, _: err and failures.append(err))
    assert producer.flush(FUTURE_TIMEOUT_S) == 0 and not failures, failures


def _segment_bytes(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))


def test_logs_of_topics_deleted_while_down_are_gone_after_restart(tmp_path):
    with ProcessCluster(tmp_path / "cluster", 3) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        for name in ("gone", "reborn"):
            admin.create_topics([NewTopic(name, 1, 3)])[name].result(FUTURE_TIMEOUT_S)
            _produce(cluster, name, OLD_VALUE)
        data_dir = Path(cluster.nodes[3].config.data_dir) / "logs"
        cluster.wait_for(
            lambda: OLD_VALUE in _segment_bytes(data_dir / "reborn-0"), "node 3 to replicate"
        )

        cluster.kill(3, signal.SIGTERM)
        live = AdminClient({"bootstrap.servers": cluster.live_bootstrap_servers()})
        for future in live.delete_topics(["gone", "reborn"]).values():
            future.result(FUTURE_TIMEOUT_S)
        cluster.wait_for(
            lambda: not {"gone", "reborn"} & set(cluster.describe(1)["topics"]), "the deletes"
        )
        live.create_topics([NewTopic("reborn", 1, 2)])["reborn"].result(FUTURE_TIMEOUT_S)
        _produce(cluster, "reborn", NEW_VALUE)

        # Node 3's disk still holds both old logs until it is back and caught up.
        assert (data_dir / "gone-0").exists()
        cluster.start(3)
        cluster.wait_ready()
        cluster.wait_for(lambda: not (data_dir / "gone-0").exists(), "gone-0 removed on node 3")
        cluster.wait_for(
            lambda: (
                not (data_dir / "reborn-0").exists()
                or OLD_VALUE not in _segment_bytes(data_dir / "reborn-0")
            ),
            "the earlier reborn-0 log replaced on node 3",
        )
        cluster.wait_for(
            lambda: not [p for p in data_dir.iterdir() if p.name.endswith(("-delete", "-stray"))],
            "the renamed logs deleted on node 3",
        )
