"""message.timestamp.type=LogAppendTime against three real node processes, with confluent-kafka:
a record produced with an old explicit timestamp comes back stamped with the broker's append
time (timestamp type LogAppendTime), offsets_for_times finds it by that time, DescribeConfigs
shows the topic's value, and a CreateTime topic still returns the producer's timestamp."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic

from raftlog.testing.cluster import ProcessCluster

pytestmark = pytest.mark.cluster

STAMPED = "stamped"
PLAIN = "plain"
OLD_TIMESTAMP_MS = 1_000_000
# The append time is the leader's wall clock; the test runs on the same machine.
CLOCK_SLACK_MS = 5_000
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("append-time")
    with ProcessCluster(root / "c", 3, {"min_insync_replicas": 2}) as running:
        yield running


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _produce_old_record(cluster: ProcessCluster, topic: str) -> Message:
    """One record with timestamp OLD_TIMESTAMP_MS, acks=all; returns its delivery report."""
    producer = Producer(
        {"bootstrap.servers": cluster.live_bootstrap_servers(), "acks": "all", "linger.ms": 0}
    )
    delivered: list[Message] = []

    def on_delivery(error: object, message: Message) -> None:
        assert error is None, error
        delivered.append(message)

    producer.produce(
        topic, value=b"hello", key=b"k", timestamp=OLD_TIMESTAMP_MS, on_delivery=on_delivery
    )
    assert producer.flush(DEADLINE_S) == 0, f"{topic}: produce not delivered"
    assert len(delivered) == 1
    return delivered[0]


def _consume_first(consumer: Consumer, topic: str) -> Message:
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is None:
            continue
        assert message.error() is None, message.error()
        return message
    raise AssertionError(f"{topic}: nothing consumed within {DEADLINE_S}s")


def _offset_for_time(consumer: Consumer, topic: str, timestamp_ms: int) -> int:
    [found] = consumer.offsets_for_times([TopicPartition(topic, 0, timestamp_ms)], DEADLINE_S)
    assert found.error is None, found.error
    return found.offset


def test_log_append_time_topic_stamps_records_with_the_broker_time(cluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.live_bootstrap_servers()})
    futures = admin.create_topics(
        [
            NewTopic(STAMPED, 1, 3, config={"message.timestamp.type": "LogAppendTime"}),
            NewTopic(PLAIN, 1, 3),
        ]
    )
    for future in futures.values():
        future.result(DEADLINE_S)

    resources = [ConfigResource("topic", STAMPED), ConfigResource("topic", PLAIN)]
    described = {
        r.name: f.result(DEADLINE_S)["message.timestamp.type"]
        for r, f in admin.describe_configs(resources).items()
    }
    assert described[STAMPED].value == "LogAppendTime"
    assert described[STAMPED].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert described[PLAIN].value == "CreateTime"
    assert described[PLAIN].source == ConfigSource.DEFAULT_CONFIG.value

    before_ms = _now_ms()
    report = _produce_old_record(cluster, STAMPED)
    after_ms = _now_ms()
    # The produce response carries log_append_time, which librdkafka reports as the timestamp.
    report_type, report_ms = report.timestamp()
    assert report_type == TIMESTAMP_LOG_APPEND_TIME
    assert before_ms - CLOCK_SLACK_MS <= report_ms <= after_ms + CLOCK_SLACK_MS

    consumer = Consumer(
        {
            "bootstrap.servers": cluster.live_bootstrap_servers(),
            "group.id": "append-time-check",
            "enable.auto.commit": False,
        }
    )
    try:
        message = _consume_first(consumer, STAMPED)
        assert (message.key(), message.value(), message.offset()) == (b"k", b"hello", 0)
        assert message.timestamp() == (TIMESTAMP_LOG_APPEND_TIME, report_ms)
        # ListOffsets by timestamp works on the append time, not the producer's old one.
        assert _offset_for_time(consumer, STAMPED, OLD_TIMESTAMP_MS + 1) == 0
        assert _offset_for_time(consumer, STAMPED, report_ms) == 0
        assert _offset_for_time(consumer, STAMPED, report_ms + 1) == -1  # nothing later

        plain_report = _produce_old_record(cluster, PLAIN)
        assert plain_report.timestamp() == (TIMESTAMP_CREATE_TIME, OLD_TIMESTAMP_MS)
        plain = _consume_first(consumer, PLAIN)
        assert plain.timestamp() == (TIMESTAMP_CREATE_TIME, OLD_TIMESTAMP_MS)
        assert _offset_for_time(consumer, PLAIN, OLD_TIMESTAMP_MS) == 0
        assert _offset_for_time(consumer, PLAIN, OLD_TIMESTAMP_MS + 1) == -1
    finally:
        consumer.close()
