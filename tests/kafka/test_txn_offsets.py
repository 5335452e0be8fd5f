"""TxnOffsetCommit and FindCoordinator for transactional ids, over the wire with kio.

The server runs the in-memory backend with the ACL authorizer and SASL/PLAIN (admin is a
super user; alice gets only the ACLs a test grants), the real group coordinator
(InProcessGroupService, whose `write_txn_marker` plays the transaction driver's part) and, for
FindCoordinator key type 1, a stand-in TxnService that implements only `coordinator_for`:
the one method the group handlers call.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode
from raftlog.groups.service import CoordinatorLocation, InProcessGroupService
from raftlog.groups.settings import GroupConfig
from raftlog.metadata.controller.messages import NewTopic
from raftlog.net.kafka import handlers_security
from raftlog.net.kafka.apis import ApiKey, default_registry
from raftlog.net.kafka.handlers_groups import GroupHandlers, register_group_apis
from raftlog.net.kafka.handlers_txn_offsets import (
    MAX_PARTITIONS_PER_REQUEST,
    TXN_OFFSET_COMMIT,
    TXN_OFFSET_COMMIT_VERSIONS,
    for_version,
)
from raftlog.net.kafka.server import ListenerSecurity, serve
from raftlog.security.acl import AclOperation, ResourceType
from raftlog.txn.log_format import MAX_TRANSACTIONAL_ID_BYTES
from tests.kafka.test_authz import AclBackend, AuthzBroker, acl, lookup, request
from tests.kafka.wire import WireClient

E = ErrorCode
Op = AclOperation
TXN_NODE_ID = 42
TXN_ID = "payments-txn"
GROUP = "payments"
PID = 9_000
EPOCH = 3
ALL_VERSIONS = range(TXN_OFFSET_COMMIT_VERSIONS[0], TXN_OFFSET_COMMIT_VERSIONS[1] + 1)


@dataclasses.dataclass
class TxnCoordinatorAt:
    """The TxnService seam as FindCoordinator sees it: where an id's coordinator is."""

    host: str = "txn.example"
    port: int = 9999
    asked: list[str] = dataclasses.field(default_factory=list)

    async def coordinator_for(self, transactional_id: str) -> CoordinatorLocation:
        self.asked.append(transactional_id)
        return CoordinatorLocation(E.none, TXN_NODE_ID, self.host, self.port)


@dataclasses.dataclass
class TxnBroker:
    backend: AclBackend
    groups: InProcessGroupService
    txn: TxnCoordinatorAt
    port: int

    async def client(self, user: str = "admin") -> WireClient:
        sasl = AuthzBroker(self.backend, None, self.port)  # type: ignore[arg-type]
        return await sasl.client(user)


@pytest.fixture
async def broker(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[TxnBroker]:
    backend = AclBackend(tmp_path)
    groups = InProcessGroupService(GroupConfig(offsets_topic_num_partitions=3))
    await nursery.start(groups.run)
    txn = TxnCoordinatorAt()
    registry = default_registry()
    register_group_apis(registry, groups, txn)  # type: ignore[arg-type]  # only coordinator_for
    handlers_security.register(registry)
    security = ListenerSecurity(
        name="SASL_PLAINTEXT",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanisms=("PLAIN",),
        credential_lookup=lookup,
    )
    listeners = await nursery.start(
        functools.partial(
            serve, backend, "127.0.0.1", 0, NodeConfig(), registry=registry, security=security
        )
    )
    port = listeners[0].socket.getsockname()[1]
    backend.port = groups.port = port
    groups.node_id = backend.node_id
    await backend.create_topics([NewTopic("orders", 2, 1), NewTopic("secret", 1, 1)], 5000, False)
    yield TxnBroker(backend, groups, txn, port)
    backend.close()


def txn_commit(
    version: int,
    partitions: dict[tuple[str, int], int],
    *,
    metadata: str | None = None,
    leader_epoch: int = -1,
    **fields: Any,
) -> Any:
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), offset in partitions.items():
        topics.setdefault(topic, []).append(
            {
                "partition_index": partition,
                "committed_offset": offset,
                "committed_leader_epoch": leader_epoch,
                "committed_metadata": metadata,
            }
        )
    values: dict[str, Any] = {
        "transactional_id": TXN_ID,
        "group_id": GROUP,
        "producer_id": PID,
        "producer_epoch": EPOCH,
        "generation_id": -1,
        "member_id": "",
        "group_instance_id": None,
        "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
    }
    values.update(fields)
    return request(TXN_OFFSET_COMMIT, version, **values)


