"""Produce and Fetch on the wire: offsets, KIP-951 leader hints, long-poll wake-up and the
sendfile (zero-copy) path with its byte fallback."""

from __future__ import annotations

import os

import pytest
import trio
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode

from raftlog.net.kafka.apis import ApiKey
from raftlog.net.kafka.backend import LeaderHint
from raftlog.net.kafka.codec import build, request_class
from raftlog.net.kafka.handlers_util import to_ms
from tests.kafka.conftest import Broker
from tests.kafka.wire import WireClient


def batch(values: list[bytes]) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for i, value in enumerate(values):
        builder.append(i, 1_700_000_000_000 + i, b"k", value, [("h", b"v")])
    return bytes(builder.build())


def produce_request(version: int, topic: str, records: bytes, partition: int = 0, acks=-1):
    return build(
        request_class(ApiKey.PRODUCE, version),
        {
            "transactional_id": None,
            "acks": acks,
            "timeout": 5000,
            "topic_data": [
                {"name": topic, "partition_data": [{"index": partition, "records": records}]}
            ],
        },
    )


def fetch_request(version: int, topic: str, offset: int, max_wait_ms=0, min_bytes=0):
    # build() drops the fields an older version does not have.
    return build(
        request_class(ApiKey.FETCH, version),
        {
            "replica_id": -1,
            "max_wait": max_wait_ms,
            "min_bytes": min_bytes,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic": topic,
                    "partitions": [
                        {
                            "partition": 0,
                            "current_leader_epoch": -1,
                            "fetch_offset": offset,
                            "last_fetched_epoch": -1,
                            "log_start_offset": -1,
                            "partition_max_bytes": 1 << 20,
                        }
                    ],
                }
            ],
            "forgotten_topics_data": [],
            "rack_id": "",
        },
    )


async def create_topic(broker: Broker, name: str) -> None:
    from raftlog.metadata.controller.messages import NewTopic

    await broker.backend.create_topics([NewTopic(name, 1)], 1000, False)


@pytest.mark.parametrize("use_sendfile", [True, False], ids=["sendfile", "bytes-fallback"])
@pytest.mark.parametrize("fetch_version", [4, 11, 12])
async def test_produce_then_fetch_returns_stored_batches(
    broker: Broker, monkeypatch, use_sendfile: bool, fetch_version: int
) -> None:
    calls = []
    if use_sendfile:
        real = os.sendfile

        def counting_sendfile(*args):
            calls.append(args)
            return real(*args)

        monkeypatch.setattr(os, "sendfile", counting_sendfile)
    else:
        monkeypatch.delattr(os, "sendfile")
    await create_topic(broker, "t")
    client = await WireClient.connect(broker.port)
    first = batch([b"a", b"b", b"c"])
    second = batch([b"d"])
    r1 = await client.request(produce_request(9, "t", first))
    r2 = await client.request(produce_request(9, "t", second))
    assert [r.responses[0].partition_responses[0].base_offset for r in (r1, r2)] == [0, 3]
    response = await client.request(fetch_request(fetch_version, "t", 1))
    part = response.responses[0].partitions[0]
    assert part.error_code == ErrorCode.none
    assert part.high_watermark == 4
    # Whole batches from the one containing offset 1, with baseOffset rewritten.
    assert len(part.records) == len(first) + len(second)
    records = bytes(part.records)
    assert records[:8] == (0).to_bytes(8, "big") and records[8 : len(first)] == first[8:]
    assert records[len(first) : len(first) + 8] == (3).to_bytes(8, "big")
    assert records[len(first) + 8 :] == second[8:]
    assert bool(calls) == use_sendfile


async def test_fetch_waits_for_data_and_wakes_on_produce(broker: Broker) -> None:
    await create_topic(broker, "w")
    consumer = await WireClient.connect(broker.port)
    producer = await WireClient.connect(broker.port)
    with trio.fail_after(5):
        start = trio.current_time()
        await consumer.send(fetch_request(12, "w", 0, max_wait_ms=10_000, min_bytes=1))
        await producer.request(produce_request(9, "w", batch([b"x"])))
        _, response = await consumer.receive(ApiKey.FETCH, 12)
    assert trio.current_time() - start < 5  # woken by the append, not by max_wait
    assert response.responses[0].partitions[0].high_watermark == 1


async def test_fetch_max_wait_expires_with_empty_records(broker: Broker) -> None:
    await create_topic(broker, "e")
    client = await WireClient.connect(broker.port)
    response = await client.request(fetch_request(12, "e", 0, max_wait_ms=50, min_bytes=1))
    part = response.responses[0].partitions[0]
    assert (part.error_code, part.high_watermark, len(part.records or b"")) == (
        ErrorCode.none,
        0,
        0,
    )


async def test_fetch_errors_per_partition(broker: Broker) -> None:
    client = await WireClient.connect(broker.port)
    response = await client.request(fetch_request(12, "nope", 0))
    assert response.responses[0].partitions[0].error_code == ErrorCode.unknown_topic_or_partition
    await create_topic(broker, "f")
    response = await client.request(fetch_request(12, "f", 99))
    assert response.responses[0].partitions[0].error_code == ErrorCode.offset_out_of_range


async def test_not_leader_carries_kip951_leader_and_endpoint(broker: Broker) -> None:
    await create_topic(broker, "moved")
    broker.backend.not_leader[("moved", 0)] = LeaderHint(leader_id=1, leader_epoch=7)
    client = await WireClient.connect(broker.port)
    response = await client.request(produce_request(10, "moved", batch([b"x"])))
    part = response.responses[0].partition_responses[0]
    assert part.error_code == ErrorCode.not_leader_or_follower
    assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (1, 7)
    assert [(e.node_id, e.port) for e in response.node_endpoints] == [(1, broker.port)]


async def test_invalid_acks_and_corrupt_batch(broker: Broker) -> None:
    await create_topic(broker, "v")
    client = await WireClient.connect(broker.port)
    response = await client.request(produce_request(9, "v", batch([b"x"]), acks=2))
    assert response.responses[0].partition_responses[0].error_code == (
        ErrorCode.invalid_required_acks
    )
    corrupt = bytearray(batch([b"x"]))
    corrupt[-1] ^= 0xFF
    response = await client.request(produce_request(9, "v", bytes(corrupt)))
    assert response.responses[0].partition_responses[0].error_code == ErrorCode.corrupt_message
    assert to_ms(response.throttle_time) == 0


async def test_acks_zero_gets_no_response_but_is_stored(broker: Broker) -> None:
    await create_topic(broker, "z")
    client = await WireClient.connect(broker.port)
    await client.send(produce_request(9, "z", batch([b"x"]), acks=0))
    # The next request's response is the first one on the wire.
    response = await client.request(fetch_request(12, "z", 0))
    assert response.responses[0].partitions[0].high_watermark == 1
