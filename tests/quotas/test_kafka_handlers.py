"""The quota parts of the Kafka handlers, over the wire against the in-memory backend:
produce bytes per (user, client-id), the fetch cap, and controller mutations (KIP-599)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from functools import partial
from types import SimpleNamespace

import pytest
import trio

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode
from raftlog.metadata.controller.messages import NewTopic
from raftlog.net.kafka.apis import ApiKey
from raftlog.net.kafka.codec import build, request_class
from raftlog.net.kafka.handlers_util import to_ms
from raftlog.net.kafka.server import serve
from raftlog.quotas import QuotaLimits
from raftlog.quotas.broker_hook import BrokerQuotas
from raftlog.records import Record, build_batch
from tests.kafka.memory_backend import MemoryBackend
from tests.kafka.test_fetch_produce import fetch_request, produce_request
from tests.kafka.wire import WireClient, encode_request


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 0

    def __call__(self) -> int:
        return self.now_ms


class Harness:
    def __init__(self, backend: MemoryBackend, port: int, quotas: BrokerQuotas, clock: FakeClock):
        self.backend = backend
        self.port = port
        self.quotas = quotas
        self.clock = clock

    def set_quotas(self, table: dict) -> None:
        self.quotas.on_metadata(SimpleNamespace(client_quotas=table), None)  # type: ignore[arg-type]

    async def request(self, body, client_id: str):
        """One request on a fresh connection, so an earlier mute never delays the next."""
        client = await WireClient.connect(self.port)
        try:
            await client.stream.send_all(encode_request(body, 1, client_id))
            _, response = await client.receive(type(body).__api_key__, type(body).__version__)
            return response
        finally:
            await client.stream.aclose()


@pytest.fixture
async def harness(nursery: trio.Nursery, tmp_path) -> AsyncIterator[Harness]:
    backend = MemoryBackend(tmp_path)
    clock = FakeClock()
    quotas = BrokerQuotas(QuotaLimits(), clock)
    listeners = await nursery.start(
        partial(serve, backend, "127.0.0.1", 0, NodeConfig(), quotas=quotas)
    )
    yield Harness(backend, listeners[0].socket.getsockname()[1], quotas, clock)
    backend.close()


def create_topics_request(version: int, topics: list[tuple[str, int]]):
    return build(
        request_class(ApiKey.CREATE_TOPICS, version),
        {
            "topics": [
                {
                    "name": name,
                    "num_partitions": count,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [],
                }
                for name, count in topics
            ],
            "timeout": 5000,
            "validate_only": False,
        },
    )


def value_batch(size_bytes: int) -> bytes:
    return build_batch([Record(value=b"x" * size_bytes)])


async def test_produce_bytes_count_against_the_anonymous_user_and_client_id(harness) -> None:
    harness.set_quotas(
        {(("client-id", "slow"), ("user", "ANONYMOUS")): {"producer_byte_rate": 10_000.0}}
    )
    await harness.backend.create_topics([NewTopic("t", 1)], 1000, False)
    records = value_batch(20_000)
    slow = await harness.request(produce_request(9, "t", records), "slow")
    fast = await harness.request(produce_request(9, "t", records), "fast")
    assert slow.responses[0].partition_responses[0].error_code == ErrorCode.none
    assert fast.responses[0].partition_responses[0].error_code == ErrorCode.none
    # 20 kB (plus batch overhead) at 10 kB/s, from a standing start: about 2 s.
    assert to_ms(slow.throttle_time) == pytest.approx(2_000, rel=0.02)
    assert to_ms(fast.throttle_time) == 0
    (row,) = harness.quotas.manager.usage(harness.clock.now_ms)
    assert (row.user, row.client_id) == ("ANONYMOUS", "slow")


async def test_fetch_under_a_consumer_quota_returns_one_window_of_bytes(harness) -> None:
    await harness.backend.create_topics([NewTopic("t", 1)], 1000, False)
    for _ in range(10):
        await harness.request(produce_request(9, "t", value_batch(3000)), "producer")
    harness.set_quotas({(("client-id", "c"),): {"consumer_byte_rate": 5000.0}})
    capped = await harness.request(fetch_request(12, "t", 0), "c")
    free = await harness.request(fetch_request(12, "t", 0), "free")
    capped_bytes = len(capped.responses[0].partitions[0].records)
    free_bytes = len(free.responses[0].partitions[0].records)
    assert 3000 < capped_bytes <= 5000  # one window of 5000 B/s: one whole batch fits
    assert free_bytes > 30_000
    # The file regions (zero-copy sends) were counted: ~3 kB from a standing start at 5 kB/s.
    assert to_ms(capped.throttle_time) == pytest.approx(capped_bytes / 5, abs=50)
    assert to_ms(free.throttle_time) == 0
    # Naming a replica buys nothing without an authorizer to vouch for it (raftlog's
    # followers fetch over the internal listener): capped and counted as the consumer it is.
    usage_before = harness.quotas.manager.usage(harness.clock.now_ms)
    posing = await harness.request(
        dataclasses.replace(fetch_request(12, "t", 0), replica_id=2), "c"
    )
    assert len(posing.responses[0].partitions[0].records) <= 5000
    assert harness.quotas.manager.usage(harness.clock.now_ms) != usage_before
    # The first non-empty partition still returns a batch bigger than the cap.
    harness.set_quotas({(("client-id", "c"),): {"consumer_byte_rate": 1024.0}})
    tiny = await harness.request(fetch_request(12, "t", 0), "c")
    assert len(tiny.responses[0].partitions[0].records) > 3000


async def test_create_topics_over_mutation_quota_strict_and_permissive(harness) -> None:
    harness.set_quotas({(("client-id", "adm"),): {"controller_mutation_rate": 1.0}})
    first = await harness.request(create_topics_request(7, [("a", 20), ("b", 2)]), "adm")
    codes = {t.name: t.error_code for t in first.topics}
    # "a" overdraws the 11-credit burst once; "b" is refused while the debt lasts.
    assert codes == {"a": ErrorCode.none, "b": ErrorCode.throttling_quota_exceeded}
    assert to_ms(first.throttle_time) == 9_000
    assert [t.name for t in harness.backend.topics(None)] == ["a"]
    # CreateTopics v5 predates KIP-599: the same request is accepted, only delayed.
    old = await harness.request(create_topics_request(5, [("c", 2)]), "adm")
    assert old.topics[0].error_code == ErrorCode.none
    assert to_ms(old.throttle_time) == 11_000  # capped at one span
    # Naming a topic that exists mutates nothing and is answered as usual, even in debt.
    exists = await harness.request(create_topics_request(7, [("a", 20)]), "adm")
    assert exists.topics[0].error_code == ErrorCode.topic_already_exists
    # Another client id is not limited by adm's quota.
    other = await harness.request(create_topics_request(7, [("d", 50)]), "other")
    assert (other.topics[0].error_code, to_ms(other.throttle_time)) == (ErrorCode.none, 0)
    # After the debt is repaid the client may mutate again.
    harness.clock.now_ms = 30_000
    later = await harness.request(create_topics_request(7, [("b", 2)]), "adm")
    assert later.topics[0].error_code == ErrorCode.none


async def test_delete_topics_and_create_partitions_count_partitions(harness) -> None:
    await harness.backend.create_topics([NewTopic("big", 30), NewTopic("small", 1)], 1000, False)
    harness.set_quotas({(("client-id", "adm"),): {"controller_mutation_rate": 1.0}})
    grow = build(
        request_class(ApiKey.CREATE_PARTITIONS, 3),
        {
            "topics": [{"name": "small", "count": 5, "assignments": None}],
            "timeout": 5000,
            "validate_only": False,
        },
    )
    grown = await harness.request(grow, "adm")
    assert grown.results[0].error_code == ErrorCode.none
    assert to_ms(grown.throttle_time) == 0  # 4 of 11 credits
    delete = build(
        request_class(ApiKey.DELETE_TOPICS, 6),
        {
            "topics": [{"name": "big", "topic_id": None}, {"name": "small", "topic_id": None}],
            "timeout": 5000,
        },
    )
    deleted = await harness.request(delete, "adm")
    codes = {r.name: r.error_code for r in deleted.responses}
    assert codes == {"big": ErrorCode.none, "small": ErrorCode.throttling_quota_exceeded}
    # 7 credits left, 30 spent: 23 s of debt, the throttle capped at one 11 s span.
    assert to_ms(deleted.throttle_time) == 11_000
    grow_more = build(
        request_class(ApiKey.CREATE_PARTITIONS, 3),
        {
            "topics": [{"name": "small", "count": 8, "assignments": None}],
            "timeout": 5000,
            "validate_only": False,
        },
    )
    refused = await harness.request(grow_more, "adm")
    assert refused.results[0].error_code == ErrorCode.throttling_quota_exceeded
