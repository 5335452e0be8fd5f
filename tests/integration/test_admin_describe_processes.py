"""What librdkafka's 0081_admin asks, from stock clients against a real node process (no
authorizer configured): DescribeTopics and DescribeCluster with authorized operations (every
operation of the resource type, as Kafka answers without an authorizer), ListOffsets with
MAX_TIMESTAMP (the exact record holding the largest timestamp) and a broker's broker.rack."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AclOperation,
    AdminClient,
    ConfigResource,
    NewTopic,
    OffsetSpec,
    ResourceType,
)
from kafka.admin import KafkaAdminClient

from raftlog.testing.cluster import ProcessCluster

pytestmark = pytest.mark.cluster

FUTURE_TIMEOUT_S = 30
RACK = "rack-a"
TOPIC = "described"
TOPIC_OPERATIONS = {"READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE"} | {
    "DESCRIBE_CONFIGS",
    "ALTER_CONFIGS",
}
CLUSTER_OPERATIONS = {"CREATE", "ALTER", "DESCRIBE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS"} | {
    "ALTER_CONFIGS",
    "IDEMPOTENT_WRITE",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("describe")
    with ProcessCluster(root / "c", 1, overrides={"broker_rack": RACK}) as running:
        admin = AdminClient({"bootstrap.servers": running.bootstrap_servers})
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(FUTURE_TIMEOUT_S)
        yield running


@pytest.fixture
def admin(cluster):
    return AdminClient({"bootstrap.servers": cluster.bootstrap_servers})


def names(operations: list[AclOperation] | None) -> set[str] | None:
    return None if operations is None else {op.name for op in operations}


def test_describe_topics_with_and_without_operations(admin) -> None:
    topics = TopicCollection([TOPIC])
    asked = admin.describe_topics(topics, include_authorized_operations=True)[TOPIC]
    assert names(asked.result(FUTURE_TIMEOUT_S).authorized_operations) == TOPIC_OPERATIONS
    plain = admin.describe_topics(topics, include_authorized_operations=False)[TOPIC]
    assert not plain.result(FUTURE_TIMEOUT_S).authorized_operations


def test_describe_cluster_with_and_without_operations(admin) -> None:
    asked = admin.describe_cluster(include_authorized_operations=True).result(FUTURE_TIMEOUT_S)
    assert names(asked.authorized_operations) == CLUSTER_OPERATIONS
    plain = admin.describe_cluster(include_authorized_operations=False).result(FUTURE_TIMEOUT_S)
    assert not plain.authorized_operations


def test_kafka_python_metadata_operations(cluster) -> None:
    # kafka-python's describe_topics sends Metadata with both include flags set, its
    # describe_cluster DescribeCluster with include_cluster_authorized_operations.
    kadmin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    try:
        (topic,) = kadmin.describe_topics([TOPIC])
        described = kadmin.describe_cluster()
    finally:
        kadmin.close()
    assert set(topic["authorized_operations"]) == TOPIC_OPERATIONS
    assert set(described["authorized_operations"]) == CLUSTER_OPERATIONS


def test_list_offsets_max_timestamp_is_the_exact_record(cluster, admin) -> None:
    # 0081's records: one batch (one flush), the second record holds the largest timestamp.
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 1000})
    base_ms = 1_700_000_000_000
    for delta_ms in (0, 2000, 1000):
        producer.produce(TOPIC, b"v", partition=0, timestamp=base_ms + delta_ms)
    assert producer.flush(FUTURE_TIMEOUT_S) == 0
    partition = TopicPartition(TOPIC, 0)
    got = admin.list_offsets({partition: OffsetSpec.max_timestamp()})[partition]
    info = got.result(FUTURE_TIMEOUT_S)
    assert (info.offset, info.timestamp) == (1, base_ms + 2000)


def test_broker_configs_list_broker_rack(cluster, admin) -> None:
    (node_id,) = cluster.nodes
    resource = ConfigResource(ResourceType.BROKER, str(node_id))
    entries = admin.describe_configs([resource])[resource].result(FUTURE_TIMEOUT_S)
    rack = entries["broker.rack"]
    assert (rack.value, rack.is_read_only) == (RACK, True)
