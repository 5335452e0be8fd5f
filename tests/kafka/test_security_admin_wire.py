"""The ACL and SCRAM credential APIs on the wire, every version registered: requests built
with kio, a backend whose writes go through a real (sans-IO) controller."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from kio.schema.errors import ErrorCode

from raftlog.broker import scram_descriptions
from raftlog.config import NodeConfig
from raftlog.errors import KafkaError
from raftlog.metadata.controller import messages as cm
from raftlog.metadata.controller.acls import check_filter
from raftlog.metadata.controller.controller import Controller
from raftlog.metadata.image import MetadataImage
from raftlog.net.kafka.apis import ApiRegistry, default_registry
from raftlog.net.kafka.backend import (
    AclCreateResult,
    AclDeleteResult,
    ScramAlterResult,
    ScramUserDescription,
)
from raftlog.net.kafka.codec import build, request_class
from raftlog.net.kafka.handlers_security import HANDLERS, register
from raftlog.net.kafka.server import serve
from raftlog.security.acl import AclBinding, AclBindingFilter, ScramMechanism
from raftlog.security.scram import verify_password
from tests.kafka.memory_backend import MemoryBackend
from tests.kafka.wire import WireClient

KEYS = {"create_acls": 30, "describe_acls": 29, "delete_acls": 31}
ACL_VERSIONS = [1, 2, 3]
SALT = bytes(range(24))


class ControllerBackend(MemoryBackend):
    """MemoryBackend plus the security operations, served by a controller of its own."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.controller = Controller(MetadataImage.empty("cid"), NodeConfig(), now_ms=0)

    async def create_acls(self, creations: Sequence[AclBinding]) -> Sequence[AclCreateResult]:
        reply = self.controller.handle(cm.CreateAcls(tuple(creations)), 0).reply
        return [AclCreateResult(r.error_code, r.error_message) for r in reply.results]

    async def describe_acls(self, acl_filter: AclBindingFilter) -> Sequence[AclBinding]:
        message = check_filter(acl_filter)
        if message is not None:
            raise KafkaError(ErrorCode.invalid_request, message)
        return [b for b in self.controller.image.acls.values() if acl_filter.matches(b)]

    async def delete_acls(self, filters: Sequence[AclBindingFilter]) -> Sequence[AclDeleteResult]:
        reply = self.controller.handle(cm.DeleteAcls(tuple(filters)), 0).reply
        return [AclDeleteResult(r.error_code, r.error_message, r.matching) for r in reply.results]

    async def describe_user_scram_credentials(
        self, users: Sequence[str] | None
    ) -> Sequence[ScramUserDescription]:
        return scram_descriptions(self.controller.image, users)

    async def alter_user_scram_credentials(
        self,
        deletions: Sequence[cm.ScramCredentialDeletion],
        upsertions: Sequence[cm.ScramCredentialUpsertion],
    ) -> Sequence[ScramAlterResult]:
        request = cm.AlterUserScramCredentials(tuple(deletions), tuple(upsertions))
        reply = self.controller.handle(request, 0).reply
        return [ScramAlterResult(r.user, r.error_code, r.error_message) for r in reply.results]


