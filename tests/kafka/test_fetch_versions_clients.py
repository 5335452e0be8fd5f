"""confluent-kafka (librdkafka 2.x) consumes at every Fetch version it shares with the server.

librdkafka picks the highest Fetch version both sides advertise, so capping the server's
Fetch range moves the client from names (v12) to topic ids (v13+) and KIP-951's endpoints
(v16). The server records the version of every Fetch it answers, which is what the client
negotiated; each run consumes the same records at the same offsets.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from raftlog.net.kafka.apis import VERSION_TABLE, ApiKey, default_registry
from raftlog.net.kafka.context import RequestContext
from tests.kafka.conftest import start_broker

RECORDS = 30
CLIENT_DEADLINE_S = 30
FETCH_MIN, FETCH_MAX, _ = VERSION_TABLE[ApiKey.FETCH]


def _roundtrip(bootstrap: str, topic: str) -> list[tuple[bytes, int]]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(
        timeout=20
    )
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(RECORDS):
        producer.produce(topic, key=b"k", value=f"v{i}".encode())
    assert producer.flush(20) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",  # required by the API; assign() never joins it
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got: list[tuple[bytes, int]] = []
    while len(got) < RECORDS:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        got.append((msg.value(), msg.offset()))
    consumer.close()
    return got


@pytest.mark.parametrize("fetch_max", [12, 13, 14, 15, 16, FETCH_MAX])
async def test_confluent_consumes_at_the_negotiated_fetch_version(
    nursery: trio.Nursery, tmp_path, fetch_max: int
) -> None:
    registry = default_registry()
    spec = registry.get(ApiKey.FETCH)
    assert spec is not None
    versions: list[int] = []

    async def recording_fetch(ctx: RequestContext, request: Any) -> dict[str, Any] | None:
        versions.append(ctx.api_version)
        return await spec.handler(ctx, request)

    registry.register(ApiKey.FETCH, FETCH_MIN, fetch_max, recording_fetch)
    broker = await start_broker(nursery, tmp_path, registry)
    try:
        with trio.fail_after(CLIENT_DEADLINE_S):
            got = await trio.to_thread.run_sync(
                _roundtrip, broker.bootstrap, f"v{fetch_max}", abandon_on_cancel=True
            )
    finally:
        broker.backend.close()
    assert got == [(f"v{i}".encode(), i) for i in range(RECORDS)]
    if fetch_max <= 16:
        # librdkafka 2.x speaks up to v16: it takes the server's highest.
        assert set(versions) == {fetch_max}
    else:
        # The whole table: the client's own highest, at least v16 (topic ids, KIP-951).
        assert len(set(versions)) == 1 and 16 <= versions[0] <= fetch_max


async def test_confluent_follows_a_recreated_topic_to_its_new_id(
    nursery: trio.Nursery, tmp_path
) -> None:
    """Deleted and created again under its name, a topic has a new id: the consumer's
    fetches by the old id get UNKNOWN_TOPIC_ID (or the topic is gone from metadata), it
    learns the new id from Metadata v12 and reads the new topic's records from the start."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    from raftlog.metadata.controller.messages import NewTopic

    registry = default_registry()
    spec = registry.get(ApiKey.FETCH)
    assert spec is not None
    asked_ids: list[Any] = []

    async def recording_fetch(ctx: RequestContext, request: Any) -> dict[str, Any] | None:
        asked_ids.extend(t.topic_id for t in request.topics)
        return await spec.handler(ctx, request)

    registry.register(ApiKey.FETCH, FETCH_MIN, FETCH_MAX, recording_fetch)
    broker = await start_broker(nursery, tmp_path, registry)
    backend = broker.backend
    [first] = await backend.create_topics([NewTopic("again", 1)], 1000, False)
    token = trio.lowlevel.current_trio_token()

    async def recreate() -> Any:
        await backend.delete_topics(["again"], 1000)
        # The test backend keeps a partition's bytes in a file named after the topic: a new
        # topic must not find the old one's bytes there.
        (tmp_path / "again-0.log").unlink()
        [created] = await backend.create_topics([NewTopic("again", 1)], 1000, False)
        return created

    def run() -> tuple[list[bytes], Any]:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": "unused",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "topic.metadata.refresh.interval.ms": 1000,
                "fetch.wait.max.ms": 100,
            }
        )

        def consume(count: int, got: list[bytes]) -> None:
            while len(got) < count:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    got.append(msg.value())

        got: list[bytes] = []
        for i in range(3):
            producer.produce("again", value=f"old{i}".encode())
        assert producer.flush(20) == 0
        consumer.assign([TopicPartition("again", 0, OFFSET_BEGINNING)])
        consume(3, got)
        created = trio.from_thread.run(recreate, trio_token=token)
        for i in range(2):
            producer.produce("again", value=f"new{i}".encode())
        assert producer.flush(20) == 0
        consume(5, got)
        consumer.close()
        return got, created

    try:
        with trio.fail_after(CLIENT_DEADLINE_S):
            got, second = await trio.to_thread.run_sync(run, abandon_on_cancel=True)
    finally:
        backend.close()
    assert got == [b"old0", b"old1", b"old2", b"new0", b"new1"]
    assert first.topic_id != second.topic_id
    assert asked_ids[0] == first.topic_id and asked_ids[-1] == second.topic_id
    assert set(asked_ids) == {first.topic_id, second.topic_id}
