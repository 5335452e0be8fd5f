"""OffsetDelete (KIP-496) against a real node process: confluent-kafka commits and reads
offsets, kafka-python's KafkaAdminClient.delete_group_offsets deletes them (confluent-kafka's
Python AdminClient has no call for it). A group's committed offset of one partition goes, the
other stays; an unknown group is GROUP_ID_NOT_FOUND; an unknown topic's partitions are
UNKNOWN_TOPIC_OR_PARTITION."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import TopicPartition as KTopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import GroupIdNotFoundError, NoError, UnknownTopicOrPartitionError

from raftlog.testing.cluster import ProcessCluster

pytestmark = pytest.mark.cluster

TOPIC = "od-events"
GROUP = "od-group"
FUTURE_TIMEOUT_S = 30
NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: nothing committed


def _committed(bootstrap: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP})
    try:
        got = consumer.committed(
            [TopicPartition(TOPIC, p) for p in range(partitions)], timeout=FUTURE_TIMEOUT_S
        )
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in got}


def test_delete_consumer_group_offsets(tmp_path) -> None:
    with ProcessCluster(tmp_path / "c", 1) as cluster:
        bootstrap = cluster.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(FUTURE_TIMEOUT_S)
        # A standalone consumer (no subscription) commits: an Empty group with offsets.
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP})
        try:
            consumer.commit(
                offsets=[TopicPartition(TOPIC, 0, 5), TopicPartition(TOPIC, 1, 7)],
                asynchronous=False,
            )
        finally:
            consumer.close()
        assert _committed(bootstrap, 2) == {0: 5, 1: 7}

        kadmin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
        try:
            result = kadmin.delete_group_offsets(GROUP, [KTopicPartition(TOPIC, 0)])
            assert result == {KTopicPartition(TOPIC, 0): NoError}
            assert _committed(bootstrap, 2) == {0: NO_OFFSET, 1: 7}

            result = kadmin.delete_group_offsets(GROUP, [KTopicPartition("no-such-topic", 0)])
            assert result == {KTopicPartition("no-such-topic", 0): UnknownTopicOrPartitionError}

            with pytest.raises(GroupIdNotFoundError):
                kadmin.delete_group_offsets("no-such-group", [KTopicPartition(TOPIC, 0)])
        finally:
            kadmin.close()
