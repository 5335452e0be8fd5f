"""Security with real node processes: named listeners (PLAINTEXT, SSL, SASL_PLAINTEXT,
SASL_SSL) served side by side, SCRAM users created through the Kafka admin API and then used
by stock clients, and the internal listener under mutual TLS refusing processes that are not
the node they claim to be.

Every node keeps its PLAINTEXT listener at client_listener, so the harness watches readiness
as usual; the secured listeners get ports of their own.
"""

from __future__ import annotations

import base64
import dataclasses
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from raftlog.security import certs, scram, tls
from raftlog.security.acl import ScramMechanism as ScramMechanismCode
from raftlog.testing.cluster import ProcessCluster, free_ports
from tests.net.test_tls_certs import PemFiles, issue, write_ca

pytestmark = pytest.mark.cluster

SECURE_OVERRIDES: dict[str, Any] = {
    "sasl_enabled_mechanisms": "PLAIN,SCRAM-SHA-512",
    "ssl_client_auth": "requested",
    "internal_security_protocol": "SSL",
}
CLIENT_DEADLINE_S = 30.0
KIND_REQUEST = 1


@dataclasses.dataclass
class SecureCluster:
    cluster: ProcessCluster
    ca: str
    node_files: dict[int, PemFiles]
    ports: dict[int, dict[str, int]]  # node id -> listener name -> port
    pki_dir: Path
    ca_authority: certs.CertificateAuthority

    def bootstrap(self, listener: str) -> str:
        return ",".join(f"127.0.0.1:{p[listener]}" for p in self.ports.values())

    def node_log(self, node_id: int) -> str:
        return self.cluster.nodes[node_id].log_path.read_text(errors="replace")


def start_secure_cluster(
    root: Path, size: int, extra_overrides: dict[str, Any] | None = None
) -> SecureCluster:
    pki_dir = root / "pki"
    ca, ca_path = write_ca(pki_dir)
    node_files = {i: issue(pki_dir, ca, ca_path, f"node-{i}") for i in range(1, size + 1)}
    files = node_files[1]
    cluster = ProcessCluster(
        root / "cluster",
        size,
        overrides={
            **SECURE_OVERRIDES,
            **(extra_overrides or {}),
            "ssl_certificate_location": files.cert,
            "ssl_key_location": files.key,
            "ssl_ca_location": ca_path,
        },
    )
    extra = free_ports(3 * size)
    ports: dict[int, dict[str, int]] = {}
    for index, (node_id, node) in enumerate(sorted(cluster.nodes.items())):
        plaintext_port = int(node.config.client_listener.rsplit(":", 1)[1])
        ssl_port, sasl_port, sasl_ssl_port = extra[3 * index : 3 * index + 3]
        ports[node_id] = {
            "PLAINTEXT": plaintext_port,
            "SSL": ssl_port,
            "SASL_PLAINTEXT": sasl_port,
            "SASL_SSL": sasl_ssl_port,
        }
        config = dataclasses.replace(
            node.config,
            listeners=",".join(
                f"{name}://127.0.0.1:{port}" for name, port in ports[node_id].items()
            ),
            ssl_certificate_location=node_files[node_id].cert,
            ssl_key_location=node_files[node_id].key,
        )
        config.validate(str(node.config_path))
        node.config = config
        node.config_path.write_text(config.to_toml())
    return SecureCluster(cluster, ca_path, node_files, ports, pki_dir, ca)


def _create_user(secure: SecureCluster, user: str, password: str) -> None:
    admin = AdminClient({"bootstrap.servers": secure.bootstrap("PLAINTEXT")})
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
    )
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(CLIENT_DEADLINE_S)


