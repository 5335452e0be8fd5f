"""SASL mechanisms as sans-IO state machines: PLAIN (RFC 4616) and SCRAM-SHA-256/512
(RFC 5802, RFC 7677), server and client side.

Why this module: the Kafka server hands each SaslAuthenticate payload to `step()` and sends
back what it returns; no socket, clock or trio here, so every exchange is testable byte for
byte. The server side is written for a hostile client: messages are bounded and parsed
strictly (no channel binding, no extensions, no delegation tokens), proofs are compared in
constant time, and a failure says only "invalid credentials" to the client, whatever went
wrong, while the reason goes to the server log through `log_detail`. An unknown SCRAM user
gets a believable exchange with a fake credential derived from a per-process secret and
fails at the last step, so neither the replies nor their timing tell which users exist.
PLAIN checks the password against the user's stored SCRAM credential, so one set of
credentials (KIP-554) serves both mechanisms.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hmac
import secrets
from collections.abc import Callable, Collection
from typing import Protocol

from raftlog.config_listeners import SASL_MECHANISMS
from raftlog.errors import RemoteError
from raftlog.security import scram
from raftlog.security.acl import ScramCredential, ScramMechanism

# The mechanisms implemented here; the config keys and client properties accept these names.
SUPPORTED_MECHANISMS = SASL_MECHANISMS
SCRAM_MECHANISMS = {m.sasl_name: m for m in scram.MECHANISMS}

# One SASL message from a client; a SCRAM client-first with a 255-byte name is far smaller.
MAX_SASL_MESSAGE_BYTES = 4096
MAX_USERNAME_BYTES = 255
MAX_PASSWORD_BYTES = 1024
MAX_NONCE_CHARS = 256
# Server nonce: 24 random bytes, base64url, so it never holds a ','.
SERVER_NONCE_BYTES = 24

GENERIC_FAILURE = "Authentication failed: invalid credentials"
_GS2_HEADER = "n,,"
_CHANNEL_BINDING = base64.b64encode(_GS2_HEADER.encode()).decode()  # "biws"

CredentialLookup = Callable[[str, ScramMechanism], ScramCredential | None]

# Keys the fake credentials of unknown users; new each process, never leaves it.
_PROCESS_FAKE_SECRET = secrets.token_bytes(32)


class SaslAuthenticationFailed(RemoteError):
    """The exchange failed and is over. str() is safe to send to the peer; `log_detail` says
    why, for the local log only."""

    def __init__(self, log_detail: str, client_message: str = GENERIC_FAILURE) -> None:
        super().__init__(client_message)
        self.log_detail = log_detail


class UnsupportedSaslMechanism(RemoteError):
    """The mechanism is unknown or not enabled on this listener (Kafka:
    UNSUPPORTED_SASL_MECHANISM)."""


class SaslServer(Protocol):
    mechanism: str
    complete: bool
    principal: str | None

    def step(self, client_message: bytes) -> bytes:
        """The server's reply to `client_message` (b"" for none). Raises
        SaslAuthenticationFailed, after which the exchange is over."""
        ...


class _State(enum.Enum):
    START = "start"
    SENT_SERVER_FIRST = "sent-server-first"
    COMPLETE = "complete"
    FAILED = "failed"


def new_server(mechanism: str, lookup: CredentialLookup, enabled: Collection[str]) -> SaslServer:
    """A fresh server for one exchange of `mechanism`, if it is supported and enabled."""
    if mechanism not in SUPPORTED_MECHANISMS or mechanism not in enabled:
        raise UnsupportedSaslMechanism(
            f"SASL mechanism {mechanism[:64]!r} is not enabled "
            f"(enabled: {', '.join(m for m in SUPPORTED_MECHANISMS if m in enabled) or 'none'})"
        )
    if mechanism == "PLAIN":
        return PlainServer(lookup)
    return ScramServer(SCRAM_MECHANISMS[mechanism], lookup)


# ---------------------------------------------------------------------------------------------
# PLAIN


class PlainServer:
    """RFC 4616: one message `authzid NUL authcid NUL passwd`, answered with nothing."""

    mechanism = "PLAIN"

    def __init__(self, lookup: CredentialLookup) -> None:
        self._lookup = lookup
        self._state = _State.START
        self.complete = False
        self.principal: str | None = None

    def step(self, client_message: bytes) -> bytes:
        if self._state is not _State.START:
            self._state = _State.FAILED
            raise SaslAuthenticationFailed("PLAIN: message after the exchange ended")
        self._state = _State.FAILED  # until proven otherwise
        username = self._authenticate(client_message)
        self._state = _State.COMPLETE
        self.complete = True
        self.principal = f"User:{username}"
        return b""

    def _authenticate(self, message: bytes) -> str:
        if len(message) > MAX_SASL_MESSAGE_BYTES:
            raise SaslAuthenticationFailed(f"PLAIN: message of {len(message)} bytes")
        parts = message.split(b"\x00")
        if len(parts) != 3:
            raise SaslAuthenticationFailed(f"PLAIN: {len(parts) - 1} NUL separators, want 2")
        authzid_b, user_b, password_b = parts
        if not 1 <= len(user_b) <= MAX_USERNAME_BYTES:
            raise SaslAuthenticationFailed(f"PLAIN: username of {len(user_b)} bytes")
        if not 1 <= len(password_b) <= MAX_PASSWORD_BYTES:
            raise SaslAuthenticationFailed(f"PLAIN: password of {len(password_b)} bytes")
        try:
            authzid = authzid_b.decode("utf-8")
            username = user_b.decode("utf-8")
            password = password_b.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SaslAuthenticationFailed("PLAIN: not UTF-8") from exc
        if authzid and authzid != username:
            raise SaslAuthenticationFailed(f"PLAIN: user {username!r} asked to act as {authzid!r}")
        credential = _lookup_credential(
            self._lookup, username, (ScramMechanism.SCRAM_SHA_512, ScramMechanism.SCRAM_SHA_256)
        )
        if credential is None:
            # Spend what a real check spends, so the time taken does not tell.
            scram.verify_password(
                _fake_credential(ScramMechanism.SCRAM_SHA_512, username), password
            )
            raise SaslAuthenticationFailed(f"PLAIN: unknown user {username!r}")
        if not scram.verify_password(credential, password):
            raise SaslAuthenticationFailed(f"PLAIN: wrong password for user {username!r}")
        return username


class PlainClient:
    """The client side of PLAIN, for raftlog's own client, CLI and tests."""

    mechanism = "PLAIN"

    def __init__(self, username: str, password: str) -> None:
        if len(username.encode("utf-8")) > MAX_USERNAME_BYTES or "\x00" in username:
            raise ValueError("username is too long or holds a NUL")
        if len(password.encode("utf-8")) > MAX_PASSWORD_BYTES or "\x00" in password:
            raise ValueError("password is too long or holds a NUL")
        self._message = b"\x00" + username.encode("utf-8") + b"\x00" + password.encode("utf-8")
        self.complete = False

    def first_message(self) -> bytes:
        return self._message

    def step(self, server_message: bytes) -> bytes | None:
        if server_message:
            raise SaslAuthenticationFailed(
                "PLAIN: server sent data", client_message="Authentication failed: bad server reply"
            )
        self.complete = True
        return None


