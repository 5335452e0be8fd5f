"""TLS contexts and the local CA: real handshakes (in memory, no sockets needed) between
server_context and client_context, client principals from certificates, and clear errors
for every way the files can be wrong."""

from __future__ import annotations

import datetime
import re
import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from raftlog.errors import ConfigError
from raftlog.security.certs import (
    CertificateAuthority,
    IssuedCertificate,
    issue_certificate,
    make_ca,
)
from raftlog.security.principal import (
    ANONYMOUS,
    PrincipalMappingRules,
    principal_from_certificate,
)
from raftlog.security.tls import CLIENT_AUTH, client_context, server_context

# Making keys is quick; one PKI still serves the whole module.


class Pki:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca = make_ca()
        self.other_ca = make_ca("someone else's CA")
        self.server = issue_certificate(self.ca, "node-1", client=False)
        self.client = issue_certificate(
            self.ca, "alice", server=False, dns_names=(), ip_addresses=()
        )
        self.stranger = issue_certificate(self.other_ca, "alice", server=False)
        self.other_server = issue_certificate(self.other_ca, "node-1", client=False)

    def write(self, name: str, data: bytes) -> str:
        path = self.root / name
        path.write_bytes(data)
        return str(path)

    def files(self, name: str, issued: IssuedCertificate | CertificateAuthority) -> tuple[str, str]:
        return self.write(f"{name}.crt", issued.cert_pem), self.write(f"{name}.key", issued.key_pem)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def server_ctx(
    pki: Pki, client_auth: str = "required", issued: IssuedCertificate | None = None
) -> ssl.SSLContext:
    cert, key = pki.files("server", issued or pki.server)
    return server_context(
        certfile=cert,
        keyfile=key,
        cafile=pki.write("ca.crt", pki.ca.cert_pem),
        client_auth=client_auth,
    )


def client_ctx(
    pki: Pki,
    issued: IssuedCertificate | None = None,
    *,
    ca: CertificateAuthority | None = None,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    cafile = pki.write("client-ca.crt", (ca or pki.ca).cert_pem)
    if issued is None:
        return client_context(cafile=cafile, check_hostname=check_hostname)
    cert, key = pki.files("client", issued)
    return client_context(cafile=cafile, certfile=cert, keyfile=key, check_hostname=check_hostname)


def handshake(
    server: ssl.SSLContext, client: ssl.SSLContext, hostname: str = "localhost"
) -> tuple[ssl.SSLObject, ssl.SSLObject]:
    """Run a TLS handshake between the two contexts through memory BIOs, then one round trip
    of data (under TLS 1.3 the server's verdict on the client certificate arrives after the
    client's handshake is done). Raises ssl.SSLError from whichever side refuses."""
    to_server, from_server = ssl.MemoryBIO(), ssl.MemoryBIO()
    to_client, from_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_side = server.wrap_bio(to_server, from_server, server_side=True)
    client_side = client.wrap_bio(to_client, from_client, server_hostname=hostname)

    def move() -> None:
        to_server.write(from_client.read())
        to_client.write(from_server.read())

    done = {"server": False, "client": False}
    for _ in range(10):
        for name, side in (("client", client_side), ("server", server_side)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            move()
        if all(done.values()):
            break
    assert all(done.values()), done
    client_side.write(b"ping")
    move()
    assert server_side.read(4) == b"ping"
    server_side.write(b"pong")
    move()
    assert client_side.read(4) == b"pong"
    return server_side, client_side


# --- handshakes ---------------------------------------------------------------------------


def test_mutual_tls_and_client_principal(pki: Pki) -> None:
    server, client = handshake(server_ctx(pki), client_ctx(pki, pki.client))
    assert server.version() in ("TLSv1.2", "TLSv1.3")
    peer = server.getpeercert()
    assert principal_from_certificate(peer, PrincipalMappingRules.default()) == "User:CN=alice"
    rules = PrincipalMappingRules.parse("RULE:^CN=(.*)$/$1/L,DEFAULT")
    assert principal_from_certificate(peer, rules) == "User:alice"
    # And the client saw the node's certificate.
    assert principal_from_certificate(client.getpeercert(), rules) == "User:node-1"


def test_required_refuses_a_client_without_certificate(pki: Pki) -> None:
    with pytest.raises(ssl.SSLError):
        handshake(server_ctx(pki, "required"), client_ctx(pki))


@pytest.mark.parametrize("client_auth", ["requested", "required"])
def test_certificate_from_another_ca_is_refused(pki: Pki, client_auth: str) -> None:
    with pytest.raises(ssl.SSLError):
        handshake(server_ctx(pki, client_auth), client_ctx(pki, pki.stranger))


def test_requested_lets_anonymous_in(pki: Pki) -> None:
    server, _ = handshake(server_ctx(pki, "requested"), client_ctx(pki))
    assert server.getpeercert() is None
    assert principal_from_certificate(server.getpeercert(), PrincipalMappingRules.default()) == (
        ANONYMOUS
    )
    server, _ = handshake(server_ctx(pki, "requested"), client_ctx(pki, pki.client))
    assert principal_from_certificate(server.getpeercert(), PrincipalMappingRules.default()) == (
        "User:CN=alice"
    )


def test_none_ignores_client_certificates(pki: Pki) -> None:
    server, _ = handshake(server_ctx(pki, "none"), client_ctx(pki, pki.stranger))
    # Not verified, so not an identity.
    assert principal_from_certificate(server.getpeercert(), PrincipalMappingRules.default()) == (
        ANONYMOUS
    )


def test_client_refuses_a_server_from_another_ca(pki: Pki) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server_ctx(pki, "none", pki.other_server), client_ctx(pki))
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server_ctx(pki, "none"), client_ctx(pki, ca=pki.other_ca))


