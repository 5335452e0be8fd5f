"""One trio TCP connection to a Kafka broker: pipelined requests matched by correlation id.

`open_connection()` connects (with TLS when the ClientSecurity asks for it), starts the reader
task in its own nursery, negotiates API versions (ApiVersions, highest version both sides
support), authenticates with SASL when asked (SaslHandshake v1, then SaslAuthenticate rounds,
the order librdkafka uses) and yields a BrokerConnection.
Requests from many tasks may be in flight at once, up to `max_in_flight_requests`; the reader
hands each response to the task waiting on its correlation id.

A request that times out closes the connection, as Kafka's own clients do: the broker may
still answer it, and the stream position of that answer is no longer known to be useful.
A caller cancelled from outside merely abandons its request; the answer is read and dropped.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from raftlog.client.auth import (
    TlsHandshakeFailed,
    authenticate,
    client_ssl_context,
)
from raftlog.client.properties import PLAINTEXT, ClientSecurity
from raftlog.client.protocol import (
    API_KEYS,
    API_VERSIONS_KEY,
    CLIENT_API_VERSIONS,
    ProtocolError,
    api_name,
    build_request,
    decode_response,
    encode_request,
    error_of,
    peek_correlation_id,
)
from raftlog.codec import I32_MAX
from raftlog.constants import MIB
from raftlog.errors import ErrorCode, RemoteError
from raftlog.net.framing import FrameReader, FrameTooLarge, frame
from raftlog.net.tls import TLSStream

log = logging.getLogger(__name__)

CLIENT_SOFTWARE_NAME = "raftlog-client"
CLIENT_SOFTWARE_VERSION = "0.1.0"
# Correlation ids are int32 and wrap; the in-flight limit keeps wrapped ids from colliding.
_MAX_CORRELATION_ID = I32_MAX


@dataclass(frozen=True)
class ConnectionLimits:
    """Bounds of one connection; all have units in their names."""

    max_frame_bytes: int = 100 * MIB
    max_in_flight_requests: int = 16
    request_timeout_ms: int = 30_000
    connect_timeout_ms: int = 10_000


class ConnectionClosed(RemoteError):
    """The connection is closed (by us, by the peer, or after an error); the request failed."""


class RequestTimeout(RemoteError):
    """No response within the request timeout; the connection has been closed."""


class UnsupportedVersion(RemoteError):
    """The broker supports no version of an API that this client also supports."""


def negotiated_version(
    connection: BrokerConnection, api: str, versions: Mapping[str, tuple[int, int]]
) -> int:
    """The highest version of api that `versions` (a module's own ranges) and the broker
    both support; UnsupportedVersion when none is."""
    client_min, client_max = versions[api]
    broker = connection.broker_versions.get(API_KEYS[api])
    if broker is not None:
        chosen = min(client_max, broker[1])
        if chosen >= max(client_min, broker[0]):
            return chosen
    raise UnsupportedVersion(
        f"broker {connection.address[0]}:{connection.address[1]} does not serve {api}"
    )


async def call_negotiated(
    connection: BrokerConnection,
    api: str,
    values: dict[str, Any],
    versions: Mapping[str, tuple[int, int]],
    *,
    timeout_ms: int | None = None,
) -> Any:
    """Send api at the version negotiated_version picks; timeout_ms overrides the
    connection's."""
    payload = build_request(api, negotiated_version(connection, api, versions), values)
    return await connection.request(payload, timeout_ms=timeout_ms)


class _Pending:
    __slots__ = ("abandoned", "api_key", "api_version", "error", "event", "response")

    def __init__(self, api_key: int, api_version: int) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.event = trio.Event()
        self.response: Any = None
        self.error: Exception | None = None
        self.abandoned = False


class BrokerConnection:
    """A negotiated connection; create it with open_connection()."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        client_id: str | None,
        limits: ConnectionLimits,
        address: tuple[str, int] = ("?", 0),
    ) -> None:
        self._stream = stream
        self._reader = FrameReader(stream, limits.max_frame_bytes)
        self.client_id = client_id
        self.limits = limits
        self.address = address
        self._send_lock = trio.Lock()
        self._in_flight = trio.Semaphore(limits.max_in_flight_requests)
        self._pending: dict[int, _Pending] = {}
        self._next_correlation_id = 0
        self._closed = False
        self.closed_event = trio.Event()
        # api name -> version chosen for this broker (filled by negotiate()).
        self.versions: dict[str, int] = {}
        # api key -> (min, max) the broker announced.
        self.broker_versions: dict[int, tuple[int, int]] = {}
        # trio.current_time() after which the SASL session should be renewed (KIP-368:
        # the broker closes a connection whose session has run out); None: never.
        self.session_renew_at: float | None = None
        # The TLS alert that broke the connection, if one did.
        self.tls_error: ssl.SSLError | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def session_expiring(self) -> bool:
        """Whether the SASL session is near its end: open a new connection instead."""
        return self.session_renew_at is not None and trio.current_time() >= self.session_renew_at

    def version(self, api: str) -> int:
        try:
            return self.versions[api]
        except KeyError:
            raise UnsupportedVersion(
                f"broker {self.address[0]}:{self.address[1]} supports no version of {api} "
                f"in this client's range {CLIENT_API_VERSIONS.get(api)}"
            ) from None

    # ------------------------------------------------------------------ requests
    async def call(self, api: str, values: dict[str, Any], *, timeout_ms: int | None = None) -> Any:
        """Build `values` at the negotiated version of `api`, send it, return the response."""
        payload = build_request(api, self.version(api), values)
        return await self.request(payload, timeout_ms=timeout_ms)

    async def request(
        self, payload: Any, *, timeout_ms: int | None = None, expect_response: bool = True
    ) -> Any:
        """Send a kio request entity; return its response (None if expect_response is False).

        expect_response=False is for produce with acks=0, which Kafka never answers.
        """
        if self._closed:
            raise ConnectionClosed(f"connection to {self._peer} is closed")
        timeout_ms = self.limits.request_timeout_ms if timeout_ms is None else timeout_ms
        api_key = int(type(payload).__api_key__)
        api_version = int(type(payload).__version__)
        async with self._in_flight:
            correlation_id = self._next_correlation_id
            self._next_correlation_id = (correlation_id + 1) % (_MAX_CORRELATION_ID + 1)
            data = encode_request(payload, correlation_id, self.client_id)
            if len(data) > self.limits.max_frame_bytes:
                raise ValueError(
                    f"{api_name(api_key)} request of {len(data)} bytes exceeds "
                    f"max_frame_bytes {self.limits.max_frame_bytes}"
                )
            pending = _Pending(api_key, api_version)
            if expect_response:
                self._pending[correlation_id] = pending
            with trio.move_on_after(timeout_ms / 1000) as scope:
                await self._send(frame(data))
                if not expect_response:
                    return None
                try:
                    await pending.event.wait()
                except trio.Cancelled:
                    # Leave the entry: the reader drops the answer when it comes.
                    pending.abandoned = True
                    raise
            if scope.cancelled_caught:
                pending.abandoned = True
                await self.aclose()
                raise RequestTimeout(
                    f"{api_name(api_key)} to {self._peer} got no response in {timeout_ms} ms"
                )
        if pending.error is not None:
            raise pending.error
        return pending.response

    async def _send(self, data: bytes) -> None:
        async with self._send_lock:
            if self._closed:
                raise ConnectionClosed(f"connection to {self._peer} is closed")
            try:
                await self._stream.send_all(data)
            except BaseException as exc:
                # A cancelled or failed send leaves part of a frame on the wire: the stream
                # can carry nothing more.
                with trio.CancelScope(shield=True):
                    await self.aclose()
                if isinstance(exc.__cause__, ssl.SSLError):
                    self.tls_error = exc.__cause__
                if isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError):
                    raise ConnectionClosed(f"connection to {self._peer} broke: {exc}") from exc
                raise

    # ------------------------------------------------------------------ reading
    async def read_loop(self) -> None:
        """Deliver responses until the stream ends; run by open_connection's nursery."""
        reason = "closed"
        try:
            while True:
                data = await self._reader.read_frame()
                if data is None:
                    reason = "closed by the broker"
                    return
                self._deliver(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            reason = f"broken: {exc}" if not self._closed else "closed"
            if isinstance(exc.__cause__, ssl.SSLError):
                # With TLS 1.3 a server refuses a client certificate after the handshake:
                # the alert arrives here, on the first read.
                self.tls_error = exc.__cause__
                reason = f"broken: TLS: {_tls_reason(exc.__cause__)}"
        except (FrameTooLarge, ProtocolError) as exc:
            reason = f"protocol error: {exc}"
            log.warning("closing connection to %s: %s", self._peer, exc)
        finally:
            self._fail_all(ConnectionClosed(f"connection to {self._peer} {reason}"))
            with trio.CancelScope(shield=True):
                await self.aclose()

    def _deliver(self, data: bytes) -> None:
        correlation_id = peek_correlation_id(data)
        pending = self._pending.pop(correlation_id, None)
        if pending is None:
            raise ProtocolError(f"response with unknown correlation id {correlation_id}")
        try:
            response = decode_response(data, pending.api_key, pending.api_version)
        except ProtocolError as exc:
            if pending.api_key != API_VERSIONS_KEY:
                pending.error = exc
                pending.event.set()
                return
            # A broker that does not know our ApiVersions version answers in v0 (KIP-511).
            response = decode_response(data, API_VERSIONS_KEY, 0)
        pending.response = response
        pending.event.set()

    def _fail_all(self, error: Exception) -> None:
        pending_list = list(self._pending.values())
        self._pending.clear()
        for pending in pending_list:
            pending.error = error
            pending.event.set()

    # ------------------------------------------------------------------ negotiation
    async def negotiate(self) -> None:
        """ApiVersions: pick, per API, the highest version both sides support."""
        version = CLIENT_API_VERSIONS["api_versions"][1]
        response = await self._api_versions(version)
        if error_of(response.error_code) == ErrorCode.unsupported_version:
            broker_range = {int(k.api_key): int(k.max_version) for k in response.api_keys}
            version = min(version, broker_range.get(API_VERSIONS_KEY, 0))
            response = await self._api_versions(version)
        code = error_of(response.error_code)
        if code != ErrorCode.none:
            raise ProtocolError(f"ApiVersions to {self._peer} failed: {code.name}")
        self.broker_versions = {
            int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys
        }
        self.versions = {}
        for api, (client_min, client_max) in CLIENT_API_VERSIONS.items():
            broker = self.broker_versions.get(API_KEYS[api])
            if broker is None:
                continue
            chosen = min(client_max, broker[1])
            if chosen >= max(client_min, broker[0]):
                self.versions[api] = chosen

    async def _api_versions(self, version: int) -> Any:
        payload = build_request(
            "api_versions",
            version,
            {
                "client_software_name": CLIENT_SOFTWARE_NAME,
                "client_software_version": CLIENT_SOFTWARE_VERSION,
            },
        )
        return await self.request(payload)

    # ------------------------------------------------------------------ closing
    async def aclose(self) -> None:
        """Close the stream; waiting requests fail with ConnectionClosed. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._fail_all(ConnectionClosed(f"connection to {self._peer} closed"))
        try:
            await trio.aclose_forcefully(self._stream)
        finally:
            self.closed_event.set()

    @property
    def _peer(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"


@asynccontextmanager
async def open_connection(
    host: str,
    port: int,
    *,
    client_id: str | None = "raftlog",
    limits: ConnectionLimits | None = None,
    security: ClientSecurity = PLAINTEXT,
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[BrokerConnection]:
    """Connect, negotiate versions, authenticate, and yield the connection; closes it on exit.

    ssl_context: a context built once by the caller (Cluster shares one); made from
    `security` when None. Errors while setting up (TLS, ApiVersions, SASL) are raised as
    themselves, not inside an exception group.
    """
    limits = limits or ConnectionLimits()
    timeout_s = limits.connect_timeout_ms / 1000
    stream = await _connect_stream(host, port, timeout_s, security, ssl_context)
    connection = BrokerConnection(stream, client_id=client_id, limits=limits, address=(host, port))
    setup_error: Exception | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.read_loop)
        try:
            with trio.fail_after(timeout_s):
                await connection.negotiate()
                if security.uses_sasl:
                    await authenticate(connection, security)
        except Exception as exc:
            setup_error = exc
            with trio.CancelScope(shield=True):
                await connection.aclose()
            if connection.tls_error is not None:
                setup_error = TlsHandshakeFailed(
                    f"TLS with {host}:{port} failed: {_tls_reason(connection.tls_error)}"
                )
        else:
            try:
                yield connection
            finally:
                with trio.CancelScope(shield=True):
                    await connection.aclose()
    if setup_error is not None:
        raise setup_error


async def _connect_stream(
    host: str,
    port: int,
    timeout_s: float,
    security: ClientSecurity,
    ssl_context: ssl.SSLContext | None,
) -> trio.abc.Stream:
    with trio.fail_after(timeout_s):
        tcp = await trio.open_tcp_stream(host, port)
    if not security.uses_tls:
        return tcp
    if ssl_context is None:
        ssl_context = client_ssl_context(security)
    # The name checked against the certificate is the host we dialled, as in every Kafka
    # client (an address from Metadata is dialled by the name the broker advertised).
    stream = TLSStream(tcp, ssl_context, server_side=False, server_hostname=host)
    try:
        with trio.fail_after(timeout_s):
            await stream.do_handshake()
    except trio.BrokenResourceError as exc:
        await trio.aclose_forcefully(tcp)
        raise TlsHandshakeFailed(
            f"TLS handshake with {host}:{port} failed: {_tls_reason(exc.__cause__)}"
        ) from exc
    except BaseException:
        await trio.aclose_forcefully(tcp)
        raise
    return stream


def _tls_reason(cause: BaseException | None) -> str:
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {cause.verify_message}"
    if isinstance(cause, ssl.SSLError):
        reason = cause.reason or str(cause)
        if reason == "WRONG_VERSION_NUMBER":
            return "the port does not speak TLS (is its listener PLAINTEXT?)"
        if reason in ("TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_HANDSHAKE_FAILURE"):
            return (
                f"refused by the server: {reason.lower()} (does it require a client "
                "certificate? set ssl.certificate.location and ssl.key.location)"
            )
        if reason == "UNEXPECTED_EOF_WHILE_READING":
            return (
                "the server closed the connection during TLS (does it require a client "
                "certificate, or is its listener PLAINTEXT?)"
            )
        return reason.replace("_", " ").lower()
    if cause is None:
        return "the connection closed"
    return str(cause) or type(cause).__name__


async def serve_connection(
    host: str,
    port: int,
    *,
    client_id: str | None,
    limits: ConnectionLimits,
    security: ClientSecurity = PLAINTEXT,
    ssl_context: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[BrokerConnection] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a connection as a nursery task: `conn = await nursery.start(serve_connection, ...)`.

    The task ends when the connection closes, so a pool can hold connections with lifetimes
    of their own inside one long-lived nursery.
    """
    async with open_connection(
        host, port, client_id=client_id, limits=limits, security=security, ssl_context=ssl_context
    ) as connection:
        task_status.started(connection)
        await connection.closed_event.wait()