# ---------------------------------------------------------------------------------------------
# SCRAM


class ScramServer:
    """RFC 5802 server: client-first -> server-first, client-final -> server-final (v=)."""

    def __init__(
        self,
        mechanism: ScramMechanism,
        lookup: CredentialLookup,
        *,
        server_nonce: str | None = None,
        fake_secret: bytes | None = None,
    ) -> None:
        """`server_nonce` and `fake_secret` are for tests (RFC vectors, determinism); a
        server normally draws a random nonce and uses the per-process secret."""
        if mechanism not in scram.MECHANISMS:
            raise UnsupportedSaslMechanism(f"not a SCRAM mechanism: {mechanism!r}")
        if server_nonce is not None and not _is_printable_nonce(server_nonce):
            raise ValueError("server nonce must be printable ASCII without ','")
        self._scram = mechanism
        self.mechanism = mechanism.sasl_name
        self._lookup = lookup
        self._server_nonce = server_nonce
        self._fake_secret = _PROCESS_FAKE_SECRET if fake_secret is None else fake_secret
        self._state = _State.START
        self.complete = False
        self.principal: str | None = None
        # Set by the first step.
        self._username = ""
        self._credential: ScramCredential | None = None
        self._user_known = False
        self._nonce = ""
        self._client_first_bare = ""
        self._server_first = ""

    def step(self, client_message: bytes) -> bytes:
        state = self._state
        self._state = _State.FAILED  # any exception below ends the exchange
        if state is _State.START:
            reply = self._client_first(client_message)
            self._state = _State.SENT_SERVER_FIRST
            return reply
        if state is _State.SENT_SERVER_FIRST:
            reply = self._client_final(client_message)
            self._state = _State.COMPLETE
            self.complete = True
            self.principal = f"User:{self._username}"
            return reply
        raise SaslAuthenticationFailed(f"{self.mechanism}: message after the exchange ended")

    def _client_first(self, message: bytes) -> bytes:
        text = _decode(self.mechanism, message)
        if not text.startswith(_GS2_HEADER):
            # "y" and "p=" ask for channel binding; "a=" for another identity. Neither exists here.
            raise SaslAuthenticationFailed(f"{self.mechanism}: gs2 header is not 'n,,'")
        bare = text[len(_GS2_HEADER) :]
        attributes = _split_attributes(self.mechanism, bare)
        if [name for name, _ in attributes[:2]] != ["n", "r"]:
            raise SaslAuthenticationFailed(
                f"{self.mechanism}: client-first must be n=...,r=... "
                "(mandatory extensions are refused)"
            )
        if len(attributes) > 2:
            # Kafka's tokenauth=true (delegation tokens) and any other extension.
            raise SaslAuthenticationFailed(
                f"{self.mechanism}: extensions are not supported: "
                f"{','.join(name for name, _ in attributes[2:])}"
            )
        username = _decode_saslname(self.mechanism, attributes[0][1])
        client_nonce = attributes[1][1]
        if not 1 <= len(client_nonce) <= MAX_NONCE_CHARS or not _is_printable_nonce(client_nonce):
            raise SaslAuthenticationFailed(f"{self.mechanism}: bad client nonce")
        credential = _lookup_credential(self._lookup, username, (self._scram,))
        self._user_known = credential is not None
        self._credential = credential or _fake_credential(self._scram, username, self._fake_secret)
        self._username = username
        server_nonce = self._server_nonce or base64.urlsafe_b64encode(
            secrets.token_bytes(SERVER_NONCE_BYTES)
        ).decode("ascii")
        self._nonce = client_nonce + server_nonce
        self._client_first_bare = bare
        salt = base64.b64encode(self._credential.salt).decode("ascii")
        self._server_first = f"r={self._nonce},s={salt},i={self._credential.iterations}"
        return self._server_first.encode("ascii")

    def _client_final(self, message: bytes) -> bytes:
        text = _decode(self.mechanism, message)
        attributes = _split_attributes(self.mechanism, text)
        names = [name for name, _ in attributes]
        if names != ["c", "r", "p"]:
            raise SaslAuthenticationFailed(
                f"{self.mechanism}: client-final must be c=...,r=...,p=..., got {names}"
            )
        values = dict(attributes)
        if values["c"] != _CHANNEL_BINDING:
            raise SaslAuthenticationFailed(f"{self.mechanism}: channel binding data is not 'biws'")
        # Kafka's ScramSaslServer accepts a final nonce that ends with the combined one, and
        # librdkafka 2.0 (Debian's kcat) sends the client nonce twice: accept that too. The
        # proof still covers the message exactly as sent, so nothing is weakened.
        nonce = values["r"]
        if len(nonce) > 2 * len(self._nonce) or not hmac.compare_digest(
            nonce[len(nonce) - len(self._nonce) :].encode(), self._nonce.encode()
        ):
            raise SaslAuthenticationFailed(f"{self.mechanism}: nonce does not match")
        proof = _b64decode(self.mechanism, values["p"])
        credential = self._credential
        assert credential is not None  # set by the first step
        if len(proof) != len(credential.stored_key):
            raise SaslAuthenticationFailed(f"{self.mechanism}: proof of {len(proof)} bytes")
        without_proof = text[: text.rindex(",p=")]
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        client_signature = scram.hmac_digest(self._scram, credential.stored_key, auth_message)
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
        proof_ok = hmac.compare_digest(
            scram.hash_digest(self._scram, client_key), credential.stored_key
        )
        if not self._user_known:
            raise SaslAuthenticationFailed(f"{self.mechanism}: unknown user {self._username!r}")
        if not proof_ok:
            raise SaslAuthenticationFailed(
                f"{self.mechanism}: wrong proof (password) for user {self._username!r}"
            )
        server_signature = scram.hmac_digest(self._scram, credential.server_key, auth_message)
        return b"v=" + base64.b64encode(server_signature)


