"""ListOffsets v8/v9 (KIP-405 EARLIEST_LOCAL, KIP-1005 LATEST_TIERED) against a real node
process: without tiered storage the earliest local offset is the log start (moved here by
DeleteRecords) and the latest tiered offset is -1 with leader epoch -1, as Kafka answers."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from raftlog.client import open_connection
from raftlog.client.protocol import build_request
from raftlog.net.kafka.handlers_fetch import EARLIEST_LOCAL_TIMESTAMP, LATEST_TIERED_TIMESTAMP
from raftlog.testing.cluster import ProcessCluster

pytestmark = pytest.mark.cluster

TOPIC = "tiered-specs"
FUTURE_TIMEOUT_S = 30
EARLIEST, LATEST = -2, -1


def _list_offsets(address: str, version: int, timestamps: list[int]) -> list[tuple[int, ...]]:
    host, port = address.rsplit(":", 1)

    async def ask() -> list[tuple[int, ...]]:
        async with open_connection(host, int(port)) as connection:
            answers = []
            for timestamp_ms in timestamps:
                values: dict[str, Any] = {
                    "replica_id": -1,
                    "isolation_level": 0,
                    "topics": [
                        {
                            "name": TOPIC,
                            "partitions": [
                                {
                                    "partition_index": 0,
                                    "current_leader_epoch": -1,
                                    "timestamp": timestamp_ms,
                                }
                            ],
                        }
                    ],
                }
                response = await connection.request(build_request("list_offsets", version, values))
                [p] = response.topics[0].partitions
                answers.append((int(p.error_code), p.timestamp, p.offset, p.leader_epoch))
            return answers

    return trio.run(ask)


def test_tiered_specs_without_tiered_storage(tmp_path) -> None:
    with ProcessCluster(tmp_path / "c", 1) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(FUTURE_TIMEOUT_S)
        producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
        for i in range(10):
            producer.produce(TOPIC, f"r{i}".encode(), partition=0)
        assert producer.flush(FUTURE_TIMEOUT_S) == 0
        deleted = admin.delete_records([TopicPartition(TOPIC, 0, 4)])
        assert deleted[TopicPartition(TOPIC, 0)].result(FUTURE_TIMEOUT_S).low_watermark == 4

        [node] = cluster.nodes.values()
        v9 = _list_offsets(
            node.client_address,
            9,
            [EARLIEST_LOCAL_TIMESTAMP, LATEST_TIERED_TIMESTAMP, EARLIEST, LATEST],
        )
        earliest_local, latest_tiered, earliest, latest = v9
        assert earliest_local[:3] == (0, -1, 4)
        assert earliest_local[2] == earliest[2]
        assert latest_tiered == (0, -1, -1, -1)
        assert latest[:3] == (0, -1, 10)
        [v8] = _list_offsets(node.client_address, 8, [EARLIEST_LOCAL_TIMESTAMP])
        assert v8 == earliest_local
