"""DescribeLogDirs on three real node processes, asked by a stock client (kafka-python's
KafkaAdminClient.describe_log_dirs): each broker names its partition log directory and the
partitions it holds, with their segment bytes; followers that caught up lag by 0.

Skipped until the nodes advertise DescribeLogDirs in ApiVersions (apis.py registers
handlers_log_dirs.LOG_DIR_APIS)."""

import io
import socket
import struct
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.serial import entity_reader, entity_writer

from raftlog.net.kafka.codec import response_class
from raftlog.net.kafka.handlers_log_dirs import DESCRIBE_LOG_DIRS_KEY
from tests.integration.test_replication_processes import partition_info

pytestmark = pytest.mark.cluster

TOPIC = "described"
RECORDS = 200
API_VERSIONS_KEY = 18


def advertised_versions(address: str) -> dict[int, tuple[int, int]]:
    """api key -> (min, max) as the node's ApiVersions v0 answer gives them."""
    host, port = address.rsplit(":", 1)
    header_cls = ApiVersionsRequest.__header_schema__
    body = io.BytesIO()
    entity_writer(header_cls)(
        body,
        header_cls(
            request_api_key=API_VERSIONS_KEY,
            request_api_version=0,
            correlation_id=1,
            client_id="log-dirs-test",
        ),
    )
    entity_writer(ApiVersionsRequest)(body, ApiVersionsRequest())
    payload = body.getvalue()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", _read_exactly(sock, 4))[0]
        answer = _read_exactly(sock, size)
    cls = response_class(API_VERSIONS_KEY, 0)
    _, offset = entity_reader(cls.__header_schema__)(answer, 0)
    response, _ = entity_reader(cls)(answer, offset)
    return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys}


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        assert chunk, "connection closed"
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def test_a_stock_client_describes_every_brokers_log_dir(cluster) -> None:
    first = next(iter(cluster.nodes.values()))
    if DESCRIBE_LOG_DIRS_KEY not in advertised_versions(first.client_address):
        pytest.skip("the nodes do not advertise DescribeLogDirs (apis.py does not register it)")
    assert advertised_versions(first.client_address)[DESCRIBE_LOG_DIRS_KEY] == (1, 4)

    creator = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    creator.create_topics([NewTopic(TOPIC, 1, 3)])[TOPIC].result(30)
    cluster.wait_for(lambda: partition_info(cluster, TOPIC)["leader_id"] > 0, "a leader")
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    for i in range(RECORDS):
        producer.produce(TOPIC, value=b"x" * 1000, key=str(i).encode())
    assert producer.flush(30) == 0
    cluster.wait_for(lambda: len(partition_info(cluster, TOPIC)["isr"]) == 3, "a full ISR")

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers, client_id="log-dirs")
    try:

        def described() -> dict[int, dict]:
            answers = admin.describe_log_dirs({TOPIC: [0]})
            return {a["broker"]: a for a in answers}

        def all_copied() -> dict[int, dict] | None:
            answers = described()
            sizes = {
                broker: [
                    p["partition_size"]
                    for d in a["log_dirs"]
                    for t in d["topics"]
                    for p in t["partitions"]
                ]
                for broker, a in answers.items()
            }
            wanted = {b: [n] for b, n in sizes.items() if len(n) == 1 and n[0] >= RECORDS * 1000}
            return answers if len(wanted) == 3 else None

        answers = cluster.wait_for(all_copied, "every replica's segments hold the records")
    finally:
        admin.close()
    sizes = set()
    for broker, answer in answers.items():
        (log_dir,) = answer["log_dirs"]
        assert log_dir["error_code"] == 0
        expected_dir = Path(cluster.nodes[broker].config.data_dir).resolve() / "logs"
        assert Path(log_dir["log_dir"]) == expected_dir
        if "total_bytes" in log_dir:  # v4+
            assert log_dir["total_bytes"] >= log_dir["usable_bytes"] > 0
        (topic,) = log_dir["topics"]
        (partition,) = topic["partitions"]
        assert topic["name"] == TOPIC and partition["partition_index"] == 0
        on_disk = sum(f.stat().st_size for f in (expected_dir / f"{TOPIC}-0").glob("*.log"))
        assert partition["partition_size"] == on_disk
        assert partition["offset_lag"] == 0 and partition["is_future_key"] is False
        sizes.add(partition["partition_size"])
    assert len(sizes) == 1  # the same batches on every replica
