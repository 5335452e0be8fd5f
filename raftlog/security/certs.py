"""A small local certificate authority: make a CA, issue node and client certificates.

Why this module: trying TLS and mutual TLS locally (`make cluster` with SSL, the tests, the
Jepsen harness) needs a CA and one certificate per node and per client, and asking users to
drive openssl by hand is where most TLS set-ups go wrong. This returns PEM bytes only; the
CLI decides where files go (and makes key files private). Keys are ECDSA P-256 (fast to make,
accepted by every client TLS stack), signatures SHA-256. Certificates start five minutes in
the past so a little clock skew between machines does not make a fresh one "not yet valid".
It is meant for development and test clusters, not as a production PKI.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_VALID_DAYS = 825  # the most that Apple's TLS stack accepts for a server certificate
MAX_VALID_DAYS = 3650
CLOCK_SKEW_ALLOWANCE = datetime.timedelta(minutes=5)
MAX_COMMON_NAME_CHARS = 64  # X.520's upper bound for a common name


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    """A CA: its certificate (hand this to whoever must trust it) and its private key (keep
    it private; it is all that is needed to issue more). Can be rebuilt from the two PEMs."""

    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True, slots=True)
class IssuedCertificate:
    cert_pem: bytes
    key_pem: bytes


def make_ca(
    common_name: str = "raftlog local CA", *, valid_days: int = DEFAULT_VALID_DAYS
) -> CertificateAuthority:
    """A self-signed CA that may sign end-entity certificates only (path length 0)."""
    _check_common_name(common_name)
    _check_valid_days(valid_days)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW_ALLOWANCE)
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(cert_pem=_cert_pem(certificate), key_pem=_key_pem(key))


def issue_certificate(
    ca: CertificateAuthority,
    common_name: str,
    *,
    dns_names: Sequence[str] = ("localhost",),
    ip_addresses: Sequence[str] = ("127.0.0.1",),
    client: bool = True,
    server: bool = True,
    valid_days: int = DEFAULT_VALID_DAYS,
) -> IssuedCertificate:
    """A certificate for `common_name` (e.g. "node-1" or a user name) signed by `ca`, with the
    given DNS names and IP addresses as subject alternative names (what clients check the
    host name against) and usable for server and/or client authentication."""
    _check_common_name(common_name)
    _check_valid_days(valid_days)
    if not (client or server):
        raise ValueError("a certificate must be usable for client or server authentication")
    ca_certificate = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an ECDSA key made by make_ca")
    alternative_names: list[x509.GeneralName] = []
    for dns_name in dns_names:
        if not dns_name or dns_name != dns_name.strip() or "/" in dns_name:
            raise ValueError(f"not a DNS name: {dns_name!r}")
        alternative_names.append(x509.DNSName(dns_name))
    for address in ip_addresses:
        try:
            alternative_names.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError:
            raise ValueError(f"not an IP address: {address!r}") from None
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    not_after = min(now + datetime.timedelta(days=valid_days), ca_certificate.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW_ALLOWANCE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if alternative_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(alternative_names), critical=False
        )
    certificate = builder.sign(ca_key, hashes.SHA256())
    return IssuedCertificate(cert_pem=_cert_pem(certificate), key_pem=_key_pem(key))


def _check_common_name(common_name: str) -> None:
    if not common_name or len(common_name) > MAX_COMMON_NAME_CHARS:
        raise ValueError(f"common name must be 1..{MAX_COMMON_NAME_CHARS} characters")


def _check_valid_days(valid_days: int) -> None:
    if not 1 <= valid_days <= MAX_VALID_DAYS:
        raise ValueError(f"valid_days must be in [1, {MAX_VALID_DAYS}], got {valid_days}")


def _cert_pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
