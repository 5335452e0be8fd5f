"""Transaction APIs on loopback: raw kio-encoded requests of every advertised version, and
confluent-kafka's transactional producer (librdkafka) committing and aborting.

The server runs with the in-memory test backend, InProcessGroupService and
InProcessTxnService (real TxnCoordinators; markers become control batches in the backend's
partitions). FindCoordinator for transactional ids (key type 1) belongs to the group handlers,
which do not route it to the TxnService yet: `start_txn_broker` puts a small FindCoordinator
in front of theirs that does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode
from raftlog.groups.service import CoordinatorLocation, InProcessGroupService
from raftlog.groups.settings import GroupConfig
from raftlog.metadata.controller.messages import NewTopic
from raftlog.net.kafka import authz, codec
from raftlog.net.kafka.apis import ApiKey, default_registry
from raftlog.net.kafka.context import Handler, RequestContext
from raftlog.net.kafka.handlers_groups import register_group_apis
from raftlog.net.kafka.handlers_txn import TXN_VERSION_TABLE, register_txn_apis
from raftlog.net.kafka.server import serve
from raftlog.txn.service import TxnService
from tests.kafka.conftest import TEST_MAX_FRAME_BYTES
from tests.kafka.memory_backend import MemoryBackend
from tests.kafka.wire import WireClient, raw_header
from tests.txn.inprocess_service import InProcessTxnService
from tests.waiting import wait_until

E = ErrorCode
TOPIC = "txn-topic"
PARTITIONS = 2
STEP_DEADLINE_S = 10
CLIENT_DEADLINE_S = 60
KEY_TYPE_TRANSACTION = 1


@dataclasses.dataclass
class TxnBroker:
    backend: MemoryBackend
    txn: InProcessTxnService
    port: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def find_coordinator_for_transactions(groups: Handler, txn: TxnService) -> Handler:
    """FindCoordinator: transactional ids (key type 1) from the TxnService, the rest from
    the group handlers."""

    async def locate(ctx: RequestContext, key: str) -> CoordinatorLocation:
        if not authz.allows(ctx, authz.DESCRIBE_TRANSACTIONAL_ID, key):
            return CoordinatorLocation(authz.DESCRIBE_TRANSACTIONAL_ID.error)
        return await txn.coordinator_for(key)

    async def handle(ctx: RequestContext, request: Any) -> dict[str, Any] | None:
        if getattr(request, "key_type", 0) != KEY_TYPE_TRANSACTION:
            return await groups(ctx, request)
        keys = list(request.coordinator_keys) if ctx.api_version >= 4 else [request.key]
        found = [(key, await locate(ctx, key)) for key in keys]
        answers = [
            {
                "key": key,
                "error_code": code,
                "error_message": None,
                "node_id": node_id,
                "host": host,
                "port": port,
            }
            for key, (code, node_id, host, port) in found
        ]
        return {"coordinators": answers} if ctx.api_version >= 4 else answers[0]

    return handle


async def start_txn_broker(nursery: trio.Nursery, data_dir: Path) -> TxnBroker:
    backend = MemoryBackend(data_dir)
    await backend.create_topics([NewTopic(TOPIC, PARTITIONS, 1)], 5000, False)
    groups = InProcessGroupService(GroupConfig(offsets_topic_num_partitions=3))
    await nursery.start(groups.run)
    txn = InProcessTxnService(backend.write_txn_markers)
    await nursery.start(txn.run)
    registry = default_registry()
    register_group_apis(registry, groups)
    register_txn_apis(registry, txn)
    group_find = registry.get(ApiKey.FIND_COORDINATOR)
    assert group_find is not None
    registry.register(
        ApiKey.FIND_COORDINATOR,
        group_find.min_version,
        group_find.max_version,
        find_coordinator_for_transactions(group_find.handler, txn),
    )
    config = NodeConfig(socket_request_max_bytes=TEST_MAX_FRAME_BYTES)
    listeners = await nursery.start(
        functools.partial(
            serve,
            backend,  # type: ignore[arg-type]  # no ACL or SCRAM methods: not asked here
            "127.0.0.1",
            0,
            config,
            registry=registry,
        )
    )
    port = listeners[0].socket.getsockname()[1]
    backend.port = groups.port = txn.port = port
    groups.node_id = txn.node_id = backend.node_id
    return TxnBroker(backend, txn, port)


@pytest.fixture
async def tb(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[TxnBroker]:
    started = await start_txn_broker(nursery, tmp_path)
    yield started
    started.backend.close()


@pytest.fixture
async def client(tb: TxnBroker) -> AsyncIterator[WireClient]:
    wire = await WireClient.connect(tb.port)
    yield wire
    await wire.aclose()


async def call(client: WireClient, api_key: int, version: int, **values: Any) -> Any:
    with trio.fail_after(STEP_DEADLINE_S):
        return await client.request(codec.build(codec.request_class(api_key, version), values))


# ---------------------------------------------------------------- the protocol
async def test_api_versions_advertises_the_transaction_apis(client: WireClient) -> None:
    response = await call(
        client, ApiKey.API_VERSIONS, 3, client_software_name="t", client_software_version="1"
    )
    advertised = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    for api_key, span in TXN_VERSION_TABLE.items():
        assert advertised[api_key] == span


async def test_an_end_txn_version_past_the_advertised_one_is_not_served(
    client: WireClient,
) -> None:
    """EndTxn v6 (past KIP-890 part 2's v5, which tests/txn/test_tv2_node.py drives) is
    refused as any unadvertised version is."""
    await client.send_raw(_frame(raw_header(ApiKey.END_TXN, 6, 9)))
    assert await client.is_closed_by_peer()


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


@pytest.mark.parametrize(
    ("init_v", "add_v", "end_v"), [(0, 0, 0), (1, 1, 1), (2, 2, 2), (3, 3, 3), (4, 3, 4)]
)
async def test_a_transaction_per_version(
    tb: TxnBroker, client: WireClient, init_v: int, add_v: int, end_v: int
) -> None:
    txn_id = f"wire-{init_v}-{add_v}-{end_v}"
    found = await call(client, ApiKey.FIND_COORDINATOR, 3, key=txn_id, key_type=1)
    assert (found.error_code, found.port) == (E.none, tb.port)
    init = await call(
        client,
        ApiKey.INIT_PRODUCER_ID,
        init_v,
        transactional_id=txn_id,
        transaction_timeout=30_000,
        producer_id=-1,
        producer_epoch=-1,
    )
    assert init.error_code == E.none
    pid, epoch = init.producer_id, init.producer_epoch
    added = await call(
        client,
        ApiKey.ADD_PARTITIONS_TO_TXN,
        add_v,
        v3_and_below_transactional_id=txn_id,
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[{"name": TOPIC, "partitions": [0, 1]}],
    )
    codes = {
        (t.name, p.partition_index): p.partition_error_code
        for t in added.results_by_topic_v3_and_below
        for p in t.results_by_partition
    }
    assert codes == {(TOPIC, 0): E.none, (TOPIC, 1): E.none}
    offsets = await call(
        client,
        ApiKey.ADD_OFFSETS_TO_TXN,
        min(end_v, 4),
        transactional_id=txn_id,
        producer_id=pid,
        producer_epoch=epoch,
        group_id="wire-group",
    )
    assert offsets.error_code == E.none
    ended = await call(
        client,
        ApiKey.END_TXN,
        end_v,
        transactional_id=txn_id,
        producer_id=pid,
        producer_epoch=epoch,
        committed=True,
    )
    assert ended.error_code == E.none
    await wait_until("committed", lambda: tb.txn.state_of(txn_id) == "CompleteCommit")
    # The offsets partition got its marker from the service, the topic's from the backend.
    (marker,) = tb.backend.markers_written
    assert set(marker.partitions) == {(TOPIC, 0), (TOPIC, 1)} and marker.commit
    listed = await call(
        client, ApiKey.LIST_TRANSACTIONS, 1, state_filters=[], producer_id_filters=[]
    )
    assert [(t.transactional_id, t.transaction_state) for t in listed.transaction_states] == [
        (txn_id, "CompleteCommit")
    ]


async def test_markers_and_producers_on_the_wire(tb: TxnBroker, client: WireClient) -> None:
    from tests.kafka.test_txn_handlers import txn_batch

    await tb.backend.produce(TOPIC, 1, txn_batch(99, 0), -1, 5000, _producer())
    described = await call(
        client, ApiKey.DESCRIBE_PRODUCERS, 0, topics=[{"name": TOPIC, "partition_indexes": [1]}]
    )
    (state,) = described.topics[0].partitions[0].active_producers
    assert (state.producer_id, state.current_txn_start_offset) == (99, 0)
    written = await call(
        client,
        ApiKey.WRITE_TXN_MARKERS,
        1,
        markers=[
            {
                "producer_id": 99,
                "producer_epoch": 0,
                "transaction_result": False,
                "coordinator_epoch": 0,
                "topics": [{"name": TOPIC, "partition_indexes": [1]}],
            }
        ],
    )
    assert written.markers[0].topics[0].partitions[0].error_code == E.none
    described = await call(
        client, ApiKey.DESCRIBE_PRODUCERS, 0, topics=[{"name": TOPIC, "partition_indexes": [1]}]
    )
    (state,) = described.topics[0].partitions[0].active_producers
    assert state.current_txn_start_offset == -1


def _producer() -> Any:
    from raftlog.net.kafka.backend import ProducerInfo

    return ProducerInfo()


async def test_an_oversized_request_is_refused_and_the_connection_lives(
    tb: TxnBroker, client: WireClient
) -> None:
    # 200 000 partitions: within the frame limit, over the per-request limit.
    response = await call(
        client,
        ApiKey.ADD_PARTITIONS_TO_TXN,
        3,
        v3_and_below_transactional_id="big",
        v3_and_below_producer_id=1,
        v3_and_below_producer_epoch=0,
        v3_and_below_topics=[{"name": TOPIC, "partitions": list(range(200_000))}],
    )
    assert response.results_by_topic_v3_and_below == ()
    init = await call(
        client,
        ApiKey.INIT_PRODUCER_ID,
        4,
        transactional_id="after-big",
        transaction_timeout=30_000,
        producer_id=-1,
        producer_epoch=-1,
    )
    assert init.error_code == E.none
    assert tb.txn.state_of("big") == ""  # never reached the coordinator


# ---------------------------------------------------------------- confluent-kafka
async def in_thread(fn: Callable[[], Any]) -> Any:
    with trio.fail_after(CLIENT_DEADLINE_S):
        return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)


def _transactional_producer(tb: TxnBroker, records_per_txn: int) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": tb.bootstrap,
            "transactional.id": "ck-txn",
            "transaction.timeout.ms": 30_000,
            "linger.ms": 5,
        }
    )
    producer.init_transactions(20)
    for commit in (True, False):
        producer.begin_transaction()
        for i in range(records_per_txn):
            producer.produce(TOPIC, key=f"k{i}".encode(), value=b"v", partition=i % PARTITIONS)
        if commit:
            producer.commit_transaction(20)
        else:
            producer.flush(20)  # the records are on the partitions before the abort
            producer.abort_transaction(20)
    assert producer.flush(20) == 0


async def test_confluent_kafka_transactional_producer(tb: TxnBroker) -> None:
    await in_thread(lambda: _transactional_producer(tb, 10))
    await wait_until("aborted", lambda: tb.txn.state_of("ck-txn") == "CompleteAbort")
    commit, abort = tb.backend.markers_written
    assert commit.commit and not abort.commit
    expected = {(TOPIC, p) for p in range(PARTITIONS)}
    assert set(commit.partitions) == set(abort.partitions) == expected
    # Same producer id and epoch for both transactions (no KIP-890 part 2 epoch bumps).
    assert (commit.producer_id, commit.producer_epoch) == (abort.producer_id, abort.producer_epoch)
    found = await tb.backend.describe_producers(TOPIC, 0)
    (state,) = found.producers
    assert (state.producer_id, state.current_txn_start_offset) == (commit.producer_id, -1)


async def _aiokafka_transactions(bootstrap: str, records_per_txn: int) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id="aio-txn", enable_idempotence=True
    )
    await producer.start()
    try:
        async with producer.transaction():
            for i in range(records_per_txn):
                await producer.send(TOPIC, key=f"k{i}".encode(), value=b"v", partition=i % 2)
        await producer.begin_transaction()
        for i in range(records_per_txn):
            await producer.send_and_wait(TOPIC, key=f"k{i}".encode(), value=b"v", partition=0)
        await producer.abort_transaction()
    finally:
        await producer.stop()


def _kafka_python_transactions(bootstrap: str, records_per_txn: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id="kp-txn")
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(records_per_txn):
        producer.send(TOPIC, key=f"k{i}".encode(), value=b"v", partition=i % 2)
    producer.commit_transaction()
    producer.begin_transaction()
    for i in range(records_per_txn):
        producer.send(TOPIC, key=f"k{i}".encode(), value=b"v", partition=0)
    producer.flush()
    producer.abort_transaction()
    producer.close()


@pytest.mark.parametrize("client_name", ["aiokafka", "kafka-python"])
async def test_other_clients_transactional_producers(tb: TxnBroker, client_name: str) -> None:
    if client_name == "aiokafka":
        txn_id = "aio-txn"
        await in_thread(lambda: asyncio.run(_aiokafka_transactions(tb.bootstrap, 6)))
    else:
        txn_id = "kp-txn"
        await in_thread(lambda: _kafka_python_transactions(tb.bootstrap, 6))
    await wait_until("aborted", lambda: tb.txn.state_of(txn_id) == "CompleteAbort")
    commit, abort = tb.backend.markers_written
    assert commit.commit and not abort.commit
    assert set(commit.partitions) == {(TOPIC, 0), (TOPIC, 1)}
    assert set(abort.partitions) == {(TOPIC, 0)}


async def test_find_coordinator_for_a_transactional_id(client: WireClient, tb: TxnBroker) -> None:
    found = await call(client, ApiKey.FIND_COORDINATOR, 4, key_type=1, coordinator_keys=["a", "b"])
    assert [(c.key, c.error_code, c.port) for c in found.coordinators] == [
        ("a", E.none, tb.port),
        ("b", E.none, tb.port),
    ]
