"""DeleteRecords' checks at the handler, as an attacker would send it (the real path against
three nodes: tests/integration/test_admin_processes.py)."""

from __future__ import annotations

import datetime
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from raftlog.metadata.controller.messages import NewTopic
from raftlog.net.kafka import codec
from raftlog.net.kafka.apis import ApiKey
from raftlog.net.kafka.handlers_records import MAX_PARTITIONS_PER_REQUEST
from tests.kafka.conftest import Broker
from tests.kafka.wire import WireClient


def _request(version: int, partitions: list[tuple[str, int, int]], timeout_s: float = 5) -> Any:
    by_topic: dict[str, list[dict[str, int]]] = {}
    for topic, partition, offset in partitions:
        by_topic.setdefault(topic, []).append({"partition_index": partition, "offset": offset})
    values = {
        "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()],
        "timeout": datetime.timedelta(seconds=timeout_s),
    }
    return codec.build(codec.request_class(ApiKey.DELETE_RECORDS, version), values)


def _codes(response: Any) -> dict[tuple[str, int], ErrorCode]:
    return {
        (t.name, p.partition_index): p.error_code for t in response.topics for p in t.partitions
    }


async def test_bad_offsets_and_unknown_partitions_are_refused_each(broker: Broker) -> None:
    await broker.backend.create_topics([NewTopic("dr", 2)], 1000, False)
    client = await WireClient.connect(broker.port)
    response = await client.request(
        _request(2, [("dr", 0, -1), ("dr", 1, -2), ("dr", 7, 0), ("nope", 0, 0), ("dr", 1, 99)])
    )
    assert _codes(response) == {
        ("dr", 0): ErrorCode.none,
        ("dr", 1): ErrorCode.offset_out_of_range,  # -2 and 99 (past the high watermark)
        ("dr", 7): ErrorCode.unknown_topic_or_partition,
        ("nope", 0): ErrorCode.unknown_topic_or_partition,
    }
    await client.aclose()


async def test_too_many_partitions_delete_nothing(broker: Broker) -> None:
    await broker.backend.create_topics([NewTopic("dr", 1)], 1000, False)
    client = await WireClient.connect(broker.port)
    count = MAX_PARTITIONS_PER_REQUEST + 1
    response = await client.request(_request(0, [("dr", i, 0) for i in range(count)]))
    codes = [p.error_code for t in response.topics for p in t.partitions]
    assert len(codes) == count and set(codes) == {ErrorCode.invalid_request}
    await client.aclose()


async def test_a_timeout_of_0_still_deletes(broker: Broker, monkeypatch: Any) -> None:
    """librdkafka's 0081 sends timeout 0: Kafka still moves the log start (the timeout only
    bounds its wait for the replicas), so the answer is NONE, not REQUEST_TIMED_OUT."""
    await broker.backend.create_topics([NewTopic("dr", 1)], 1000, False)
    real = broker.backend.delete_records

    async def durable_after_a_step(topic: str, partition: int, offset: int) -> Any:
        await trio.lowlevel.checkpoint()  # the leader waits for its checkpoint to be written
        return await real(topic, partition, offset)

    monkeypatch.setattr(broker.backend, "delete_records", durable_after_a_step)
    client = await WireClient.connect(broker.port)
    response = await client.request(_request(2, [("dr", 0, -1)], timeout_s=0))
    assert _codes(response) == {("dr", 0): ErrorCode.none}
    await client.aclose()