def answer(response: Any) -> dict[tuple[str, int], ErrorCode]:
    return {
        (t.name, p.partition_index): p.error_code for t in response.topics for p in t.partitions
    }


def fetch_stable(*partitions: tuple[str, int]) -> Any:
    topics: dict[str, list[int]] = {}
    for topic, partition in partitions:
        topics.setdefault(topic, []).append(partition)
    return request(
        ApiKey.OFFSET_FETCH,
        7,
        group_id=GROUP,
        topics=[{"name": t, "partition_indexes": ps} for t, ps in topics.items()],
        require_stable=True,
    )


def fetched(response: Any) -> dict[tuple[str, int], tuple[int, ErrorCode]]:
    assert response.error_code == E.none
    return {
        (t.name, p.partition_index): (p.committed_offset, p.error_code)
        for t in response.topics
        for p in t.partitions
    }


# ---------------------------------------------------------------- TxnOffsetCommit
@pytest.mark.parametrize("version", ALL_VERSIONS)
async def test_commit_is_pending_until_the_marker(broker: TxnBroker, version: int) -> None:
    admin = await broker.client()
    got = await admin.request(txn_commit(version, {("orders", 0): 10, ("orders", 1): 20}))
    assert answer(got) == {("orders", 0): E.none, ("orders", 1): E.none}
    before = fetched(await admin.request(fetch_stable(("orders", 0), ("orders", 1))))
    assert before == {
        ("orders", 0): (-1, E.unstable_offset_commit),
        ("orders", 1): (-1, E.unstable_offset_commit),
    }
    partition = broker.groups.shell.coordinator.partition_for(GROUP)
    await broker.groups.write_txn_marker(partition, PID, commit=True)
    after = fetched(await admin.request(fetch_stable(("orders", 0), ("orders", 1))))
    assert after == {("orders", 0): (10, E.none), ("orders", 1): (20, E.none)}


async def test_aborted_offsets_are_dropped(broker: TxnBroker) -> None:
    admin = await broker.client()
    assert answer(await admin.request(txn_commit(4, {("orders", 0): 10}))) == {
        ("orders", 0): E.none
    }
    partition = broker.groups.shell.coordinator.partition_for(GROUP)
    await broker.groups.write_txn_marker(partition, PID, commit=False)
    assert fetched(await admin.request(fetch_stable(("orders", 0)))) == {
        ("orders", 0): (-1, E.none)
    }


async def test_kip447_member_fields_reach_the_coordinator(broker: TxnBroker) -> None:
    admin = await broker.client()
    ghost = await admin.request(txn_commit(3, {("orders", 0): 1}, member_id="ghost"))
    assert answer(ghost) == {("orders", 0): E.unknown_member_id}
    stale = await admin.request(txn_commit(4, {("orders", 0): 1}, generation_id=5))
    assert answer(stale) == {("orders", 0): E.illegal_generation}


async def test_hostile_fields(broker: TxnBroker) -> None:
    admin = await broker.client()
    one = {("orders", 0): 1}
    for fields in (
        {"transactional_id": ""},
        {"transactional_id": "x" * (MAX_TRANSACTIONAL_ID_BYTES + 1)},
        {"producer_id": -1},
        {"producer_epoch": -1},
    ):
        got = await admin.request(txn_commit(4, one, **fields))
        assert answer(got) == {("orders", 0): E.invalid_request}, fields
    assert answer(await admin.request(txn_commit(4, one, group_id=""))) == {
        ("orders", 0): E.invalid_group_id
    }
    mixed = await admin.request(
        txn_commit(
            4,
            {("orders", 0): -5, ("orders", 1): 7, ("orders", 2): 7, ("ghost", 0): 7},
        )
    )
    assert answer(mixed) == {
        ("orders", 0): E.invalid_request,  # a negative offset
        ("orders", 1): E.none,
        ("orders", 2): E.unknown_topic_or_partition,
        ("ghost", 0): E.unknown_topic_or_partition,
    }
    epoch = await admin.request(txn_commit(4, {("orders", 1): 7}, leader_epoch=-9))
    assert answer(epoch) == {("orders", 1): E.invalid_request}
    big = "m" * (GroupConfig().offset_metadata_max_bytes + 1)
    too_large = await admin.request(txn_commit(4, {("orders", 1): 7}, metadata=big))
    assert answer(too_large) == {("orders", 1): E.offset_metadata_too_large}
    many = {("orders", i): 1 for i in range(MAX_PARTITIONS_PER_REQUEST + 1)}
    refused = answer(await admin.request(txn_commit(4, many)))
    assert set(refused.values()) == {E.invalid_request}
    assert len(refused) == len(many)
    # Nothing refused above reached the log as pending: only orders-1 is undecided.
    assert fetched(await admin.request(fetch_stable(("orders", 0), ("orders", 1)))) == {
        ("orders", 0): (-1, E.none),
        ("orders", 1): (-1, E.unstable_offset_commit),
    }


