"""TLS on a Kafka listener, in-process on loopback: stock clients over SSL and SASL_SSL,
certificate principals, and peers that fail the handshake (closed with one log line while
the listener keeps serving)."""

from __future__ import annotations

import functools
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from raftlog.config import NodeConfig
from raftlog.net.kafka.server import ListenerSecurity, serve
from raftlog.security import principal, tls
from tests.kafka.memory_backend import MemoryBackend
from tests.kafka.wire import encode_request
from tests.net.test_sasl import PASSWORDS, RecordingQuotas, lookup
from tests.net.test_tls_certs import PemFiles, issue, write_ca
from tests.waiting import wait_until

CLIENT_DEADLINE_S = 30
# Larger than fetch_send's coalescing limit, so the record goes out as a file region, which
# a TLS stream must send as bytes (no sendfile).
LARGE_VALUE = bytes(range(256)) * 1024


@dataclass
class TlsBroker:
    backend: MemoryBackend
    port: int
    quotas: RecordingQuotas
    ca: str
    client: PemFiles  # a client certificate (CN=alice) from the cluster CA
    rogue: PemFiles  # a client certificate (CN=mallory) from another CA

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


async def start_tls_broker(
    nursery: trio.Nursery, tmp_path: Path, *, protocol: str = "SSL", client_auth: str = "requested"
) -> TlsBroker:
    certs_dir = tmp_path / "certs"
    ca, ca_path = write_ca(certs_dir)
    server = issue(certs_dir, ca, ca_path, "broker-1")
    client = issue(certs_dir, ca, ca_path, "alice")
    rogue_ca, _ = write_ca(certs_dir, "rogue-ca")
    rogue = issue(certs_dir, rogue_ca, ca_path, "mallory")
    rules = principal.PrincipalMappingRules.parse(
        "RULE:^CN=([a-z]+)$/$1/,DEFAULT"  # "CN=alice" -> "alice"
    )
    security = ListenerSecurity(
        name=protocol,
        security_protocol=protocol,
        ssl_context=tls.server_context(
            certfile=server.cert, keyfile=server.key, cafile=ca_path, client_auth=client_auth
        ),
        principal_of_certificate=functools.partial(
            principal.principal_from_certificate, rules=rules
        ),
        sasl_mechanisms=("PLAIN", "SCRAM-SHA-512") if protocol == "SASL_SSL" else (),
        credential_lookup=lookup,
        handshake_timeout_ms=2000,
    )
    backend = MemoryBackend(tmp_path)
    quotas = RecordingQuotas()
    listeners = await nursery.start(
        functools.partial(
            serve, backend, "127.0.0.1", 0, NodeConfig(), quotas=quotas, security=security
        )
    )
    backend.port = listeners[0].socket.getsockname()[1]
    return TlsBroker(backend, backend.port, quotas, ca_path, client, rogue)


async def _in_thread(fn: Callable[[], Any]) -> Any:
    with trio.fail_after(CLIENT_DEADLINE_S):
        return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)