def test_client_checks_the_host_name(pki: Pki) -> None:
    handshake(server_ctx(pki, "none"), client_ctx(pki), hostname="127.0.0.1")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server_ctx(pki, "none"), client_ctx(pki), hostname="evil.example")
    # Without the name check the chain is still verified.
    handshake(
        server_ctx(pki, "none"), client_ctx(pki, check_hostname=False), hostname="evil.example"
    )
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server_ctx(pki, "none", pki.other_server), client_ctx(pki, check_hostname=False))


def test_client_certificate_cannot_serve(pki: Pki) -> None:
    """A client-only certificate (no serverAuth usage) is refused as a server's."""
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server_ctx(pki, "none", pki.client), client_ctx(pki, check_hostname=False))


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated")
def test_old_tls_refused(pki: Pki) -> None:
    old_client = client_ctx(pki, pki.client)
    old_client.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    old_client.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises(ssl.SSLError):
        handshake(server_ctx(pki), old_client)


def test_contexts_are_hardened(pki: Pki) -> None:
    for context in (server_ctx(pki), client_ctx(pki, pki.client)):
        assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
        assert context.options & ssl.OP_NO_COMPRESSION
        assert context.verify_mode == ssl.CERT_REQUIRED
    assert server_ctx(pki, "requested").verify_mode == ssl.CERT_OPTIONAL
    assert server_ctx(pki, "none").verify_mode == ssl.CERT_NONE
    assert CLIENT_AUTH == ("none", "requested", "required")


def test_over_real_sockets(pki: Pki) -> None:
    """The same over a socketpair, each side in its own thread, as a listener would."""
    left, right = socket.socketpair()
    server_result: dict[str, object] = {}

    def serve() -> None:
        try:
            with server_ctx(pki).wrap_socket(left, server_side=True) as tls:
                server_result["principal"] = principal_from_certificate(
                    tls.getpeercert(), PrincipalMappingRules.default()
                )
                tls.sendall(tls.recv(4))
        except Exception as exc:
            server_result["error"] = exc

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client_ctx(pki, pki.client).wrap_socket(right, server_hostname="localhost") as tls:
            tls.sendall(b"ping")
            assert tls.recv(4) == b"ping"
    finally:
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert server_result == {"principal": "User:CN=alice"}


# --- configuration errors -----------------------------------------------------------------


def test_missing_files(pki: Pki, tmp_path: Path) -> None:
    cert, key = pki.files("ok", pki.server)
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(ConfigError, match=r"certificate file .*nope\.pem: no such file"):
        server_context(certfile=missing, keyfile=key, cafile=None)
    with pytest.raises(ConfigError, match=r"key file .*nope\.pem: no such file"):
        server_context(certfile=cert, keyfile=missing, cafile=None)
    with pytest.raises(ConfigError, match=r"CA file .*nope\.pem: no such file"):
        server_context(certfile=cert, keyfile=key, cafile=missing, client_auth="required")
    with pytest.raises(ConfigError, match="not set"):
        server_context(certfile="", keyfile=key, cafile=None)


def test_bad_pem(pki: Pki, tmp_path: Path) -> None:
    cert, key = pki.files("ok", pki.server)
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    not_a_certificate = re.escape(f"certificate file {garbage}: not a PEM certificate")
    with pytest.raises(ConfigError, match=not_a_certificate):
        server_context(certfile=str(garbage), keyfile=key, cafile=None)
    with pytest.raises(ConfigError, match=re.escape(f"key file {garbage}: not a PEM private key")):
        server_context(certfile=cert, keyfile=str(garbage), cafile=None)
    with pytest.raises(ConfigError, match=re.escape(f"CA file {garbage}: no usable PEM CA")):
        server_context(certfile=cert, keyfile=key, cafile=str(garbage), client_auth="requested")
    # The key where the certificate should be, and the other way round.
    with pytest.raises(ConfigError, match="not a PEM certificate"):
        server_context(certfile=key, keyfile=cert, cafile=None)


def test_key_does_not_match_certificate(pki: Pki) -> None:
    cert, _ = pki.files("ok", pki.server)
    _, other_key = pki.files("other", pki.client)
    mismatch = r"other\.key does not match the certificate in .*ok\.crt"
    with pytest.raises(ConfigError, match=mismatch):
        server_context(certfile=cert, keyfile=other_key, cafile=None)