class ScramClient:
    """RFC 5802 client; checks the server's signature before calling the exchange done."""

    def __init__(
        self,
        mechanism: ScramMechanism,
        username: str,
        password: str,
        *,
        client_nonce: str | None = None,
    ) -> None:
        if mechanism not in scram.MECHANISMS:
            raise ValueError(f"not a SCRAM mechanism: {mechanism!r}")
        if not username or len(username.encode("utf-8")) > MAX_USERNAME_BYTES:
            raise ValueError(f"username must be 1..{MAX_USERNAME_BYTES} bytes")
        if client_nonce is not None and not _is_printable_nonce(client_nonce):
            raise ValueError("client nonce must be printable ASCII without ','")
        self._scram = mechanism
        self.mechanism = mechanism.sasl_name
        self._username = username
        self._password = password
        self._client_nonce = client_nonce or base64.urlsafe_b64encode(
            secrets.token_bytes(SERVER_NONCE_BYTES)
        ).decode("ascii")
        self._client_first_bare = f"n={_encode_saslname(username)},r={self._client_nonce}"
        self._expected_server_signature: bytes | None = None
        self._state = _State.START
        self.complete = False

    def first_message(self) -> bytes:
        return (_GS2_HEADER + self._client_first_bare).encode("utf-8")

    def step(self, server_message: bytes) -> bytes | None:
        state = self._state
        self._state = _State.FAILED
        if state is _State.START:
            reply = self._server_first(server_message)
            self._state = _State.SENT_SERVER_FIRST
            return reply
        if state is _State.SENT_SERVER_FIRST:
            self._server_final(server_message)
            self._state = _State.COMPLETE
            self.complete = True
            return None
        raise _client_failure(f"{self.mechanism}: message after the exchange ended")

    def _server_first(self, message: bytes) -> bytes:
        text = _decode(self.mechanism, message)
        attributes = _split_attributes(self.mechanism, text)
        if [name for name, _ in attributes] != ["r", "s", "i"]:
            raise _client_failure(f"{self.mechanism}: server-first is not r=,s=,i=")
        values = dict(attributes)
        nonce = values["r"]
        if (
            not nonce.startswith(self._client_nonce)
            or len(nonce) == len(self._client_nonce)
            or not _is_printable_nonce(nonce)
        ):
            raise _client_failure(f"{self.mechanism}: server nonce does not extend ours")
        salt = _b64decode(self.mechanism, values["s"])
        if not values["i"].isdigit() or len(values["i"]) > 9:
            raise _client_failure(f"{self.mechanism}: bad iteration count")
        iterations = int(values["i"])
        try:
            salted = scram.salted_password(self._scram, self._password, salt, iterations)
        except ValueError as exc:
            raise _client_failure(f"{self.mechanism}: {exc}") from exc
        without_proof = f"c={_CHANNEL_BINDING},r={nonce}"
        auth_message = f"{self._client_first_bare},{text},{without_proof}".encode()
        client_key = scram.client_key(self._scram, salted)
        stored_key = scram.hash_digest(self._scram, client_key)
        client_signature = scram.hmac_digest(self._scram, stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, client_signature, strict=True))
        self._expected_server_signature = scram.hmac_digest(
            self._scram, scram.server_key(self._scram, salted), auth_message
        )
        return f"{without_proof},p={base64.b64encode(proof).decode('ascii')}".encode("ascii")

    def _server_final(self, message: bytes) -> None:
        text = _decode(self.mechanism, message)
        if text.startswith("e="):
            raise _client_failure(f"{self.mechanism}: server error {text[2:]!r}")
        if not text.startswith("v="):
            raise _client_failure(f"{self.mechanism}: server-final is not v=")
        signature = _b64decode(self.mechanism, text[2:])
        expected = self._expected_server_signature
        assert expected is not None  # set by the previous step
        if not hmac.compare_digest(signature, expected):
            raise _client_failure(f"{self.mechanism}: server signature does not match")


