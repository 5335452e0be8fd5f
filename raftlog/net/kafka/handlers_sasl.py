"""SASL on a Kafka listener: SaslHandshake (v0-1) and SaslAuthenticate (v0-2), KIP-368.

`SaslSession` is one connection's authentication state, as Kafka's SaslServerAuthenticator
keeps it, without I/O: the server asks it whether a request may be read (`admit`) and hands it
the two SASL requests, which are answered in the reader task itself, in order, so no request
that follows can overtake the state change an answer makes.

States: HANDSHAKE (only ApiVersions and SaslHandshake) -> AUTHENTICATE (only SaslAuthenticate,
as many rounds as the mechanism needs) -> AUTHENTICATED (everything but the SASL requests;
a SaslHandshake starts a KIP-368 re-authentication, which must name the same principal with
the same mechanism). With connections_max_reauth_ms > 0 a session expires: after that only a
re-authentication may follow, anything else closes the connection. SaslHandshake v0 would
mean raw SASL tokens after it; the clients raftlog supports (librdkafka, kafka-python >= 2,
aiokafka, the Java client) send v1 and SaslAuthenticate, so raw tokens are not read.

A failed authentication is answered SASL_AUTHENTICATION_FAILED with the mechanism's safe
message (it never says whether the user exists) and the connection is closed once that
answer is written; the detail goes to this node's log.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any

from raftlog.errors import ErrorCode, KafkaError
from raftlog.net.kafka.context import RequestContext
from raftlog.security import sasl

log = logging.getLogger("raftlog.kafka")

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
API_VERSIONS = 18
SASL_HANDSHAKE_VERSIONS = (0, 1)
SASL_AUTHENTICATE_VERSIONS = (0, 2)
ANONYMOUS_PRINCIPAL = "User:ANONYMOUS"
# Kafka's text for a failed SASL exchange whose mechanism gave no message of its own.
GENERIC_FAILURE = "Authentication failed: invalid credentials with SASL mechanism {}"


class SaslState(enum.Enum):
    HANDSHAKE = "handshake"
    AUTHENTICATE = "authenticate"
    AUTHENTICATED = "authenticated"
    REAUTH_AUTHENTICATE = "reauth_authenticate"
    FAILED = "failed"


class Admission(enum.Enum):
    SERVE = 0  # hand the request to its handler as usual
    SASL = 1  # a SASL request: answer it through the session
    CLOSE = 2  # not allowed now: close the connection (Kafka does the same)


@dataclass(frozen=True, slots=True)
class SaslAnswer:
    """A SASL response (kio field names) and whether to close once it is written."""

    response: dict[str, Any]
    close_after: bool = False
    # Set when this answer completes an authentication: the principal ("User:alice").
    authenticated_as: str | None = None


class SaslSession:
    """One SASL_PLAINTEXT/SASL_SSL connection's authentication state (sans-IO: the caller
    passes `now_ms` in)."""

    def __init__(
        self,
        mechanisms: tuple[str, ...],
        lookup: sasl.CredentialLookup,
        *,
        reauth_ms: int = 0,
        peer: str = "?",
        listener: str = "",
    ) -> None:
        self.mechanisms = mechanisms
        self._lookup = lookup
        self.reauth_ms = reauth_ms
        self.peer = peer
        self.listener = listener
        self.state = SaslState.HANDSHAKE
        self.principal: str | None = None
        self.mechanism: str | None = None
        self.expires_at_ms: int | None = None  # KIP-368 session end (None: no end)
        self._server: sasl.SaslServer | None = None
        self.refusal = ""  # why the last CLOSE admission closed, for the log line

    @property
    def authenticated(self) -> bool:
        return self.state is SaslState.AUTHENTICATED

    def admit(self, api_key: int, now_ms: int) -> Admission:
        state = self.state
        if state is SaslState.AUTHENTICATED:
            if api_key == SASL_HANDSHAKE:
                return Admission.SASL
            if self.expires_at_ms is not None and now_ms >= self.expires_at_ms:
                self.refusal = (
                    f"SASL session of {self.principal} expired (connections_max_reauth_ms "
                    f"= {self.reauth_ms}) without re-authentication"
                )
                return Admission.CLOSE
            if api_key == SASL_AUTHENTICATE:
                self.refusal = "SaslAuthenticate without a SaslHandshake first"
                return Admission.CLOSE
            return Admission.SERVE
        if state is SaslState.HANDSHAKE:
            if api_key == SASL_HANDSHAKE:
                return Admission.SASL
            if api_key == API_VERSIONS:
                return Admission.SERVE
            self.refusal = f"api key {api_key} before SASL authentication"
            return Admission.CLOSE
        if state in (SaslState.AUTHENTICATE, SaslState.REAUTH_AUTHENTICATE):
            if api_key == SASL_AUTHENTICATE:
                return Admission.SASL
            self.refusal = f"api key {api_key} while a SASL exchange is in progress"
            return Admission.CLOSE
        self.refusal = "request after a failed SASL authentication"
        return Admission.CLOSE

    # ------------------------------------------------------------------ SaslHandshake
    def handshake(self, version: int, mechanism: str) -> SaslAnswer:
        enabled = list(self.mechanisms)
        reauth = self.state is SaslState.AUTHENTICATED
        if reauth and mechanism != self.mechanism:
            log.info(
                "SASL re-authentication from %s switched mechanism %s -> %s: closing",
                self.peer,
                self.mechanism,
                mechanism,
            )
            self.state = SaslState.FAILED
            return SaslAnswer(
                {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": enabled},
                close_after=True,
            )
        try:
            server = sasl.new_server(mechanism, self._lookup, self.mechanisms)
        except sasl.UnsupportedSaslMechanism:
            log.info(
                "SASL handshake from %s asks for mechanism %r; enabled: %s: closing",
                self.peer,
                mechanism[:64],
                ",".join(enabled),
            )
            self.state = SaslState.FAILED
            return SaslAnswer(
                {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": enabled},
                close_after=True,
            )
        self._server = server
        if not reauth:
            self.mechanism = mechanism
        self.state = SaslState.REAUTH_AUTHENTICATE if reauth else SaslState.AUTHENTICATE
        return SaslAnswer({"error_code": ErrorCode.none, "mechanisms": enabled})

    # ------------------------------------------------------------------ SaslAuthenticate
    def authenticate(self, version: int, auth_bytes: bytes, now_ms: int) -> SaslAnswer:
        server = self._server
        assert server is not None, "admit() lets SaslAuthenticate in only after a handshake"
        try:
            challenge = server.step(auth_bytes)
        except sasl.SaslAuthenticationFailed as exc:
            return self._fail(str(exc), exc.log_detail)
        except Exception as exc:  # a malformed client message the mechanism refused
            return self._fail(GENERIC_FAILURE.format(self.mechanism), repr(exc))
        if not server.complete:
            return SaslAnswer(_authenticate_response(ErrorCode.none, None, challenge))
        principal = server.principal
        reauth = self.state is SaslState.REAUTH_AUTHENTICATE
        if reauth and principal != self.principal:
            return self._fail(
                "Cannot change principals during re-authentication",
                f"re-authenticated as {principal}, the session is {self.principal}",
            )
        self.state = SaslState.AUTHENTICATED
        self.principal = principal
        self._server = None
        lifetime_ms = 0
        if self.reauth_ms > 0:
            self.expires_at_ms = now_ms + self.reauth_ms
            # v0 has no field to tell the client; its connection still ends at expiry.
            lifetime_ms = self.reauth_ms if version >= 1 else 0
        log.log(
            logging.DEBUG if reauth else logging.INFO,
            "%s %s from %s as %s (%s)",
            "re-authenticated" if reauth else "authenticated",
            self.listener,
            self.peer,
            principal,
            self.mechanism,
        )
        return SaslAnswer(
            _authenticate_response(ErrorCode.none, None, challenge, lifetime_ms),
            authenticated_as=principal,
        )

    def _fail(self, safe_message: str, detail: str) -> SaslAnswer:
        self.state = SaslState.FAILED
        self._server = None
        log.info(
            "SASL %s authentication from %s failed: %s: closing",
            self.mechanism,
            self.peer,
            detail,
        )
        return SaslAnswer(
            _authenticate_response(ErrorCode.sasl_authentication_failed, safe_message),
            close_after=True,
        )


def _authenticate_response(
    code: ErrorCode, message: str | None, auth_bytes: bytes = b"", lifetime_ms: int = 0
) -> dict[str, Any]:
    # session_lifetime exists from v1 on; codec.build leaves it out of v0.
    return {
        "error_code": code,
        "error_message": message,
        "auth_bytes": auth_bytes,
        "session_lifetime": lifetime_ms,
    }


def user_of(principal: str) -> str:
    """The name quotas key by: "User:alice" -> "alice"."""
    _kind, sep, name = principal.partition(":")
    return name if sep else principal


def backend_lookup(backend: Any) -> sasl.CredentialLookup:
    """SCRAM credentials from the metadata image through the backend seam; a backend
    without `scram_credential` knows no users (every authentication fails)."""
    lookup = getattr(backend, "scram_credential", None)
    if lookup is None:
        return _no_credentials
    return lookup  # type: ignore[no-any-return]


def _no_credentials(_user: str, _mechanism: Any) -> None:
    return None


async def handle_sasl_unexpected(ctx: RequestContext, request: Any) -> dict[str, Any]:
    """The registry's entry for both SASL APIs: the server answers them through the
    connection's SaslSession before any handler runs, so reaching this is a state error."""
    raise KafkaError(ErrorCode.illegal_sasl_state, "SASL request outside a SASL exchange")
