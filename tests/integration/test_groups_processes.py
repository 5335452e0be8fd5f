"""Consumer groups on a real three-node cluster: stock consumers split partitions, commit,
and committed offsets survive killing the coordinator's node."""

import signal
import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from raftlog.testing.cluster import ProcessCluster

pytestmark = pytest.mark.cluster

TOPIC = "events"


def _consume(bootstrap, group, want, deadline_s=60):
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
        }
    )
    consumer.subscribe([TOPIC])
    seen = []
    deadline = time.monotonic() + deadline_s
    try:
        while len(seen) < want and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            seen.append(message.value())
            consumer.commit(message, asynchronous=False)
    finally:
        consumer.close()
    return seen


def test_committed_offsets_survive_coordinator_failover(tmp_path):
    with ProcessCluster(tmp_path / "c", 3) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        admin.create_topics([NewTopic(TOPIC, 3, 3)])[TOPIC].result(30)
        producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
        for i in range(60):
            producer.produce(TOPIC, value=f"m{i}".encode())
        assert producer.flush(30) == 0

        first = _consume(cluster.bootstrap_servers, "g", 30)
        assert len(first) == 30
        # Kill the node coordinating group "g": the leader of its offsets partition.
        from raftlog.groups.hashing import partition_for_group

        offsets = cluster.describe()["topics"]["__consumer_offsets"]
        index = partition_for_group("g", len(offsets))
        coordinator = next(p["leader_id"] for p in offsets if p["partition"] == index)
        cluster.kill(coordinator, signal.SIGKILL)
        live = cluster.live_bootstrap_servers()
        rest = _consume(live, "g", 30)
        assert sorted(first + rest) == sorted(f"m{i}".encode() for i in range(60)), (
            "a resumed consumer must continue from the committed offsets: no gaps, no repeats"
        )