# ---------------------------------------------------------------------------------------------
# Parsing helpers: strict, bounded, and every failure a SaslAuthenticationFailed.


def _client_failure(detail: str) -> SaslAuthenticationFailed:
    return SaslAuthenticationFailed(
        detail, client_message="Authentication failed: the server could not be verified"
    )


def _decode(mechanism: str, message: bytes) -> str:
    if len(message) > MAX_SASL_MESSAGE_BYTES:
        raise SaslAuthenticationFailed(f"{mechanism}: message of {len(message)} bytes")
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SaslAuthenticationFailed(f"{mechanism}: message is not UTF-8") from exc
    if "\x00" in text:
        raise SaslAuthenticationFailed(f"{mechanism}: message holds a NUL")
    return text


def _split_attributes(mechanism: str, text: str) -> list[tuple[str, str]]:
    """`a=value,b=value` into pairs; attribute names are single ASCII letters (RFC 5802)."""
    pairs: list[tuple[str, str]] = []
    for part in text.split(","):
        if len(part) < 2 or part[1] != "=" or not (part[0].isascii() and part[0].isalpha()):
            raise SaslAuthenticationFailed(f"{mechanism}: malformed attribute {part[:16]!r}")
        pairs.append((part[0], part[2:]))
    return pairs


def _is_printable_nonce(nonce: str) -> bool:
    # RFC 5802 printable: %x21-2B / %x2D-7E (no ',').
    return bool(nonce) and all("!" <= ch <= "~" and ch != "," for ch in nonce)


