"""Stock Kafka clients against the server on loopback (single in-process test backend).

Each client creates a topic, produces keyed records with headers once per compression codec
it supports, and consumes everything back without a consumer group (groups are not part of
this layer yet). Blocking clients run in a worker thread; the server runs on the test's trio
loop.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from typing import Any

import pytest
import trio

from raftlog.errors import ErrorCode
from raftlog.net.kafka.apis import default_registry
from tests.kafka.conftest import Broker, start_broker

RECORDS_PER_CODEC = 20
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
CLIENT_DEADLINE_S = 30


def expected_records(codecs: list[str]) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    return [
        (
            f"key-{codec}-{i}".encode(),
            f"value-{codec}-{i}".encode() * 3,
            [("codec", codec.encode()), ("i", str(i).encode())],
        )
        for codec in codecs
        for i in range(RECORDS_PER_CODEC)
    ]


async def in_thread(fn: Callable[[], Any]) -> Any:
    with trio.fail_after(CLIENT_DEADLINE_S):
        return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)


# ------------------------------------------------------------------------------ kafka-python
def _kafka_python_codecs() -> list[str]:
    from kafka import codec

    available = {
        "gzip": codec.has_gzip,
        "snappy": codec.has_snappy,
        "lz4": codec.has_lz4,
        "zstd": codec.has_zstd,
    }
    return ["none"] + [name for name, has in available.items() if has()]


async def test_kafka_python(broker: Broker) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic

    codecs = _kafka_python_codecs()
    expected = expected_records(codecs)

    def run() -> list[Any]:
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="kp-admin")
        admin.create_topics([NewTopic("kp-topic", num_partitions=1, replication_factor=1)])
        admin.close()
        for codec in codecs:
            producer = KafkaProducer(
                bootstrap_servers=broker.bootstrap,
                compression_type=None if codec == "none" else codec,
                acks="all",
            )
            for key, value, headers in expected:
                if headers[0][1] == codec.encode():
                    producer.send("kp-topic", key=key, value=value, headers=headers)
            producer.flush(timeout=20)
            producer.close()
        consumer = KafkaConsumer(
            bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False
        )
        tp = TopicPartition("kp-topic", 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got: list[Any] = []
        while len(got) < len(expected):
            for records in consumer.poll(timeout_ms=1000).values():
                got.extend(records)
        consumer.close()
        return got

    got = await in_thread(run)
    assert [(r.key, r.value, list(r.headers)) for r in got] == [(k, v, h) for k, v, h in expected]
    assert [r.offset for r in got] == list(range(len(expected)))
    # Every codec reached the broker compressed (a client can silently fall back).
    assert broker.backend.codecs_seen["kp-topic"] == {CODEC_IDS[c] for c in codecs}


# ------------------------------------------------------------------------------ confluent-kafka
CONFLUENT_CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def _confluent_roundtrip(broker: Broker, topic: str, codecs: list[str]) -> list[Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    expected = expected_records(codecs)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    futures[topic].result(timeout=20)
    errors: list[Any] = []
    for codec in codecs:
        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "compression.type": codec,
                "enable.idempotence": True,
                "linger.ms": 5,
            }
        )
        for key, value, headers in expected:
            if headers[0][1] == codec.encode():
                producer.produce(
                    topic,
                    key=key,
                    value=value,
                    headers=headers,
                    on_delivery=lambda err, msg: err and errors.append(err),
                )
        assert producer.flush(20) == 0
    assert not errors, errors
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "unused",  # required by the API; assign() never joins it
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got: list[Any] = []
    while len(got) < len(expected):
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        got.append(msg)
    consumer.close()
    assert [(m.key(), m.value(), m.headers()) for m in got] == [(k, v, h) for k, v, h in expected]
    assert [m.offset() for m in got] == list(range(len(expected)))
    return got


async def test_confluent_kafka(broker: Broker) -> None:
    await in_thread(lambda: _confluent_roundtrip(broker, "ck-topic", CONFLUENT_CODECS))
    # librdkafka's LZ4 feature depends on FindCoordinator v0 being advertised (a group
    # API this layer does not own), so without it librdkafka sends LZ4 uncompressed.
    assert broker.backend.codecs_seen["ck-topic"] == {
        CODEC_IDS[c] for c in CONFLUENT_CODECS if c != "lz4"
    }


async def test_confluent_lz4_needs_find_coordinator(nursery: trio.Nursery, tmp_path) -> None:
    """Registering FindCoordinator (as the group coordinator package will) from outside
    apis.py enables librdkafka's LZ4."""

    async def find_coordinator(ctx: Any, request: Any) -> dict[str, Any]:
        return {
            "error_code": ErrorCode.coordinator_not_available,
            "error_message": None,
            "node_id": -1,
            "host": "",
            "port": -1,
            "coordinators": [],
        }

    registry = default_registry()
    registry.register(10, 0, 6, find_coordinator)
    broker = await start_broker(nursery, tmp_path, registry)
    await in_thread(lambda: _confluent_roundtrip(broker, "lz4-topic", ["lz4"]))
    assert broker.backend.codecs_seen["lz4-topic"] == {CODEC_IDS["lz4"]}
    broker.backend.close()


# ------------------------------------------------------------------------------ aiokafka
AIOKAFKA_CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


async def test_aiokafka(broker: Broker) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    expected = expected_records(AIOKAFKA_CODECS)

    async def main() -> list[Any]:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        await admin.create_topics([NewTopic("aio-topic", num_partitions=1, replication_factor=1)])
        await admin.close()
        for codec in AIOKAFKA_CODECS:
            producer = AIOKafkaProducer(
                bootstrap_servers=broker.bootstrap,
                compression_type=None if codec == "none" else codec,
                acks="all",
            )
            await producer.start()
            for key, value, headers in expected:
                if headers[0][1] == codec.encode():
                    await producer.send("aio-topic", key=key, value=value, headers=headers)
            await producer.flush()
            await producer.stop()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False
        )
        await consumer.start()
        tp = TopicPartition("aio-topic", 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        got: list[Any] = []
        while len(got) < len(expected):
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                got.extend(records)
        await consumer.stop()
        return got

    got = await in_thread(lambda: asyncio.run(main()))
    assert [(r.key, r.value, list(r.headers)) for r in got] == [(k, v, h) for k, v, h in expected]
    assert broker.backend.codecs_seen["aio-topic"] == {CODEC_IDS[c] for c in AIOKAFKA_CODECS}


# ------------------------------------------------------------------------------ kcat
@pytest.mark.skipif(
    shutil.which("kcat") is None,
    reason="kcat is not installed (apt package kcat; `make sysdeps` installs it in CI)",
)
async def test_kcat(broker: Broker) -> None:
    lines = [f"k{i}:v{i}" for i in range(10)]
    with trio.fail_after(CLIENT_DEADLINE_S):
        await trio.run_process(
            [
                "kcat",
                "-b",
                broker.bootstrap,
                "-t",
                "kcat-topic",
                "-P",
                "-K:",
                "-z",
                "zstd",
                "-H",
                "h=1",
                "-X",
                "topic.metadata.refresh.interval.ms=100",
            ],
            stdin="\n".join(lines).encode() + b"\n",
        )
        result = await trio.run_process(
            [
                "kcat",
                "-b",
                broker.bootstrap,
                "-t",
                "kcat-topic",
                "-C",
                "-e",
                "-o",
                "beginning",
                "-f",
                "%k:%s:%h\n",
            ],
            capture_stdout=True,
        )
    assert result.stdout.decode().splitlines() == [f"{line}:h=1" for line in lines]
