"""DescribeTopicPartitions (API 75, KIP-966) on the wire: paging by response_partition_limit
and cursor, Kafka's errors, and DESCRIBE per topic with an authorizer (a refused topic is
indistinguishable from a missing one)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from kio.schema.errors import ErrorCode

from raftlog.config import NodeConfig
from raftlog.metadata.controller.messages import NewTopic
from raftlog.net.kafka import codec
from raftlog.net.kafka.apis import ApiKey, default_registry
from raftlog.net.kafka.handlers_topic_partitions import (
    MAX_RESPONSE_PARTITIONS,
    MAX_TOPICS_PER_REQUEST,
    handle_describe_topic_partitions,
)
from raftlog.net.kafka.server import ListenerSecurity, serve
from raftlog.security.acl import AclOperation, ResourceType
from tests.kafka.conftest import Broker, start_broker
from tests.kafka.test_authz import AclBackend, acl, lookup
from tests.kafka.wire import WireClient

E = ErrorCode
API = ApiKey.DESCRIBE_TOPIC_PARTITIONS


def _registry():
    registry = default_registry()
    registry.register(API, 0, 0, handle_describe_topic_partitions)
    return registry


@pytest.fixture
async def dtp(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Broker]:
    started = await start_broker(nursery, tmp_path, _registry())
    # "a" 3 partitions, "b" 2, "c" 1.
    await started.backend.create_topics(
        [NewTopic("a", 3, 1), NewTopic("b", 2, 1), NewTopic("c", 1, 1)], 1000, False
    )
    yield started
    started.backend.close()


def describe(topics: list[str], limit: int = 2000, cursor: tuple[str, int] | None = None):
    values: dict[str, Any] = {
        "topics": [{"name": t} for t in topics],
        "response_partition_limit": limit,
        "cursor": None
        if cursor is None
        else {"topic_name": cursor[0], "partition_index": cursor[1]},
    }
    return codec.build(codec.request_class(API, 0), values)


def shape(response) -> tuple[list[tuple[str, int, list[int]]], tuple[str, int] | None]:
    topics = [
        (t.name, t.error_code, [p.partition_index for p in t.partitions]) for t in response.topics
    ]
    cursor = response.next_cursor
    return topics, None if cursor is None else (cursor.topic_name, cursor.partition_index)


async def test_all_topics_in_pages(dtp: Broker) -> None:
    client = await WireClient.connect(dtp.port)
    first = await client.request(describe([], limit=4))
    assert shape(first) == ([("a", E.none, [0, 1, 2]), ("b", E.none, [0])], ("b", 1))
    assert first.topics[0].topic_id is not None
    second = await client.request(describe([], limit=4, cursor=("b", 1)))
    assert shape(second) == ([("b", E.none, [1]), ("c", E.none, [0])], None)
    # A page that ends exactly at a topic's end points the cursor at the next topic.
    exact = await client.request(describe([], limit=3))
    assert shape(exact) == ([("a", E.none, [0, 1, 2])], ("b", 0))
    # Limits are clamped to 1..MAX_RESPONSE_PARTITIONS.
    tiny = await client.request(describe([], limit=-5))
    assert shape(tiny) == ([("a", E.none, [0])], ("a", 1))
    assert MAX_RESPONSE_PARTITIONS == 2000


async def test_named_topics_sorted_with_errors(dtp: Broker) -> None:
    client = await WireClient.connect(dtp.port)
    response = await client.request(describe(["c", "ghost", "a", "bad/name", "c"]))
    assert shape(response) == (
        [
            ("a", E.none, [0, 1, 2]),
            ("bad/name", E.invalid_topic_exception, []),
            ("c", E.none, [0]),
            ("ghost", E.unknown_topic_or_partition, []),
        ],
        None,
    )
    assert [t.topic_id for t in response.topics][1::2] == [None, None]


async def test_bad_cursors_and_too_many_topics(dtp: Broker) -> None:
    client = await WireClient.connect(dtp.port)
    outside = await client.request(describe(["a"], cursor=("b", 0)))
    assert shape(outside) == ([("a", E.invalid_request, [])], None)
    negative = await client.request(describe([], cursor=("a", -1)))
    assert shape(negative) == ([], None)
    beyond = await client.request(describe(["a"], cursor=("a", 7)))
    assert shape(beyond) == ([("a", E.none, [])], None)
    flood = await client.request(describe([f"t{i}" for i in range(MAX_TOPICS_PER_REQUEST + 1)]))
    assert {t.error_code for t in flood.topics} == {E.invalid_request}


@pytest.fixture
async def secured(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[tuple[AclBackend, int]]:
    backend = AclBackend(tmp_path)
    security = ListenerSecurity(
        name="SASL_PLAINTEXT",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanisms=("PLAIN",),
        credential_lookup=lookup,
    )
    listeners = await nursery.start(
        functools.partial(
            serve, backend, "127.0.0.1", 0, NodeConfig(), registry=_registry(), security=security
        )
    )
    port = listeners[0].socket.getsockname()[1]
    backend.port = port
    await backend.create_topics([NewTopic("orders", 2, 1), NewTopic("secret", 1, 1)], 1000, False)
    yield backend, port
    backend.close()


async def test_describe_acl_per_topic(secured) -> None:
    from tests.kafka.test_authz import AuthzBroker, ScriptedGroups

    backend, port = secured
    alice = await AuthzBroker(backend, ScriptedGroups(), port).client("alice")
    backend.set_acls(acl(ResourceType.TOPIC, "orders", AclOperation.DESCRIBE))
    listed = await alice.request(describe([]))
    assert shape(listed) == ([("orders", E.none, [0, 1])], None)
    named = await alice.request(describe(["secret", "ghost", "orders"]))
    assert shape(named) == (
        [
            ("orders", E.none, [0, 1]),
            ("ghost", E.topic_authorization_failed, []),
            ("secret", E.topic_authorization_failed, []),
        ],
        None,
    )
    assert [t.topic_id for t in named.topics[1:]] == [None, None]
    assert named.topics[0].topic_authorized_operations != -(2**31)