async def test_authorization(broker: TxnBroker) -> None:
    alice = await broker.client("alice")
    wanted = {("orders", 0): 1, ("secret", 0): 1, ("ghost", 0): 1}
    refused_txn = answer(await alice.request(txn_commit(4, wanted)))
    assert set(refused_txn.values()) == {E.transactional_id_authorization_failed}
    broker.backend.set_acls(acl(ResourceType.TRANSACTIONAL_ID, TXN_ID, Op.WRITE))
    refused_group = answer(await alice.request(txn_commit(4, wanted)))
    assert set(refused_group.values()) == {E.group_authorization_failed}
    broker.backend.set_acls(
        acl(ResourceType.TRANSACTIONAL_ID, TXN_ID, Op.WRITE),
        acl(ResourceType.GROUP, GROUP, Op.READ),
        acl(ResourceType.TOPIC, "orders", Op.READ),
    )
    got = answer(await alice.request(txn_commit(4, wanted)))
    # A topic without READ is refused whether or not it exists (existence stays hidden).
    assert got == {
        ("orders", 0): E.none,
        ("secret", 0): E.topic_authorization_failed,
        ("ghost", 0): E.topic_authorization_failed,
    }
    # DESCRIBE (implied by WRITE) on the transactional id lets alice find its coordinator.
    found = await alice.request(
        request(ApiKey.FIND_COORDINATOR, 4, key_type=1, coordinator_keys=[TXN_ID, "other"])
    )
    assert [(c.key, c.error_code, c.node_id) for c in found.coordinators] == [
        (TXN_ID, E.none, TXN_NODE_ID),
        ("other", E.transactional_id_authorization_failed, -1),
    ]
    assert broker.txn.asked == [TXN_ID]


def test_error_codes_per_version() -> None:
    assert for_version(E.producer_fenced, 2) == E.invalid_producer_epoch
    assert for_version(E.producer_fenced, 3) == E.producer_fenced
    assert for_version(E.transaction_abortable, 3) == E.invalid_txn_state
    assert for_version(E.transaction_abortable, 4) == E.transaction_abortable
    assert for_version(E.unknown_member_id, 0) == E.unknown_member_id


# ---------------------------------------------------------------- FindCoordinator key type 1
@pytest.mark.parametrize("version", [1, 2, 3])
async def test_find_transaction_coordinator_single_key(broker: TxnBroker, version: int) -> None:
    admin = await broker.client()
    got = await admin.request(request(ApiKey.FIND_COORDINATOR, version, key=TXN_ID, key_type=1))
    assert (got.error_code, got.node_id, got.host, got.port) == (
        E.none,
        TXN_NODE_ID,
        "txn.example",
        9999,
    )
    empty = await admin.request(request(ApiKey.FIND_COORDINATOR, version, key="", key_type=1))
    assert (empty.error_code, empty.node_id) == (E.invalid_request, -1)
    assert broker.txn.asked == [TXN_ID]


async def test_find_transaction_coordinator_batch(broker: TxnBroker) -> None:
    admin = await broker.client()
    keys = [TXN_ID, "", "y" * (MAX_TRANSACTIONAL_ID_BYTES + 1)]
    got = await admin.request(
        request(ApiKey.FIND_COORDINATOR, 4, key_type=1, coordinator_keys=keys)
    )
    assert [(c.error_code, c.node_id, c.port) for c in got.coordinators] == [
        (E.none, TXN_NODE_ID, 9999),
        (E.invalid_request, -1, -1),
        (E.invalid_request, -1, -1),
    ]
    # Group lookups still go to the group service.
    groups = await admin.request(
        request(ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=[GROUP])
    )
    assert [c.node_id for c in groups.coordinators] == [broker.groups.node_id]


async def test_without_a_txn_service_nothing_changes() -> None:
    handlers = GroupHandlers(InProcessGroupService())
    location = await handlers._locate(1, TXN_ID)
    assert location == CoordinatorLocation(E.coordinator_not_available)
    registry = default_registry()
    register_group_apis(registry, InProcessGroupService())
    assert registry.get(TXN_OFFSET_COMMIT) is None