@pytest.fixture
async def client(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[WireClient]:
    registry: ApiRegistry = default_registry()
    register(registry)
    backend = ControllerBackend(tmp_path)
    listeners = await nursery.start(
        functools.partial(serve, backend, "127.0.0.1", 0, NodeConfig(), registry=registry)
    )
    backend.port = listeners[0].socket.getsockname()[1]
    wire = await WireClient.connect(backend.port)
    yield wire
    await wire.aclose()
    backend.close()


def request(name: str, version: int, **fields: Any) -> Any:
    key = KEYS.get(name) or {"describe_user_scram_credentials": 50}.get(name, 51)
    return build(request_class(key, version), fields)


def creation(resource_type: int = 2, name: str = "orders", **kw: Any) -> dict[str, Any]:
    return {
        "resource_type": resource_type,
        "resource_name": name,
        "resource_pattern_type": kw.get("pattern", 3),
        "principal": kw.get("principal", "User:alice"),
        "host": "*",
        "operation": kw.get("operation", 3),
        "permission_type": 3,
    }


def acl_filter(**kw: Any) -> dict[str, Any]:
    return {
        "resource_type_filter": kw.get("resource_type", 1),
        "resource_name_filter": kw.get("name"),
        "pattern_type_filter": kw.get("pattern", 1),
        "principal_filter": kw.get("principal"),
        "host_filter": None,
        "operation": kw.get("operation", 1),
        "permission_type": 1,
    }


def test_the_registered_versions() -> None:
    assert {name: (lo, hi) for name, (lo, hi, _) in HANDLERS.items()} == {
        "create_acls": (1, 3),
        "describe_acls": (1, 3),
        "delete_acls": (1, 3),
        "describe_user_scram_credentials": (0, 0),
        "alter_user_scram_credentials": (0, 0),
    }


@pytest.mark.parametrize("version", ACL_VERSIONS)
async def test_acl_apis_every_version(client: WireClient, version: int) -> None:
    created = await client.request(
        request(
            "create_acls",
            version,
            creations=[
                creation(),
                creation(operation=4),
                creation(3, "app-", pattern=4, principal="User:bob"),
                creation(99),  # a resource type Kafka does not know
                creation(1),  # ANY cannot be stored
                creation(pattern=2),  # nor MATCH
            ],
        )
    )
    assert [r.error_code for r in created.results] == [ErrorCode.none] * 3 + [
        ErrorCode.invalid_request
    ] * 3
    assert created.results[3].error_message

    described = await client.request(request("describe_acls", version, **acl_filter()))
    assert described.error_code == ErrorCode.none
    # Grouped by resource pattern, as Kafka answers.
    assert [
        (
            r.resource_type,
            r.resource_name,
            r.pattern_type,
            [(a.principal, a.operation) for a in r.acls],
        )
        for r in described.resources
    ] == [
        (2, "orders", 3, [("User:alice", 3), ("User:alice", 4)]),
        (3, "app-", 4, [("User:bob", 3)]),
    ]
    match = await client.request(
        request("describe_acls", version, **acl_filter(resource_type=3, name="app-1", pattern=2))
    )
    assert [r.resource_name for r in match.resources] == ["app-"]
    bad = await client.request(request("describe_acls", version, **acl_filter(pattern=0)))
    assert bad.error_code == ErrorCode.invalid_request and bad.resources == ()

    deleted = await client.request(
        request(
            "delete_acls",
            version,
            filters=[acl_filter(resource_type=2, operation=3), acl_filter(operation=77)],
        )
    )
    first, second = deleted.filter_results
    assert first.error_code == ErrorCode.none
    assert [(m.resource_name, m.operation) for m in first.matching_acls] == [("orders", 3)]
    assert second.error_code == ErrorCode.invalid_request  # operation 77 is UNKNOWN
    left = await client.request(request("describe_acls", version, **acl_filter()))
    assert sum(len(r.acls) for r in left.resources) == 2


async def test_scram_apis(client: WireClient) -> None:
    salted = hashlib.pbkdf2_hmac("sha256", b"pw", SALT, 4096)

    def upsertion(name: str, mechanism: int = 1, iterations: int = 4096) -> dict[str, Any]:
        return {
            "name": name,
            "mechanism": mechanism,
            "iterations": iterations,
            "salt": SALT,
            "salted_password": salted,
        }

    altered = await client.request(
        request(
            "alter_user_scram_credentials",
            0,
            deletions=[{"name": "nobody", "mechanism": 1}],
            upsertions=[upsertion("alice"), upsertion("bob", 5), upsertion("carol", 1, 100)],
        )
    )
    assert [(r.user, r.error_code) for r in altered.results] == [
        ("nobody", ErrorCode.resource_not_found),
        ("alice", ErrorCode.none),
        ("bob", ErrorCode.unsupported_sasl_mechanism),
        ("carol", ErrorCode.unacceptable_credential),
    ]
    described = await client.request(request("describe_user_scram_credentials", 0, users=None))
    assert described.error_code == ErrorCode.none
    assert [
        (r.user, [(c.mechanism, c.iterations) for c in r.credential_infos])
        for r in described.results
    ] == [("alice", [(1, 4096)])]
    named = await client.request(
        request(
            "describe_user_scram_credentials",
            0,
            users=[{"name": "alice"}, {"name": "zed"}, {"name": "zed"}],
        )
    )
    assert [(r.user, r.error_code) for r in named.results] == [
        ("alice", ErrorCode.none),
        ("zed", ErrorCode.duplicate_resource),
    ]


async def test_the_stored_credential_logs_in(tmp_path: Path) -> None:
    backend = ControllerBackend(tmp_path)
    salted = hashlib.pbkdf2_hmac("sha512", b"s3cret", SALT, 8192)
    upsertion = cm.ScramCredentialUpsertion("alice", 2, 8192, SALT, salted)
    (result,) = await backend.alter_user_scram_credentials([], [upsertion])
    assert result.error == ErrorCode.none
    credential = backend.controller.image.scram_credentials[("alice", ScramMechanism.SCRAM_SHA_512)]
    assert verify_password(credential, "s3cret")
