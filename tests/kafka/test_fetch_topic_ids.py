"""Fetch v13-17, Produce v13 and Metadata by topic id, spoken with kio requests the way an
attacker would write them: forged ids (all zeros, random), negative and absurd partition
indexes, limits and session fields. Every answer is a Kafka error code in a well-formed
response; the server keeps serving. The stock-client side: test_fetch_versions_clients.py;
real nodes: test_fetch_topic_ids_processes.py."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from kio.schema.errors import ErrorCode

from raftlog.metadata.controller.messages import NewTopic
from raftlog.net.kafka import handlers_core
from raftlog.net.kafka.apis import VERSION_TABLE, ApiKey, default_registry
from raftlog.net.kafka.backend import LeaderHint
from raftlog.net.kafka.codec import build, request_class
from raftlog.records import Record, build_batch
from tests.kafka.conftest import Broker, start_broker
from tests.kafka.test_authz import AuthzBroker, acl, start_authz_broker
from tests.kafka.wire import WireClient

TOPIC = "ids"
ZERO_ID = uuid.UUID(int=0)
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
BY_ID_VERSIONS = [13, 14, 15, 16, 17]


def records(*values: bytes) -> bytes:
    return build_batch([Record(key=b"k", value=v) for v in values], now_ms=1_700_000_000_000)


def partition(index: int = 0, offset: int = 0, **overrides: Any) -> dict[str, Any]:
    return {
        "partition": index,
        "current_leader_epoch": -1,
        "fetch_offset": offset,
        "last_fetched_epoch": -1,
        "log_start_offset": -1,
        "partition_max_bytes": 1 << 20,
        **overrides,
    }


def fetch(version: int, topics: list[tuple[Any, list[dict[str, Any]]]], **overrides: Any) -> Any:
    """A Fetch of `version`; each topic is (name, or id from v13, its partitions)."""
    key = "topic_id" if version >= 13 else "topic"
    values: dict[str, Any] = {
        "replica_id": -1,
        "max_wait": 0,
        "min_bytes": 0,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [{key: t, "partitions": ps} for t, ps in topics],
        "forgotten_topics_data": [],
        "rack_id": "",
        **overrides,
    }
    return build(request_class(ApiKey.FETCH, version), values)


def answers(response: Any, version: int) -> list[tuple[Any, int, ErrorCode]]:
    """(topic name or id, partition, error) for every partition answered, in order."""
    key = "topic_id" if version >= 13 else "topic"
    return [
        (getattr(t, key), p.partition_index, p.error_code)
        for t in response.responses
        for p in t.partitions
    ]


async def topic_id(broker: Broker, name: str = TOPIC, partitions: int = 2) -> uuid.UUID:
    [created] = await broker.backend.create_topics([NewTopic(name, partitions)], 1000, False)
    assert created.topic_id is not None
    return created.topic_id


async def produce_by_name(client: WireClient, name: str, values: list[bytes]) -> None:
    request = build(
        request_class(ApiKey.PRODUCE, 9),
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 5000,
            "topic_data": [
                {"name": name, "partition_data": [{"index": 0, "records": records(*values)}]}
            ],
        },
    )
    response = await client.request(request)
    assert response.responses[0].partition_responses[0].error_code == ErrorCode.none


async def assert_still_serving(broker: Broker) -> None:
    other = await WireClient.connect(broker.port)
    response = await other.request(fetch(12, [(TOPIC, [partition()])]))
    assert response.error_code == ErrorCode.none
    await other.aclose()


def test_fetch_versions_advertised() -> None:
    assert VERSION_TABLE[ApiKey.FETCH][:2] == (4, 17)


# ------------------------------------------------------------------------------ by id
@pytest.mark.parametrize("version", BY_ID_VERSIONS)
async def test_fetch_by_topic_id_returns_records_keyed_by_id(broker: Broker, version: int) -> None:
    tid = await topic_id(broker)
    client = await WireClient.connect(broker.port)
    await produce_by_name(client, TOPIC, [b"a", b"b"])
    response = await client.request(fetch(version, [(tid, [partition(0), partition(1)])]))
    assert response.error_code == ErrorCode.none and response.session_id == 0
    assert answers(response, version) == [(tid, 0, ErrorCode.none), (tid, 1, ErrorCode.none)]
    first = response.responses[0].partitions[0]
    assert first.high_watermark == 2 and len(first.records) > 0
    # The same bytes as a fetch by name (v12) returns.
    by_name = await client.request(fetch(12, [(TOPIC, [partition(0)])]))
    assert bytes(first.records) == bytes(by_name.responses[0].partitions[0].records)


@pytest.mark.parametrize("version", BY_ID_VERSIONS)
@pytest.mark.parametrize(
    "forged",
    [ZERO_ID, uuid.UUID(int=1), uuid.UUID(int=2**128 - 1), uuid.UUID("0" * 31 + "a")],
    ids=["zero", "one", "all-ones", "small"],
)
async def test_forged_topic_ids_are_unknown_topic_id(
    broker: Broker, version: int, forged: uuid.UUID
) -> None:
    tid = await topic_id(broker)
    client = await WireClient.connect(broker.port)
    response = await client.request(
        fetch(version, [(forged, [partition(0), partition(7)]), (tid, [partition(0)])])
    )
    assert response.error_code == ErrorCode.none
    # kio reads the all-zero id as None (its null uuid): it comes back as sent.
    sent = None if forged == ZERO_ID else forged
    assert answers(response, version) == [
        (sent, 0, ErrorCode.unknown_topic_id),
        (sent, 7, ErrorCode.unknown_topic_id),
        (tid, 0, ErrorCode.none),
    ]
    await assert_still_serving(broker)


async def test_random_ids_never_name_a_topic(broker: Broker) -> None:
    """Seeded: a thousand random ids, one request; each is UNKNOWN_TOPIC_ID."""
    seed = 20261126
    rng = random.Random(seed)
    await topic_id(broker)
    forged = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(1000)]
    client = await WireClient.connect(broker.port)
    response = await client.request(
        fetch(16, [(f, [partition(rng.randint(-5, 5))]) for f in forged])
    )
    codes = {code for _, _, code in answers(response, 16)}
    assert codes == {ErrorCode.unknown_topic_id}, f"seed={seed}"
    assert [t.topic_id for t in response.responses] == forged, f"seed={seed}"


# ------------------------------------------------------------------------------ ranges
@pytest.mark.parametrize("version", [12, *BY_ID_VERSIONS])
async def test_negative_and_absurd_partition_indexes(broker: Broker, version: int) -> None:
    tid = await topic_id(broker)
    key: Any = tid if version >= 13 else TOPIC
    client = await WireClient.connect(broker.port)
    wanted = [partition(i) for i in (-1, INT32_MIN, 2, INT32_MAX, 0)]
    response = await client.request(fetch(version, [(key, wanted)]))
    assert answers(response, version) == [
        (key, -1, ErrorCode.unknown_topic_or_partition),
        (key, INT32_MIN, ErrorCode.unknown_topic_or_partition),
        (key, 2, ErrorCode.unknown_topic_or_partition),
        (key, INT32_MAX, ErrorCode.unknown_topic_or_partition),
        (key, 0, ErrorCode.none),
    ]


@pytest.mark.parametrize("version", [4, 12, *BY_ID_VERSIONS])
@pytest.mark.parametrize(
    "overrides",
    [
        {"max_bytes": -1},
        {"max_bytes": INT32_MIN},
        {"min_bytes": -1},
        {"max_wait": -1},
        {"isolation_level": 2},
        {"isolation_level": -1},
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
async def test_nonsense_limits_are_invalid_request(
    broker: Broker, version: int, overrides: dict[str, Any]
) -> None:
    tid = await topic_id(broker)
    key: Any = tid if version >= 13 else TOPIC
    client = await WireClient.connect(broker.port)
    response = await client.request(fetch(version, [(key, [partition(0)])], **overrides))
    assert_refused(response, version, [(key, 0)])
    await assert_still_serving(broker)


def assert_refused(response: Any, version: int, named: list[tuple[Any, int]]) -> None:
    """INVALID_REQUEST as Kafka answers it: top-level from v7; below v13 on every partition
    named too (v4-6 have only that)."""
    if version >= 7:
        assert response.error_code == ErrorCode.invalid_request
    if version >= 13:
        assert response.responses == ()
    else:
        assert answers(response, version) == [(k, i, ErrorCode.invalid_request) for k, i in named]


@pytest.mark.parametrize("version", [12, *BY_ID_VERSIONS])
async def test_negative_partition_max_bytes_is_invalid_request(
    broker: Broker, version: int
) -> None:
    tid = await topic_id(broker)
    key: Any = tid if version >= 13 else TOPIC
    client = await WireClient.connect(broker.port)
    bad = [partition(0), partition(1, partition_max_bytes=-1)]
    response = await client.request(fetch(version, [(key, bad)]))
    assert_refused(response, version, [(key, 0), (key, 1)])
    # Zero is a limit (the first batch still comes, as Kafka's minOneMessage).
    await produce_by_name(client, TOPIC, [b"x"])
    response = await client.request(fetch(version, [(key, [partition(0, partition_max_bytes=0)])]))
    assert response.error_code == ErrorCode.none
    assert len(response.responses[0].partitions[0].records) > 0


@pytest.mark.parametrize("version", [12, 13, 16])
@pytest.mark.parametrize(
    ("session_id", "session_epoch", "error"),
    [
        # Incremental fetches: raftlog opens no session, so none is ever found.
        (0, 1, ErrorCode.fetch_session_id_not_found),
        (12345, 3, ErrorCode.fetch_session_id_not_found),
        (-7, INT32_MAX, ErrorCode.fetch_session_id_not_found),
        # No epoch is below FINAL (-1).
        (0, -2, ErrorCode.invalid_fetch_session_epoch),
        (99, INT32_MIN, ErrorCode.invalid_fetch_session_epoch),
        # Full fetches are served whatever session they name (Kafka closes it; none here).
        (0, 0, ErrorCode.none),
        (0, -1, ErrorCode.none),
        (INT32_MAX, 0, ErrorCode.none),
        (INT32_MIN, -1, ErrorCode.none),
    ],
)
async def test_session_ids_and_epochs(
    broker: Broker, version: int, session_id: int, session_epoch: int, error: ErrorCode
) -> None:
    tid = await topic_id(broker)
    key: Any = tid if version >= 13 else TOPIC
    client = await WireClient.connect(broker.port)
    response = await client.request(
        fetch(version, [(key, [partition(0)])], session_id=session_id, session_epoch=session_epoch)
    )
    assert response.error_code == error
    assert response.session_id == 0  # never a session
    assert len(response.responses) == (1 if error == ErrorCode.none else 0)


async def test_a_partition_named_twice_is_answered_once(broker: Broker) -> None:
    tid = await topic_id(broker)
    client = await WireClient.connect(broker.port)
    await produce_by_name(client, TOPIC, [b"a", b"b", b"c"])
    # As Kafka's fetch map: one answer, with the values given last (offset 99: out of range).
    response = await client.request(
        fetch(16, [(tid, [partition(0, 0)] * 500 + [partition(1), partition(0, 99)])])
    )
    assert answers(response, 16) == [
        (tid, 0, ErrorCode.offset_out_of_range),
        (tid, 1, ErrorCode.none),
    ]


async def test_forgotten_topics_and_replica_fields_are_decoded_and_ignored(
    broker: Broker,
) -> None:
    tid = await topic_id(broker)
    client = await WireClient.connect(broker.port)
    await produce_by_name(client, TOPIC, [b"a"])
    forgotten = [{"topic_id": uuid.uuid4(), "partitions": [-1, INT32_MAX]}]
    for version in (15, 16, 17):
        request = fetch(
            version,
            [(tid, [partition(0)])],
            forgotten_topics_data=forgotten,
            replica_state={"replica_id": -1, "replica_epoch": -1},
        )
        assert request.replica_state.replica_epoch == -1
        response = await client.request(request)
        assert answers(response, version) == [(tid, 0, ErrorCode.none)]
        assert response.responses[0].partitions[0].high_watermark == 1


async def test_v17_replica_directory_id_is_ignored(broker: Broker) -> None:
    tid = await topic_id(broker)
    client = await WireClient.connect(broker.port)
    request = fetch(17, [(tid, [partition(0, replica_directory_id=uuid.uuid4())])])
    assert request.topics[0].partitions[0].replica_directory_id is not None
    response = await client.request(request)
    assert answers(response, 17) == [(tid, 0, ErrorCode.none)]


# ------------------------------------------------------------------------------ KIP-951
@pytest.mark.parametrize("version", [12, 13, 15, 16, 17])
async def test_moved_leader_and_its_endpoint(broker: Broker, version: int) -> None:
    """NOT_LEADER_OR_FOLLOWER carries the current leader (from the node's metadata when the
    backend names none); v16+ add that leader's endpoint."""
    tid = await topic_id(broker)
    broker.backend.not_leader[(TOPIC, 0)] = LeaderHint(leader_id=1, leader_epoch=7)
    key: Any = tid if version >= 13 else TOPIC
    client = await WireClient.connect(broker.port)
    response = await client.request(fetch(version, [(key, [partition(0), partition(1)])]))
    moved, stayed = response.responses[0].partitions
    assert moved.error_code == ErrorCode.not_leader_or_follower
    assert (moved.current_leader.leader_id, moved.current_leader.leader_epoch) == (1, 0)
    assert stayed.error_code == ErrorCode.none and stayed.current_leader.leader_id == -1
    if version >= 16:
        assert [(e.node_id, e.host, e.port) for e in response.node_endpoints] == [
            (1, "127.0.0.1", broker.port)
        ]
    else:
        assert not hasattr(response, "node_endpoints")