def _encode_saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _decode_saslname(mechanism: str, value: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "=":
            escape = value[i : i + 3]
            if escape == "=2C":
                out.append(",")
            elif escape == "=3D":
                out.append("=")
            else:
                raise SaslAuthenticationFailed(f"{mechanism}: bad '=' escape in username")
            i += 3
        else:
            out.append(ch)
            i += 1
    name = "".join(out)
    if not 1 <= len(name.encode("utf-8")) <= MAX_USERNAME_BYTES:
        raise SaslAuthenticationFailed(f"{mechanism}: username length out of range")
    return name


def _b64decode(mechanism: str, value: str) -> bytes:
    try:
        decoded = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise SaslAuthenticationFailed(f"{mechanism}: bad base64") from exc
    # Only the canonical spelling: stray low bits in the last character are refused too.
    if base64.b64encode(decoded).decode("ascii") != value:
        raise SaslAuthenticationFailed(f"{mechanism}: non-canonical base64")
    return decoded


def _lookup_credential(
    lookup: CredentialLookup, username: str, mechanisms: tuple[ScramMechanism, ...]
) -> ScramCredential | None:
    """The first valid stored credential among `mechanisms`; a malformed one counts as none."""
    for mechanism in mechanisms:
        credential = lookup(username, mechanism)
        if credential is None or credential.mechanism != mechanism:
            continue
        try:
            return scram.validate_credential(credential)
        except ValueError:
            continue
    return None


def _fake_credential(
    mechanism: ScramMechanism, username: str, secret: bytes = _PROCESS_FAKE_SECRET
) -> ScramCredential:
    """A stable credential for a user that does not exist: the same salt on every attempt
    (a fresh one would give the game away) and keys nobody can match."""
    seed = scram.hmac_digest(mechanism, secret, b"fake\x00" + username.encode("utf-8"))
    size = len(seed)
    return ScramCredential(
        mechanism=mechanism,
        salt=scram.hmac_digest(mechanism, seed, b"salt")[: scram.DEFAULT_SALT_BYTES],
        stored_key=scram.hmac_digest(mechanism, seed, b"stored")[:size],
        server_key=scram.hmac_digest(mechanism, seed, b"server")[:size],
        iterations=scram.MIN_ITERATIONS,
    )
