"""SASL on a Kafka listener: the session state machine, the wire exchange, stock clients.

The server runs in-process on loopback with a credential lookup the test passes in (the
SCRAM users a cluster keeps in its metadata reach the listener the same way, through the
backend's `scram_credential`). Stock clients (confluent-kafka, kafka-python) run in threads.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.sasl_authenticate.v0.request import SaslAuthenticateRequest as AuthV0
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest as AuthV2
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode
from raftlog.net.kafka.context import NoQuotas
from raftlog.net.kafka.handlers_sasl import (
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    Admission,
    SaslSession,
    SaslState,
)
from raftlog.net.kafka.server import ListenerSecurity, serve
from raftlog.security import scram
from raftlog.security.acl import ScramCredential, ScramMechanism
from raftlog.security.sasl import PlainClient, ScramClient
from tests.kafka.memory_backend import MemoryBackend
from tests.kafka.wire import WireClient

PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret"}
METADATA_KEY = 3
API_VERSIONS_KEY = 18
CLIENT_DEADLINE_S = 30
METADATA_ALL = MetadataRequest(
    topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
)


def _credentials() -> dict[tuple[str, ScramMechanism], ScramCredential]:
    return {
        (user, mechanism): scram.make_credential(mechanism, password)
        for user, password in PASSWORDS.items()
        for mechanism in scram.MECHANISMS
    }


CREDENTIALS = _credentials()


def lookup(user: str, mechanism: ScramMechanism) -> ScramCredential | None:
    return CREDENTIALS.get((user, mechanism))


class RecordingQuotas(NoQuotas):
    """Remembers the user each request was accounted to (quotas key by connection.user)."""

    def __init__(self) -> None:
        self.users: list[str] = []

    def record_request(self, client_id: str, user: str, handler_time_ms: float) -> int:
        self.users.append(user)
        return 0


@dataclass
class SaslBroker:
    backend: MemoryBackend
    port: int
    quotas: RecordingQuotas

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


async def start_sasl_broker(
    nursery: trio.Nursery,
    data_dir: Path,
    *,
    mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
    reauth_ms: int = 0,
) -> SaslBroker:
    backend = MemoryBackend(data_dir)
    quotas = RecordingQuotas()
    security = ListenerSecurity(
        name="SASL_PLAINTEXT",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanisms=mechanisms,
        credential_lookup=lookup,
        connections_max_reauth_ms=reauth_ms,
    )
    listeners = await nursery.start(
        functools.partial(
            serve, backend, "127.0.0.1", 0, NodeConfig(), quotas=quotas, security=security
        )
    )
    backend.port = listeners[0].socket.getsockname()[1]
    return SaslBroker(backend, backend.port, quotas)


@pytest.fixture
async def sasl_broker(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[SaslBroker]:
    broker = await start_sasl_broker(nursery, tmp_path)
    yield broker
    broker.backend.close()


async def _authenticate(client: WireClient, mechanism: str, exchange: Any) -> Any:
    """Handshake, then SaslAuthenticate v2 rounds until the client is done; the last answer."""
    handshake = await client.request(SaslHandshakeRequest(mechanism=mechanism))
    assert handshake.error_code == ErrorCode.none, handshake
    message: bytes | None = exchange.first_message()
    response = None
    while message is not None:
        response = await client.request(AuthV2(auth_bytes=message))
        if response.error_code != ErrorCode.none:
            return response
        message = exchange.step(response.auth_bytes)
    return response


# ---------------------------------------------------------------- the session, without I/O
def test_session_admits_only_sasl_until_authenticated_and_after_expiry() -> None:
    session = SaslSession(("PLAIN",), lookup, reauth_ms=1000)
    assert session.admit(API_VERSIONS_KEY, 0) is Admission.SERVE
    assert session.admit(METADATA_KEY, 0) is Admission.CLOSE
    assert session.admit(SASL_AUTHENTICATE, 0) is Admission.CLOSE  # no handshake yet
    assert session.admit(SASL_HANDSHAKE, 0) is Admission.SASL
    assert session.handshake(1, "PLAIN").response["error_code"] == ErrorCode.none
    assert session.admit(METADATA_KEY, 0) is Admission.CLOSE  # mid-exchange
    answer = session.authenticate(2, PlainClient("alice", PASSWORDS["alice"]).first_message(), 0)
    assert answer.authenticated_as == "User:alice"
    assert answer.response["session_lifetime"] == 1000
    assert session.admit(METADATA_KEY, 999) is Admission.SERVE
    # KIP-368: once the session is over only a re-authentication may follow.
    assert session.admit(METADATA_KEY, 1000) is Admission.CLOSE
    assert "expired" in session.refusal
    assert session.admit(SASL_HANDSHAKE, 1000) is Admission.SASL
    session.handshake(1, "PLAIN")
    answer = session.authenticate(2, PlainClient("alice", PASSWORDS["alice"]).first_message(), 1500)
    assert answer.authenticated_as == "User:alice" and session.expires_at_ms == 2500
    assert session.admit(METADATA_KEY, 2000) is Admission.SERVE


def test_reauthentication_must_keep_principal_and_mechanism() -> None:
    session = SaslSession(("PLAIN", "SCRAM-SHA-256"), lookup, reauth_ms=1000)
    session.handshake(1, "PLAIN")
    session.authenticate(2, PlainClient("alice", PASSWORDS["alice"]).first_message(), 0)
    session.handshake(1, "PLAIN")
    answer = session.authenticate(2, PlainClient("bob", PASSWORDS["bob"]).first_message(), 10)
    assert answer.close_after
    assert answer.response["error_code"] == ErrorCode.sasl_authentication_failed
    assert answer.response["error_message"] == "Cannot change principals during re-authentication"
    assert session.state is SaslState.FAILED
    assert session.admit(METADATA_KEY, 10) is Admission.CLOSE

    other = SaslSession(("PLAIN", "SCRAM-SHA-256"), lookup, reauth_ms=1000)
    other.handshake(1, "PLAIN")
    other.authenticate(2, PlainClient("alice", PASSWORDS["alice"]).first_message(), 0)
    answer = other.handshake(1, "SCRAM-SHA-256")
    assert answer.close_after and answer.response["error_code"] == ErrorCode.illegal_sasl_state


def test_wrong_password_fails_with_a_message_that_reveals_nothing() -> None:
    for user in ("alice", "nobody"):
        session = SaslSession(("PLAIN",), lookup)
        session.handshake(1, "PLAIN")
        answer = session.authenticate(0, PlainClient(user, "wrong").first_message(), 0)
        assert answer.close_after and answer.authenticated_as is None
        assert answer.response["error_code"] == ErrorCode.sasl_authentication_failed
        assert user not in answer.response["error_message"]


# ---------------------------------------------------------------- the wire
async def test_api_versions_advertises_sasl_and_other_requests_close(
    sasl_broker: SaslBroker, caplog: pytest.LogCaptureFixture
) -> None:
    client = await WireClient.connect(sasl_broker.port)
    versions = await client.request(
        ApiVersionsRequest(client_software_name="t", client_software_version="1")
    )
    table = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
    assert table[SASL_HANDSHAKE] == (0, 1) and table[SASL_AUTHENTICATE] == (0, 2)
    caplog.set_level(logging.INFO, "raftlog.kafka")
    await client.send(METADATA_ALL)
    assert await client.is_closed_by_peer()
    assert "api key 3 before SASL authentication" in caplog.text
    # The listener keeps serving.
    client = await WireClient.connect(sasl_broker.port)
    answer = await _authenticate(client, "PLAIN", PlainClient("bob", PASSWORDS["bob"]))
    assert answer.error_code == ErrorCode.none


async def test_unsupported_mechanism_is_answered_with_the_enabled_list(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    broker = await start_sasl_broker(nursery, tmp_path, mechanisms=("SCRAM-SHA-512",))
    client = await WireClient.connect(broker.port)
    answer = await client.request(SaslHandshakeRequest(mechanism="PLAIN"))
    assert answer.error_code == ErrorCode.unsupported_sasl_mechanism
    assert list(answer.mechanisms) == ["SCRAM-SHA-512"]
    assert await client.is_closed_by_peer()
    broker.backend.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_each_mechanism_authenticates_and_the_user_reaches_quotas(
    sasl_broker: SaslBroker, mechanism: str
) -> None:
    client = await WireClient.connect(sasl_broker.port)
    if mechanism == "PLAIN":
        exchange: Any = PlainClient("alice", PASSWORDS["alice"])
    else:
        exchange = ScramClient(ScramMechanism[mechanism.replace("-", "_")], "alice", "alice-secret")
    answer = await _authenticate(client, mechanism, exchange)
    assert answer.error_code == ErrorCode.none, answer
    assert exchange.complete  # SCRAM: the client checked the server's signature too
    metadata = await client.request(METADATA_ALL)
    assert [b.port for b in metadata.brokers] == [sasl_broker.port]
    assert sasl_broker.quotas.users[-1] == "alice"


async def test_wrong_password_is_answered_promptly_then_closed(
    sasl_broker: SaslBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "raftlog.kafka")
    client = await WireClient.connect(sasl_broker.port)
    with trio.fail_after(5):
        answer = await _authenticate(
            client,
            "SCRAM-SHA-512",
            ScramClient(ScramMechanism.SCRAM_SHA_512, "alice", "not-her-password"),
        )
        assert answer.error_code == ErrorCode.sasl_authentication_failed
        assert answer.error_message and "alice" not in answer.error_message
        assert await client.is_closed_by_peer()
    assert "SASL SCRAM-SHA-512 authentication from" in caplog.text
    # v0 of SaslAuthenticate fails the same way.
    client = await WireClient.connect(sasl_broker.port)
    await client.request(SaslHandshakeRequest(mechanism="PLAIN"))
    answer = await client.request(AuthV0(auth_bytes=b"\x00alice\x00wrong"))
    assert answer.error_code == ErrorCode.sasl_authentication_failed
    assert await client.is_closed_by_peer()


async def test_reauthentication_on_the_wire(nursery: trio.Nursery, tmp_path: Path) -> None:
    broker = await start_sasl_broker(nursery, tmp_path, reauth_ms=60_000)
    client = await WireClient.connect(broker.port)
    answer = await _authenticate(client, "PLAIN", PlainClient("alice", PASSWORDS["alice"]))
    assert answer.session_lifetime.total_seconds() == 60
    # A re-authentication as the same principal keeps the connection serving.
    answer = await _authenticate(client, "PLAIN", PlainClient("alice", PASSWORDS["alice"]))
    assert answer.error_code == ErrorCode.none
    await client.request(METADATA_ALL)
    # As another principal it is refused and the connection closed.
    answer = await _authenticate(client, "PLAIN", PlainClient("bob", PASSWORDS["bob"]))
    assert answer.error_code == ErrorCode.sasl_authentication_failed
    assert await client.is_closed_by_peer()
    broker.backend.close()


# ---------------------------------------------------------------- stock clients
async def _in_thread(fn: Callable[[], Any]) -> Any:
    with trio.fail_after(CLIENT_DEADLINE_S):
        return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
async def test_confluent_kafka_produces_and_consumes_over_sasl(
    sasl_broker: SaslBroker, mechanism: str
) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    common = {
        "bootstrap.servers": sasl_broker.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": "alice",
        "sasl.password": PASSWORDS["alice"],
    }
    topic = f"sasl-{mechanism.lower()}"

    def produce_and_consume() -> list[bytes]:
        producer = confluent_kafka.Producer(common)
        for i in range(5):
            producer.produce(topic, value=f"v{i}".encode())
        assert producer.flush(20) == 0
        consumer = confluent_kafka.Consumer(
            {**common, "group.id": "g", "enable.auto.commit": False}
        )
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        values = []
        while len(values) < 5:
            message = consumer.poll(5)
            assert message is not None, "no record within 5 s"
            assert message.error() is None, message.error()
            values.append(message.value())
        consumer.close()
        return values

    assert await _in_thread(produce_and_consume) == [f"v{i}".encode() for i in range(5)]
    assert "alice" in sasl_broker.quotas.users


async def test_confluent_kafka_wrong_password_fails_fast(sasl_broker: SaslBroker) -> None:
    """librdkafka reports the broker's SASL_AUTHENTICATION_FAILED at once (error_cb), not
    after a request timeout."""
    confluent_kafka = pytest.importorskip("confluent_kafka")

    def first_error() -> Any:
        errors: list[Any] = []
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": sasl_broker.bootstrap,
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "SCRAM-SHA-256",
                "sasl.username": "alice",
                "sasl.password": "wrong",
                "error_cb": errors.append,
            }
        )
        deadline = time.monotonic() + 5
        while not errors and time.monotonic() < deadline:
            producer.poll(0.05)
        return errors[0] if errors else None

    error = await _in_thread(first_error)
    assert error is not None, "no error reported within 5 s"
    assert error.code() == confluent_kafka.KafkaError._AUTHENTICATION, error
    assert "Authentication failed" in error.str()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
async def test_kafka_python_produces_and_consumes_over_sasl(
    sasl_broker: SaslBroker, mechanism: str
) -> None:
    kafka = pytest.importorskip("kafka")
    common = {
        "bootstrap_servers": sasl_broker.bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "bob",
        "sasl_plain_password": PASSWORDS["bob"],
    }
    topic = f"kp-sasl-{mechanism.lower()}"

    def produce_and_consume() -> list[bytes]:
        producer = kafka.KafkaProducer(**common)
        for i in range(5):
            producer.send(topic, f"v{i}".encode()).get(timeout=20)
        producer.close()
        consumer = kafka.KafkaConsumer(**common, consumer_timeout_ms=10_000)
        consumer.assign([kafka.TopicPartition(topic, 0)])
        consumer.seek(kafka.TopicPartition(topic, 0), 0)
        values = [record.value for _, record in zip(range(5), consumer, strict=False)]
        consumer.close()
        return values

    assert await _in_thread(produce_and_consume) == [f"v{i}".encode() for i in range(5)]
    assert "bob" in sasl_broker.quotas.users
