"""The client's side of TLS and SASL: the TLS context, and the SASL exchange on a connection.

The mechanisms themselves (PLAIN, SCRAM) are sans-IO state machines in raftlog.security.sasl;
this module drives one over Kafka requests, as librdkafka does after ApiVersions:
SaslHandshake v1 names the mechanism, then each SaslAuthenticate request carries one client
message and its response the server's, until the mechanism has nothing more to send.
"""

from __future__ import annotations

import datetime
import ssl
from typing import Any, Protocol

import trio

from raftlog.client.properties import ClientPropertiesError, ClientSecurity
from raftlog.client.protocol import error_of
from raftlog.errors import ConfigError, ErrorCode, RemoteError
from raftlog.security.acl import ScramMechanism
from raftlog.security.sasl import PlainClient, SaslAuthenticationFailed, ScramClient
from raftlog.security.tls import client_context

# SCRAM takes two rounds and PLAIN one; a server that keeps asking is misbehaving.
MAX_SASL_ROUNDS = 4
# KIP-368: renew a session once this share of its lifetime has passed (Kafka's clients
# pick 85-95%); the connection is then replaced before the broker closes it.
SESSION_RENEW_FRACTION = 0.85


class AuthenticationFailed(RemoteError):
    """SASL authentication failed: the broker refused the credentials or the mechanism, or
    it could not prove it knows them (SCRAM). Retrying with the same settings cannot help."""


class TlsHandshakeFailed(RemoteError):
    """The TLS handshake failed (untrusted or misnamed certificate, or no TLS on the port)."""


class SaslConnection(Protocol):
    """What the exchange needs of a connection (BrokerConnection is one)."""

    address: tuple[str, int]
    versions: dict[str, int]
    session_renew_at: float | None

    async def call(
        self, api: str, values: dict[str, Any], *, timeout_ms: int | None = None
    ) -> Any: ...


def client_ssl_context(security: ClientSecurity) -> ssl.SSLContext:
    """The TLS context for `security` (reads the CA, certificate and key files once)."""
    try:
        context = client_context(
            cafile=security.ssl_ca_location,
            certfile=security.ssl_certificate_location,
            keyfile=security.ssl_key_location,
            check_hostname=security.ssl_check_hostname and security.ssl_verify_certificate,
            key_password=security.ssl_key_password,
        )
    except ConfigError as exc:
        raise ClientPropertiesError(f"cannot set up TLS: {exc}") from None
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ClientPropertiesError(f"cannot set up TLS: {_reason(exc)}") from None
    if not security.ssl_verify_certificate:
        # librdkafka's enable.ssl.certificate.verification=false, asked for in so many words.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return str(exc)


def mechanism_client(security: ClientSecurity) -> PlainClient | ScramClient:
    name = security.sasl_mechanism
    username = security.sasl_username or ""
    password = security.sasl_password or ""
    try:
        if name == "PLAIN":
            return PlainClient(username, password)
        if name in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            return ScramClient(ScramMechanism[str(name).replace("-", "_")], username, password)
    except ValueError as exc:
        raise ClientPropertiesError(f"sasl.username/sasl.password: {exc}") from None
    raise ClientPropertiesError(f"sasl.mechanism {name!r} is not supported")


async def authenticate(connection: SaslConnection, security: ClientSecurity) -> None:
    """SaslHandshake v1 + SaslAuthenticate rounds; raises AuthenticationFailed."""
    peer = f"{connection.address[0]}:{connection.address[1]}"
    mechanism = str(security.sasl_mechanism)
    if (
        "sasl_handshake" not in connection.versions
        or "sasl_authenticate" not in connection.versions
    ):
        # SaslHandshake v0 sends raw tokens outside Kafka framing; no current broker needs it.
        raise AuthenticationFailed(
            f"the broker at {peer} offers no SaslHandshake v1/SaslAuthenticate (no SASL on "
            "this listener?)"
        )
    handshake = await connection.call("sasl_handshake", {"mechanism": mechanism})
    code = error_of(handshake.error_code)
    if code == ErrorCode.unsupported_sasl_mechanism:
        enabled = ", ".join(handshake.mechanisms) or "none"
        raise AuthenticationFailed(
            f"the broker at {peer} does not enable SASL mechanism {mechanism} (enabled: {enabled})"
        )
    if code != ErrorCode.none:
        raise AuthenticationFailed(f"SASL handshake with {peer} failed: {code.name}")
    client = mechanism_client(security)
    try:
        message: bytes | None = client.first_message()
        rounds = 0
        while message is not None:
            rounds += 1
            if rounds > MAX_SASL_ROUNDS:
                raise AuthenticationFailed(
                    f"SASL {mechanism} with {peer} did not finish in {MAX_SASL_ROUNDS} rounds"
                )
            response = await connection.call("sasl_authenticate", {"auth_bytes": message})
            code = error_of(response.error_code)
            if code != ErrorCode.none:
                detail = response.error_message or code.name
                raise AuthenticationFailed(
                    f"authentication as {security.sasl_username!r} with {mechanism} "
                    f"at {peer} failed: {detail}"
                )
            _note_session_lifetime(connection, response)
            message = client.step(bytes(response.auth_bytes))
    except SaslAuthenticationFailed as exc:
        # Our own mechanism refused the server's reply; its detail is ours to show.
        raise AuthenticationFailed(
            f"authentication with {mechanism} at {peer} failed: {exc.log_detail}"
        ) from None


def _note_session_lifetime(connection: SaslConnection, response: Any) -> None:
    lifetime = getattr(response, "session_lifetime", None)
    if isinstance(lifetime, datetime.timedelta):
        lifetime_s = lifetime.total_seconds()
    else:
        lifetime_s = float(lifetime or 0) / 1000
    if lifetime_s > 0:
        connection.session_renew_at = trio.current_time() + lifetime_s * SESSION_RENEW_FRACTION
