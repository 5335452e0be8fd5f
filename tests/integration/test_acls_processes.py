"""ACLs with real node processes and stock clients (confluent-kafka and kafka-python) over
SASL_PLAINTEXT: the authorizer refuses what Kafka refuses, with Kafka's error codes, allows
what an ACL grants (DENY over ALLOW, PREFIXED patterns, a consumer group needing READ on the
group and the topic), hides unauthorized topics from Metadata, lets the super user do
everything, and keeps its ACLs through a controller kill and a restart of the whole cluster
from the same data directories (restarted with allow_everyone_if_no_acl_found=true, which
must then behave as Kafka's does).

One three-node cluster serves the whole story so the test stays short.
"""

from __future__ import annotations

import base64
import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaPythonPartition
from kafka.errors import TopicAuthorizationFailedError

from raftlog.security import scram
from raftlog.security.acl import ScramMechanism as ScramMechanismCode
from raftlog.testing.cluster import ProcessCluster, free_ports

pytestmark = pytest.mark.cluster

CLIENT_DEADLINE_S = 20.0
PASSWORDS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}


def _bootstrap_admin() -> str:
    """The super user, seeded as kafka-storage format --add-scram would."""
    salt = b"acl-test-salt-of-32-bytes-long!!"
    salted = scram.salted_password(ScramMechanismCode.SCRAM_SHA_512, PASSWORDS["admin"], salt, 4096)
    return (
        f'SCRAM-SHA-512=[name=admin,iterations=4096,salt="{base64.b64encode(salt).decode()}",'
        f'saltedpassword="{base64.b64encode(salted).decode()}"]'
    )


def _start(root: Path) -> tuple[ProcessCluster, dict[int, int]]:
    cluster = ProcessCluster(
        root,
        3,
        overrides={
            "sasl_enabled_mechanisms": "PLAIN,SCRAM-SHA-512",
            "authorizer_class_name": "StandardAuthorizer",
            "super_users": "User:admin",
            "bootstrap_scram_credentials": _bootstrap_admin(),
        },
    )
    sasl_ports: dict[int, int] = {}
    for (node_id, node), port in zip(sorted(cluster.nodes.items()), free_ports(3), strict=True):
        sasl_ports[node_id] = port
        plaintext = node.config.client_listener
        config = dataclasses.replace(
            node.config,
            listeners=f"PLAINTEXT://{plaintext},SASL_PLAINTEXT://127.0.0.1:{port}",
        )
        config.validate(str(node.config_path))
        node.config = config
        node.config_path.write_text(config.to_toml())
    return cluster, sasl_ports


def _restart_with(cluster: ProcessCluster, **changes: Any) -> None:
    """Stop every node and start them again from the same data directories."""
    cluster.stop()
    for node in cluster.nodes.values():
        node.config = dataclasses.replace(node.config, **changes)
        node.config_path.write_text(node.config.to_toml())
    cluster.start()
    cluster.wait_ready()


@dataclasses.dataclass
class Clients:
    cluster: ProcessCluster
    ports: dict[int, int]

    def bootstrap(self) -> str:
        return ",".join(
            f"127.0.0.1:{port}"
            for node_id, port in self.ports.items()
            if self.cluster.nodes[node_id].running
        )

    def confluent(self, user: str, mechanism: str = "SCRAM-SHA-512") -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap(),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": PASSWORDS[user],
        }

    def kafka_python(self, user: str) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.bootstrap().split(","),
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": user,
            "sasl_plain_password": PASSWORDS[user],
        }

    def admin(self) -> AdminClient:
        return AdminClient(self.confluent("admin"))

    def produce(self, user: str, topic: str) -> int | None:
        """One record from `user`; None when acknowledged, else the Kafka error code."""
        errors: list[KafkaError] = []
        producer = Producer({**self.confluent(user), "acks": "all", "message.timeout.ms": 10_000})
        producer.produce(
            topic, value=b"v", on_delivery=lambda err, msg: errors.append(err) if err else None
        )
        assert producer.flush(CLIENT_DEADLINE_S) == 0
        return errors[0].code() if errors else None

    def wait_produce(self, user: str, topic: str, expected: int | None) -> None:
        """ACL changes reach every node through the metadata log: wait until they have."""
        self.cluster.wait_for(
            lambda: self.produce(user, topic) == expected,
            f"{user}'s produce to {topic} to answer {expected}",
            CLIENT_DEADLINE_S,
        )


def _acl(
    resource_type: ResourceType,
    name: str,
    principal: str,
    operation: AclOperation,
    permission: AclPermissionType = AclPermissionType.ALLOW,
    pattern: ResourcePatternType = ResourcePatternType.LITERAL,
) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, "*", operation, permission)


def _create_acls(admin: AdminClient, *bindings: AclBinding) -> None:
    for future in admin.create_acls(list(bindings)).values():
        future.result(CLIENT_DEADLINE_S)


