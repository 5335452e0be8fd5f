"""The client's TLS: the broker's certificate checked against the CA and the dialled host,
the librdkafka/Java switches that relax it, client certificates, and one-line failures."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
import trio

from raftlog.client.auth import TlsHandshakeFailed
from raftlog.client.connection import open_connection
from raftlog.client.properties import (
    ClientPropertiesError,
    ClientSecurity,
    SecurityProtocol,
    parse_client_properties,
)
from raftlog.security import tls
from raftlog.security.certs import CertificateAuthority, issue_certificate, make_ca
from tests.client.fake_broker import FakeBroker


def write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


class Pki:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca = make_ca("test CA")
        self.ca_file = write(root / "ca.pem", self.ca.cert_pem)

    def issue(
        self, name: str, *, ca: CertificateAuthority | None = None, **kwargs: Any
    ) -> tuple[str, str]:
        issued = issue_certificate(ca or self.ca, name, **kwargs)
        return (
            write(self.root / f"{name}.pem", issued.cert_pem),
            write(self.root / f"{name}.key", issued.key_pem),
        )


async def start(nursery: trio.Nursery, context: ssl.SSLContext) -> FakeBroker:
    started: FakeBroker = await nursery.start(FakeBroker(ssl_context=context).serve)
    return started


def ssl_security(**settings: str) -> ClientSecurity:
    return parse_client_properties({"security.protocol": "SSL", **settings}).security


async def test_verified_by_ca_and_ip_address(nursery: trio.Nursery, tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    cert, key = pki.issue("broker")  # SAN localhost, 127.0.0.1
    broker = await start(nursery, tls.server_context(certfile=cert, keyfile=key, cafile=None))
    security = ssl_security(**{"ssl.ca.location": pki.ca_file})
    async with open_connection(broker.host, broker.port, security=security) as conn:
        response = await conn.call("metadata", {"topics": None})
        assert response.brokers[0].port == broker.port


async def test_a_certificate_for_another_name(nursery: trio.Nursery, tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    cert, key = pki.issue("elsewhere", dns_names=("kafka.example",), ip_addresses=())
    broker = await start(nursery, tls.server_context(certfile=cert, keyfile=key, cafile=None))
    strict = ssl_security(**{"ssl.ca.location": pki.ca_file})
    with pytest.raises(TlsHandshakeFailed) as caught:
        async with open_connection(broker.host, broker.port, security=strict):
            pass
    assert str(caught.value).startswith(
        f"TLS handshake with 127.0.0.1:{broker.port} failed: certificate verify failed: "
        "IP address mismatch"
    )
    # ssl.endpoint.identification.algorithm=none: the CA still counts, the name does not.
    relaxed = ssl_security(
        **{"ssl.ca.location": pki.ca_file, "ssl.endpoint.identification.algorithm": "none"}
    )
    async with open_connection(broker.host, broker.port, security=relaxed):
        pass


async def test_an_unknown_ca(nursery: trio.Nursery, tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    cert, key = pki.issue("rogue", ca=make_ca("rogue CA"))
    broker = await start(nursery, tls.server_context(certfile=cert, keyfile=key, cafile=None))
    with pytest.raises(TlsHandshakeFailed, match="unable to get local issuer certificate"):
        async with open_connection(
            broker.host, broker.port, security=ssl_security(**{"ssl.ca.location": pki.ca_file})
        ):
            pass
    # librdkafka's enable.ssl.certificate.verification=false, asked for in so many words.
    unverified = ssl_security(
        **{"ssl.ca.location": pki.ca_file, "enable.ssl.certificate.verification": "false"}
    )
    async with open_connection(broker.host, broker.port, security=unverified):
        pass


async def test_client_certificate_for_mutual_tls(nursery: trio.Nursery, tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    cert, key = pki.issue("broker")
    client_cert, client_key = pki.issue("alice", server=False)
    context = tls.server_context(
        certfile=cert, keyfile=key, cafile=pki.ca_file, client_auth="required"
    )
    broker = await start(nursery, context)
    with_cert = ssl_security(
        **{
            "ssl.ca.location": pki.ca_file,
            "ssl.certificate.location": client_cert,
            "ssl.key.location": client_key,
        }
    )
    async with open_connection(broker.host, broker.port, security=with_cert) as conn:
        await conn.call("metadata", {"topics": None})
    without = ssl_security(**{"ssl.ca.location": pki.ca_file})
    with pytest.raises(TlsHandshakeFailed, match="require a client certificate"):
        async with open_connection(broker.host, broker.port, security=without) as conn:
            # TLS 1.3 reports a refused client certificate after the handshake, on first use.
            await conn.call("metadata", {"topics": None})


async def test_a_plaintext_port(nursery: trio.Nursery, tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    broker: FakeBroker = await nursery.start(FakeBroker().serve)
    with pytest.raises(TlsHandshakeFailed, match=r"does not speak TLS|PLAINTEXT"):
        async with open_connection(
            broker.host, broker.port, security=ssl_security(**{"ssl.ca.location": pki.ca_file})
        ):
            pass


def test_unusable_tls_files_are_configuration_errors(tmp_path: Path) -> None:
    from raftlog.client.auth import client_ssl_context

    bad = write(tmp_path / "bad.pem", b"not a certificate\n")
    with pytest.raises(ClientPropertiesError, match=r"cannot set up TLS: TLS CA file .*bad.pem"):
        client_ssl_context(ClientSecurity(protocol=SecurityProtocol.SSL, ssl_ca_location=bad))
