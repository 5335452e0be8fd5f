"""Clients cannot produce into internal topics: Kafka answers INVALID_TOPIC_EXCEPTION, and the
backend never sees the records (a record the group coordinator cannot decode in
__consumer_offsets would keep that offsets partition from loading after every move)."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from raftlog.groups.settings import OFFSETS_TOPIC
from tests.kafka.conftest import Broker
from tests.kafka.test_fetch_produce import batch, create_topic, produce_request
from tests.kafka.wire import WireClient


@pytest.mark.parametrize("topic", [OFFSETS_TOPIC, "__transaction_state", "__cluster_metadata"])
async def test_produce_to_an_internal_topic_is_refused(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, topic: str
) -> None:
    await create_topic(broker, topic)
    calls = []
    real_produce = broker.backend.produce

    async def counting_produce(*args, **kwargs):
        calls.append(args)
        return await real_produce(*args, **kwargs)

    monkeypatch.setattr(broker.backend, "produce", counting_produce)
    client = await WireClient.connect(broker.port)
    for version in (3, 9):
        response = await client.request(produce_request(version, topic, batch([b"forged"])))
        part = response.responses[0].partition_responses[0]
        assert part.error_code == ErrorCode.invalid_topic_exception
        assert part.base_offset == -1
    assert calls == []
    # The same connection still produces to an ordinary topic.
    await create_topic(broker, "ordinary")
    response = await client.request(produce_request(9, "ordinary", batch([b"x"])))
    assert response.responses[0].partition_responses[0].error_code == ErrorCode.none
