"""Admin APIs through kafka-python's admin client, Metadata auto-create, quota muting and
the per-connection in-flight limit."""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import trio
import trio.lowlevel
from kio.schema.errors import ErrorCode

from raftlog.config import NodeConfig
from raftlog.net.kafka.apis import ApiKey
from raftlog.net.kafka.codec import build, request_class
from raftlog.net.kafka.context import NoQuotas
from raftlog.net.kafka.handlers_util import to_ms
from raftlog.net.kafka.server import serve
from tests.kafka.conftest import Broker
from tests.kafka.memory_backend import MemoryBackend
from tests.kafka.test_clients import in_thread
from tests.kafka.wire import WireClient


async def test_kafka_python_admin_roundtrip(broker: Broker) -> None:
    from kafka.admin import (
        ConfigResource,
        ConfigResourceType,
        KafkaAdminClient,
        NewPartitions,
        NewTopic,
    )

    def run() -> dict[str, Any]:
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        out: dict[str, Any] = {}
        admin.create_topics([NewTopic("adm", num_partitions=1, replication_factor=1)])
        admin.create_partitions({"adm": NewPartitions(total_count=3)})
        resource = ConfigResource(ConfigResourceType.TOPIC, "adm", {"retention.ms": "1000"})
        admin.alter_configs([resource])
        out["configs"] = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "adm")])
        out["cluster"] = admin.describe_cluster()
        out["topics_before"] = set(admin.list_topics())
        admin.delete_topics(["adm"])
        out["topics_after"] = set(admin.list_topics())
        admin.close()
        return out

    out = await in_thread(run)
    assert "adm" in out["topics_before"] and "adm" not in out["topics_after"]
    assert out["cluster"]["cluster_id"] == broker.backend.cluster_id
    assert "retention.ms" in repr(out["configs"]) and "1000" in repr(out["configs"])


async def test_metadata_auto_creates_topics(broker: Broker) -> None:
    client = await WireClient.connect(broker.port)
    request = build(
        request_class(ApiKey.METADATA, 12),
        {
            "topics": [{"name": "auto", "topic_id": None}],
            "allow_auto_topic_creation": True,
            "include_topic_authorized_operations": False,
        },
    )
    response = await client.request(request)
    topic = response.topics[0]
    assert (topic.name, topic.error_code) == ("auto", ErrorCode.none)
    assert [p.leader_id for p in topic.partitions] == [1]
    broker.backend.auto_create = False
    request = dataclasses.replace(
        request, topics=(dataclasses.replace(request.topics[0], name="no"),)
    )
    response = await client.request(request)
    assert response.topics[0].error_code == ErrorCode.unknown_topic_or_partition


class FixedThrottle(NoQuotas):
    def __init__(self, throttle_ms: int) -> None:
        self.throttle_ms = throttle_ms

    def record_request(self, client_id: str, user: str, handler_time_ms: float) -> int:
        return self.throttle_ms


async def test_quota_throttle_is_reported_and_mutes_the_connection(tmp_path) -> None:
    backend = MemoryBackend(tmp_path)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(serve, backend, "127.0.0.1", 0, NodeConfig(), quotas=FixedThrottle(300))
        )
        client = await WireClient.connect(listeners[0].socket.getsockname()[1])
        request = build(
            request_class(ApiKey.DESCRIBE_CLUSTER, 1),
            {"include_cluster_authorized_operations": False},
        )
        first = await client.request(request)
        assert to_ms(first.throttle_time) == 300
        started = trio.current_time()
        await client.request(request)
        # The second request was not read until the 300 ms mute had passed.
        assert trio.current_time() - started >= 0.25
        nursery.cancel_scope.cancel()
    backend.close()


async def test_inflight_limit_stops_reading(tmp_path) -> None:
    """With max_inflight_requests_per_connection=2, a third pipelined request is not
    dispatched while the first two are unanswered."""
    backend = MemoryBackend(tmp_path)
    calls: list[str] = []
    backend.gates["slow"] = gate = trio.Event()
    original = backend.describe_configs

    async def describe_configs(rtype, name, keys):
        calls.append(name)
        return await original(rtype, name, keys)

    backend.describe_configs = describe_configs
    config = NodeConfig(max_inflight_requests_per_connection=2)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(serve, backend, "127.0.0.1", 0, config))
        client = await WireClient.connect(listeners[0].socket.getsockname()[1])
        for name in ("slow", "slow", "third"):
            await client.send(
                build(
                    request_class(ApiKey.DESCRIBE_CONFIGS, 4),
                    {
                        "resources": [
                            {"resource_type": 2, "resource_name": name, "configuration_keys": None}
                        ],
                        "include_synonyms": False,
                        "include_documentation": False,
                    },
                )
            )
        with trio.fail_after(5):
            while len(calls) < 2:
                await trio.lowlevel.checkpoint()
        # Bounded negative check: the third request stays unread while two are in flight.
        with trio.move_on_after(0.2):
            while len(calls) < 3:
                await trio.lowlevel.checkpoint()
        assert calls == ["slow", "slow"]
        gate.set()
        for _ in range(3):
            await client.receive(ApiKey.DESCRIBE_CONFIGS, 4)
        assert calls == ["slow", "slow", "third"]
        nursery.cancel_scope.cancel()
    backend.close()