def _round_trip(
    config: dict[str, Any], topic: str, count: int = 10, start_offset: int = 0
) -> list[bytes]:
    """Produce `count` new records (acks=all) and read them back from start_offset, where
    the caller knows they land."""
    producer = Producer({**config, "acks": "all"})
    tag = time.monotonic_ns()
    sent = [f"{topic}-{tag}-{i}".encode() for i in range(count)]
    for value in sent:
        producer.produce(topic, value=value)
    assert producer.flush(CLIENT_DEADLINE_S) == 0
    consumer = Consumer({**config, "group.id": f"g-{tag}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, start_offset)])
    got: list[bytes] = []
    deadline = time.monotonic() + CLIENT_DEADLINE_S
    while len(got) < count and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is None:
            continue
        assert message.error() is None, message.error()
        got.append(message.value())
    consumer.close()
    assert got == sent
    return got


def _bootstrap_entry(user: str, password: str) -> str:
    """kafka-storage format --add-scram's syntax, salted here as a client would."""
    salt = b"bootstrap-salt-of-32-bytes-long!"
    salted = scram.salted_password(ScramMechanismCode.SCRAM_SHA_512, password, salt, 4096)
    return (
        f'SCRAM-SHA-512=[name={user},iterations=4096,salt="{base64.b64encode(salt).decode()}",'
        f'saltedpassword="{base64.b64encode(salted).decode()}"]'
    )


def test_one_node_serves_every_listener_with_its_security(tmp_path: Path) -> None:
    bootstrap = {"bootstrap_scram_credentials": _bootstrap_entry("admin", "admin-secret")}
    secure = start_secure_cluster(tmp_path, 1, bootstrap)
    with secure.cluster:
        _create_user(secure, "alice", "alice-secret")
        ssl_client = {"security.protocol": "SSL", "ssl.ca.location": secure.ca}
        # Metadata on each listener names that listener's endpoint.
        for listener, extra in [("SSL", ssl_client), ("PLAINTEXT", {})]:
            admin = AdminClient({"bootstrap.servers": secure.bootstrap(listener), **extra})
            brokers = admin.list_topics(timeout=CLIENT_DEADLINE_S).brokers
            assert [b.port for b in brokers.values()] == [secure.ports[1][listener]]
        admin = AdminClient({"bootstrap.servers": secure.bootstrap("PLAINTEXT")})
        admin.create_topics([NewTopic("secure", 1, 1)])["secure"].result(CLIENT_DEADLINE_S)

        ssl_bootstrap = {"bootstrap.servers": secure.bootstrap("SSL"), **ssl_client}
        _round_trip(ssl_bootstrap, "secure")
        scram = {
            "bootstrap.servers": secure.bootstrap("SASL_SSL"),
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": secure.ca,
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": "alice-secret",
        }
        _round_trip(scram, "secure", start_offset=10)
        # The user seeded by bootstrap_scram_credentials logs in too.
        admin_login = {**scram, "sasl.username": "admin", "sasl.password": "admin-secret"}
        listed = AdminClient(admin_login).list_topics(timeout=CLIENT_DEADLINE_S)
        assert "secure" in listed.topics
        plain = {
            "bootstrap.servers": secure.bootstrap("SASL_PLAINTEXT"),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": "alice-secret",
        }
        _round_trip(plain, "secure", start_offset=20)

        # A wrong password is refused at once, not after a timeout.
        errors: list[KafkaError] = []
        producer = Producer({**scram, "sasl.password": "wrong", "error_cb": errors.append})
        deadline = time.monotonic() + 10
        while not errors and time.monotonic() < deadline:
            producer.poll(0.1)
        assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors

        # A plaintext client on the TLS port: one log line, and the node keeps serving.
        with socket.create_connection(("127.0.0.1", secure.ports[1]["SSL"]), timeout=5) as sock:
            client_port = sock.getsockname()[1]
            sock.sendall(b"\x00\x00\x00\x0a" + b"\x00" * 10)
            while sock.recv(4096):
                pass
        # This connection's line only: a client closed by the test while its own handshake
        # was under way logs one too.
        line = f"raftlog.kafka: SSL listener: TLS handshake with 127.0.0.1:{client_port} failed"
        secure.cluster.wait_for(lambda: line in secure.node_log(1), "the log line")
        assert secure.node_log(1).count(line) == 1
        assert "Traceback" not in secure.node_log(1)
        _round_trip(ssl_bootstrap, "secure", start_offset=30)


def _tls_socket(secure: SecureCluster, port: int, files: PemFiles | None) -> ssl.SSLSocket:
    context = tls.client_context(
        cafile=secure.ca,
        certfile=files.cert if files else None,
        keyfile=files.key if files else None,
        check_hostname=False,
    )
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    return context.wrap_socket(raw)


def _frame(sender_id: int, method: str, body: Any) -> bytes:
    payload = msgpack.packb([KIND_REQUEST, 1, sender_id, method, body])
    return len(payload).to_bytes(4, "big") + payload


def _closed_without_answer(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except (ConnectionError, ssl.SSLError):
        return True


def test_internal_mutual_tls_refuses_processes_that_are_not_the_node(tmp_path: Path) -> None:
    secure = start_secure_cluster(tmp_path, 3)
    with secure.cluster:  # ready: votes, registrations and heartbeats went over mutual TLS
        admin = AdminClient({"bootstrap.servers": secure.bootstrap("PLAINTEXT")})
        admin.create_topics([NewTopic("replicated", 1, 3, config={"min.insync.replicas": "3"})])[
            "replicated"
        ].result(CLIENT_DEADLINE_S)
        # acks=all with min.insync.replicas=3: every follower fetched over mutual TLS.
        _round_trip({"bootstrap.servers": secure.bootstrap("PLAINTEXT")}, "replicated")

        internal_port = int(secure.cluster.nodes[1].config.internal_listener.rsplit(":", 1)[1])
        # A rogue process speaking plaintext msgpack.
        with socket.create_connection(("127.0.0.1", internal_port), timeout=5) as sock:
            sock.sendall(_frame(2, "raft", None))
            assert _closed_without_answer(sock)
        # A process holding node 3's certificate that sends a replica fetch as node 2.
        with _tls_socket(secure, internal_port, secure.node_files[3]) as sock:
            sock.sendall(_frame(2, "replica.fetch", {"replica_id": 2}))
            assert _closed_without_answer(sock)
        # A certificate from the cluster CA naming no node.
        user = issue(secure.pki_dir, secure.ca_authority, secure.ca, "alice")
        with _tls_socket(secure, internal_port, user) as sock:
            sock.sendall(_frame(2, "raft", None))
            assert _closed_without_answer(sock)
        log = secure.node_log(1)
        secure.cluster.wait_for(
            lambda: "it speaks for node 3, a replica.fetch names node 2" in secure.node_log(1),
            "the forged id's log line",
        )
        assert "internal listener: TLS handshake with" in log
        assert "names no node" in secure.node_log(1)
        # The cluster is unharmed.
        _round_trip(
            {"bootstrap.servers": secure.bootstrap("PLAINTEXT")}, "replicated", start_offset=10
        )
