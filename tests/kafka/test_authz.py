"""An in-process Kafka server with the ACL authorizer on, for the authorization tests.

The server listens with SASL_PLAINTEXT (PLAIN), so each client connection carries the
principal it logged in as; the backend is the in-memory one plus the ACL seam
(`authorizer`, `acl_bindings`) a node's BrokerBackend has; the group APIs answer from a
small scripted coordinator that records what reached it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from kio.schema.index import api_key_map
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from raftlog.broker import BrokerBackend
from raftlog.config import NodeConfig
from raftlog.constants import NO_AUTHORIZED_OPERATIONS
from raftlog.errors import ErrorCode
from raftlog.groups import messages as m
from raftlog.groups.service import CoordinatorLocation, InProcessGroupService
from raftlog.metadata.controller.messages import NewTopic
from raftlog.metadata.image import MetadataImage
from raftlog.net.kafka import authz, codec, handlers_security
from raftlog.net.kafka.apis import ApiKey, default_registry
from raftlog.net.kafka.backend import AclCreateResult, AclDeleteResult, ScramAlterResult
from raftlog.net.kafka.handlers_consumer_group import register_consumer_group_apis
from raftlog.net.kafka.handlers_groups import register_group_apis
from raftlog.net.kafka.handlers_quorum import register_quorum_apis
from raftlog.net.kafka.server import ListenerSecurity, serve
from raftlog.records import Record, build_batch
from raftlog.security import scram
from raftlog.security.acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    ScramCredential,
    ScramMechanism,
)
from raftlog.security.authorizer import SUPPORTED_OPERATIONS, Authorizer, operations_bitfield
from raftlog.security.sasl import PlainClient
from tests.kafka.memory_backend import MemoryBackend
from tests.kafka.test_quorum_handlers import CLUSTER_ID, ScriptedQuorum
from tests.kafka.wire import WireClient

PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret", "admin": "admin-secret"}
SUPER_USERS = frozenset({"User:admin"})
CREDENTIALS = {
    (user, mechanism): scram.make_credential(mechanism, password)
    for user, password in PASSWORDS.items()
    for mechanism in scram.MECHANISMS
}


def lookup(user: str, mechanism: ScramMechanism) -> ScramCredential | None:
    return CREDENTIALS.get((user, mechanism))


def acl(
    resource_type: ResourceType,
    name: str,
    operation: AclOperation,
    *,
    principal: str = "User:alice",
    permission: AclPermissionType = AclPermissionType.ALLOW,
    pattern: PatternType = PatternType.LITERAL,
    host: str = "*",
) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation, permission)


class AclBackend(MemoryBackend):
    """MemoryBackend with ACLs held in memory and the authorizer built from them."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.bindings: list[AclBinding] = []
        self.allow_everyone = False
        self.authorizer: Authorizer | None = None
        self.set_acls()

    def set_acls(self, *bindings: AclBinding, allow_everyone: bool | None = None) -> None:
        if allow_everyone is not None:
            self.allow_everyone = allow_everyone
        self.bindings = list(bindings)
        self.authorizer = Authorizer(
            self.bindings,
            super_users=SUPER_USERS,
            allow_everyone_if_no_acl_found=self.allow_everyone,
        )

    def acl_bindings(self) -> Collection[AclBinding]:
        return tuple(self.bindings)

    def scram_credential(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        return lookup(user, mechanism)

    async def create_acls(self, creations: Sequence[AclBinding]) -> Sequence[AclCreateResult]:
        self.set_acls(*self.bindings, *creations)
        return [AclCreateResult() for _ in creations]

    async def describe_acls(self, acl_filter: AclBindingFilter) -> Sequence[AclBinding]:
        return [b for b in self.bindings if acl_filter.matches(b)]

    async def delete_acls(self, filters: Sequence[AclBindingFilter]) -> Sequence[AclDeleteResult]:
        results = [
            AclDeleteResult(matching=[b for b in self.bindings if f.matches(b)]) for f in filters
        ]
        gone = {b for r in results for b in r.matching}
        self.set_acls(*(b for b in self.bindings if b not in gone))
        return results

    async def describe_user_scram_credentials(self, users: Sequence[str] | None) -> Sequence[Any]:
        return []

    async def alter_user_scram_credentials(
        self, deletions: Sequence[Any], upsertions: Sequence[Any]
    ) -> Sequence[ScramAlterResult]:
        users = dict.fromkeys([d.name for d in deletions] + [u.name for u in upsertions])
        return [ScramAlterResult(user) for user in users]


@dataclass
class ScriptedShell:
    """A coordinator that agrees to everything and remembers what it was asked."""

    asked: list[Any] = field(default_factory=list)
    committed: dict[tuple[str, int], int] = field(default_factory=dict)
    groups: tuple[str, ...] = ("g1", "g2", "other")

    async def join_group(self, req: m.JoinGroupRequest) -> m.JoinGroupResponse:
        self.asked.append(req)
        return m.JoinGroupResponse(ErrorCode.none, "m-1", 1, req.protocol_type, "range", "m-1")

    async def sync_group(self, req: m.SyncGroupRequest) -> m.SyncGroupResponse:
        self.asked.append(req)
        return m.SyncGroupResponse(ErrorCode.none, b"assignment")

    async def heartbeat(self, req: m.HeartbeatRequest) -> m.HeartbeatResponse:
        self.asked.append(req)
        return m.HeartbeatResponse(ErrorCode.none)

    async def leave_group(self, req: m.LeaveGroupRequest) -> m.LeaveGroupResponse:
        self.asked.append(req)
        return m.LeaveGroupResponse(
            ErrorCode.none,
            tuple(
                m.LeaveMemberResult(x.member_id, x.group_instance_id, ErrorCode.none)
                for x in req.members
            ),
        )

    async def offset_commit(self, req: m.OffsetCommitRequest) -> m.OffsetCommitResponse:
        self.asked.append(req)
        for t in req.topics:
            for p in t.partitions:
                self.committed[(t.name, p.partition)] = p.offset
        return m.OffsetCommitResponse(
            tuple(
                m.TopicErrors(
                    t.name,
                    tuple(m.PartitionError(p.partition, ErrorCode.none) for p in t.partitions),
                )
                for t in req.topics
            )
        )

    async def offset_fetch(self, req: m.OffsetFetchRequest) -> m.OffsetFetchResponse:
        self.asked.append(req)
        if req.topics is None:
            wanted: dict[str, list[int]] = {}
            for topic, partition in self.committed:
                wanted.setdefault(topic, []).append(partition)
        else:
            wanted = {t.name: list(t.partitions) for t in req.topics}
        return m.OffsetFetchResponse(
            ErrorCode.none,
            tuple(
                m.FetchedTopic(
                    name,
                    tuple(
                        m.FetchedOffset(p, self.committed.get((name, p), -1)) for p in partitions
                    ),
                )
                for name, partitions in wanted.items()
            ),
        )

    async def list_groups(self, states: tuple[str, ...]) -> m.ListGroupsResponse:
        return m.ListGroupsResponse(
            ErrorCode.none, tuple(m.ListedGroup(g, "consumer", "Stable") for g in self.groups)
        )

    async def describe_groups(self, group_ids: list[str]) -> list[m.DescribedGroup]:
        self.asked.append(("describe", tuple(group_ids)))
        return [m.DescribedGroup(g, ErrorCode.none, "Stable", "consumer") for g in group_ids]

    async def delete_groups(self, names: list[str]) -> list[m.DeleteGroupResult]:
        self.asked.append(("delete", tuple(names)))
        return [m.DeleteGroupResult(g, ErrorCode.none) for g in names]


@dataclass
class ScriptedGroups:
    port: int = 0
    shell: ScriptedShell = field(default_factory=ScriptedShell)

    async def coordinator_for(self, group_id: str) -> CoordinatorLocation:
        return CoordinatorLocation(ErrorCode.none, 1, "127.0.0.1", self.port)


@dataclass
class AuthzBroker:
    backend: AclBackend
    groups: ScriptedGroups
    port: int

    async def client(self, user: str) -> WireClient:
        """A connection authenticated (SASL/PLAIN) as `user`."""
        client = await WireClient.connect(self.port)
        handshake = await client.request(SaslHandshakeRequest(mechanism="PLAIN"))
        assert handshake.error_code == ErrorCode.none, handshake
        exchange = PlainClient(user, PASSWORDS[user])
        answer = await client.request(SaslAuthenticateRequest(auth_bytes=exchange.first_message()))
        assert answer.error_code == ErrorCode.none, answer
        return client


async def start_authz_broker(
    nursery: trio.Nursery, data_dir: Path, group_service: InProcessGroupService | None = None
) -> AuthzBroker:
    """The server; the group APIs answer from ScriptedGroups, or from `group_service` (a
    real coordinator, KIP-848's APIs too) when given."""
    backend = AclBackend(data_dir)
    groups = ScriptedGroups()
    registry = default_registry()
    if group_service is None:
        register_group_apis(registry, groups)  # type: ignore[arg-type]  # duck-typed service
    else:
        register_group_apis(registry, group_service)
        register_consumer_group_apis(registry, group_service)
    handlers_security.register(registry)
    quorum = ScriptedQuorum()
    register_quorum_apis(registry, quorum, quorum.describe, CLUSTER_ID)
    security = ListenerSecurity(
        name="SASL_PLAINTEXT",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanisms=("PLAIN",),
        credential_lookup=lookup,
    )
    listeners = await nursery.start(
        functools.partial(
            serve,
            backend,
            "127.0.0.1",
            0,
            NodeConfig(),
            registry=registry,
            security=security,
        )
    )
    port = listeners[0].socket.getsockname()[1]
    backend.port = groups.port = port
    if group_service is not None:
        group_service.node_id, group_service.port = backend.node_id, port
    return AuthzBroker(backend, groups, port)


def request(api_key: int, version: int, **values: Any) -> Any:
    """A kio request of `version` from keyword values (kio field names)."""
    return codec.build(codec.request_class(api_key, version), values)


# ---------------------------------------------------------------------------- tests


T, G, C, X = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)
Op = AclOperation
E = ErrorCode
CLUSTER = "kafka-cluster"
TAF = ErrorCode.topic_authorization_failed
GAF = ErrorCode.group_authorization_failed
CAF = ErrorCode.cluster_authorization_failed
XAF = ErrorCode.transactional_id_authorization_failed
DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS, DESCRIBE_SCRAM, ALTER_SCRAM = 29, 30, 31, 50, 51


