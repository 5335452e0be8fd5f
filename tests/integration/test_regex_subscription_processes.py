"""A KIP-848 regex subscription against real node processes: librdkafka with
`group.protocol=consumer` subscribes to "^rx-.*" (the coordinator resolves it), reads the
records of a matching topic that existed before it subscribed, then those of one created
after it subscribed; a topic that does not match is never assigned to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from raftlog.testing.cluster import ProcessCluster

pytestmark = pytest.mark.cluster

FUTURE_TIMEOUT_S = 30
# The coordinator resolves regexes again on heartbeats: a short interval keeps the wait short.
HEARTBEAT_INTERVAL_MS = 500
# Creating the topic, the next heartbeat's resolution, the new assignment and the fetch.
NEW_TOPIC_DEADLINE_S = 60
RECORDS = 5


def _produce(bootstrap: str, topic: str) -> set[bytes]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    values = {f"{topic}-{i}".encode() for i in range(RECORDS)}
    for value in sorted(values):
        producer.produce(topic, value)
    assert producer.flush(FUTURE_TIMEOUT_S) == 0
    return values


def test_regex_subscription_sees_a_topic_created_after_it_subscribed(tmp_path: Path) -> None:
    overrides = {"group_consumer_heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS}
    with ProcessCluster(tmp_path / "c", 1, overrides=overrides) as cluster:
        bootstrap = cluster.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for topic in ("rx-before", "other"):
            admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(FUTURE_TIMEOUT_S)
        expected = _produce(bootstrap, "rx-before")
        _produce(bootstrap, "other")
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "rx-group",
                "group.protocol": "consumer",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        seen: dict[bytes, str] = {}

        def poll_has(wanted: set[bytes]) -> bool:
            message: Any = consumer.poll(0.2)
            if message is not None and message.error() is None:
                seen[message.value()] = message.topic()
            return wanted <= seen.keys()

        try:
            consumer.subscribe(["^rx-.*"])
            cluster.wait_for(lambda: poll_has(expected), "records of rx-before", 60)
            admin.create_topics([NewTopic("rx-after", 3, 1)])["rx-after"].result(FUTURE_TIMEOUT_S)
            expected |= _produce(bootstrap, "rx-after")
            cluster.wait_for(
                lambda: poll_has(expected), "records of rx-after", NEW_TOPIC_DEADLINE_S
            )
            assignment = {tp.topic for tp in consumer.assignment()}
            assert assignment == {"rx-before", "rx-after"}
            assert "other" not in seen.values()
            # ConsumerGroupDescribe reports the regex the member subscribed with.
            [described] = admin.describe_consumer_groups(["rx-group"]).values()
            group = described.result(FUTURE_TIMEOUT_S)
            assert len(group.members) == 1
        finally:
            consumer.close()
