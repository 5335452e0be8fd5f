"""ACL and SCRAM credential admin APIs with a stock client (confluent-kafka's AdminClient)
against three in-process nodes: the changes reach every node's image, survive the active
controller's death and a restart, and the restarted node has them too."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import trio
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

import raftlog.node
from raftlog.errors import ErrorCode
from raftlog.metadata.controller import messages as cm
from raftlog.net.kafka import handlers_security
from raftlog.net.kafka.apis import ApiRegistry, default_registry
from raftlog.security import acl
from raftlog.security.scram import verify_password
from tests.metadata.test_node_quorum import Cluster, make_configs
from tests.waiting import wait_until

CLIENT_TIMEOUT_S = 20.0

READ_ORDERS = AclBinding(
    ResourceType.TOPIC,
    "orders",
    ResourcePatternType.LITERAL,
    "User:alice",
    "*",
    AclOperation.READ,
    AclPermissionType.ALLOW,
)
WRITE_PREFIXED = AclBinding(
    ResourceType.TOPIC,
    "pay-",
    ResourcePatternType.PREFIXED,
    "User:bob",
    "*",
    AclOperation.WRITE,
    AclPermissionType.ALLOW,
)
DENY_GROUP = AclBinding(
    ResourceType.GROUP,
    "g1",
    ResourcePatternType.LITERAL,
    "User:mallory",
    "10.0.0.9",
    AclOperation.READ,
    AclPermissionType.DENY,
)
EVERYTHING = AclBindingFilter(
    ResourceType.ANY,
    None,
    ResourcePatternType.ANY,
    None,
    None,
    AclOperation.ANY,
    AclPermissionType.ANY,
)


def _ours(binding: AclBinding) -> acl.AclBinding:
    """confluent-kafka's binding as raftlog's (the enums share Kafka's codes)."""
    return acl.AclBinding(
        acl.ResourceType(binding.restype.value),
        binding.name,
        acl.PatternType(binding.resource_pattern_type.value),
        binding.principal,
        binding.host,
        acl.AclOperation(binding.operation.value),
        acl.AclPermissionType(binding.permission_type.value),
    )


def _registry_with_security() -> ApiRegistry:
    registry = default_registry()
    handlers_security.register(registry)
    return registry


async def _call(admin: AdminClient, method: str, *args: Any) -> Any:
    """Run one AdminClient call in a thread and wait for its future(s)."""

    def run() -> Any:
        futures = getattr(admin, method)(*args, request_timeout=CLIENT_TIMEOUT_S)
        if isinstance(futures, dict):
            return {key: future.result(CLIENT_TIMEOUT_S) for key, future in futures.items()}
        if isinstance(futures, list):
            return [future.result(CLIENT_TIMEOUT_S) for future in futures]
        return futures.result(CLIENT_TIMEOUT_S)

    return await trio.to_thread.run_sync(run)


def _admin(config: Any) -> AdminClient:
    return AdminClient({"bootstrap.servers": config.client_listener})


def _images_agree(cluster: Cluster, acls: set[acl.AclBinding], users: set[str]) -> bool:
    for node in cluster.nodes.values():
        image = node.metadata.image
        if set(image.acls.values()) != acls:
            return False
        if {user for user, _ in image.scram_credentials} != users:
            return False
    return True


@pytest.fixture
def security_apis(monkeypatch: pytest.MonkeyPatch) -> None:
    # The node builds its registry with default_registry(); these tests add the security APIs
    # to it, as the node will once it registers them itself.
    monkeypatch.setattr(raftlog.node, "default_registry", _registry_with_security)


async def test_acls_and_scram_users_on_every_node_through_failover_and_restart(
    tmp_path: Any, security_apis: None
) -> None:
    configs = make_configs(tmp_path)
    async with trio.open_nursery() as nursery:
        cluster = Cluster(nursery, configs)
        leader = await cluster.start_all()
        admin = _admin(configs[0])

        created = await _call(admin, "create_acls", [READ_ORDERS, WRITE_PREFIXED, DENY_GROUP])
        assert set(created) == {READ_ORDERS, WRITE_PREFIXED, DENY_GROUP}
        # Creating one again succeeds and changes nothing (Kafka's behaviour).
        await _call(admin, "create_acls", [READ_ORDERS])

        upserts = [
            UserScramCredentialUpsertion(
                "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"alice-secret"
            ),
            UserScramCredentialUpsertion(
                "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"alice-512"
            ),
            UserScramCredentialUpsertion(
                "bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"bob-secret"
            ),
        ]
        altered = await _call(admin, "alter_user_scram_credentials", upserts)
        assert set(altered) == {"alice", "bob"}, altered

        ours = {_ours(b) for b in (READ_ORDERS, WRITE_PREFIXED, DENY_GROUP)}
        await wait_until(
            "ACLs and users in every node's image",
            lambda: _images_agree(cluster, ours, {"alice", "bob"}),
            wake=cluster.any_change,
        )
        for node in cluster.nodes.values():
            credential = node.backend.scram_credential("alice", acl.ScramMechanism.SCRAM_SHA_512)
            assert credential is not None and credential.iterations == 8192
            assert verify_password(credential, "alice-512")
            assert set(node.backend.acl_bindings()) == ours

        # A broker that is not the controller forwards the writes over the internal listener
        # and answers once its own image has them.
        follower = next(n for n in cluster.nodes.values() if n is not leader)
        extra = acl.AclBinding(
            acl.ResourceType.CLUSTER,
            acl.CLUSTER_RESOURCE_NAME,
            acl.PatternType.LITERAL,
            "User:admin",
            "*",
            acl.AclOperation.ALTER,
            acl.AclPermissionType.ALLOW,
        )
        (created_here,) = await follower.backend.create_acls([extra])
        assert created_here.error == ErrorCode.none, created_here
        assert extra in set(follower.backend.acl_bindings())
        (deleted_here,) = await follower.backend.delete_acls(
            [acl.AclBindingFilter(principal="User:admin")]
        )
        assert list(deleted_here.matching) == [extra]
        assert extra not in set(follower.backend.acl_bindings())
        (refused,) = await follower.backend.alter_user_scram_credentials(
            [cm.ScramCredentialDeletion("carol", 1)], []
        )
        assert refused.error == ErrorCode.resource_not_found

        # Reads are served by each node from its own image.
        for config in configs:
            each = _admin(config)
            described = await _call(each, "describe_acls", EVERYTHING)
            assert set(described) == {READ_ORDERS, WRITE_PREFIXED, DENY_GROUP}
            users = await _call(each, "describe_user_scram_credentials")
            assert {
                user: sorted((i.mechanism, i.iterations) for i in d.scram_credential_infos)
                for user, d in users.items()
            } == {
                "alice": [
                    (ScramMechanism.SCRAM_SHA_256, 4096),
                    (ScramMechanism.SCRAM_SHA_512, 8192),
                ],
                "bob": [(ScramMechanism.SCRAM_SHA_256, 4096)],
            }
        # A named unknown user fails alone (RESOURCE_NOT_FOUND).
        named = admin.describe_user_scram_credentials(["bob", "nobody"])
        bob = await trio.to_thread.run_sync(
            functools.partial(named["bob"].result, CLIENT_TIMEOUT_S)
        )
        assert bob.user == "bob"
        with pytest.raises(KafkaException, match="RESOURCE_NOT_FOUND"):
            await trio.to_thread.run_sync(
                functools.partial(named["nobody"].result, CLIENT_TIMEOUT_S)
            )

        # The active controller dies: nothing is lost, and writes go on with its successor.
        killed = leader.config.node_id
        cluster.kill(killed)
        survivor_config = next(c for c in configs if c.node_id != killed)
        admin = _admin(survivor_config)
        await cluster.controller()
        described = await _call(admin, "describe_acls", EVERYTHING)
        assert set(described) == {READ_ORDERS, WRITE_PREFIXED, DENY_GROUP}

        deleted = await _call(
            admin,
            "delete_acls",
            [
                AclBindingFilter(
                    ResourceType.TOPIC,
                    None,
                    ResourcePatternType.ANY,
                    None,
                    None,
                    AclOperation.ANY,
                    AclPermissionType.ANY,
                )
            ],
        )
        ((_filter, matched),) = deleted.items()
        assert set(matched) == {READ_ORDERS, WRITE_PREFIXED}
        await _call(
            admin,
            "alter_user_scram_credentials",
            [UserScramCredentialDeletion("bob", ScramMechanism.SCRAM_SHA_256)],
        )
        with pytest.raises(KafkaException):  # deleting it again: RESOURCE_NOT_FOUND
            await _call(
                admin,
                "alter_user_scram_credentials",
                [UserScramCredentialDeletion("bob", ScramMechanism.SCRAM_SHA_256)],
            )

        # The killed node comes back and catches up: the same ACLs and users as the others.
        await cluster.start(killed)
        await wait_until(
            "the restarted node has the changes made while it was down",
            lambda: _images_agree(cluster, {_ours(DENY_GROUP)}, {"alice"}),
            wake=cluster.any_change,
        )
        described = await _call(_admin(configs[killed - 1]), "describe_acls", EVERYTHING)
        assert described == [DENY_GROUP]
        nursery.cancel_scope.cancel()
