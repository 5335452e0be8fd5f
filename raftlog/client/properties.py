"""Client security settings from a Kafka / librdkafka client properties file.

One file serves kcat (`-F`), confluent-kafka (the same keys in a dict), Kafka's Java tools
(`--command-config`) and raftlog (`--command-config`), so the keys are theirs:

    security.protocol=SASL_SSL
    sasl.mechanism=SCRAM-SHA-512
    sasl.username=admin
    sasl.password=...
    ssl.ca.location=/path/ca.pem

Java's `sasl.jaas.config` (PlainLoginModule / ScramLoginModule with username and password)
and a PEM truststore/keystore (`ssl.truststore.location` with `ssl.truststore.type=PEM`) are
read as aliases. Keys that only tune a client (linger.ms, client.id, ...) are accepted and
reported back as ignored, since one file is shared by clients that each know other keys.

The file comes from outside the process: its size, line count and every value's length are
bounded, and a bad value raises ClientPropertiesError naming the key and where it came from.
Nothing here opens a socket or builds a TLS context; that is the connection's job.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from raftlog.config_listeners import SASL_MECHANISMS
from raftlog.constants import MIB
from raftlog.errors import ConfigError

MAX_PROPERTIES_FILE_BYTES = 1 * MIB
MAX_PROPERTIES_LINES = 10_000
MAX_KEY_CHARS = 256
# A PEM path, a JAAS line or a password: generous, but bounded.
MAX_VALUE_CHARS = 8_192
MAX_USERNAME_CHARS = 1_024
MAX_PASSWORD_CHARS = 1_024

# Mechanisms Kafka knows that raftlog does not implement: named in the error, not "unknown".
_UNSUPPORTED_MECHANISMS = ("GSSAPI", "OAUTHBEARER", "AWS_MSK_IAM")
_PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
_JAAS_FLAGS = ("required", "requisite", "sufficient", "optional")


class ClientPropertiesError(ConfigError):
    """A client properties file or option cannot be used; the message names the key."""


# bad(key, why): the error for one key, prefixed with where the properties came from.
_Bad = Callable[[str, str], ClientPropertiesError]


class SecurityProtocol(enum.StrEnum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def uses_tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


@dataclass(frozen=True)
class ClientSecurity:
    """How a client connects: TLS settings and SASL credentials (checked at construction).

    The password fields are left out of repr() so the object can be logged.
    """

    protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: str | None = field(default=None, repr=False)
    # https (the default of Kafka and of librdkafka >= 2.0): the broker's certificate must
    # name the host we dialled. none: any certificate the CA signed is accepted.
    ssl_check_hostname: bool = True
    # librdkafka's enable.ssl.certificate.verification=false: no verification at all.
    ssl_verify_certificate: bool = True

    def __post_init__(self) -> None:
        if self.protocol.uses_sasl:
            if self.sasl_mechanism is None:
                raise ClientPropertiesError(
                    f"security.protocol={self.protocol} needs sasl.mechanism "
                    f"({', '.join(SASL_MECHANISMS)})"
                )
            if self.sasl_mechanism not in SASL_MECHANISMS:
                raise ClientPropertiesError(f"sasl.mechanism {self.sasl_mechanism!r} is unknown")
            if not self.sasl_username:
                raise ClientPropertiesError(
                    f"sasl.mechanism={self.sasl_mechanism} needs sasl.username "
                    "(or a username in sasl.jaas.config)"
                )
            if self.sasl_password is None:
                raise ClientPropertiesError(
                    f"sasl.mechanism={self.sasl_mechanism} needs sasl.password "
                    "(or a password in sasl.jaas.config)"
                )
        if (self.ssl_key_location is None) != (self.ssl_certificate_location is None):
            raise ClientPropertiesError(
                "ssl.certificate.location and ssl.key.location go together (a client "
                "certificate needs its key)"
            )

    @property
    def uses_tls(self) -> bool:
        return self.protocol.uses_tls

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.uses_sasl


PLAINTEXT = ClientSecurity()


@dataclass(frozen=True)
class ClientProperties:
    """What a properties file said: the security settings, the few general keys raftlog
    uses, and the keys it ignored (for a warning)."""

    security: ClientSecurity
    bootstrap_servers: str | None = None
    client_id: str | None = None
    ignored_keys: tuple[str, ...] = ()


# ------------------------------------------------------------------------------ file syntax
def read_properties_text(text: str, *, source: str) -> dict[str, str]:
    """`key=value` (or `key: value`) lines, `#`/`!` comments, `\\` line continuation.

    The last occurrence of a key wins, as in Java's Properties and librdkafka.
    """
    lines = text.splitlines()
    if len(lines) > MAX_PROPERTIES_LINES:
        raise ClientPropertiesError(f"{source}: more than {MAX_PROPERTIES_LINES} lines")
    out: dict[str, str] = {}
    pending = ""
    start_line = 0
    for number, raw in enumerate(lines, start=1):
        line = raw.strip() if not pending else raw.lstrip()
        if not pending:
            start_line = number
            if not line or line[0] in "#!":
                continue
        if _continues(line):
            pending += line[:-1]
            continue
        logical, pending = pending + line, ""
        _add(out, logical, source, start_line)
    if pending:
        _add(out, pending, source, start_line)
    return out


def _continues(line: str) -> bool:
    # An odd number of trailing backslashes: the last one escapes the newline.
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _add(out: dict[str, str], logical: str, source: str, line_number: int) -> None:
    where = f"{source}:{line_number}"
    if "\x00" in logical:
        raise ClientPropertiesError(f"{where}: a NUL character")
    match = re.match(r"\s*([^=:\s]+)\s*[=:]\s?(.*)$", logical)
    if match is None:
        raise ClientPropertiesError(f"{where}: expected key=value, got {_shown(logical)}")
    key, value = match.group(1), match.group(2).strip()
    if len(key) > MAX_KEY_CHARS:
        raise ClientPropertiesError(f"{where}: a key longer than {MAX_KEY_CHARS} characters")
    if len(value) > MAX_VALUE_CHARS:
        raise ClientPropertiesError(f"{where}: {key} is longer than {MAX_VALUE_CHARS} characters")
    out[key] = value


def _shown(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def load_properties_file(path: str | Path) -> dict[str, str]:
    """Read a properties file (bounded in size, UTF-8) into a key -> value dict."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_PROPERTIES_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ClientPropertiesError(f"client properties file {path} does not exist") from None
    except IsADirectoryError:
        raise ClientPropertiesError(f"client properties file {path} is a directory") from None
    except OSError as exc:
        raise ClientPropertiesError(
            f"cannot read client properties file {path}: {exc.strerror or exc}"
        ) from None
    if len(data) > MAX_PROPERTIES_FILE_BYTES:
        raise ClientPropertiesError(
            f"client properties file {path} is larger than {MAX_PROPERTIES_FILE_BYTES} bytes"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ClientPropertiesError(
            f"client properties file {path} is not UTF-8 text (byte {exc.start})"
        ) from None
    return read_properties_text(text, source=str(path))


# ------------------------------------------------------------------------------ meaning
# Keys raftlog reads; everything else is reported as ignored.
_SECURITY_KEYS = frozenset(
    {
        "security.protocol",
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "sasl.jaas.config",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
        "ssl.endpoint.identification.algorithm",
        "enable.ssl.certificate.verification",
        "ssl.truststore.location",
        "ssl.truststore.type",
        "ssl.keystore.location",
        "ssl.keystore.type",
    }
)
_GENERAL_KEYS = frozenset({"bootstrap.servers", "metadata.broker.list", "client.id"})


def parse_client_properties(
    values: Mapping[str, str], *, source: str = "client properties"
) -> ClientProperties:
    """Turn raw key -> value pairs into ClientProperties; raises ClientPropertiesError."""

    def get(key: str) -> str | None:
        value = values.get(key)
        return None if value is None else str(value).strip()

    def bad(key: str, why: str) -> ClientPropertiesError:
        return ClientPropertiesError(f"{source}: {key} {why}")

    protocol_text = get("security.protocol") or "PLAINTEXT"
    try:
        protocol = SecurityProtocol(protocol_text.upper())
    except ValueError:
        raise bad(
            "security.protocol",
            f"must be one of {', '.join(p.value for p in SecurityProtocol)}, "
            f"got {_shown(protocol_text)}",
        ) from None

    mechanism = _mechanism(get("sasl.mechanism"), get("sasl.mechanisms"), bad)
    username = get("sasl.username")
    password = values.get("sasl.password")  # not stripped again: inner spaces are its own
    jaas = get("sasl.jaas.config")
    if jaas:
        module, options = parse_jaas_config(jaas, bad)
        implied = "PLAIN" if module == _PLAIN_MODULE else None
        if module == _SCRAM_MODULE and mechanism is not None and not mechanism.startswith("SCRAM"):
            raise bad("sasl.jaas.config", f"uses ScramLoginModule but sasl.mechanism={mechanism}")
        if module == _PLAIN_MODULE and mechanism not in (None, "PLAIN"):
            raise bad("sasl.jaas.config", f"uses PlainLoginModule but sasl.mechanism={mechanism}")
        if module == _SCRAM_MODULE and mechanism is None:
            raise bad("sasl.mechanism", "is needed with ScramLoginModule (SCRAM-SHA-256 or -512)")
        mechanism = mechanism or implied
        username = username or options.get("username")
        password = password if password is not None else options.get("password")
    if username is not None and len(username) > MAX_USERNAME_CHARS:
        raise bad("sasl.username", f"is longer than {MAX_USERNAME_CHARS} characters")
    if password is not None and len(password) > MAX_PASSWORD_CHARS:
        raise bad("sasl.password", f"is longer than {MAX_PASSWORD_CHARS} characters")

    ca = get("ssl.ca.location")
    truststore = get("ssl.truststore.location")
    if truststore:
        _require_pem(get("ssl.truststore.type"), "ssl.truststore.type", bad)
        if ca and ca != truststore:
            raise bad("ssl.truststore.location", "and ssl.ca.location name different files")
        ca = ca or truststore
    certificate = get("ssl.certificate.location")
    key = get("ssl.key.location")
    keystore = get("ssl.keystore.location")
    if keystore:
        # A PEM keystore holds the certificate chain and the key in one file.
        _require_pem(get("ssl.keystore.type"), "ssl.keystore.type", bad)
        certificate = certificate or keystore
        key = key or keystore

    # Java's clients turn the check off with an empty value, librdkafka with "none".
    identification_text = get("ssl.endpoint.identification.algorithm")
    identification = "https" if identification_text is None else identification_text.lower()
    if identification not in ("https", "none", ""):
        raise bad(
            "ssl.endpoint.identification.algorithm",
            f"must be https or none, got {_shown(identification)}",
        )
    verify = _boolean(get("enable.ssl.certificate.verification"), True,
                      "enable.ssl.certificate.verification", bad)  # fmt: skip

    for name, path in (("ssl.ca.location", ca), ("ssl.certificate.location", certificate),
                       ("ssl.key.location", key)):  # fmt: skip
        if path is not None and path == "":
            raise bad(name, "is empty")

    try:
        security = ClientSecurity(
            protocol=protocol,
            sasl_mechanism=mechanism if protocol.uses_sasl else None,
            sasl_username=username if protocol.uses_sasl else None,
            sasl_password=password if protocol.uses_sasl else None,
            ssl_ca_location=ca,
            ssl_certificate_location=certificate,
            ssl_key_location=key,
            ssl_key_password=values.get("ssl.key.password"),
            ssl_check_hostname=identification == "https",
            ssl_verify_certificate=verify,
        )
    except ClientPropertiesError as exc:
        raise ClientPropertiesError(f"{source}: {exc}") from None
    bootstrap = get("bootstrap.servers") or get("metadata.broker.list")
    ignored = sorted(k for k in values if k not in _SECURITY_KEYS and k not in _GENERAL_KEYS)
    return ClientProperties(
        security=security,
        bootstrap_servers=bootstrap or None,
        client_id=get("client.id") or None,
        ignored_keys=tuple(ignored),
    )


def load_client_properties(path: str | Path) -> ClientProperties:
    """Read and interpret a client properties file; TLS files named in it must exist."""
    properties = parse_client_properties(load_properties_file(path), source=str(path))
    security = properties.security
    for key, location in (
        ("ssl.ca.location", security.ssl_ca_location),
        ("ssl.certificate.location", security.ssl_certificate_location),
        ("ssl.key.location", security.ssl_key_location),
    ):
        if location is not None and security.uses_tls and not Path(location).is_file():
            raise ClientPropertiesError(f"{path}: {key} {location} is not a readable file")
    return properties


def _mechanism(singular: str | None, plural: str | None, bad: _Bad) -> str | None:
    if singular and plural and singular.upper() != plural.upper():
        raise bad("sasl.mechanism", f"({singular}) and sasl.mechanisms ({plural}) disagree")
    text = singular or plural
    if not text:
        return None
    key = "sasl.mechanism" if singular else "sasl.mechanisms"
    name = text.upper()
    if name in _UNSUPPORTED_MECHANISMS:
        raise bad(key, f"{name} is not supported by raftlog (use {', '.join(SASL_MECHANISMS)})")
    if name not in SASL_MECHANISMS:
        raise bad(key, f"must be one of {', '.join(SASL_MECHANISMS)}, got {_shown(text)}")
    return name


def _require_pem(kind: str | None, key: str, bad: _Bad) -> None:
    if (kind or "JKS").upper() != "PEM":
        raise bad(key, f"must be PEM (raftlog reads no {kind or 'JKS'} store; the default is JKS)")


def _boolean(text: str | None, default: bool, key: str, bad: _Bad) -> bool:
    if text is None or text == "":
        return default
    lowered = text.lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise bad(key, f"must be true or false, got {_shown(text)}")


_JAAS_OPTION = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s;"]+)')


def parse_jaas_config(text: str, bad: _Bad) -> tuple[str, dict[str, str]]:
    """`<LoginModule> required key="value" ...;` -> (module, options).

    One login module only (a client has one); PlainLoginModule and ScramLoginModule only.
    """
    match = re.match(r"\s*([A-Za-z0-9_.$]+)\s+([A-Za-z]+)", text)
    if match is None:
        raise bad("sasl.jaas.config", "must look like '<LoginModule> required username=... ;'")
    module, flag = match.group(1), match.group(2).lower()
    if module not in (_PLAIN_MODULE, _SCRAM_MODULE):
        raise bad(
            "sasl.jaas.config",
            f"uses {_shown(module, 80)}; raftlog reads PlainLoginModule and ScramLoginModule",
        )
    if flag not in _JAAS_FLAGS:
        raise bad("sasl.jaas.config", f"has flag {_shown(flag)}; expected one of {_JAAS_FLAGS}")
    rest = text[match.end() :]
    options: dict[str, str] = {}
    position = 0
    while True:
        option = _JAAS_OPTION.match(rest, position)
        if option is None:
            break
        value = option.group(2)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        options[option.group(1)] = value
        position = option.end()
    tail = rest[position:].strip()
    if tail != ";":
        what = "ends without ';'" if not tail else f"cannot be read at {_shown(tail)}"
        raise bad("sasl.jaas.config", what)
    return module, options


__all__ = [
    "PLAINTEXT",
    "SASL_MECHANISMS",
    "ClientProperties",
    "ClientPropertiesError",
    "ClientSecurity",
    "SecurityProtocol",
    "load_client_properties",
    "load_properties_file",
    "parse_client_properties",
    "read_properties_text",
]
