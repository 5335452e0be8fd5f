"""Issue 5, administration against three real node processes: kafka-python's KafkaAdminClient
and confluent-kafka's AdminClient create, describe and delete topics, describe and change
topic configs (legacy and incremental AlterConfigs) and every node then reports the change;
DescribeQuorum (kafka-python) and DescribeCluster from both clients.

One cluster serves the whole module.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin import NewTopic as CNewTopic
from kafka.admin import AlterConfigOp, KafkaAdminClient
from kafka.admin import ConfigResource as KConfigResource
from kafka.admin import ConfigResourceType as KConfigResourceType
from kafka.admin import NewTopic as KNewTopic

from raftlog.client import open_connection
from raftlog.storage.checkpoint import CheckpointError, read_checkpoint
from raftlog.storage.recovery import LOG_START_FILE
from raftlog.testing.cluster import ProcessCluster

pytestmark = pytest.mark.cluster

TOPIC_RESOURCE = 2
FUTURE_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("admin")
    with ProcessCluster(root / "c", 3) as running:
        yield running


@pytest.fixture
def kadmin(cluster):
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers, request_timeout_ms=30_000)
    yield admin
    admin.close()


@pytest.fixture
def cadmin(cluster):
    return AdminClient({"bootstrap.servers": cluster.bootstrap_servers})


def _node_topic_configs(address: str, topic: str) -> dict[str, str | None]:
    """DescribeConfigs of `topic` asked of exactly one node (not routed by a client)."""
    host, port = address.rsplit(":", 1)

    async def ask() -> dict[str, str | None]:
        async with open_connection(host, int(port)) as connection:
            response = await connection.call(
                "describe_configs",
                {
                    "resources": [
                        {
                            "resource_type": TOPIC_RESOURCE,
                            "resource_name": topic,
                            "configuration_keys": None,
                        }
                    ]
                },
            )
        (result,) = response.results
        assert int(result.error_code) == 0, result
        return {c.name: c.value for c in result.configs}

    return trio.run(ask)


def _wait_everywhere(cluster, topic: str, expected: dict[str, str | None]) -> None:
    for node in cluster.nodes.values():

        def visible(node=node) -> bool:
            configs = _node_topic_configs(node.client_address, topic)
            return all(configs.get(k) == v for k, v in expected.items())

        cluster.wait_for(visible, f"node {node.node_id} to report {expected} for {topic}", 20)


def _topics_on_every_node(cluster) -> list[set[str]]:
    return [set(cluster.describe(n)["topics"]) for n in cluster.nodes]


# ------------------------------------------------------------------------------ kafka-python
def test_kafka_python_topics_create_describe_delete(cluster, kadmin):
    kadmin.create_topics(
        [
            KNewTopic("kp-a", 3, 3, topic_configs={"retention.ms": "3600000"}),
            KNewTopic("kp-b", 1, 2),
        ],
        timeout_ms=30_000,
    )
    assert {"kp-a", "kp-b"} <= set(kadmin.list_topics())
    described = {t["name"]: t for t in kadmin.describe_topics(["kp-a", "kp-b"])}
    assert len(described["kp-a"]["partitions"]) == 3
    assert all(len(p["replica_nodes"]) == 3 for p in described["kp-a"]["partitions"])
    assert all(len(p["replica_nodes"]) == 2 for p in described["kp-b"]["partitions"])
    cluster.wait_for(
        lambda: all({"kp-a", "kp-b"} <= t for t in _topics_on_every_node(cluster)),
        "kp-a and kp-b on every node",
        20,
    )
    kadmin.delete_topics(["kp-b"], timeout_ms=30_000)
    cluster.wait_for(
        lambda: all("kp-b" not in t and "kp-a" in t for t in _topics_on_every_node(cluster)),
        "kp-b deleted on every node",
        20,
    )


def test_kafka_python_describe_and_alter_configs(cluster, kadmin):
    topic = "kp-configs"
    kadmin.create_topics([KNewTopic(topic, 1, 3)], timeout_ms=30_000)
    # CreateTopics answers once the controller committed the topic; the broker kafka-python
    # asks next may not have applied that record yet (its answer is then empty).
    cluster.wait_for(
        lambda: all(topic in t for t in _topics_on_every_node(cluster)),
        "the topic on every node",
        20,
    )
    described = kadmin.describe_configs(
        [KConfigResource(KConfigResourceType.TOPIC, topic)], config_filter="all"
    )
    (configs,) = _only_resource(described).values()
    assert "retention.ms" in configs and "cleanup.policy" in configs, configs

    # Incremental (the client's default when the broker supports it).
    result = kadmin.alter_configs(
        [
            KConfigResource(
                KConfigResourceType.TOPIC,
                topic,
                {"retention.ms": (AlterConfigOp.SET, "123456"), "segment.bytes": "1048576"},
            )
        ]
    )
    _assert_no_errors(result)
    _wait_everywhere(cluster, topic, {"retention.ms": "123456", "segment.bytes": "1048576"})

    # Legacy AlterConfigs replaces the whole dynamic config (kafka-python re-sends the other
    # modified keys itself, so segment.bytes stays).
    result = kadmin.alter_configs(
        [KConfigResource(KConfigResourceType.TOPIC, topic, {"retention.ms": "654321"})],
        incremental=False,
    )
    _assert_no_errors(result)
    _wait_everywhere(cluster, topic, {"retention.ms": "654321"})
    _wait_everywhere(cluster, topic, {"segment.bytes": "1048576"})

    result = kadmin.alter_configs(
        [
            KConfigResource(
                KConfigResourceType.TOPIC, topic, {"retention.ms": (AlterConfigOp.DELETE, None)}
            )
        ]
    )
    _assert_no_errors(result)
    default_retention = str(next(iter(cluster.nodes.values())).config.retention_ms)
    _wait_everywhere(cluster, topic, {"retention.ms": default_retention})


def _only_resource(described) -> dict:
    """kafka-python: {resource_type: {name: {key: data}}} -> {name: {key: value}}."""
    (by_name,) = described.values()
    return {
        name: {key: (data["value"] if isinstance(data, dict) else data) for key, data in c.items()}
        for name, c in by_name.items()
    }


def _assert_no_errors(result) -> None:
    for by_name in result.values():
        for name, outcome in by_name.items():
            assert not isinstance(outcome, Exception), (name, outcome)
            code = getattr(outcome, "errno", 0) or 0
            assert code == 0, (name, outcome)


def test_kafka_python_describe_metadata_quorum(cluster, kadmin):
    quorum = kadmin.describe_metadata_quorum()
    (partition,) = quorum["topics"][0]["partitions"]
    assert quorum["topics"][0]["topic_name"] == "__cluster_metadata"
    assert not partition.get("error"), partition
    assert partition["leader_id"] in cluster.nodes
    assert partition["leader_epoch"] >= 1
    assert partition["high_watermark"] > 0
    voters = {v["replica_id"]: v for v in partition["current_voters"]}
    assert set(voters) == set(cluster.nodes)
    assert voters[partition["leader_id"]]["log_end_offset"] >= partition["high_watermark"]


def test_kafka_python_describe_cluster(cluster, kadmin):
    described = kadmin.describe_cluster()
    brokers = {b["broker_id"]: f"{b['host']}:{b['port']}" for b in described["brokers"]}
    assert brokers == {n.node_id: n.client_address for n in cluster.nodes.values()}
    assert described["cluster_id"] == cluster.nodes[1].config.cluster_id
    assert described["controller_id"] in cluster.nodes


# ------------------------------------------------------------------------------ confluent
def test_confluent_topics_create_describe_delete(cluster, cadmin):
    futures = cadmin.create_topics(
        [
            CNewTopic("ck-a", 4, 3, config={"retention.ms": "7200000"}),
            CNewTopic("ck-b", 2, 1),
        ]
    )
    for future in futures.values():
        future.result(FUTURE_TIMEOUT_S)
    topics = cadmin.list_topics(timeout=FUTURE_TIMEOUT_S).topics
    assert len(topics["ck-a"].partitions) == 4
    assert all(len(p.replicas) == 3 for p in topics["ck-a"].partitions.values())
    duplicate = cadmin.create_topics([CNewTopic("ck-a", 1, 1)])["ck-a"]
    with pytest.raises(Exception, match=r"TOPIC_ALREADY_EXISTS|already exists"):
        duplicate.result(FUTURE_TIMEOUT_S)
    for future in cadmin.delete_topics(["ck-b"], operation_timeout=30).values():
        future.result(FUTURE_TIMEOUT_S)
    cluster.wait_for(
        lambda: all("ck-b" not in t and "ck-a" in t for t in _topics_on_every_node(cluster)),
        "ck-b deleted on every node",
        20,
    )


def test_confluent_describe_and_alter_configs(cluster, cadmin):
    topic = "ck-configs"
    cadmin.create_topics([CNewTopic(topic, 1, 3)])[topic].result(FUTURE_TIMEOUT_S)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = cadmin.describe_configs([resource])[resource].result(FUTURE_TIMEOUT_S)
    assert "retention.ms" in configs and "min.insync.replicas" in configs
    assert configs["retention.ms"].is_default

    legacy = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"retention.ms": "111"})
    cadmin.alter_configs([legacy])[legacy].result(FUTURE_TIMEOUT_S)
    _wait_everywhere(cluster, topic, {"retention.ms": "111"})

    incremental = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", "222", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    cadmin.incremental_alter_configs([incremental])[incremental].result(FUTURE_TIMEOUT_S)
    _wait_everywhere(cluster, topic, {"retention.ms": "222", "cleanup.policy": "compact"})
    configs = cadmin.describe_configs([resource])[resource].result(FUTURE_TIMEOUT_S)
    assert configs["retention.ms"].value == "222" and not configs["retention.ms"].is_default

    bad = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(Exception, match=r"INVALID_CONFIG|nvalid"):
        cadmin.incremental_alter_configs([bad])[bad].result(FUTURE_TIMEOUT_S)
    _wait_everywhere(cluster, topic, {"retention.ms": "222"})

    # Legacy AlterConfigs replaces the whole dynamic config: cleanup.policy goes back.
    legacy = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"retention.ms": "333"})
    cadmin.alter_configs([legacy])[legacy].result(FUTURE_TIMEOUT_S)
    _wait_everywhere(cluster, topic, {"retention.ms": "333", "cleanup.policy": "delete"})


def test_confluent_describe_cluster(cluster, cadmin):
    described = cadmin.describe_cluster().result(FUTURE_TIMEOUT_S)
    brokers = {n.id: f"{n.host}:{n.port}" for n in described.nodes}
    assert brokers == {n.node_id: n.client_address for n in cluster.nodes.values()}
    assert described.cluster_id == cluster.nodes[1].config.cluster_id
    assert described.controller.id in cluster.nodes


def test_delete_records_moves_the_log_start_on_every_replica(cluster, cadmin):
    """KIP-107 with confluent-kafka's AdminClient: records below the offset are gone for
    readers (earliest is the new start, a consumer from the beginning starts there), on the
    leader and, after their next fetch, on the followers; an offset past the high watermark
    is refused; -1 deletes up to the high watermark."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    topic = "delete-records"
    cadmin.create_topics([CNewTopic(topic, 1, 3)])[topic].result(FUTURE_TIMEOUT_S)
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    for i in range(10):
        producer.produce(topic, f"r{i}".encode(), partition=0)
    assert producer.flush(FUTURE_TIMEOUT_S) == 0

    deleted = cadmin.delete_records([TopicPartition(topic, 0, 4)])
    result = deleted[TopicPartition(topic, 0)].result(FUTURE_TIMEOUT_S)
    assert result.low_watermark == 4
    earliest = cadmin.list_offsets({TopicPartition(topic, 0): OffsetSpec.earliest()})
    assert earliest[TopicPartition(topic, 0)].result(FUTURE_TIMEOUT_S).offset == 4

    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap_servers, "group.id": "delete-records-reader"}
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    first = None
    for _ in range(100):
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            first = message
            break
    consumer.close()
    assert first is not None and (first.offset(), first.value()) == (4, b"r4")

    too_far = cadmin.delete_records([TopicPartition(topic, 0, 11)])
    with pytest.raises(Exception, match="OFFSET_OUT_OF_RANGE"):
        too_far[TopicPartition(topic, 0)].result(FUTURE_TIMEOUT_S)
    everything = cadmin.delete_records([TopicPartition(topic, 0, -1)])
    assert everything[TopicPartition(topic, 0)].result(FUTURE_TIMEOUT_S).low_watermark == 10

    # Every replica follows the leader's log start on its next fetch, and checkpoints it.
    cluster.wait_for(
        lambda: [_log_start(node, topic) for node in cluster.nodes.values()] == [10] * 3,
        "every replica's checkpointed log start at 10",
    )


def _log_start(node, topic: str) -> int | None:
    """The log start offset partition 0 of `topic` has checkpointed on `node`'s disk."""
    directory = Path(node.config.data_dir)
    found = list(directory.rglob(f"{topic}-0/{LOG_START_FILE}"))
    if not found:
        return None
    try:
        return int(read_checkpoint(found[0], LOG_START_FILE.split(".")[0])["log_start_offset"])
    except (OSError, CheckpointError):
        return None  # being replaced right now: asked again