def _group_consume(clients: Clients, user: str, group: str, topic: str) -> KafkaError | bytes:
    """Subscribe in `group`; the first record's value or the first error."""
    consumer = Consumer(
        {
            **clients.confluent(user),
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + CLIENT_DEADLINE_S
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                return error
            consumer.commit(message=message, asynchronous=False)
            return message.value() or b""
        raise AssertionError(f"{user} got neither a record nor an error from {topic}")
    finally:
        consumer.close()


def _kafka_python_read_refused(clients: Clients, user: str, topic: str) -> None:
    """kafka-python's consumer: looking up where to read (ListOffsets, after Metadata) is
    refused with TOPIC_AUTHORIZATION_FAILED."""
    consumer = KafkaConsumer(**clients.kafka_python(user), group_id=None)
    try:
        partition = KafkaPythonPartition(topic, 0)
        consumer.assign([partition])
        with pytest.raises(TopicAuthorizationFailedError):
            consumer.position(partition, timeout_ms=int(CLIENT_DEADLINE_S * 1000))
    finally:
        consumer.close()


def test_acls_decide_what_each_user_may_do(tmp_path: Path) -> None:
    cluster, ports = _start(tmp_path / "cluster")
    clients = Clients(cluster, ports)
    with cluster:
        # The seeded super user logs in once the cluster has written it.
        cluster.wait_for(
            lambda: clients.admin().list_topics(timeout=5) is not None,
            "the bootstrap admin to log in",
        )
        admin = clients.admin()
        upserts = [
            UserScramCredentialUpsertion(
                user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
            )
            for user, password in PASSWORDS.items()
            if user != "admin"
        ]
        for future in admin.alter_user_scram_credentials(upserts).values():
            future.result(CLIENT_DEADLINE_S)
        for future in admin.create_topics(
            [NewTopic(name, 1, 3) for name in ("orders", "pay-1", "secret", "free")]
        ).values():
            future.result(CLIENT_DEADLINE_S)

        # No ACL: produce and consume are refused with TOPIC_AUTHORIZATION_FAILED.
        assert clients.produce("alice", "orders") == KafkaError.TOPIC_AUTHORIZATION_FAILED
        _kafka_python_read_refused(clients, "alice", "orders")
        # The refusal is in the authorizer log, as Kafka's authorizer logs it (the client's
        # Metadata request met it first).
        denied = (
            "Principal = User:alice is Denied Operation = DESCRIBE from host = 127.0.0.1 "
            "on resource = TOPIC:orders"
        )

        def logged() -> bool:
            return any(
                denied in n.log_path.read_text(errors="replace") for n in cluster.nodes.values()
            )

        cluster.wait_for(logged, "the refusal's log line")

        # ALLOW WRITE lets alice produce; a PREFIXED ALLOW covers pay-1.
        _create_acls(
            admin,
            _acl(ResourceType.TOPIC, "orders", "User:alice", AclOperation.WRITE),
            _acl(ResourceType.TOPIC, "orders", "User:alice", AclOperation.READ),
            _acl(
                ResourceType.TOPIC,
                "pay-",
                "User:alice",
                AclOperation.WRITE,
                pattern=ResourcePatternType.PREFIXED,
            ),
        )
        clients.wait_produce("alice", "orders", None)
        clients.wait_produce("alice", "pay-1", None)
        assert clients.produce("alice", "secret") == KafkaError.TOPIC_AUTHORIZATION_FAILED

        # DENY wins over ALLOW.
        _create_acls(
            admin,
            _acl(
                ResourceType.TOPIC,
                "pay-1",
                "User:alice",
                AclOperation.WRITE,
                AclPermissionType.DENY,
            ),
        )
        clients.wait_produce("alice", "pay-1", KafkaError.TOPIC_AUTHORIZATION_FAILED)

        # A consumer group needs READ on the group as well as on the topic.
        refused = _group_consume(clients, "alice", "g1", "orders")
        assert isinstance(refused, KafkaError)
        assert refused.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, refused
        _create_acls(admin, _acl(ResourceType.GROUP, "g1", "User:alice", AclOperation.READ))
        cluster.wait_for(
            lambda: _group_consume(clients, "alice", "g1", "orders") == b"v",
            "alice to consume in g1",
            CLIENT_DEADLINE_S,
        )

        # Metadata lists only what alice may DESCRIBE (READ/WRITE imply it; DENY WRITE does
        # not take DESCRIBE away); both clients see the same.
        listed = set(AdminClient(clients.confluent("alice")).list_topics(timeout=10).topics)
        assert listed == {"orders", "pay-1"}
        consumer = KafkaConsumer(**clients.kafka_python("alice"))
        assert consumer.topics() == {"orders", "pay-1"}
        consumer.close()

        # The super user may do everything.
        assert clients.produce("admin", "secret") is None
        assert {"orders", "pay-1", "secret", "free"} <= set(admin.list_topics(timeout=10).topics)

        # The ACLs survive the active controller's death...
        controller = cluster.describe()["controller_id"]
        cluster.kill(controller)
        cluster.wait_for(
            lambda: cluster.describe()["controller_id"] not in (controller, -1),
            "a new controller",
        )
        clients.wait_produce("alice", "orders", None)
        assert clients.produce("alice", "secret") == KafkaError.TOPIC_AUTHORIZATION_FAILED
        cluster.start(controller)
        cluster.wait_ready()

        # ...and a restart of every node from its data directory; restarted with
        # allow_everyone_if_no_acl_found=true, a topic no ACL names is open to everyone,
        # and one that some ACL names is not.
        _restart_with(cluster, allow_everyone_if_no_acl_found=True)
        clients.wait_produce("alice", "orders", None)
        assert clients.produce("alice", "pay-1") == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert clients.produce("bob", "free") is None
        assert clients.produce("bob", "orders") == KafkaError.TOPIC_AUTHORIZATION_FAILED
        admin = clients.admin()  # held until its answer is in (a dropped client cancels it)
        listed_acls = admin.describe_acls(
            AclBindingFilter(
                ResourceType.ANY,
                None,
                ResourcePatternType.ANY,
                None,
                None,
                AclOperation.ANY,
                AclPermissionType.ANY,
            )
        )
        assert len(listed_acls.result(CLIENT_DEADLINE_S)) == 5
        for node in cluster.nodes.values():
            assert "Traceback" not in node.log_path.read_text(errors="replace")
