"""The four stock clients (confluent-kafka, kafka-python, aiokafka, kcat) over every security
protocol against real node processes: each one administers (creates a topic; kcat, which has
no admin commands, reads the cluster's metadata), produces with acks=all, and consumes in a
consumer group (subscribe, commit), over

- SASL_SSL with SCRAM-SHA-512,
- SASL_PLAINTEXT with PLAIN,
- SSL with a client certificate from the cluster's CA (ssl_client_auth = required).

One node serves all four listeners for the whole client matrix (its PLAINTEXT listener is
for the harness and for checking committed offsets). A second, three-node cluster with
mutual TLS between its nodes runs a SASL_SSL consumer group through a partition leader kill.

raftlog applies ssl_client_auth to SASL_SSL listeners as well, so under `required` every TLS
client here presents the client certificate; test_sasl_ssl_needs_no_client_certificate
records where that differs from Kafka.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.integration.test_secure_processes import SecureCluster, start_secure_cluster
from tests.net.test_tls_certs import PemFiles, issue

pytestmark = pytest.mark.cluster

USER, PASSWORD = "alice", "alice-secret"
RECORDS = 10
DEADLINE_S = 30.0
# Group membership settles quickly on loopback; a short session makes a dead member's
# partitions move within seconds.
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 500

PROTOCOLS = ("SASL_SSL-SCRAM-SHA-512", "SASL_PLAINTEXT-PLAIN", "SSL-mutual")
CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka", "kcat")


@dataclass(frozen=True)
class Security:
    """One way to connect, in neutral terms; each client spells it its own way."""

    bootstrap: str
    protocol: str  # SASL_SSL, SASL_PLAINTEXT or SSL
    mechanism: str | None = None
    username: str | None = None
    password: str | None = None
    ca: str | None = None
    client: PemFiles | None = None  # certificate and key presented to the node

    def librdkafka(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": self.protocol,
        }
        if self.mechanism:
            out |= {
                "sasl.mechanism": self.mechanism,
                "sasl.username": self.username,
                "sasl.password": self.password,
            }
        if self.ca:
            out["ssl.ca.location"] = self.ca
        if self.client:
            out |= {
                "ssl.certificate.location": self.client.cert,
                "ssl.key.location": self.client.key,
            }
        return out

    def kafka_python(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": self.protocol,
        }
        if self.mechanism:
            out |= {
                "sasl_mechanism": self.mechanism,
                "sasl_plain_username": self.username,
                "sasl_plain_password": self.password,
            }
        if self.ca:
            out["ssl_cafile"] = self.ca
        if self.client:
            out |= {"ssl_certfile": self.client.cert, "ssl_keyfile": self.client.key}
        return out

    def aiokafka(self) -> dict[str, Any]:
        from aiokafka.helpers import create_ssl_context

        out: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": self.protocol,
        }
        if self.mechanism:
            out |= {
                "sasl_mechanism": self.mechanism,
                "sasl_plain_username": self.username,
                "sasl_plain_password": self.password,
            }
        if self.ca:
            out["ssl_context"] = create_ssl_context(
                cafile=self.ca,
                certfile=self.client.cert if self.client else None,
                keyfile=self.client.key if self.client else None,
            )
        return out

    def kcat_args(self) -> list[str]:
        args = ["-b", self.bootstrap]
        for key, value in self.librdkafka().items():
            if key != "bootstrap.servers":
                args += ["-X", f"{key}={value}"]
        return args


@dataclass
class Matrix:
    secure: SecureCluster
    client: PemFiles

    def security(self, protocol: str) -> Security:
        if protocol == "SASL_SSL-SCRAM-SHA-512":
            return Security(
                self.secure.bootstrap("SASL_SSL"),
                "SASL_SSL",
                "SCRAM-SHA-512",
                USER,
                PASSWORD,
                self.secure.ca,
                self.client,
            )
        if protocol == "SASL_PLAINTEXT-PLAIN":
            return Security(
                self.secure.bootstrap("SASL_PLAINTEXT"), "SASL_PLAINTEXT", "PLAIN", USER, PASSWORD
            )
        assert protocol == "SSL-mutual"
        return Security(self.secure.bootstrap("SSL"), "SSL", ca=self.secure.ca, client=self.client)

    def committed(self, group: str, topic: str) -> int:
        """The group's committed offset of partition 0, asked over PLAINTEXT."""
        consumer = Consumer(
            {"bootstrap.servers": self.secure.bootstrap("PLAINTEXT"), "group.id": group}
        )
        try:
            (position,) = consumer.committed([TopicPartition(topic, 0)], timeout=DEADLINE_S)
            return int(position.offset)
        finally:
            consumer.close()


