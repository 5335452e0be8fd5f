"""The listener and security values of the node config: Kafka's listener syntax
(`NAME://HOST:PORT`, `NAME:PROTOCOL`), security protocols, SASL mechanisms, super users and
the salted bootstrap SCRAM credentials, each parsed with an error that names its key.
raftlog.config declares the keys; this module reads their values."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from raftlog.errors import ConfigError

# Kafka's security protocols; a listener's protocol comes from listener_security_protocol_map.
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
SASL_PROTOCOLS = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})
INTERNAL_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL")
SSL_CLIENT_AUTH = ("none", "requested", "required")
# The SASL mechanisms raftlog implements (raftlog.security.sasl); GSSAPI and OAUTHBEARER are not.
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# authorizer_class_name values that turn on the ACL authorizer (Kafka's KRaft one, by its
# short or full class name, so a Kafka server.properties carries over).
STANDARD_AUTHORIZER_NAMES = (
    "StandardAuthorizer",
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
)
# The listener a config without `listeners` has: the one at client_listener.
DEFAULT_LISTENER_NAME = "PLAINTEXT"
_LISTENER_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")


def parse_host_port(value: str, what: str) -> tuple[str, int]:
    """Split "host:port" (IPv6 as "[::1]:9092") with a clear error naming the key."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ConfigError(f"{what}: expected HOST:PORT, got {value!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ConfigError(f"{what}: port {port} is outside 0..65535")
    return host.strip("[]"), port


@dataclass(frozen=True, slots=True)
class Listener:
    """One named Kafka listener: where it binds (or is advertised) and its security protocol."""

    name: str
    host: str
    port: int
    security_protocol: str

    @property
    def tls(self) -> bool:
        return self.security_protocol in TLS_PROTOCOLS

    @property
    def sasl(self) -> bool:
        return self.security_protocol in SASL_PROTOCOLS


def parse_protocol_map(value: str) -> dict[str, str]:
    """Parse listener_security_protocol_map: "NAME:PROTOCOL,..." (names upper-cased)."""
    mapping: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, protocol = item.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not _LISTENER_NAME.fullmatch(name):
            raise ConfigError(
                f"listener_security_protocol_map: expected NAME:PROTOCOL entries, got {item!r}"
            )
        if protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(
                f"listener_security_protocol_map: {name} maps to unknown security protocol "
                f"{protocol!r}; known: {', '.join(SECURITY_PROTOCOLS)}"
            )
        if name in mapping:
            raise ConfigError(f"listener_security_protocol_map: {name} is listed twice")
        mapping[name] = protocol
    return mapping


def parse_listeners(value: str, what: str) -> list[tuple[str, str, int]]:
    """Parse Kafka's listener list "NAME://HOST:PORT,..." into (NAME, host, port); an empty
    host ("PLAINTEXT://:9092") means every interface, as in Kafka."""
    out: list[tuple[str, str, int]] = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, address = item.partition("://")
        name = name.strip().upper()
        if not sep or not _LISTENER_NAME.fullmatch(name):
            raise ConfigError(f"{what}: expected NAME://HOST:PORT entries, got {item!r}")
        if address.startswith(":"):
            address = "0.0.0.0" + address
        host, port = parse_host_port(address, f"{what}[{name}]")
        if any(name == seen for seen, _, _ in out):
            raise ConfigError(f"{what}: listener name {name} is used twice")
        out.append((name, host, port))
    return out


def parse_sasl_mechanisms(value: str) -> tuple[str, ...]:
    mechanisms = tuple(m.strip().upper() for m in value.split(",") if m.strip())
    for mechanism in mechanisms:
        if mechanism not in SASL_MECHANISMS:
            raise ConfigError(
                f"sasl_enabled_mechanisms: {mechanism!r} is not supported; "
                f"supported: {', '.join(SASL_MECHANISMS)}"
            )
    return mechanisms


def parse_super_users(value: str) -> frozenset[str]:
    """Kafka's super.users: "User:alice;User:bob" (principal type and name, ';'-separated)."""
    users = set()
    for item in filter(None, (part.strip() for part in value.split(";"))):
        kind, sep, name = item.partition(":")
        if not sep or not kind.strip() or not name.strip():
            raise ConfigError(
                f"super_users: expected TYPE:NAME entries like User:alice, got {item!r}"
            )
        users.add(f"{kind.strip()}:{name.strip()}")
    return frozenset(users)


@dataclass(frozen=True, slots=True)
class BootstrapScramCredential:
    """One SCRAM user to seed into a new cluster, already salted (never the password)."""

    mechanism: str  # "SCRAM-SHA-256" or "SCRAM-SHA-512"
    user: str
    iterations: int
    salt: bytes
    salted_password: bytes


# kafka-storage format --add-scram's syntax, one entry:
# SCRAM-SHA-512=[name=admin,iterations=8192,salt="<base64>",saltedpassword="<base64>"]
_SCRAM_ENTRY = re.compile(
    r"(SCRAM-SHA-256|SCRAM-SHA-512)=\[name=([^,\]=\s]{1,255}),iterations=([0-9]{1,9}),"
    r'salt="([A-Za-z0-9+/=]{1,2048})",saltedpassword="([A-Za-z0-9+/=]{1,2048})"\]'
)


def parse_bootstrap_scram(value: str) -> tuple[BootstrapScramCredential, ...]:
    """Parse bootstrap_scram_credentials: ';'-separated --add-scram entries (salted only)."""
    out = []
    for item in filter(None, (part.strip() for part in value.split(";"))):
        match = _SCRAM_ENTRY.fullmatch(item)
        if match is None:
            raise ConfigError(
                "bootstrap_scram_credentials: expected entries like SCRAM-SHA-512=[name=admin,"
                'iterations=8192,salt="<base64>",saltedpassword="<base64>"] (the password '
                "itself is never accepted)"
            )
        mechanism, user, iterations_text, salt_text, salted_text = match.groups()
        try:
            salt = base64.b64decode(salt_text, validate=True)
            salted = base64.b64decode(salted_text, validate=True)
        except binascii.Error:
            raise ConfigError(
                f"bootstrap_scram_credentials: {user}'s salt or saltedpassword is not base64"
            ) from None
        out.append(BootstrapScramCredential(mechanism, user, int(iterations_text), salt, salted))
    return tuple(out)
