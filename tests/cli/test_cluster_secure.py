"""`raftlog cluster up --secure` bookkeeping without real nodes: the CA and node
certificates, private key files, the client properties file and the SASL_SSL node configs."""

from __future__ import annotations

import base64
import re
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from raftlog_cli import cluster_local as local
from raftlog_cli import cluster_secure as secure

from raftlog.client.properties import SecurityProtocol, load_client_properties
from raftlog.config import NodeConfig
from raftlog.security.acl import ScramMechanism
from raftlog.security.scram import credential_from_salted_password, verify_password
from tests.cli.conftest import invoke


def secure_cluster(tmp_path: Path, nodes: int = 3) -> local.LocalCluster:
    planned = local.plan_cluster(tmp_path / ".raftlog", nodes, 9092)
    return local.LocalCluster(
        planned.root, planned.cluster_id, planned.nodes, secure.client_properties_path(planned)
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_material_layout_and_modes(tmp_path: Path) -> None:
    cluster = secure_cluster(tmp_path)
    material = secure.prepare(cluster)
    root = cluster.root
    assert material.ca_location == root / "tls" / "ca.pem"
    assert mode(material.ca_location) == 0o644
    assert mode(material.client_properties) == 0o600
    for node in cluster.nodes:
        key, cert = secure.node_key_path(node), secure.node_cert_path(node)
        assert mode(key) == 0o600 and mode(cert) == 0o644
        certificate = x509.load_pem_x509_certificate(cert.read_bytes())
        names = certificate.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
        assert names[0].value == f"node-{node.node_id}"
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        assert san.value.get_values_for_type(x509.DNSName) == ["localhost"]
        assert [str(ip) for ip in san.value.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
        # The node certificate chains to the CA clients are told to trust.
        context = ssl.create_default_context(cafile=str(material.ca_location))
        context.load_cert_chain(cert, key)
    # The CA's private key is not kept anywhere under the cluster directory.
    assert not [p for p in root.rglob("*") if p.is_file() and b"PRIVATE KEY" in p.read_bytes()
                and p.name != "node.key"]  # fmt: skip

    loaded = load_client_properties(material.client_properties)
    security = loaded.security
    assert security.protocol is SecurityProtocol.SASL_SSL
    assert (security.sasl_mechanism, security.sasl_username) == ("SCRAM-SHA-512", "admin")
    assert security.ssl_ca_location == str(material.ca_location)
    assert security.sasl_password and len(security.sasl_password) >= 40
    assert loaded.bootstrap_servers == cluster.bootstrap_servers
    assert loaded.ignored_keys == ()

    # A second `up` reuses everything (same CA, same password).
    ca_before = material.ca_location.read_bytes()
    again = secure.prepare(cluster)
    assert material.ca_location.read_bytes() == ca_before
    assert load_client_properties(again.client_properties).security == security


def test_bootstrap_credential_is_the_admin_password_salted(tmp_path: Path) -> None:
    cluster = secure_cluster(tmp_path, nodes=1)
    material = secure.prepare(cluster)
    password = load_client_properties(material.client_properties).security.sasl_password
    assert password is not None
    entry = material.bootstrap_credentials
    assert password not in entry
    match = re.fullmatch(
        r'SCRAM-SHA-512=\[name=admin,iterations=8192,salt="([^"]+)",saltedpassword="([^"]+)"\]',
        entry,
    )
    assert match is not None
    credential = credential_from_salted_password(
        ScramMechanism.SCRAM_SHA_512,
        salt=base64.b64decode(match.group(1)),
        salted_password=base64.b64decode(match.group(2)),
        iterations=8192,
    )
    assert verify_password(credential, password)


def test_secure_node_configs(tmp_path: Path) -> None:
    cluster = secure_cluster(tmp_path)
    material = secure.prepare(cluster)
    overrides = {n.node_id: secure.node_overrides(cluster, n, material) for n in cluster.nodes}
    local.write_cluster(cluster, {}, lambda node: overrides[node.node_id])
    for node in cluster.nodes:
        assert mode(node.config_path) == 0o600
        config = NodeConfig.load(node.config_path)
        assert config.bootstrap_scram_credentials == material.bootstrap_credentials
        (listener,) = config.client_listeners
        assert (listener.security_protocol, listener.port) == ("SASL_SSL", node.client_port)
        assert config.internal_tls and config.authorizer_enabled
        assert config.super_user_principals == frozenset({"User:admin"})
        assert config.ssl_ca_location == str(material.ca_location)
    assert local.load_cluster(cluster.root) == cluster


def test_secure_node_configs_hold_no_plaintext_listener(tmp_path: Path) -> None:
    cluster = secure_cluster(tmp_path, nodes=2)
    material = secure.prepare(cluster)
    for node in cluster.nodes:
        config = local.node_config(cluster, node, secure.node_overrides(cluster, node, material))
        assert [(b.name, b.security_protocol) for b in config.client_listeners] == [
            ("SASL_SSL", "SASL_SSL")
        ]
        assert not config.allow_everyone_if_no_acl_found


async def test_quota_usage_is_refused_on_a_secure_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = secure_cluster(tmp_path, nodes=1)
    material = secure.prepare(cluster)
    local.write_cluster(cluster, {}, lambda node: secure.node_overrides(cluster, node, material))
    monkeypatch.chdir(tmp_path)
    r = await invoke(["quotas", "describe", "--usage"])
    assert (r.exit_code, r.stdout) == (1, "")
    assert r.stderr == (
        "error: --usage reads the nodes' internal listeners, which a secure cluster keeps to "
        "mutual TLS between its nodes\n"
    )