def _create_scram_user(bootstrap: str, user: str, password: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
    )
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(DEADLINE_S)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Matrix]:
    root = tmp_path_factory.mktemp("secure-clients")
    secure = start_secure_cluster(root, 1, {"ssl_client_auth": "required"})
    client = issue(secure.pki_dir, secure.ca_authority, secure.ca, "client-alice")
    with secure.cluster:
        # The first SCRAM user, created over the PLAINTEXT listener of the same node.
        _create_scram_user(secure.bootstrap("PLAINTEXT"), USER, PASSWORD)
        yield Matrix(secure, client)


# ------------------------------------------------------------------------ each client


def _values(topic: str) -> list[bytes]:
    return [f"{topic}-{i}".encode() for i in range(RECORDS)]


def _confluent_kafka(security: Security, topic: str, group: str) -> list[bytes]:
    config = security.librdkafka()
    admin = AdminClient(config)  # kept alive until the future resolves
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(DEADLINE_S)
    producer = Producer({**config, "acks": "all", "enable.idempotence": True})
    for value in _values(topic):
        producer.produce(topic, value=value)
    assert producer.flush(DEADLINE_S) == 0
    consumer = Consumer(
        {
            **config,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
        }
    )
    got: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(message.value())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return got


def _kafka_python(security: Security, topic: str, group: str) -> list[bytes]:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic as KNewTopic

    config = security.kafka_python()
    admin = KafkaAdminClient(**config)
    try:
        admin.create_topics([KNewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        admin.close()
    producer = KafkaProducer(**config, acks="all")
    for value in _values(topic):
        producer.send(topic, value=value, partition=0)
    producer.flush(DEADLINE_S)
    producer.close()
    consumer = KafkaConsumer(
        topic,
        **config,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
    )
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < RECORDS and time.monotonic() < deadline:
            for records in consumer.poll(500).values():
                got.extend(r.value for r in records)
        consumer.commit()
    finally:
        consumer.close()
    return got


async def _aiokafka_async(security: Security, topic: str, group: str) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin import NewTopic as ANewTopic

    config = security.aiokafka()
    admin = AIOKafkaAdminClient(**config)
    await admin.start()
    try:
        await admin.create_topics([ANewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(**config, acks="all")
    await producer.start()
    try:
        for value in _values(topic):
            await producer.send_and_wait(topic, value=value, partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic,
        **config,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
    )
    await consumer.start()
    got: list[bytes] = []
    try:
        async with asyncio.timeout(DEADLINE_S):
            while len(got) < RECORDS:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend(r.value for r in records)
        await consumer.commit()
    finally:
        await consumer.stop()
    return got


def _aiokafka(security: Security, topic: str, group: str) -> list[bytes]:
    return asyncio.run(_aiokafka_async(security, topic, group))


def _kcat(security: Security, topic: str, group: str) -> list[bytes]:
    """kcat has no admin commands: the topic is made through the PLAINTEXT listener and kcat
    administers what it can, the metadata listing (-L)."""
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (make sysdeps installs it)")
    args = security.kcat_args()
    producer = subprocess.run(
        ["kcat", "-P", *args, "-t", topic, "-p", "0", "-X", "acks=all"],
        input=b"".join(v + b"\n" for v in _values(topic)),
        capture_output=True,
        timeout=DEADLINE_S,
    )
    assert producer.returncode == 0, producer.stderr.decode()
    listed = subprocess.run(
        ["kcat", "-L", *args, "-t", topic, "-J"], capture_output=True, timeout=DEADLINE_S
    )
    assert listed.returncode == 0, listed.stderr.decode()
    (described,) = json.loads(listed.stdout)["topics"]
    assert (described["topic"], len(described["partitions"])) == (topic, 1)
    # -G: a balanced consumer group member, committing what it consumed; -e: exit at the end.
    consumed = subprocess.run(
        [
            "kcat",
            *args,
            "-G",
            group,
            "-X",
            "auto.offset.reset=earliest",
            "-X",
            f"session.timeout.ms={SESSION_TIMEOUT_MS}",
            "-X",
            "enable.auto.commit=false",
            "-c",
            str(RECORDS),
            "-e",
            topic,
        ],
        capture_output=True,
        timeout=DEADLINE_S,
    )
    assert consumed.returncode == 0, consumed.stderr.decode()
    return consumed.stdout.splitlines()


ROUND_TRIPS: dict[str, Callable[[Security, str, str], list[bytes]]] = {
    "confluent-kafka": _confluent_kafka,
    "kafka-python": _kafka_python,
    "aiokafka": _aiokafka,
    "kcat": _kcat,
}

# kcat 1.7.1 links Debian's librdkafka 2.0.2, which (before 2.6.1, librdkafka PR #4895) puts
# its own nonce in front of the combined nonce in the SCRAM client-final message; raftlog
# accepts a final nonce that ends with the combined one, as Kafka 3.x's ScramSaslServer does,
# so kcat logs in over SCRAM too.
CASES = [
    pytest.param(client, protocol, id=f"{client}-{protocol}")
    for client in CLIENTS
    for protocol in PROTOCOLS
]


@pytest.mark.parametrize(("client", "protocol"), CASES)
def test_stock_client_administers_produces_and_consumes_in_a_group(
    matrix: Matrix, client: str, protocol: str
) -> None:
    name = f"{client}-{protocol}".lower().replace("_", "-")
    topic, group = f"t-{name}", f"g-{name}"
    if client == "kcat":
        # kcat cannot create topics (see _kcat).
        admin = AdminClient({"bootstrap.servers": matrix.secure.bootstrap("PLAINTEXT")})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(DEADLINE_S)
    got = ROUND_TRIPS[client](matrix.security(protocol), topic, group)
    assert got == _values(topic)
    assert matrix.committed(group, topic) == RECORDS


def test_sasl_ssl_needs_no_client_certificate(matrix: Matrix) -> None:
    security = matrix.security("SASL_SSL-SCRAM-SHA-512")
    config = {k: v for k, v in security.librdkafka().items() if "certificate" not in k}
    config = {k: v for k, v in config.items() if k != "ssl.key.location"}
    metadata = AdminClient(config).list_topics(timeout=10)
    assert metadata.brokers


def test_consumer_group_survives_a_leader_kill_under_internal_mutual_tls(
    tmp_path: Path,
) -> None:
    """Three nodes, mutual TLS between them, a SASL_SSL (SCRAM-SHA-512) consumer group on an
    RF 3 topic: the partition leader is killed between two halves of the records, and the
    group reads every record once and commits the end."""
    secure = start_secure_cluster(tmp_path, 3, {"ssl_client_auth": "none"})
    with secure.cluster:
        _create_scram_user(secure.bootstrap("PLAINTEXT"), USER, PASSWORD)
        config = Security(
            secure.bootstrap("SASL_SSL"), "SASL_SSL", "SCRAM-SHA-512", USER, PASSWORD, secure.ca
        ).librdkafka()
        topic, group = "failover", "g-failover"
        admin = AdminClient(config)
        admin.create_topics([NewTopic(topic, 1, 3, config={"min.insync.replicas": "2"})])[
            topic
        ].result(DEADLINE_S)
        producer = Producer({**config, "acks": "all", "enable.idempotence": True})
        consumer = Consumer(
            {
                **config,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        consumer.subscribe([topic])
        sent = [f"failover-{i}".encode() for i in range(2 * RECORDS)]
        got: list[bytes] = []

        def produce(values: list[bytes]) -> None:
            for value in values:
                producer.produce(topic, value=value, partition=0)
            assert producer.flush(DEADLINE_S) == 0

        def consume_until(count: int) -> None:
            deadline = time.monotonic() + DEADLINE_S
            while len(got) < count:
                assert time.monotonic() < deadline, f"consumed {len(got)} of {count}"
                message = consumer.poll(0.5)
                if message is None or message.error() is not None:
                    continue  # a leader change shows up as transient errors
                got.append(message.value())
            consumer.commit(asynchronous=False)

        produce(sent[:RECORDS])
        consume_until(RECORDS)
        described = admin.list_topics(topic, timeout=DEADLINE_S).topics[topic]
        (partition,) = described.partitions.values()
        secure.cluster.kill(partition.leader)
        produce(sent[RECORDS:])
        consume_until(2 * RECORDS)
        consumer.close()
        assert got == sent
        survivors = [n for n in secure.cluster.nodes if n != partition.leader]
        check = Consumer(
            {"bootstrap.servers": f"127.0.0.1:{secure.ports[survivors[0]]['PLAINTEXT']}",
             "group.id": group}
        )  # fmt: skip
        (position,) = check.committed([TopicPartition(topic, 0)], timeout=DEADLINE_S)
        check.close()
        assert position.offset == 2 * RECORDS