@pytest.fixture
async def broker(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[AuthzBroker]:
    started = await start_authz_broker(nursery, tmp_path)
    # Two topics exist; "ghost" never does.
    await started.backend.create_topics(
        [NewTopic("orders", 1, 1), NewTopic("secret", 1, 1)], 5000, False
    )
    yield started
    started.backend.close()


def records(transactional: bool = False) -> bytes:
    return build_batch(
        [Record(key=b"k", value=b"v")],
        producer_id=7 if transactional else -1,
        producer_epoch=0 if transactional else -1,
        base_sequence=0 if transactional else -1,
        is_transactional=transactional,
        now_ms=1_700_000_000_000,
    )


def produce(*topics: str, transactional_id: str | None = None, txn: bool = False) -> Any:
    return request(
        ApiKey.PRODUCE,
        9,
        transactional_id=transactional_id,
        acks=-1,
        timeout=5000,
        topic_data=[
            {"name": t, "partition_data": [{"index": 0, "records": records(txn)}]} for t in topics
        ],
    )


def produce_codes(response: Any) -> dict[str, ErrorCode]:
    return {t.name: t.partition_responses[0].error_code for t in response.responses}


def metadata(
    *names: str | None, version: int = 10, auto_create: bool = False, ops: bool = False
) -> Any:
    return request(
        ApiKey.METADATA,
        version,
        topics=None if names == (None,) else [{"name": n, "topic_id": None} for n in names],
        allow_auto_topic_creation=auto_create,
        include_topic_authorized_operations=ops,
        include_cluster_authorized_operations=ops,
    )


def metadata_codes(response: Any) -> dict[str, ErrorCode]:
    return {t.name: t.error_code for t in response.topics}


# ---------------------------------------------------------------- the table
def test_every_served_api_has_its_rules() -> None:
    """API_RULES names every API a node serves (a new API must say what it checks)."""
    registry = default_registry()
    register_group_apis(registry, ScriptedGroups())  # type: ignore[arg-type]
    handlers_security.register(registry)
    quorum = ScriptedQuorum()
    register_quorum_apis(registry, quorum, quorum.describe, CLUSTER_ID)
    served = {codec.api_name(spec.api_key) for spec in registry}
    served |= {"sasl_handshake", "sasl_authenticate"}
    assert served <= set(authz.API_RULES), served - set(authz.API_RULES)
    assert set(authz.API_RULES) <= set(api_key_map.values()) | served  # Kafka's names
    unchecked = {api for api, rules in authz.API_RULES.items() if not rules}
    assert unchecked == {"api_versions", "sasl_handshake", "sasl_authenticate"}


# ---------------------------------------------------------------- produce
async def test_produce_needs_write_and_hides_existence(broker: AuthzBroker) -> None:
    alice = await broker.client("alice")
    got = produce_codes(await alice.request(produce("orders", "ghost")))
    # No ACL: refused, and a topic that does not exist looks exactly the same.
    assert got == {"orders": TAF, "ghost": TAF}
    broker.backend.set_acls(acl(T, "orders", Op.WRITE))
    got = produce_codes(await alice.request(produce("orders", "secret")))
    assert got == {"orders": E.none, "secret": TAF}  # the allowed partition is appended
    assert len(broker.backend._topics["orders"].partitions[0].batches) == 1
    assert not broker.backend._topics["secret"].partitions[0].batches


async def test_produce_deny_wins_and_prefixed_acls_match(broker: AuthzBroker) -> None:
    broker.backend.set_acls(
        acl(T, "ord", Op.WRITE, pattern=PatternType.PREFIXED),
        acl(T, "*", Op.ALL),
        acl(T, "secret", Op.WRITE, permission=AclPermissionType.DENY),
    )
    alice = await broker.client("alice")
    assert produce_codes(await alice.request(produce("orders", "secret"))) == {
        "orders": E.none,
        "secret": TAF,
    }


async def test_transactional_produce_needs_write_on_the_transactional_id(
    broker: AuthzBroker,
) -> None:
    broker.backend.set_acls(acl(T, "orders", Op.WRITE))
    alice = await broker.client("alice")
    got = produce_codes(await alice.request(produce("orders", transactional_id="tx", txn=True)))
    assert got == {"orders": XAF}
    # A non-transactional batch does not ask about the transactional id.
    got = produce_codes(await alice.request(produce("orders", transactional_id="tx")))
    assert got == {"orders": E.none}


# ---------------------------------------------------------------- fetch paths
async def test_fetch_list_offsets_and_epochs_need_read_or_describe(broker: AuthzBroker) -> None:
    broker.backend.set_acls(acl(T, "orders", Op.READ), acl(T, "secret", Op.WRITE))
    alice = await broker.client("alice")
    fetch = request(
        ApiKey.FETCH,
        12,
        replica_id=-1,
        max_wait=0,
        min_bytes=1,
        max_bytes=1 << 20,
        forgotten_topics_data=[],
        topics=[
            {
                "topic": t,
                "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}],
            }
            for t in ("orders", "secret", "ghost")
        ],
    )
    got = await alice.request(fetch)
    codes = {t.topic: t.partitions[0].error_code for t in got.responses}
    assert codes == {"orders": E.none, "secret": TAF, "ghost": TAF}
    # A fetch naming a replica needs CLUSTER_ACTION on the cluster.
    replica_fetch = dataclasses.replace(fetch, replica_id=2)
    got = await alice.request(replica_fetch)
    assert {p.error_code for t in got.responses for p in t.partitions} == {TAF}

    list_offsets = request(
        ApiKey.LIST_OFFSETS,
        7,
        replica_id=-1,
        isolation_level=0,
        topics=[
            {"name": t, "partitions": [{"partition_index": 0, "timestamp": -1}]}
            for t in ("orders", "secret", "ghost")
        ],
    )
    got = await alice.request(list_offsets)
    # READ and WRITE imply DESCRIBE.
    assert {t.name: t.partitions[0].error_code for t in got.topics} == {
        "orders": E.none,
        "secret": E.none,
        "ghost": TAF,
    }
    epochs = request(
        ApiKey.OFFSET_FOR_LEADER_EPOCH,
        4,
        replica_id=-1,
        topics=[
            {"topic": t, "partitions": [{"partition": 0, "leader_epoch": 0}]}
            for t in ("orders", "ghost")
        ],
    )
    got = await alice.request(epochs)
    assert {t.topic: t.partitions[0].error_code for t in got.topics} == {
        "orders": E.none,
        "ghost": TAF,
    }


# ---------------------------------------------------------------- metadata
async def test_metadata_lists_only_describable_topics(broker: AuthzBroker) -> None:
    broker.backend.set_acls(acl(T, "orders", Op.DESCRIBE))
    alice = await broker.client("alice")
    assert metadata_codes(await alice.request(metadata(None))) == {"orders": E.none}
    got = metadata_codes(await alice.request(metadata("orders", "secret", "ghost")))
    assert got == {"orders": E.none, "secret": TAF, "ghost": TAF}
    admin = await broker.client("admin")
    assert set(metadata_codes(await admin.request(metadata(None)))) == {"orders", "secret"}


async def test_metadata_auto_creation_needs_create(broker: AuthzBroker) -> None:
    broker.backend.set_acls(acl(T, "new-", Op.DESCRIBE, pattern=PatternType.PREFIXED))
    alice = await broker.client("alice")
    got = metadata_codes(await alice.request(metadata("new-a", auto_create=True)))
    assert got == {"new-a": TAF}
    assert "new-a" not in broker.backend._topics
    # Kafka asks for DESCRIBE first, then CREATE (CREATE does not imply DESCRIBE).
    broker.backend.set_acls(
        acl(T, "new-", Op.CREATE, pattern=PatternType.PREFIXED),
        acl(T, "new-", Op.DESCRIBE, pattern=PatternType.PREFIXED),
    )
    got = metadata_codes(await alice.request(metadata("new-a", auto_create=True)))
    assert got["new-a"] in (E.none, E.leader_not_available)
    assert "new-a" in broker.backend._topics
    # CREATE on the cluster creates any name (DESCRIBE on it still needed to see it).
    broker.backend.set_acls(acl(C, CLUSTER, Op.CREATE), acl(T, "*", Op.DESCRIBE))
    got = metadata_codes(await alice.request(metadata("other", auto_create=True)))
    assert got["other"] in (E.none, E.leader_not_available)


async def test_metadata_authorized_operations(broker: AuthzBroker) -> None:
    broker.backend.set_acls(acl(T, "orders", Op.READ), acl(C, CLUSTER, Op.DESCRIBE))
    alice = await broker.client("alice")
    got = await alice.request(metadata("orders", "secret", ops=True))
    by_name = {t.name: t for t in got.topics}
    assert by_name["orders"].topic_authorized_operations == operations_bitfield(
        {Op.READ, Op.DESCRIBE}
    )
    assert by_name["secret"].topic_authorized_operations == NO_AUTHORIZED_OPERATIONS
    assert got.cluster_authorized_operations == operations_bitfield({Op.DESCRIBE})
    not_asked = await alice.request(metadata("orders"))
    assert not_asked.topics[0].topic_authorized_operations == NO_AUTHORIZED_OPERATIONS
    assert not_asked.cluster_authorized_operations == NO_AUTHORIZED_OPERATIONS
    # Without DESCRIBE on the cluster its field is 0, as Kafka answers.
    broker.backend.set_acls(acl(T, "orders", Op.READ))
    assert (await alice.request(metadata("orders", ops=True))).cluster_authorized_operations == 0


# ---------------------------------------------------------------- groups
async def test_find_coordinator_needs_describe_on_group_or_transactional_id(
    broker: AuthzBroker,
) -> None:
    broker.backend.set_acls(acl(G, "g1", Op.READ), acl(X, "tx1", Op.WRITE))
    alice = await broker.client("alice")

    async def codes(key_type: int, *keys: str) -> dict[str, ErrorCode]:
        got = await alice.request(
            request(ApiKey.FIND_COORDINATOR, 6, key_type=key_type, coordinator_keys=list(keys))
        )
        return {c.key: c.error_code for c in got.coordinators}

    assert await codes(0, "g1", "g2") == {"g1": E.none, "g2": GAF}
    # tx1 is allowed (no transaction coordinator yet: retriable); tx2 is refused.
    assert await codes(1, "tx1", "tx2") == {"tx1": E.coordinator_not_available, "tx2": XAF}


async def test_membership_apis_need_read_on_the_group(broker: AuthzBroker) -> None:
    alice = await broker.client("alice")
    join = request(
        ApiKey.JOIN_GROUP,
        9,
        group_id="g1",
        session_timeout=10_000,
        rebalance_timeout=10_000,
        member_id="",
        protocol_type="consumer",
        protocols=[{"name": "range", "metadata": b""}],
    )
    sync = request(
        ApiKey.SYNC_GROUP, 5, group_id="g1", generation_id=1, member_id="m-1", assignments=[]
    )
    heartbeat = request(ApiKey.HEARTBEAT, 4, group_id="g1", generation_id=1, member_id="m-1")
    leave = request(ApiKey.LEAVE_GROUP, 5, group_id="g1", members=[{"member_id": "m-1"}])
    for call in (join, sync, heartbeat, leave):
        assert (await alice.request(call)).error_code == GAF
    assert broker.groups.shell.asked == []  # nothing reached the coordinator
    broker.backend.set_acls(acl(G, "g1", Op.READ))
    for call in (join, sync, heartbeat, leave):
        assert (await alice.request(call)).error_code == E.none
    assert len(broker.groups.shell.asked) == 4


def commit(group: str, *topics: str) -> Any:
    return request(
        ApiKey.OFFSET_COMMIT,
        9,
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        topics=[
            {
                "name": t,
                "partitions": [
                    {"partition_index": 0, "committed_offset": 5, "committed_metadata": None}
                ],
            }
            for t in topics
        ],
    )


def commit_codes(response: Any) -> dict[str, ErrorCode]:
    return {t.name: t.partitions[0].error_code for t in response.topics}


async def test_offset_commit_needs_read_on_group_and_topic(broker: AuthzBroker) -> None:
    alice = await broker.client("alice")
    got = commit_codes(await alice.request(commit("g1", "orders", "secret")))
    assert got == {"orders": GAF, "secret": GAF}
    broker.backend.set_acls(acl(G, "g1", Op.READ), acl(T, "orders", Op.READ))
    got = commit_codes(await alice.request(commit("g1", "orders", "secret")))
    assert got == {"orders": E.none, "secret": TAF}
    assert broker.groups.shell.committed == {("orders", 0): 5}


async def test_offset_fetch_needs_describe_and_hides_topics(broker: AuthzBroker) -> None:
    broker.groups.shell.committed = {("orders", 0): 5, ("secret", 0): 9}
    alice = await broker.client("alice")

    def fetch(topics: list[str] | None, version: int = 9) -> Any:
        group: dict[str, Any] = {
            "group_id": "g1",
            "topics": None
            if topics is None
            else [{"name": t, "partition_indexes": [0]} for t in topics],
        }
        return request(ApiKey.OFFSET_FETCH, version, groups=[group], require_stable=False)

    got = (await alice.request(fetch(None))).groups[0]
    assert got.error_code == GAF
    broker.backend.set_acls(acl(G, "g1", Op.DESCRIBE), acl(T, "orders", Op.DESCRIBE))
    got = (await alice.request(fetch(None))).groups[0]
    assert got.error_code == E.none
    assert {t.name: t.partitions[0].committed_offset for t in got.topics} == {"orders": 5}
    got = (await alice.request(fetch(["orders", "secret"]))).groups[0]
    assert {t.name: t.partitions[0].error_code for t in got.topics} == {
        "orders": E.none,
        "secret": TAF,
    }
    # v1 has no top-level error: a refused group is every partition's error.
    broker.backend.set_acls()
    v1 = request(
        ApiKey.OFFSET_FETCH, 1, group_id="g1", topics=[{"name": "orders", "partition_indexes": [0]}]
    )
    got = await alice.request(v1)
    assert got.topics[0].partitions[0].error_code == GAF


async def test_group_admin_apis(broker: AuthzBroker) -> None:
    broker.backend.set_acls(acl(G, "g1", Op.DESCRIBE), acl(G, "g2", Op.DELETE))
    alice = await broker.client("alice")
    listed = await alice.request(request(ApiKey.LIST_GROUPS, 4, states_filter=[]))
    assert sorted(g.group_id for g in listed.groups) == ["g1", "g2"]  # DELETE implies DESCRIBE
    described = await alice.request(
        request(
            ApiKey.DESCRIBE_GROUPS, 5, groups=["g1", "other"], include_authorized_operations=True
        )
    )
    by_id = {g.group_id: g for g in described.groups}
    assert by_id["g1"].error_code == E.none
    assert by_id["g1"].authorized_operations == operations_bitfield({Op.DESCRIBE})
    assert by_id["other"].error_code == GAF
    deleted = await alice.request(request(ApiKey.DELETE_GROUPS, 2, groups_names=["g1", "g2"]))
    assert {r.group_id: r.error_code for r in deleted.results} == {"g1": GAF, "g2": E.none}
    assert ("delete", ("g2",)) in broker.groups.shell.asked
    # DESCRIBE on the cluster lists every group.
    broker.backend.set_acls(acl(C, CLUSTER, Op.DESCRIBE))
    listed = await alice.request(request(ApiKey.LIST_GROUPS, 4, states_filter=[]))
    assert sorted(g.group_id for g in listed.groups) == ["g1", "g2", "other"]


# ---------------------------------------------------------------- topics and configs
async def test_create_topics_needs_create_on_cluster_or_topic(broker: AuthzBroker) -> None:
    alice = await broker.client("alice")

    def create(*names: str) -> Any:
        return request(
            ApiKey.CREATE_TOPICS,
            7,
            topics=[
                {
                    "name": n,
                    "num_partitions": 1,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [],
                }
                for n in names
            ],
            timeout=5000,
            validate_only=False,
        )

    broker.backend.set_acls(acl(T, "mine", Op.CREATE))
    got = await alice.request(create("mine", "theirs"))
    by_name = {t.name: t for t in got.topics}
    assert by_name["theirs"].error_code == TAF
    assert by_name["mine"].error_code == E.none
    # Created, but without DESCRIBE_CONFIGS its configs are not shown.
    assert by_name["mine"].topic_config_error_code == TAF
    assert "theirs" not in broker.backend._topics
    broker.backend.set_acls(acl(C, CLUSTER, Op.CREATE), acl(T, "*", Op.DESCRIBE_CONFIGS))
    got = await alice.request(create("theirs"))
    assert got.topics[0].error_code == E.none
    assert got.topics[0].topic_config_error_code == E.none


async def test_delete_topics_and_create_partitions(broker: AuthzBroker) -> None:
    alice = await broker.client("alice")
    broker.backend.set_acls(acl(T, "orders", Op.ALTER))
    got = await alice.request(
        request(
            ApiKey.CREATE_PARTITIONS,
            3,
            topics=[{"name": n, "count": 2, "assignments": None} for n in ("orders", "secret")],
            timeout=5000,
            validate_only=False,
        )
    )
    assert {r.name: r.error_code for r in got.results} == {"orders": E.none, "secret": TAF}
    got = await alice.request(
        request(ApiKey.DELETE_TOPICS, 5, topic_names=["orders", "ghost"], timeout=5000)
    )
    assert {r.name: r.error_code for r in got.responses} == {"orders": TAF, "ghost": TAF}
    broker.backend.set_acls(acl(T, "orders", Op.DELETE))
    got = await alice.request(
        request(ApiKey.DELETE_TOPICS, 5, topic_names=["orders"], timeout=5000)
    )
    assert got.responses[0].error_code == E.none
    # By id: a topic the principal may not DESCRIBE is as unknown as a missing one.
    secret_id = broker.backend._topics["secret"].topic_id
    got = await alice.request(
        request(
            ApiKey.DELETE_TOPICS, 6, topics=[{"name": None, "topic_id": secret_id}], timeout=5000
        )
    )
    assert got.responses[0].error_code == E.unknown_topic_id
    assert "secret" in broker.backend._topics


async def test_configs_need_describe_configs_and_alter_configs(broker: AuthzBroker) -> None:
    alice = await broker.client("alice")
    broker.backend.set_acls(acl(T, "orders", Op.ALTER_CONFIGS))

    def resources(*items: tuple[int, str]) -> list[dict[str, Any]]:
        return [
            {"resource_type": t, "resource_name": n, "configuration_keys": None, "configs": []}
            for t, n in items
        ]

    described = await alice.request(
        request(
            ApiKey.DESCRIBE_CONFIGS, 4, resources=resources((2, "orders"), (2, "secret"), (4, "1"))
        )
    )
    assert [r.error_code for r in described.results] == [E.none, TAF, CAF]
    altered = await alice.request(
        request(
            ApiKey.ALTER_CONFIGS,
            2,
            resources=resources((2, "orders"), (2, "ghost"), (4, "1")),
            validate_only=True,
        )
    )
    assert [r.error_code for r in altered.responses] == [E.none, TAF, CAF]
    incremental = await alice.request(
        request(
            ApiKey.INCREMENTAL_ALTER_CONFIGS,
            1,
            resources=resources((2, "secret"), (4, "")),
            validate_only=True,
        )
    )
    assert [r.error_code for r in incremental.responses] == [TAF, CAF]


# ---------------------------------------------------------------- cluster APIs
async def test_cluster_apis(broker: AuthzBroker) -> None:
    alice = await broker.client("alice")
    cluster = await alice.request(
        request(ApiKey.DESCRIBE_CLUSTER, 1, include_cluster_authorized_operations=True)
    )
    # Kafka's broker answers DescribeCluster to anyone; the operations need DESCRIBE.
    assert cluster.error_code == E.none and cluster.cluster_authorized_operations == 0
    quorum = await alice.request(
        request(
            ApiKey.DESCRIBE_QUORUM,
            2,
            topics=[{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}],
        )
    )
    assert quorum.error_code == CAF
    quotas = await alice.request(
        request(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, components=[], strict=False)
    )
    assert quotas.error_code == CAF
    altered = await alice.request(
        request(
            ApiKey.ALTER_CLIENT_QUOTAS,
            1,
            entries=[
                {
                    "entity": [{"entity_type": "user", "entity_name": "alice"}],
                    "ops": [{"key": "producer_byte_rate", "value": 1.0, "remove": False}],
                }
            ],
            validate_only=False,
        )
    )
    assert altered.entries[0].error_code == CAF
    broker.backend.set_acls(acl(C, CLUSTER, Op.ALTER_CONFIGS), acl(C, CLUSTER, Op.DESCRIBE))
    quotas = await alice.request(
        request(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, components=[], strict=False)
    )
    assert quotas.error_code == E.none  # ALTER_CONFIGS implies DESCRIBE_CONFIGS
    cluster = await alice.request(
        request(ApiKey.DESCRIBE_CLUSTER, 1, include_cluster_authorized_operations=True)
    )
    assert cluster.cluster_authorized_operations == operations_bitfield(
        {Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS, Op.DESCRIBE}
    )


async def test_init_producer_id(broker: AuthzBroker, caplog: pytest.LogCaptureFixture) -> None:
    alice = await broker.client("alice")

    def init(transactional_id: str | None) -> Any:
        return request(
            ApiKey.INIT_PRODUCER_ID,
            4,
            transactional_id=transactional_id,
            transaction_timeout=60_000,
            producer_id=-1,
            producer_epoch=-1,
        )

    assert (await alice.request(init(None))).error_code == CAF
    assert (await alice.request(init("tx"))).error_code == XAF
    # KIP-679: WRITE on any topic is enough for an idempotent producer...
    broker.backend.set_acls(acl(T, "orders", Op.WRITE))
    assert (await alice.request(init(None))).error_code == E.none
    # ...unless a DENY covers it.
    broker.backend.set_acls(
        acl(T, "orders", Op.WRITE),
        acl(T, "ord", Op.WRITE, permission=AclPermissionType.DENY, pattern=PatternType.PREFIXED),
    )
    assert (await alice.request(init(None))).error_code == CAF
    broker.backend.set_acls(acl(C, CLUSTER, Op.IDEMPOTENT_WRITE), acl(X, "tx", Op.WRITE))
    assert (await alice.request(init(None))).error_code == E.none
    # Allowed: the request reaches the backend (the in-memory one has no transactions and
    # answers with its own refusal, which the authorizer's log does not see).
    with caplog.at_level(logging.INFO, logger="raftlog.kafka.authorizer"):
        # Only this request's records: the refusals above may have been captured too, when
        # an earlier test left the logger at INFO.
        caplog.clear()
        await alice.request(init("tx"))
    assert not [r for r in caplog.records if r.name == "raftlog.kafka.authorizer"]


async def test_security_admin_apis_need_alter_or_describe_on_the_cluster(
    broker: AuthzBroker,
) -> None:
    alice = await broker.client("alice")
    creation = {
        "resource_type": int(T),
        "resource_name": "orders",
        "resource_pattern_type": int(PatternType.LITERAL),
        "principal": "User:alice",
        "host": "*",
        "operation": int(Op.ALL),
        "permission_type": int(AclPermissionType.ALLOW),
    }
    acl_filter = {
        "resource_type_filter": int(ResourceType.ANY),
        "resource_name_filter": None,
        "pattern_type_filter": int(PatternType.ANY),
        "principal_filter": None,
        "host_filter": None,
        "operation": int(Op.ANY),
        "permission_type": int(AclPermissionType.ANY),
    }
    created = await alice.request(request(CREATE_ACLS, 3, creations=[creation]))
    assert created.results[0].error_code == CAF
    assert broker.backend.bindings == []  # alice cannot grant herself anything
    described = await alice.request(request(DESCRIBE_ACLS, 3, **acl_filter))
    assert described.error_code == CAF
    deleted = await alice.request(request(DELETE_ACLS, 3, filters=[acl_filter]))
    assert deleted.filter_results[0].error_code == CAF
    users = await alice.request(request(DESCRIBE_SCRAM, 0, users=None))
    assert users.error_code == CAF
    altered = await alice.request(
        request(ALTER_SCRAM, 0, deletions=[{"name": "bob", "mechanism": 1}], upsertions=[])
    )
    assert altered.results[0].error_code == CAF
    # The super user may.
    admin = await broker.client("admin")
    created = await admin.request(request(CREATE_ACLS, 3, creations=[creation]))
    assert created.results[0].error_code == E.none
    assert (await admin.request(request(DESCRIBE_ACLS, 3, **acl_filter))).error_code == E.none
    assert (await admin.request(request(DESCRIBE_SCRAM, 0, users=None))).error_code == E.none


# ---------------------------------------------------------------- principals and defaults
async def test_super_user_may_do_everything(broker: AuthzBroker) -> None:
    broker.backend.set_acls(
        acl(T, "*", Op.ALL, principal="User:*", permission=AclPermissionType.DENY)
    )
    admin = await broker.client("admin")
    assert produce_codes(await admin.request(produce("orders"))) == {"orders": E.none}
    assert set(metadata_codes(await admin.request(metadata(None)))) == {"orders", "secret"}
    assert commit_codes(await admin.request(commit("g1", "orders"))) == {"orders": E.none}


async def test_allow_everyone_if_no_acl_found(broker: AuthzBroker) -> None:
    broker.backend.set_acls(acl(T, "secret", Op.WRITE, principal="User:bob"), allow_everyone=True)
    alice = await broker.client("alice")
    # No ACL names "orders": allowed; "secret" has one (for bob): refused to alice.
    got = produce_codes(await alice.request(produce("orders", "secret")))
    assert got == {"orders": E.none, "secret": TAF}


async def test_acls_for_other_hosts_do_not_apply(broker: AuthzBroker) -> None:
    broker.backend.set_acls(acl(T, "orders", Op.WRITE, host="10.9.9.9"))
    alice = await broker.client("alice")
    assert produce_codes(await alice.request(produce("orders"))) == {"orders": TAF}
    broker.backend.set_acls(acl(T, "orders", Op.WRITE, host="127.0.0.1"))
    assert produce_codes(await alice.request(produce("orders"))) == {"orders": E.none}


async def test_denials_are_logged_once_per_interval(
    broker: AuthzBroker, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(authz, "DENIALS", authz.DenialLog())
    alice = await broker.client("alice")
    with caplog.at_level(logging.INFO, logger="raftlog.kafka.authorizer"):
        for _ in range(5):
            await alice.request(produce("orders"))
    lines = [r.getMessage() for r in caplog.records if r.name == "raftlog.kafka.authorizer"]
    assert len(lines) == 1, lines
    assert "User:alice" in lines[0] and "WRITE" in lines[0] and "127.0.0.1" in lines[0]
    assert "TOPIC:orders" in lines[0]


def test_denial_log_counts_what_it_held_back() -> None:
    records_seen: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records_seen.append(record.getMessage())

    logger = logging.getLogger("tests.authz.denials")
    logger.addHandler(Capture())
    logger.setLevel(logging.INFO)
    denials = authz.DenialLog(logger, interval_s=0.0, max_keys=2)
    for name in ("a", "b", "c", "a"):
        denials.denied("User:x", "1.2.3.4", Op.READ, T, name, "fetch")
    assert len(records_seen) == 4  # interval 0: every line; the key table stays bounded
    held = authz.DenialLog(logger, interval_s=3600)
    for _ in range(3):
        held.denied("User:x", "1.2.3.4", Op.READ, T, "a", "fetch")
    assert len(records_seen) == 5


# ---------------------------------------------------------------- pure helpers
def test_may_do_on_some_resource_follows_kafka() -> None:
    def may(*bindings: AclBinding, allow_everyone: bool = False) -> bool:
        authorizer = Authorizer(
            bindings, super_users=SUPER_USERS, allow_everyone_if_no_acl_found=allow_everyone
        )
        return authz.may_do_on_some_resource(
            authorizer, bindings, "User:alice", "10.0.0.1", Op.WRITE, T
        )

    deny = AclPermissionType.DENY
    assert not may()
    assert may(allow_everyone=True)
    assert may(acl(T, "a", Op.WRITE))
    assert may(acl(T, "a", Op.ALL))
    assert not may(acl(T, "a", Op.READ))
    assert not may(acl(T, "a", Op.WRITE, principal="User:bob"))
    assert not may(acl(T, "a", Op.WRITE, host="10.0.0.2"))
    assert may(acl(T, "a", Op.WRITE, principal="User:*", host="10.0.0.1"))
    assert not may(acl(T, "a", Op.WRITE), acl(T, "a", Op.WRITE, permission=deny))
    assert not may(
        acl(T, "ab", Op.WRITE), acl(T, "a", Op.WRITE, permission=deny, pattern=PatternType.PREFIXED)
    )
    assert may(
        acl(T, "ab", Op.WRITE, pattern=PatternType.PREFIXED),
        acl(T, "abc", Op.WRITE, permission=deny, pattern=PatternType.PREFIXED),
    )
    assert not may(acl(T, "a", Op.WRITE), acl(T, "*", Op.WRITE, permission=deny))


def test_has_transactional_batch() -> None:
    plain, txn = records(), records(transactional=True)
    assert not authz.has_transactional_batch(plain)
    assert authz.has_transactional_batch(txn)
    assert authz.has_transactional_batch(plain + txn)
    assert not authz.has_transactional_batch(b"")
    assert not authz.has_transactional_batch(b"\x00" * 30)


# ---------------------------------------------------------------- off, and the node's wiring
async def test_without_an_authorizer_everything_is_allowed_as_before(broker: AuthzBroker) -> None:
    broker.backend.authorizer = None
    alice = await broker.client("alice")
    assert produce_codes(await alice.request(produce("orders", "secret"))) == {
        "orders": E.none,
        "secret": E.none,
    }
    got = await alice.request(metadata(None, ops=True))
    assert {t.name for t in got.topics} == {"orders", "secret"}
    # KIP-430 fields: without an authorizer every operation of the resource type, as Kafka.
    assert {t.topic_authorized_operations for t in got.topics} == {
        operations_bitfield(SUPPORTED_OPERATIONS[ResourceType.TOPIC])
    }
    assert got.cluster_authorized_operations == operations_bitfield(
        SUPPORTED_OPERATIONS[ResourceType.CLUSTER]
    )
    assert commit_codes(await alice.request(commit("g1", "orders"))) == {"orders": E.none}


class _Metadata:
    """The parts of MetadataService the broker backend uses for its authorizer."""

    def __init__(self) -> None:
        self.image = MetadataImage()
        self.listeners: list[Any] = []

    def add_listener(self, listener: Any) -> None:
        self.listeners.append(listener)
        listener(self.image, None)

    def publish(self, image: MetadataImage) -> None:
        self.image = image
        for listener in self.listeners:
            listener(image, None)


def _broker_backend(config: NodeConfig, metadata: _Metadata) -> BrokerBackend:
    paths = SimpleNamespace(
        produce=None, fetch=None, list_offset=None, offset_for_leader_epoch=None
    )
    replicas = SimpleNamespace(
        writes=paths,
        reads=paths,
        replicas=SimpleNamespace(data_event=None),
        unsafe_partitions=lambda: (),
    )
    return BrokerBackend(config, metadata, None, None, replicas)  # type: ignore[arg-type]


def test_broker_backend_builds_its_authorizer_from_the_image() -> None:
    metadata = _Metadata()
    assert _broker_backend(NodeConfig(), metadata).authorizer is None  # off: nothing built
    config = NodeConfig(
        authorizer_class_name="StandardAuthorizer",
        super_users="User:admin",
        allow_everyone_if_no_acl_found=True,
    )
    backend = _broker_backend(config, metadata)
    first = backend.authorizer
    assert first is not None and len(first) == 0
    assert first.allow_everyone_if_no_acl_found and first.super_users == {"User:admin"}
    # A change elsewhere in the image keeps the authorizer; a change of the ACLs rebuilds it.
    metadata.publish(dataclasses.replace(metadata.image, cluster_id="other"))
    assert backend.authorizer is first
    binding = acl(T, "orders", Op.WRITE)
    metadata.publish(dataclasses.replace(metadata.image, acls={uuid.uuid4(): binding}))
    assert backend.authorizer is not first and len(backend.authorizer) == 1
    assert backend.authorizer.authorize("User:alice", "1.2.3.4", Op.WRITE, T, "orders")
