"""What ``--secure`` adds to a run's cluster: a local CA, one certificate per node, a
SASL_SSL client listener with SCRAM-SHA-512, mutual TLS between the nodes, and the ACL
authorizer with the run's admin as its super user.

Layout inside the run's nodes directory:

    tls/ca.pem                 the run's CA certificate (clients and nodes trust it)
    <name>/tls/node.pem        node certificate: CN node-<id>, SAN the node's namespace
                               address (what clients dial, so host name checks pass)
    <name>/tls/node.key        its key (0600)

The admin user cannot be created over SASL before anyone can log in, so every node's config
seeds it through bootstrap_scram_credentials (salted, never the password), together with
the workload's user. The admin (the authorizer's super user) is the harness's: topic, ACLs,
leader lookups. The workload's clients log in as `jepsen`, which may do only what the ACLs
the harness creates at start-up allow (WORKLOAD_ACLS): every send and poll of the run is
decided by the authorizer, on whichever node leads. Passwords live only in this process.
The CA's key is not written anywhere: a run never issues certificates after it has started.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raftlog.client.properties import ClientSecurity, SecurityProtocol
from raftlog.net.tls import node_common_name
from raftlog.security.acl import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    ScramMechanism,
)
from raftlog.security.certs import issue_certificate, make_ca
from raftlog.security.scram import bootstrap_entry

ADMIN_USER = "admin"
WORKLOAD_USER = "jepsen"
# The workload's consumers are group members in name only (assign, never commit); their
# group ids all start with this (jepsen.workload).
WORKLOAD_GROUP_PREFIX = "jepsen-"
# The txn workload's transactional ids: jepsen-txn-<run>-<process> (jepsen/txn_workload.py).
TXN_ID_PREFIX = "jepsen-txn-"
MECHANISM = ScramMechanism.SCRAM_SHA_512
# Kafka's tools' default for SCRAM-SHA-512.
ITERATIONS = 8192
PASSWORD_BYTES = 24
LISTENER = "SASL_SSL"
TLS_DIR = "tls"
PRIVATE_MODE = 0o600
PUBLIC_MODE = 0o644


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write with `mode` from the first byte: a key is never readable by others."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # O_CREAT's mode passes through the umask; this does not
        os.write(fd, data)
    finally:
        os.close(fd)


def scram_bootstrap_entry(user: str, password: str) -> str:
    """One bootstrap_scram_credentials entry for the run's mechanism and iterations."""
    return bootstrap_entry(MECHANISM, user, password, iterations=ITERATIONS)


@dataclass
class SecureSetup:
    """The run's certificates and admin credential, made once by ``create``."""

    ca_location: Path
    node_files: dict[str, tuple[Path, Path]]  # node name -> (certificate, key)
    password: str = field(repr=False)
    workload_password: str = field(repr=False)
    bootstrap_credentials: str = field(repr=False)

    @classmethod
    def create(cls, nodes_dir: Path, nodes: dict[str, tuple[int, str]]) -> SecureSetup:
        """`nodes`: name -> (node id, namespace address)."""
        ca = make_ca("raftlog jepsen CA")
        ca_location = nodes_dir / TLS_DIR / "ca.pem"
        _write(ca_location, ca.cert_pem, PUBLIC_MODE)
        node_files = {}
        for name, (node_id, address) in nodes.items():
            issued = issue_certificate(
                ca,
                node_common_name(node_id),
                dns_names=("localhost",),
                ip_addresses=(address,),
                client=True,  # the internal listener is mutual TLS
                server=True,
            )
            cert, key = (
                nodes_dir / name / TLS_DIR / "node.pem",
                nodes_dir / name / TLS_DIR / "node.key",
            )
            _write(key, issued.key_pem, PRIVATE_MODE)
            _write(cert, issued.cert_pem, PUBLIC_MODE)
            node_files[name] = (cert, key)
        password = secrets.token_urlsafe(PASSWORD_BYTES)
        workload_password = secrets.token_urlsafe(PASSWORD_BYTES)
        credentials = ";".join(
            [
                scram_bootstrap_entry(ADMIN_USER, password),
                scram_bootstrap_entry(WORKLOAD_USER, workload_password),
            ]
        )
        return cls(ca_location, node_files, password, workload_password, credentials)

    def node_overrides(self, name: str, address: str, client_port: int) -> dict[str, Any]:
        """The node config keys of a secure node: SASL_SSL only for clients, mutual TLS
        between nodes, the authorizer with the admin as super user."""
        cert, key = self.node_files[name]
        return {
            "listeners": f"{LISTENER}://{address}:{client_port}",
            "listener_security_protocol_map": f"{LISTENER}:{LISTENER}",
            "internal_security_protocol": "SSL",
            "ssl_certificate_location": str(cert),
            "ssl_key_location": str(key),
            "ssl_ca_location": str(self.ca_location),
            "ssl_client_auth": "none",
            "sasl_enabled_mechanisms": MECHANISM.sasl_name,
            "authorizer_class_name": "StandardAuthorizer",
            "super_users": f"User:{ADMIN_USER}",
            "allow_everyone_if_no_acl_found": False,
            "bootstrap_scram_credentials": self.bootstrap_credentials,
        }

    def librdkafka(self) -> dict[str, Any]:
        """confluent-kafka settings of the workload's user over SASL_SSL."""
        return {
            "security.protocol": LISTENER,
            "sasl.mechanism": MECHANISM.sasl_name,
            "sasl.username": WORKLOAD_USER,
            "sasl.password": self.workload_password,
            "ssl.ca.location": str(self.ca_location),
        }

    @staticmethod
    def workload_acls(topic: str) -> list[AclBinding]:
        """What the workload's user needs, and no more: WRITE (idempotent produce, KIP-679)
        and READ (which implies DESCRIBE: metadata, offsets) on the run's topic, READ on its
        consumers' groups, WRITE (which implies DESCRIBE) on the transactional ids of the txn
        workload."""
        principal = f"User:{WORKLOAD_USER}"
        allow = AclPermissionType.ALLOW
        return [
            AclBinding(ResourceType.TOPIC, topic, PatternType.LITERAL, principal, "*",
                       AclOperation.WRITE, allow),
            AclBinding(ResourceType.TOPIC, topic, PatternType.LITERAL, principal, "*",
                       AclOperation.READ, allow),
            AclBinding(ResourceType.GROUP, WORKLOAD_GROUP_PREFIX, PatternType.PREFIXED,
                       principal, "*", AclOperation.READ, allow),
            AclBinding(ResourceType.TRANSACTIONAL_ID, TXN_ID_PREFIX, PatternType.PREFIXED,
                       principal, "*", AclOperation.WRITE, allow),
        ]  # fmt: skip

    def client_security(self) -> ClientSecurity:
        """The same for raftlog's own client (the harness's control-plane questions)."""
        return ClientSecurity(
            protocol=SecurityProtocol.SASL_SSL,
            sasl_mechanism=MECHANISM.sasl_name,
            sasl_username=ADMIN_USER,
            sasl_password=self.password,
            ssl_ca_location=str(self.ca_location),
        )