async def test_no_endpoints_without_a_moved_leader(broker: Broker) -> None:
    tid = await topic_id(broker)
    client = await WireClient.connect(broker.port)
    response = await client.request(fetch(16, [(tid, [partition(0)]), (ZERO_ID, [partition(0)])]))
    assert response.node_endpoints == ()


# ------------------------------------------------------------------------------ authorizer
@pytest.fixture
async def authz_broker(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[AuthzBroker]:
    started = await start_authz_broker(nursery, tmp_path)
    yield started
    started.backend.close()


async def test_ids_under_the_authorizer(authz_broker: AuthzBroker) -> None:
    """READ by the name the id resolves to; an unknown id is UNKNOWN_TOPIC_ID whoever asks."""
    from raftlog.security.acl import AclOperation, ResourceType

    backend = authz_broker.backend
    created = await backend.create_topics(
        [NewTopic("orders", 1, 1), NewTopic("secret", 1, 1)], 5000, False
    )
    orders, secret = (c.topic_id for c in created)
    backend.set_acls(acl(ResourceType.TOPIC, "orders", AclOperation.READ))
    alice = await authz_broker.client("alice")
    forged = uuid.uuid4()
    response = await alice.request(
        fetch(16, [(orders, [partition(0)]), (secret, [partition(0)]), (forged, [partition(0)])])
    )
    assert answers(response, 16) == [
        (orders, 0, ErrorCode.none),
        (secret, 0, ErrorCode.topic_authorization_failed),
        (forged, 0, ErrorCode.unknown_topic_id),
    ]
    # A fetch naming a replica (v15: replica_state) needs CLUSTER_ACTION, which alice lacks.
    response = await alice.request(
        fetch(
            15,
            [(orders, [partition(0)]), (forged, [partition(0)])],
            replica_state={"replica_id": 2, "replica_epoch": 1},
        )
    )
    assert answers(response, 15) == [
        (orders, 0, ErrorCode.topic_authorization_failed),
        (forged, 0, ErrorCode.unknown_topic_id),
    ]
    # Metadata by id: a topic alice may not DESCRIBE keeps its name hidden ("" below v12).
    for version in (11, 12):
        response = await alice.request(
            metadata(version, [{"name": None, "topic_id": t} for t in (orders, secret)])
        )
        got = [(t.name, t.topic_id, t.error_code) for t in response.topics]
        assert got == [
            ("orders", orders, ErrorCode.none),
            (None if version >= 12 else "", secret, ErrorCode.topic_authorization_failed),
        ]


# ------------------------------------------------------------------------------ Metadata
def metadata(version: int, topics: list[dict[str, Any]] | None) -> Any:
    return build(
        request_class(ApiKey.METADATA, version),
        {
            "topics": topics,
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
            "include_cluster_authorized_operations": False,  # v8-10
        },
    )


async def test_metadata_v12_returns_the_topic_ids(broker: Broker) -> None:
    tid = await topic_id(broker)
    other = await topic_id(broker, "other", 1)
    client = await WireClient.connect(broker.port)
    response = await client.request(metadata(12, None))
    assert {t.name: t.topic_id for t in response.topics} == {TOPIC: tid, "other": other}
    response = await client.request(metadata(12, [{"name": TOPIC, "topic_id": None}]))
    assert [(t.name, t.topic_id, t.error_code) for t in response.topics] == [
        (TOPIC, tid, ErrorCode.none)
    ]


@pytest.mark.parametrize("version", [10, 11, 12])
async def test_metadata_by_topic_id(broker: Broker, version: int) -> None:
    tid = await topic_id(broker)
    forged = uuid.uuid4()
    client = await WireClient.connect(broker.port)
    response = await client.request(
        metadata(
            version,
            [
                {"name": None, "topic_id": tid},
                {"name": None, "topic_id": forged},
                {"name": None, "topic_id": None},  # the all-zero id
            ],
        )
    )
    got = [(t.name, t.topic_id, t.error_code, len(t.partitions)) for t in response.topics]
    # v10-11 have no null name to answer: "" stands for it.
    unnamed = None if version >= 12 else ""
    assert got == [
        (unnamed, forged, ErrorCode.unknown_topic_id, 0),
        (unnamed, None, ErrorCode.unknown_topic_id, 0),
        (TOPIC, tid, ErrorCode.none, 2),
    ]


# ------------------------------------------------------------------------------ Produce v13
@pytest.fixture
async def broker_produce_v13(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Broker]:
    """Produce v13 as handlers_txn.register_txn_apis would register it with a coordinator
    (the handler is handle_produce either way; no transactional batch is sent here)."""
    registry = default_registry()
    registry.register(ApiKey.PRODUCE, 3, 13, handlers_core.handle_produce)
    started = await start_broker(nursery, tmp_path, registry)
    yield started
    started.backend.close()


def produce_v13(topics: list[tuple[Any, list[tuple[int, bytes]]]]) -> Any:
    return build(
        request_class(ApiKey.PRODUCE, 13),
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 5000,
            "topic_data": [
                {
                    "topic_id": t,
                    "partition_data": [{"index": i, "records": r} for i, r in parts],
                }
                for t, parts in topics
            ],
        },
    )


async def test_produce_v13_by_topic_id(broker_produce_v13: Broker) -> None:
    broker = broker_produce_v13
    tid = await topic_id(broker)
    forged = uuid.uuid4()
    client = await WireClient.connect(broker.port)
    response = await client.request(
        produce_v13(
            [
                (tid, [(0, records(b"a", b"b")), (-1, records(b"x")), (INT32_MAX, records(b"y"))]),
                (forged, [(0, records(b"z"))]),
                (ZERO_ID, [(0, records(b"z"))]),
            ]
        )
    )
    got = [
        (t.topic_id, p.index, p.error_code, p.base_offset)
        for t in response.responses
        for p in t.partition_responses
    ]
    assert got == [
        (tid, 0, ErrorCode.none, 0),
        (tid, -1, ErrorCode.unknown_topic_or_partition, -1),
        (tid, INT32_MAX, ErrorCode.unknown_topic_or_partition, -1),
        (forged, 0, ErrorCode.unknown_topic_id, -1),
        (None, 0, ErrorCode.unknown_topic_id, -1),
    ]
    # Only the known partition got records; a fetch by id reads them back.
    fetched = await client.request(fetch(16, [(tid, [partition(0)])]))
    assert fetched.responses[0].partitions[0].high_watermark == 2
