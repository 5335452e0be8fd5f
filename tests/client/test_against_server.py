"""The client against raftlog's Kafka server (in-memory test backend from tests/kafka)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

import pytest
import trio

from raftlog.client import (
    ACKS_ALL,
    ACKS_LEADER,
    ACKS_NONE,
    Admin,
    Cluster,
    ConfigOp,
    Consumer,
    NewTopic,
    Producer,
    QuotaMatch,
    ResourceType,
    open_cluster,
)
from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode, KafkaError
from raftlog.net.kafka.apis import default_registry
from raftlog.net.kafka.backend import LeaderHint
from raftlog.net.kafka.handlers_quorum import register_quorum_apis
from raftlog.net.kafka.server import serve
from raftlog.quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    QuotaEntity,
    QuotaValidationError,
)
from raftlog.records import Compression, Record
from tests.kafka.memory_backend import MemoryBackend
from tests.kafka.test_quorum_handlers import CLUSTER_ID, ScriptedQuorum


@pytest.fixture
async def backend(nursery: trio.Nursery, tmp_path) -> AsyncIterator[MemoryBackend]:
    backend = MemoryBackend(tmp_path)
    backend.auto_create = False
    # DescribeQuorum is served as on a node: by handlers_quorum, here over a scripted quorum.
    registry = default_registry()
    quorum = ScriptedQuorum()
    register_quorum_apis(registry, quorum, quorum.describe, CLUSTER_ID)
    listeners = await nursery.start(
        partial(serve, backend, "127.0.0.1", 0, NodeConfig(), registry=registry)
    )
    backend.port = listeners[0].socket.getsockname()[1]
    yield backend
    backend.close()


@pytest.fixture
async def cluster(backend: MemoryBackend) -> AsyncIterator[Cluster]:
    async with open_cluster(f"127.0.0.1:{backend.port}", client_id="client-test") as cluster:
        yield cluster


async def test_topic_admin_round_trip(cluster: Cluster) -> None:
    admin = Admin(cluster)
    created = await admin.create_topics(
        [NewTopic("events", 3, 1, configs={"retention.ms": "1000"}), NewTopic("logs", 1, 1)]
    )
    assert {name: r.error for name, r in created.items()} == {
        "events": ErrorCode.none,
        "logs": ErrorCode.none,
    }
    again = await admin.create_topics([NewTopic("events", 3, 1)])
    assert again["events"].error == ErrorCode.topic_already_exists
    assert await admin.list_topics() == ["events", "logs"]
    described = await admin.describe_topics(["events"])
    assert [p.partition for p in described["events"].partitions] == [0, 1, 2]
    assert described["events"].partitions[0].leader_id == 1
    grown = await admin.create_partitions({"events": 5})
    assert grown["events"].error == ErrorCode.none
    assert len((await admin.describe_topics(["events"]))["events"].partitions) == 5
    deleted = await admin.delete_topics(["logs"])
    assert deleted["logs"].error == ErrorCode.none
    assert await admin.list_topics() == ["events"]


async def test_configs_cluster_and_quorum(cluster: Cluster) -> None:
    admin = Admin(cluster)
    await admin.create_topics([NewTopic("t", 1, 1)])
    resource = (ResourceType.TOPIC, "t")
    await admin.incremental_alter_configs(resource, [("retention.ms", ConfigOp.SET, "5000")])
    configs = await admin.describe_configs([resource])
    assert configs[resource]["retention.ms"] == "5000"
    await admin.alter_configs(resource, {"cleanup.policy": "compact"})
    configs = await admin.describe_configs([resource])
    assert configs[resource]["cleanup.policy"] == "compact"
    description = await admin.describe_cluster()
    assert description.cluster_id == "raftlog-test-cluster"
    assert list(description.brokers) == [1]
    quorum = await admin.describe_quorum()
    assert quorum["leader_id"] == 1 and quorum["high_watermark"] == 10


async def test_client_quotas(cluster: Cluster) -> None:
    admin = Admin(cluster)
    alice_app = QuotaEntity.user_client("alice", "app")
    default_client = QuotaEntity.client(None)
    results = await admin.alter_client_quotas(
        [
            (alice_app, {PRODUCER_BYTE_RATE: 1048576, CONSUMER_BYTE_RATE: "2048"}),
            (default_client, {PRODUCER_BYTE_RATE: 100}),
        ]
    )
    assert all(r.error == ErrorCode.none for r in results.values())
    everything = await admin.describe_client_quotas()
    assert everything == {
        alice_app: {PRODUCER_BYTE_RATE: 1048576.0, CONSUMER_BYTE_RATE: 2048.0},
        default_client: {PRODUCER_BYTE_RATE: 100.0},
    }
    only_alice = await admin.describe_client_quotas([("user", QuotaMatch.EXACT, "alice")])
    assert list(only_alice) == [alice_app]
    # validate_only changes nothing; removal drops a key.
    await admin.alter_client_quotas([(default_client, {PRODUCER_BYTE_RATE: 5})], validate_only=True)
    await admin.alter_client_quotas([(alice_app, {CONSUMER_BYTE_RATE: None})])
    after = await admin.describe_client_quotas()
    assert after[default_client] == {PRODUCER_BYTE_RATE: 100.0}
    assert after[alice_app] == {PRODUCER_BYTE_RATE: 1048576.0}
    with pytest.raises(QuotaValidationError, match="must not be negative"):
        await admin.alter_client_quotas([(default_client, {PRODUCER_BYTE_RATE: -1})])


@pytest.mark.parametrize("acks", [ACKS_LEADER, ACKS_ALL])
async def test_produce_and_fetch_range(cluster: Cluster, acks: int) -> None:
    admin = Admin(cluster)
    await admin.create_topics([NewTopic("t", 2, 1)])
    producer = Producer(cluster, acks=acks)
    first = await producer.produce("t", [Record(key=b"k", value=b"v0")], partition=0)
    assert first.base_offset == 0
    second = await producer.produce(
        "t",
        [Record(value=f"v{i}".encode(), headers=(("h", b"x"),)) for i in range(1, 5)],
        partition=0,
    )
    assert second.base_offset == 1
    records = await Consumer(cluster).fetch_range("t", 0, 0)
    assert [r.value for r in records] == [f"v{i}".encode() for i in range(5)]
    assert [r.offset for r in records] == list(range(5))
    assert records[1].headers == (("h", b"x"),)
    middle = await Consumer(cluster).fetch_range("t", 0, 2, 4)
    assert [r.offset for r in middle] == [2, 3]
    assert (await admin.list_offsets("t", 0, "earliest")).offset == 0
    assert (await admin.list_offsets("t", 0, "latest")).offset == 5
    # Keyed records go where Kafka's default partitioner sends them.
    keyed = await producer.produce("t", [Record(key=b"foobar", value=b"x")], key=b"foobar")
    assert keyed.partition == (-790332482 & 0x7FFFFFFF) % 2


async def test_a_decode_budget_stops_a_fetch_at_a_batch_and_the_range_reads_on(
    cluster: Cluster,
) -> None:
    """A fetch decodes at most its budget (whole batches, at least one); fetch_range then asks
    again from where it stopped, so a small budget costs fetches, never records."""
    await Admin(cluster).create_topics([NewTopic("z", 1, 1)])
    producer = Producer(cluster, acks=ACKS_LEADER, compression=Compression.ZSTD)
    for _ in range(4):  # four batches of three 64 KiB records
        values = [bytes(64 * 1024) for _ in range(3)]
        await producer.produce("z", [Record(value=v) for v in values], partition=0)
    tight = Consumer(cluster, decode_budget_bytes=1)
    first = await tight.fetch("z", 0, 0)
    assert [r.offset for r in first.records] == [0, 1, 2] and first.next_offset == 3
    whole = await Consumer(cluster).fetch("z", 0, 0)
    assert len(whole.records) == 12 and whole.next_offset == 12
    assert [r.offset for r in await tight.fetch_range("z", 0, 0)] == list(range(12))


async def test_acks_zero_gets_no_answer_but_lands(cluster: Cluster) -> None:
    await Admin(cluster).create_topics([NewTopic("t", 1, 1)])
    result = await Producer(cluster, acks=ACKS_NONE).produce(
        "t", [Record(value=b"fire")], partition=0
    )
    assert result.base_offset == -1
    # The next acknowledged produce on the same connection proves the first was handled.
    await Producer(cluster, acks=ACKS_LEADER).produce("t", [Record(value=b"after")], partition=0)
    records = await Consumer(cluster).fetch_range("t", 0, 0)
    assert [r.value for r in records] == [b"fire", b"after"]


async def test_not_leader_refreshes_metadata_and_retries(
    cluster: Cluster, backend: MemoryBackend
) -> None:
    await Admin(cluster).create_topics([NewTopic("t", 1, 1)])
    backend.not_leader[("t", 0)] = LeaderHint(1, 1)
    refreshes = 0
    original = cluster.refresh_metadata

    async def refresh(topics=None) -> None:
        nonlocal refreshes
        refreshes += 1
        backend.not_leader.clear()  # leadership "settles" once the client looks again
        await original(topics)

    cluster.refresh_metadata = refresh  # type: ignore[method-assign]
    result = await Producer(cluster).produce("t", [Record(value=b"x")], partition=0)
    assert result.base_offset == 0 and refreshes == 1


async def test_retries_are_bounded(cluster: Cluster, backend: MemoryBackend) -> None:
    await Admin(cluster).create_topics([NewTopic("t", 1, 1)])
    backend.not_leader[("t", 0)] = LeaderHint(1, 1)
    with pytest.raises(KafkaError) as info:
        await Producer(cluster).produce("t", [Record(value=b"x")], partition=0)
    assert info.value.code == ErrorCode.not_leader_or_follower