def _confluent_round_trip(config: dict[str, Any], topic: str) -> list[bytes]:
    import confluent_kafka

    producer = confluent_kafka.Producer(config)
    values = [b"small", LARGE_VALUE, b"last"]
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(20) == 0
    consumer = confluent_kafka.Consumer({**config, "group.id": "g", "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(got) < len(values) and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is None:
            continue
        assert message.error() is None, message.error()
        got.append(message.value())
    consumer.close()
    return got


async def test_confluent_kafka_over_ssl_with_a_client_certificate(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    pytest.importorskip("confluent_kafka")
    broker = await start_tls_broker(nursery, tmp_path)
    config = {
        "bootstrap.servers": broker.bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": broker.ca,
        "ssl.certificate.location": broker.client.cert,
        "ssl.key.location": broker.client.key,
    }
    got = await _in_thread(functools.partial(_confluent_round_trip, config, "tls-topic"))
    assert got == [b"small", LARGE_VALUE, b"last"]
    # The certificate's mapped name is the connection's user (quotas key by it).
    assert "alice" in broker.quotas.users
    broker.backend.close()


async def test_kafka_python_over_ssl_without_a_client_certificate(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    kafka = pytest.importorskip("kafka")
    broker = await start_tls_broker(nursery, tmp_path)
    common = {
        "bootstrap_servers": broker.bootstrap,
        "security_protocol": "SSL",
        "ssl_cafile": broker.ca,
    }

    def round_trip() -> list[bytes]:
        producer = kafka.KafkaProducer(**common)
        for value in (b"a", LARGE_VALUE):
            producer.send("kp-tls", value).get(timeout=20)
        producer.close()
        consumer = kafka.KafkaConsumer(**common, consumer_timeout_ms=10_000)
        partition = kafka.TopicPartition("kp-tls", 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        values = [record.value for _, record in zip(range(2), consumer, strict=False)]
        consumer.close()
        return values

    assert await _in_thread(round_trip) == [b"a", LARGE_VALUE]
    assert set(broker.quotas.users) == {"ANONYMOUS"}
    broker.backend.close()


async def test_confluent_kafka_over_sasl_ssl_with_scram(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    pytest.importorskip("confluent_kafka")
    broker = await start_tls_broker(nursery, tmp_path, protocol="SASL_SSL", client_auth="none")
    config = {
        "bootstrap.servers": broker.bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": broker.ca,
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "bob",
        "sasl.password": PASSWORDS["bob"],
    }
    got = await _in_thread(functools.partial(_confluent_round_trip, config, "sasl-ssl"))
    assert got == [b"small", LARGE_VALUE, b"last"]
    # ApiVersions before authentication counts as ANONYMOUS; everything after as bob.
    assert "bob" in broker.quotas.users
    broker.backend.close()


def _tls_failure_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "TLS handshake with" in r.getMessage()]


async def test_plaintext_client_on_a_tls_port_is_closed_with_one_line(
    nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "raftlog.kafka")
    broker = await start_tls_broker(nursery, tmp_path)
    from kio.schema.api_versions.v3.request import ApiVersionsRequest

    stream = await trio.open_tcp_stream("127.0.0.1", broker.port)
    await stream.send_all(
        encode_request(ApiVersionsRequest(client_software_name="x", client_software_version="1"), 1)
    )
    with trio.fail_after(5):
        try:
            while await stream.receive_some(65536):
                pass  # a TLS alert at most, then EOF
        except trio.BrokenResourceError:
            pass
    lines = _tls_failure_lines(caplog)
    assert len(lines) == 1, lines
    assert not any(r.exc_info for r in caplog.records)
    # A client that connects and says nothing is cut off at the handshake deadline.
    idle = await trio.open_tcp_stream("127.0.0.1", broker.port)
    with trio.fail_after(10):
        try:
            assert await idle.receive_some(65536) == b""
        except trio.BrokenResourceError:
            pass
    assert "not completed within 2000 ms" in _tls_failure_lines(caplog)[-1]
    await _assert_tls_serves(broker)
    broker.backend.close()


async def test_certificate_from_another_ca_is_refused(
    nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "raftlog.kafka")
    broker = await start_tls_broker(nursery, tmp_path, client_auth="required")
    context = tls.client_context(
        cafile=broker.ca, certfile=broker.rogue.cert, keyfile=broker.rogue.key
    )
    stream = await trio.open_tcp_stream("127.0.0.1", broker.port)
    secured = trio.SSLStream(stream, context, server_hostname="127.0.0.1")
    with trio.fail_after(5), pytest.raises(trio.BrokenResourceError):
        # TLS 1.3: the client's handshake may finish before the server refuses its
        # certificate; the refusal arrives on the first read.
        await secured.do_handshake()
        await secured.send_all(b"\x00\x00\x00\x00")
        await secured.receive_some(1)
    # The server's side of the failure is logged concurrently.
    await wait_until("the server's log line", lambda: _tls_failure_lines(caplog), 5)
    (line,) = _tls_failure_lines(caplog)
    assert "CERTIFICATE_VERIFY_FAILED" in line.upper() or "certificate" in line.lower()
    # Under client_auth = required a client without a certificate is refused as well.
    plain = trio.SSLStream(
        await trio.open_tcp_stream("127.0.0.1", broker.port),
        tls.client_context(cafile=broker.ca),
        server_hostname="127.0.0.1",
    )
    with trio.fail_after(5), pytest.raises(trio.BrokenResourceError):
        await plain.do_handshake()
        await plain.send_all(b"\x00\x00\x00\x00")
        await plain.receive_some(1)
    await _assert_tls_serves(broker, with_certificate=True)
    broker.backend.close()


async def _assert_tls_serves(broker: TlsBroker, *, with_certificate: bool = False) -> None:
    """An ApiVersions round trip over TLS: the listener still serves."""
    from kio.schema.api_versions.v3.request import ApiVersionsRequest

    from tests.kafka.wire import decode_response

    context = tls.client_context(
        cafile=broker.ca,
        certfile=broker.client.cert if with_certificate else None,
        keyfile=broker.client.key if with_certificate else None,
    )
    stream = trio.SSLStream(
        await trio.open_tcp_stream("127.0.0.1", broker.port), context, server_hostname="127.0.0.1"
    )
    request = ApiVersionsRequest(client_software_name="x", client_software_version="1")
    with trio.fail_after(5):
        await stream.send_all(encode_request(request, 7))
        data = b""
        while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
            chunk = await stream.receive_some(65536)
            assert chunk, "closed"
            data += chunk
    correlation_id, response = decode_response(data[4:], 18, 3)
    assert correlation_id == 7 and response.error_code == 0
    await stream.aclose()


def test_ssl_module_reports_a_reason_for_a_failed_handshake() -> None:
    from raftlog.net.tls import failure_reason

    error = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    error.reason = "WRONG_VERSION_NUMBER"
    wrapped = trio.BrokenResourceError()
    wrapped.__cause__ = error
    assert failure_reason(wrapped) == "WRONG_VERSION_NUMBER"
