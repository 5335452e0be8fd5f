"""Certificates for the TLS tests (a cluster CA, node, user and rogue certificates in PEM
files), and the rule that a node certificate names its node: subject CN "node-<id>"."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from raftlog.net.tls import node_id_from_certificate
from raftlog.security import certs


@dataclass(frozen=True)
class PemFiles:
    cert: str
    key: str
    ca: str  # the CA this certificate's holder trusts


def write_ca(directory: Path, name: str = "ca") -> tuple[certs.CertificateAuthority, str]:
    directory.mkdir(parents=True, exist_ok=True)
    ca = certs.make_ca(f"raftlog test {name}")
    path = directory / f"{name}.pem"
    path.write_bytes(ca.cert_pem)
    return ca, str(path)


def issue(
    directory: Path, ca: certs.CertificateAuthority, ca_path: str, common_name: str
) -> PemFiles:
    issued = certs.issue_certificate(ca, common_name)
    cert = directory / f"{common_name}.crt"
    key = directory / f"{common_name}.key"
    cert.write_bytes(issued.cert_pem)
    key.write_bytes(issued.key_pem)
    key.chmod(0o600)
    return PemFiles(str(cert), str(key), ca_path)


def test_node_id_is_read_from_the_common_name_only_in_its_exact_form() -> None:
    def subject(*common_names: str) -> dict[str, object]:
        return {"subject": tuple((("commonName", cn),) for cn in common_names)}

    assert node_id_from_certificate(subject("node-0")) == 0
    assert node_id_from_certificate(subject("node-2147483647")) == 2**31 - 1
    for refused in ("node-2147483648", "node-01", "node--1", "Node-1", "node-1 ", "alice"):
        assert node_id_from_certificate(subject(refused)) is None, refused
    assert node_id_from_certificate(subject("node-1", "node-2")) is None
    assert node_id_from_certificate(None) is None
    assert node_id_from_certificate({}) is None


def test_issued_node_certificates_name_their_node(tmp_path: Path) -> None:
    ca, ca_path = write_ca(tmp_path)
    files = issue(tmp_path, ca, ca_path, "node-7")
    decoded = ssl._ssl._test_decode_cert(files.cert)  # type: ignore[attr-defined]
    assert node_id_from_certificate(decoded) == 7
