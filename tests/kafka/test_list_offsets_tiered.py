"""ListOffsets v8-10: the tiered-storage specs (EARLIEST_LOCAL -4, LATEST_TIERED -5) answered
as Kafka answers without tiered storage; v10's timeout_ms (for remote reads) changes nothing.
The real path: tests/integration/test_list_offsets_processes.py."""

from __future__ import annotations

from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from raftlog.constants import EARLIEST_TIMESTAMP
from raftlog.net.kafka import codec
from raftlog.net.kafka.apis import VERSION_TABLE, ApiKey
from raftlog.net.kafka.backend import ListOffsetsResult
from raftlog.net.kafka.handlers_fetch import EARLIEST_LOCAL_TIMESTAMP, LATEST_TIERED_TIMESTAMP
from tests.kafka.conftest import Broker
from tests.kafka.wire import WireClient

LOG_START = 4


def list_offsets(version: int, timestamp_ms: int, partition: int = 0) -> Any:
    values = {
        "replica_id": -1,
        "isolation_level": 0,
        "timeout": 30_000,  # v10+
        "topics": [
            {
                "name": "t",
                "partitions": [
                    {
                        "partition_index": partition,
                        "current_leader_epoch": -1,
                        "timestamp": timestamp_ms,
                    }
                ],
            }
        ],
    }
    return codec.build(codec.request_class(ApiKey.LIST_OFFSETS, version), values)


def answer(response: Any) -> tuple[ErrorCode, int, int, int]:
    [topic] = response.topics
    [p] = topic.partitions
    return p.error_code, p.timestamp, p.offset, p.leader_epoch


@pytest.fixture
def asked(broker: Broker) -> list[int]:
    """The backend's log starts at LOG_START; partition 0 of "t" exists, 1 does not."""
    timestamps: list[int] = []

    async def list_offset(topic, partition, timestamp_ms, current_leader_epoch, isolation):
        timestamps.append(timestamp_ms)
        if partition != 0:
            return ListOffsetsResult(ErrorCode.unknown_topic_or_partition)
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return ListOffsetsResult(offset=LOG_START, leader_epoch=2)
        return ListOffsetsResult(offset=99, leader_epoch=2)

    broker.backend.list_offset = list_offset  # type: ignore[method-assign]
    return timestamps


def test_v8_to_v10_are_advertised() -> None:
    assert VERSION_TABLE[ApiKey.LIST_OFFSETS][:2] == (1, 10)


@pytest.mark.parametrize("version", [8, 9, 10])
async def test_earliest_local_is_the_log_start(broker: Broker, asked, version) -> None:
    client = await WireClient.connect(broker.port)
    response = await client.request(list_offsets(version, EARLIEST_LOCAL_TIMESTAMP))
    assert answer(response) == (ErrorCode.none, -1, LOG_START, 2)
    assert asked == [EARLIEST_TIMESTAMP]


@pytest.mark.parametrize("version", [9, 10])
async def test_latest_tiered_is_nothing_without_tiered_storage(
    broker: Broker, asked, version
) -> None:
    client = await WireClient.connect(broker.port)
    response = await client.request(list_offsets(version, LATEST_TIERED_TIMESTAMP))
    assert answer(response) == (ErrorCode.none, -1, -1, -1)
    # The partition's own errors still come first.
    response = await client.request(list_offsets(version, LATEST_TIERED_TIMESTAMP, partition=1))
    assert answer(response)[0] == ErrorCode.unknown_topic_or_partition
    assert asked == [EARLIEST_TIMESTAMP, EARLIEST_TIMESTAMP]