def test_encrypted_key(pki: Pki) -> None:
    key = serialization.load_pem_private_key(pki.server.key_pem, password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"s3cret"),
    )
    cert = pki.write("enc.crt", pki.server.cert_pem)
    keyfile = pki.write("enc.key", encrypted)
    server_context(certfile=cert, keyfile=keyfile, cafile=None, key_password="s3cret")
    with pytest.raises(ConfigError, match="encrypted and no key password is set"):
        server_context(certfile=cert, keyfile=keyfile, cafile=None)
    with pytest.raises(ConfigError, match="wrong key password"):
        server_context(certfile=cert, keyfile=keyfile, cafile=None, key_password="nope")
    client_context(cafile=None, certfile=cert, keyfile=keyfile, key_password="s3cret")


def test_cert_and_key_in_one_file(pki: Pki) -> None:
    both = pki.write("both.pem", pki.client.cert_pem + pki.client.key_pem)
    context = client_context(cafile=pki.write("ca.crt", pki.ca.cert_pem), certfile=both)
    handshake(server_ctx(pki), context)


def test_client_auth_values(pki: Pki) -> None:
    cert, key = pki.files("ok", pki.server)
    with pytest.raises(ConfigError, match=r"ssl\.client\.auth must be one of"):
        server_context(certfile=cert, keyfile=key, cafile=None, client_auth="REQUIRED")
    with pytest.raises(ConfigError, match="needs a CA file"):
        server_context(certfile=cert, keyfile=key, cafile=None, client_auth="required")
    with pytest.raises(ConfigError, match="without a certificate"):
        client_context(cafile=None, keyfile=key)


# --- the CA ---------------------------------------------------------------------------------


def test_ca_and_leaf_certificates(pki: Pki) -> None:
    ca = x509.load_pem_x509_certificate(pki.ca.cert_pem)
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    leaf = x509.load_pem_x509_certificate(pki.server.cert_pem)
    assert leaf.issuer == ca.subject
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    usage = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    now = datetime.datetime.now(datetime.UTC)
    assert leaf.not_valid_before_utc < now < leaf.not_valid_after_utc
    assert leaf.not_valid_after_utc <= ca.not_valid_after_utc
    assert b"PRIVATE KEY" in pki.server.key_pem and b"ENCRYPTED" not in pki.server.key_pem


def test_leaf_never_outlives_its_ca() -> None:
    ca = make_ca(valid_days=10)
    leaf = issue_certificate(ca, "x", valid_days=825)
    assert x509.load_pem_x509_certificate(leaf.cert_pem).not_valid_after_utc <= (
        x509.load_pem_x509_certificate(ca.cert_pem).not_valid_after_utc
    )


def test_a_ca_can_be_rebuilt_from_its_pems(pki: Pki) -> None:
    again = CertificateAuthority(cert_pem=pki.ca.cert_pem, key_pem=pki.ca.key_pem)
    issued = issue_certificate(again, "bob", server=False)
    handshake(server_ctx(pki), client_ctx(pki, issued))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"common_name": ""},
        {"common_name": "x" * 65},
        {"valid_days": 0},
        {"valid_days": 100_000},
        {"client": False, "server": False},
        {"dns_names": ["bad name "]},
        {"dns_names": [""]},
        {"ip_addresses": ["300.1.1.1"]},
        {"ip_addresses": ["localhost"]},
    ],
)
def test_issue_refuses_bad_arguments(pki: Pki, kwargs: dict[str, object]) -> None:
    arguments: dict[str, object] = {"common_name": "ok", **kwargs}
    with pytest.raises(ValueError):
        issue_certificate(pki.ca, **arguments)  # type: ignore[arg-type]


def test_distinguished_name_of_a_real_certificate(pki: Pki) -> None:
    """getpeercert()'s subject of a certificate with several attributes, through a real
    handshake, spelled as Java's X500Principal.getName() spells it."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_cert = x509.load_pem_x509_certificate(pki.ca.cert_pem)
    ca_key = serialization.load_pem_private_key(pki.ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Example, Inc."),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "raftlog"),
            x509.NameAttribute(NameOID.COMMON_NAME, "app+1"),
            x509.NameAttribute(NameOID.EMAIL_ADDRESS, "a@b.c"),
        ]
    )
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    issued = IssuedCertificate(
        cert_pem=certificate.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    server, _ = handshake(server_ctx(pki), client_ctx(pki, issued))
    expected = "1.2.840.113549.1.9.1=#16056140622e63,CN=app\\+1,OU=raftlog,O=Example\\, Inc.,C=US"
    rules = PrincipalMappingRules.parse(r"RULE:^.*,CN=([^,]*),OU=raftlog,.*$/$1/, DEFAULT")
    assert principal_from_certificate(server.getpeercert(), PrincipalMappingRules.default()) == (
        f"User:{expected}"
    )
    assert principal_from_certificate(server.getpeercert(), rules) == "User:app\\+1"
