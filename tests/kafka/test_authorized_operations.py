"""KIP-430's authorized-operations fields on the wire, with and without an authorizer:
Metadata v8-10 (topics and cluster) and v12 (topics), DescribeCluster, DescribeTopicPartitions
and DescribeGroups. Not asked: Kafka's "not requested" value (-2**31); asked without an
authorizer: every operation of the resource type (librdkafka's 0081_admin counts 8 for a topic
and 7 for the cluster); asked with one: only what the principal's ACLs allow."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from raftlog.errors import ErrorCode
from raftlog.metadata.controller.messages import NewTopic
from raftlog.net.kafka.apis import ApiKey
from raftlog.security.acl import AclOperation, ResourceType
from tests.kafka.test_authz import AuthzBroker, acl, request, start_authz_broker

NOT_REQUESTED = -(2**31)
# Kafka's AclOperation codes, written out so the expected fields do not come from the code
# under test: READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7, DESCRIBE 8, CLUSTER_ACTION 9,
# DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12.
TOPIC_ALL = sum(1 << code for code in (3, 4, 5, 6, 7, 8, 10, 11))
CLUSTER_ALL = sum(1 << code for code in (5, 7, 8, 9, 10, 11, 12))
GROUP_ALL = sum(1 << code for code in (3, 6, 8))
CLUSTER = "kafka-cluster"
Op = AclOperation


@pytest.fixture
async def broker(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[AuthzBroker]:
    started = await start_authz_broker(nursery, tmp_path)
    await started.backend.create_topics([NewTopic("orders", 1, 1)], 5000, False)
    yield started
    started.backend.close()


def metadata(version: int, asked: bool) -> Any:
    values: dict[str, Any] = {
        "topics": [{"name": "orders", "topic_id": None}],
        "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": asked,
    }
    if version <= 10:
        values["include_cluster_authorized_operations"] = asked
    return request(ApiKey.METADATA, version, **values)


def describe_cluster(asked: bool) -> Any:
    return request(ApiKey.DESCRIBE_CLUSTER, 1, include_cluster_authorized_operations=asked)


def describe_topic_partitions() -> Any:
    return request(
        ApiKey.DESCRIBE_TOPIC_PARTITIONS,
        0,
        topics=[{"name": "orders"}],
        response_partition_limit=100,
        cursor=None,
    )


def describe_groups(asked: bool) -> Any:
    return request(ApiKey.DESCRIBE_GROUPS, 5, groups=["g1"], include_authorized_operations=asked)


def test_kafka_counts() -> None:
    # What 0081_admin expects: 8 topic operations, 7 cluster operations.
    assert (TOPIC_ALL.bit_count(), CLUSTER_ALL.bit_count()) == (8, 7)


async def test_without_an_authorizer_every_operation_when_asked(broker: AuthzBroker) -> None:
    broker.backend.authorizer = None
    alice = await broker.client("alice")
    for version in (8, 10):
        got = await alice.request(metadata(version, asked=True))
        assert got.topics[0].error_code == ErrorCode.none
        assert got.topics[0].topic_authorized_operations == TOPIC_ALL, version
        assert got.cluster_authorized_operations == CLUSTER_ALL, version
    v12 = await alice.request(metadata(12, asked=True))
    assert v12.topics[0].topic_authorized_operations == TOPIC_ALL
    cluster = await alice.request(describe_cluster(asked=True))
    assert cluster.cluster_authorized_operations == CLUSTER_ALL
    (topic,) = (await alice.request(describe_topic_partitions())).topics
    assert topic.topic_authorized_operations == TOPIC_ALL
    (group,) = (await alice.request(describe_groups(asked=True))).groups
    assert group.authorized_operations == GROUP_ALL


async def test_not_requested_value_when_not_asked(broker: AuthzBroker) -> None:
    for authorizer in (broker.backend.authorizer, None):
        broker.backend.authorizer = authorizer
        alice = await broker.client("alice")
        for version in (8, 10, 12):
            got = await alice.request(metadata(version, asked=False))
            assert got.topics[0].topic_authorized_operations == NOT_REQUESTED, version
            if version <= 10:
                assert got.cluster_authorized_operations == NOT_REQUESTED, version
        cluster = await alice.request(describe_cluster(asked=False))
        assert cluster.cluster_authorized_operations == NOT_REQUESTED
        (group,) = (await alice.request(describe_groups(asked=False))).groups
        assert group.authorized_operations == NOT_REQUESTED


async def test_an_authorizer_sets_only_the_allowed_bits(broker: AuthzBroker) -> None:
    # 0081's second half: READ on the topic, ALTER on the cluster; each implies DESCRIBE.
    broker.backend.set_acls(
        acl(ResourceType.TOPIC, "orders", Op.READ),
        acl(ResourceType.CLUSTER, CLUSTER, Op.ALTER),
        acl(ResourceType.GROUP, "g1", Op.DELETE),
    )
    alice = await broker.client("alice")
    topic_bits = (1 << Op.READ) | (1 << Op.DESCRIBE)
    cluster_bits = (1 << Op.ALTER) | (1 << Op.DESCRIBE)
    got = await alice.request(metadata(10, asked=True))
    assert got.topics[0].topic_authorized_operations == topic_bits
    assert got.cluster_authorized_operations == cluster_bits
    cluster = await alice.request(describe_cluster(asked=True))
    assert cluster.cluster_authorized_operations == cluster_bits
    (topic,) = (await alice.request(describe_topic_partitions())).topics
    assert topic.topic_authorized_operations == topic_bits
    (group,) = (await alice.request(describe_groups(asked=True))).groups
    assert group.authorized_operations == (1 << Op.DELETE) | (1 << Op.DESCRIBE)
    # A super user may do everything: every bit, as without an authorizer.
    admin = await broker.client("admin")
    got = await admin.request(metadata(10, asked=True))
    assert got.topics[0].topic_authorized_operations == TOPIC_ALL
    assert got.cluster_authorized_operations == CLUSTER_ALL
    # Without DESCRIBE on the cluster its field is 0 (Kafka), though the request succeeds.
    bob = await broker.client("bob")
    cluster = await bob.request(describe_cluster(asked=True))
    assert (cluster.error_code, cluster.cluster_authorized_operations) == (ErrorCode.none, 0)
