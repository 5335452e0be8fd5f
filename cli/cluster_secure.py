"""What `raftlog cluster up --secure` adds to a local cluster: a CA, node certificates, the
SASL_SSL node settings, the admin user and the client properties file.

Layout added to the cluster directory:

    tls/ca.pem                  the local CA's certificate (clients trust it)
    node-N/tls/node.pem         node N's certificate: CN node-N, SAN localhost and 127.0.0.1
    node-N/tls/node.key         its private key (0600)
    client.properties           security.protocol=SASL_SSL, SCRAM-SHA-512 as admin, the CA
                                (0600: it holds the admin password)

The CA's private key is not kept: nothing needs to issue more certificates later, and a key
that is not on disk cannot leak. The nodes have no PLAINTEXT listener: the client listener is
SASL_SSL and the internal one mutual TLS (each node's certificate names it, CN node-<id>).

The first user cannot be created over SASL (nobody can log in yet), so each node config
seeds it: BOOTSTRAP_SCRAM_KEY holds the admin's SCRAM-SHA-512 credential in the syntax of
Kafka's `kafka-storage format --add-scram` (salt and salted password in base64, never the
password), for the controller to write once into a fresh metadata log.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raftlog_cli.cluster_local import LOOPBACK, LocalCluster, LocalNode

from raftlog.client.admin_security import DEFAULT_ITERATIONS
from raftlog.client.properties import load_client_properties
from raftlog.errors import ConfigError
from raftlog.net.tls import node_common_name
from raftlog.security.acl import ScramMechanism
from raftlog.security.certs import issue_certificate, make_ca
from raftlog.security.scram import bootstrap_entry

TLS_DIR = "tls"
CA_FILE = "ca.pem"
NODE_CERT_FILE = "node.pem"
NODE_KEY_FILE = "node.key"
CLIENT_PROPERTIES_FILE = "client.properties"
ADMIN_USER = "admin"
ADMIN_MECHANISM = ScramMechanism.SCRAM_SHA_512
# 32 random bytes as URL-safe base64: no character a properties file would mangle.
ADMIN_PASSWORD_BYTES = 32
# The node config key that seeds SCRAM users into a new cluster (see the module docstring).
BOOTSTRAP_SCRAM_KEY = "bootstrap_scram_credentials"
PRIVATE_FILE_MODE = 0o600
PUBLIC_FILE_MODE = 0o644


@dataclass(frozen=True)
class SecureMaterial:
    ca_location: Path
    client_properties: Path
    # What BOOTSTRAP_SCRAM_KEY is set to on every node.
    bootstrap_credentials: str


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Write with `mode` from the first byte (no window where a key is world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # O_CREAT's mode is filtered by the umask; this is not
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def ca_path(cluster: LocalCluster) -> Path:
    return cluster.root / TLS_DIR / CA_FILE


def node_cert_path(node: LocalNode) -> Path:
    return node.node_dir / TLS_DIR / NODE_CERT_FILE


def node_key_path(node: LocalNode) -> Path:
    return node.node_dir / TLS_DIR / NODE_KEY_FILE


def client_properties_path(cluster: LocalCluster) -> Path:
    return cluster.root / CLIENT_PROPERTIES_FILE


def _complete(cluster: LocalCluster) -> bool:
    files = [ca_path(cluster), client_properties_path(cluster)]
    files += [p for n in cluster.nodes for p in (node_cert_path(n), node_key_path(n))]
    return all(p.is_file() for p in files)


def prepare(cluster: LocalCluster) -> SecureMaterial:
    """Make (or, for a cluster made before, reuse) the CA, certificates and admin password."""
    properties = client_properties_path(cluster)
    if _complete(cluster):
        password = load_client_properties(properties).security.sasl_password
        if not password:
            raise ConfigError(f"{properties} holds no sasl.password; remove {cluster.root}")
    else:
        password = secrets.token_urlsafe(ADMIN_PASSWORD_BYTES)
        _issue(cluster)
        write_file(properties, client_properties_text(cluster, password).encode(),
                   PRIVATE_FILE_MODE)  # fmt: skip
    return SecureMaterial(
        ca_location=ca_path(cluster),
        client_properties=properties,
        bootstrap_credentials=scram_bootstrap_entry(ADMIN_USER, ADMIN_MECHANISM, password),
    )


def _issue(cluster: LocalCluster) -> None:
    ca = make_ca(f"raftlog local CA {cluster.cluster_id}")
    for node in cluster.nodes:
        issued = issue_certificate(
            ca,
            node_common_name(node.node_id),
            dns_names=("localhost",),
            ip_addresses=(LOOPBACK,),
            client=True,  # the internal listener is mutual TLS
            server=True,
        )
        write_file(node_key_path(node), issued.key_pem, PRIVATE_FILE_MODE)
        write_file(node_cert_path(node), issued.cert_pem, PUBLIC_FILE_MODE)
    write_file(ca_path(cluster), ca.cert_pem, PUBLIC_FILE_MODE)


def client_properties_text(cluster: LocalCluster, password: str) -> str:
    """One file for kcat -F, confluent-kafka and raftlog --command-config."""
    return (
        "# Written by `raftlog cluster up --secure`: the admin user of this local cluster.\n"
        "# Works with kcat -F, confluent-kafka (as a dict) and raftlog --command-config.\n"
        f"bootstrap.servers={cluster.bootstrap_servers}\n"
        "security.protocol=SASL_SSL\n"
        f"sasl.mechanism={ADMIN_MECHANISM.sasl_name}\n"
        f"sasl.username={ADMIN_USER}\n"
        f"sasl.password={password}\n"
        f"ssl.ca.location={ca_path(cluster)}\n"
    )


def scram_bootstrap_entry(user: str, mechanism: ScramMechanism, password: str) -> str:
    """The admin's bootstrap_scram_credentials entry, at the CLI's default iterations."""
    return bootstrap_entry(mechanism, user, password, iterations=DEFAULT_ITERATIONS[mechanism])


def node_overrides(
    cluster: LocalCluster, node: LocalNode, material: SecureMaterial
) -> dict[str, Any]:
    """The node config keys of a secure node (on top of cluster_local.node_config's)."""
    values: dict[str, Any] = {
        "listeners": f"SASL_SSL://{LOOPBACK}:{node.client_port}",
        "listener_security_protocol_map": "SASL_SSL:SASL_SSL",
        "internal_security_protocol": "SSL",
        "ssl_certificate_location": str(node_cert_path(node)),
        "ssl_key_location": str(node_key_path(node)),
        "ssl_ca_location": str(material.ca_location),
        "ssl_client_auth": "none",
        "sasl_enabled_mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256",
        "authorizer_class_name": "StandardAuthorizer",
        "super_users": f"User:{ADMIN_USER}",
        "allow_everyone_if_no_acl_found": False,
        BOOTSTRAP_SCRAM_KEY: material.bootstrap_credentials,
    }
    return values
