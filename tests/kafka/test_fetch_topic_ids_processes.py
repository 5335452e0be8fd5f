"""Topic ids against three real node processes: every node's Metadata v12 gives the id the
controller assigned; Fetch v13+ by that id reads what a stock producer wrote; a forged id is
UNKNOWN_TOPIC_ID; a Fetch v16 sent to a follower answers NOT_LEADER_OR_FOLLOWER with the
leader and its endpoint (KIP-951); confluent-kafka consumes at the Fetch version it
negotiates (v16 for librdkafka 2.x)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import trio
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from raftlog.client import open_connection
from raftlog.errors import ErrorCode
from raftlog.testing.cluster import ProcessCluster
from tests.kafka.test_fetch_topic_ids import answers, fetch, metadata, partition

pytestmark = pytest.mark.cluster

TOPIC = "by-id"
RECORDS = 20
FUTURE_TIMEOUT_S = 30


def _ask(address: str, requests: list[Any]) -> list[Any]:
    host, port = address.rsplit(":", 1)

    async def run() -> list[Any]:
        async with open_connection(host, int(port)) as connection:
            return [await connection.request(r) for r in requests]

    return trio.run(run)


def _produce_and_consume(bootstrap: str) -> list[tuple[bytes, int]]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(RECORDS):
        producer.produce(TOPIC, key=b"k", value=f"v{i}".encode())
    assert producer.flush(FUTURE_TIMEOUT_S) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",  # required by the API; assign() never joins it
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
    got: list[tuple[bytes, int]] = []
    for _ in range(FUTURE_TIMEOUT_S * 2):  # polls of 0.5 s: FUTURE_TIMEOUT_S in all
        if len(got) == RECORDS:
            break
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        got.append((msg.value(), msg.offset()))
    consumer.close()
    return got


def test_topic_ids_on_real_nodes(tmp_path) -> None:
    with ProcessCluster(tmp_path / "c", 3) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        admin.create_topics([NewTopic(TOPIC, 1, 3)])[TOPIC].result(FUTURE_TIMEOUT_S)
        addresses = {n: node.client_address for n, node in cluster.nodes.items()}

        def leader_known() -> tuple[uuid.UUID, int] | None:
            seen = set()
            for address in addresses.values():
                [response] = _ask(address, [metadata(12, [{"name": TOPIC, "topic_id": None}])])
                [topic] = response.topics
                [p] = topic.partitions
                if topic.error_code != ErrorCode.none or p.leader_id < 0:
                    return None
                seen.add((topic.topic_id, p.leader_id))
            return seen.pop() if len(seen) == 1 else None

        # Every node answers the same id (and leader) once the topic has settled.
        topic_id, leader = cluster.wait_for(leader_known, "one id and leader on every node")
        assert isinstance(topic_id, uuid.UUID) and topic_id.int != 0

        got = _produce_and_consume(cluster.bootstrap_servers)
        assert got == [(f"v{i}".encode(), i) for i in range(RECORDS)]

        forged = uuid.uuid4()
        follower = next(n for n in addresses if n != leader)
        by_id, by_name, unknown, by_id_v16, named = _ask(
            addresses[leader],
            [
                fetch(13, [(topic_id, [partition(0)])]),
                fetch(12, [(TOPIC, [partition(0)])]),
                fetch(16, [(forged, [partition(0)]), (None, [partition(0)])]),
                fetch(16, [(topic_id, [partition(0)])]),
                metadata(12, [{"name": None, "topic_id": topic_id}]),
            ],
        )
        assert answers(by_id_v16, 16) == [(topic_id, 0, ErrorCode.none)]
        assert by_id_v16.node_endpoints == ()  # no leader moved
        assert answers(by_id, 13) == [(topic_id, 0, ErrorCode.none)]
        assert by_id.responses[0].partitions[0].high_watermark == RECORDS
        assert bytes(by_id.responses[0].partitions[0].records) == bytes(
            by_name.responses[0].partitions[0].records
        )
        assert answers(unknown, 16) == [
            (forged, 0, ErrorCode.unknown_topic_id),
            (None, 0, ErrorCode.unknown_topic_id),
        ]
        assert [(t.name, t.topic_id, t.error_code) for t in named.topics] == [
            (TOPIC, topic_id, ErrorCode.none)
        ]

        [moved] = _ask(addresses[follower], [fetch(16, [(topic_id, [partition(0)])])])
        [p] = moved.responses[0].partitions
        assert p.error_code == ErrorCode.not_leader_or_follower
        assert p.current_leader.leader_id == leader and p.current_leader.leader_epoch >= 0
        assert [(e.node_id, f"{e.host}:{e.port}") for e in moved.node_endpoints] == [
            (leader, addresses[leader])
        ]
