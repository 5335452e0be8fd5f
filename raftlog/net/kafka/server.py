"""The Kafka client listener: framing, per-connection ordering, limits, dispatch.

One task reads frames from a connection and starts a handler task per request; one task
writes responses strictly in request order (Kafka clients match responses to requests by
order as well as by correlation id), waiting for each handler in turn. At most
`max_inflight_requests_per_connection` requests are read before their responses are written,
so a fast client cannot queue unbounded work. Anything wrong with one connection (bad frame,
unknown API) closes that connection with a log line; the listener keeps serving the rest.

The listener's `ListenerGuard` (raftlog.net.limits) caps connections in total and per IP, and
gives each connection's reader the idle and read timeouts and an account on the listener's
queued request bytes: a request's bytes count from the moment they are read until its response
is written (or, with acks=0, its handler is done).

A listener has a name and a security protocol (`ListenerSecurity`; the default is one
PLAINTEXT listener and costs nothing per request). SSL and SASL_SSL wrap each accepted stream
in TLS, with the handshake bounded by request_read_timeout_ms; a failed handshake closes with
one info line. SASL_PLAINTEXT and SASL_SSL give each connection a `SaslSession`
(handlers_sasl.py) that admits only the SASL requests until the client has authenticated.
Responses on TLS streams go out as bytes (sendfile needs a plain socket; fetch_send falls back).
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode, KafkaError, RemoteError
from raftlog.metrics.instruments import RequestMetrics, response_error_codes
from raftlog.net import tls
from raftlog.net.framing import FrameError, FrameReader
from raftlog.net.kafka import codec
from raftlog.net.kafka.apis import ApiKey, ApiRegistry, ApiSpec, default_registry
from raftlog.net.kafka.backend import KafkaBackend
from raftlog.net.kafka.context import EndpointLookup, NoQuotas, QuotaHook, RequestContext
from raftlog.net.kafka.fetch_send import (
    COALESCE_MAX_BYTES,
    send_response,
    send_responses,
    sendfile_capable,
    small_frame,
)
from raftlog.net.kafka.handlers_sasl import (
    ANONYMOUS_PRINCIPAL,
    SASL_AUTHENTICATE,
    SASL_AUTHENTICATE_VERSIONS,
    SASL_HANDSHAKE,
    SASL_HANDSHAKE_VERSIONS,
    Admission,
    SaslAnswer,
    SaslSession,
    backend_lookup,
    handle_sasl_unexpected,
    user_of,
)
from raftlog.net.kafka.turns import Turns
from raftlog.net.limits import ListenerGuard, ListenerLimits
from raftlog.security.sasl import CredentialLookup

log = logging.getLogger("raftlog.kafka")

ANONYMOUS_USER = "ANONYMOUS"
# After a response that ends the connection (a failed authentication), how long the writer
# may take to put it on the wire before the connection is dropped anyway.
CLOSE_AFTER_RESPONSE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ListenerSecurity:
    """How one Kafka listener authenticates its clients (the default: PLAINTEXT, nobody)."""

    name: str = "PLAINTEXT"
    security_protocol: str = "PLAINTEXT"
    # Server-side TLS context for SSL and SASL_SSL (raftlog.security.tls.server_context).
    ssl_context: ssl.SSLContext | None = None
    # principal_of_certificate(getpeercert() dict) -> "User:<name>"; raises ValueError for a
    # certificate no rule maps. None: certificates give no principal.
    principal_of_certificate: Callable[[dict[str, Any]], str] | None = None
    sasl_mechanisms: tuple[str, ...] = ()
    # SCRAM credentials by user; None reads them from the backend's `scram_credential`.
    credential_lookup: CredentialLookup | None = None
    connections_max_reauth_ms: int = 0
    handshake_timeout_ms: int = 30_000

    @property
    def sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")


PLAINTEXT = ListenerSecurity()


class _CloseConnection(RemoteError):
    """The request cannot be answered; Kafka closes the connection in this case."""


@dataclass
class _Slot:
    """One request's place in the connection's response order."""

    correlation_id: int
    done: trio.Event = field(default_factory=trio.Event)
    segments: list[codec.Segment] | None = None  # None: no response (acks=0)
    request_bytes: int = 0  # the request's payload, counted in queued_max_request_bytes
    close_after: bool = False  # end the connection once this response is written


@dataclass
class ServerState:
    backend: KafkaBackend
    config: NodeConfig
    registry: ApiRegistry
    quotas: QuotaHook
    guard: ListenerGuard
    security: ListenerSecurity = PLAINTEXT
    endpoints: EndpointLookup | None = None
    credential_lookup: CredentialLookup | None = None
    connections_open: int = 0
    metrics: RequestMetrics | None = None  # None: requests are not measured


class Connection:
    """One client connection (implements context.ConnectionHandle)."""

    def __init__(
        self,
        state: ServerState,
        stream: trio.SocketStream | trio.abc.Stream,
        *,
        peer: str | None = None,
        principal: str = ANONYMOUS_PRINCIPAL,
        guard_key: object = None,
    ) -> None:
        self._state = state
        self._stream = stream
        self._use_sendfile = sendfile_capable(stream)
        self._inflight = trio.Semaphore(state.config.max_inflight_requests_per_connection)
        self._produce_turns = Turns()
        self._muted_until = 0.0
        self.client_id = ""
        self.principal = principal
        self.user = ANONYMOUS_USER if principal == ANONYMOUS_PRINCIPAL else user_of(principal)
        self.peer = peer if peer is not None else _peer_name(stream)
        security = state.security
        self.listener = security.name
        self._sasl: SaslSession | None = None
        if security.sasl:
            assert state.credential_lookup is not None
            self._sasl = SaslSession(
                security.sasl_mechanisms,
                state.credential_lookup,
                reauth_ms=security.connections_max_reauth_ms,
                peer=self.peer,
                listener=security.name,
            )
        self._reader = state.guard.frame_reader(
            stream, state.config.socket_request_max_bytes, key=guard_key
        )

    def mute(self, duration_ms: int) -> None:
        if duration_ms > 0:
            self._muted_until = max(self._muted_until, trio.current_time() + duration_ms / 1000)

    async def run(self) -> None:
        send_slots, receive_slots = trio.open_memory_channel[_Slot](
            self._state.config.max_inflight_requests_per_connection
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write_responses, receive_slots, nursery.cancel_scope)
                try:
                    if await self._read_requests(nursery, send_slots):
                        # The last response ends the connection (a failed authentication):
                        # the writer sends what is queued, then cancels this nursery.
                        send_slots.close()
                        with trio.move_on_after(CLOSE_AFTER_RESPONSE_TIMEOUT_S):
                            await trio.sleep_forever()
                finally:
                    # Either the peer is gone or the connection is being dropped: nothing
                    # that is still pending can be delivered.
                    nursery.cancel_scope.cancel()
        finally:
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                await self._stream.aclose()

    # ------------------------------------------------------------------ reading
    async def _read_requests(
        self, nursery: trio.Nursery, send_slots: trio.MemorySendChannel[_Slot]
    ) -> bool:
        """Read until the peer is gone or the connection must end; True when the last
        response queued must still be written before the connection closes."""
        reader: FrameReader = self._reader
        while True:
            try:
                frame = await reader.read_frame()
            except FrameError as exc:
                log.log(exc.log_level, "closing connection from %s: %s", self.peer, exc)
                return False
            except trio.BrokenResourceError as exc:
                log.info("connection from %s ended mid-frame: %s", self.peer, exc)
                return False
            if frame is None:
                return False
            # Throttled (quota): hold the request until the mute ends, like Kafka muting the
            # channel. Checked after the read because the throttle is usually decided while
            # the reader was already waiting for this frame.
            if self._muted_until > trio.current_time():
                await trio.sleep_until(self._muted_until)
            # This yield (and the one queueing the slot below) lets the handler just started
            # take its first step before the next request's is started: an acks=0 produce
            # then a fetch on one connection must see the produce (Kafka handles a
            # connection's requests in order). Without it both land in one scheduler batch,
            # whose order trio shuffles.
            await self._inflight.acquire()
            try:
                slot = self._dispatch(frame, nursery)
            except (_CloseConnection, codec.MalformedRequest) as exc:
                log.warning("closing connection from %s: %s", self.peer, exc)
                return False
            slot.request_bytes = len(frame)
            await send_slots.send(slot)
            if slot.close_after:
                return True

    def _dispatch(self, frame: bytes, nursery: trio.Nursery) -> _Slot:
        api_key, version = codec.peek_api(frame)
        if self._sasl is not None:
            admission = self._sasl.admit(api_key, _now_ms())
            if admission is Admission.CLOSE:
                raise _CloseConnection(f"{self._sasl.refusal} on listener {self.listener}")
            if admission is Admission.SASL:
                return self._answer_sasl(self._sasl, frame, api_key, version)
        spec = self._state.registry.get(api_key)
        if spec is None or not spec.supports(version):
            header = codec.parse_header_only(frame)
            self.client_id = header.client_id or self.client_id
            if api_key == ApiKey.API_VERSIONS:
                # As Kafka: answer a too-new ApiVersions with the v0 response carrying
                # UNSUPPORTED_VERSION and our table, so the client retries with a version
                # we speak.
                log.info(
                    "ApiVersions v%d from %s (%s) is unsupported; answering v0",
                    version,
                    self.peer,
                    self.client_id,
                )
                slot = _Slot(header.correlation_id)
                response = codec.build(
                    codec.response_class(ApiKey.API_VERSIONS, 0),
                    {
                        "error_code": ErrorCode.unsupported_version,
                        "api_keys": [
                            {"api_key": k, "min_version": lo, "max_version": hi}
                            for k, lo, hi in self._state.registry.table()
                        ],
                    },
                )
                slot.segments = codec.encode_response(response, header.correlation_id)
                slot.done.set()
                return slot
            what = "unknown api" if spec is None else "unsupported version of"
            raise _CloseConnection(
                f"{what} {codec.api_name(api_key)} (key {api_key}) v{version} "
                f"from client {self.client_id!r}"
            )
        header, body = codec.parse_request(frame, api_key, version)
        self.client_id = header.client_id or ""
        slot = _Slot(header.correlation_id)
        ctx = RequestContext(
            backend=self._state.backend,
            config=self._state.config,
            quotas=self._state.quotas,
            connection=self,
            api_key=api_key,
            api_version=version,
            correlation_id=header.correlation_id,
            client_id=self.client_id,
            api_table=self._state.registry.table(),
            endpoints=self._state.endpoints,
            # The backend swaps in a new authorizer when the ACLs change; each request
            # uses the one current when it was read.
            authorizer=getattr(self._state.backend, "authorizer", None),
            # Taken here, in the reader, so tickets follow the order requests were sent.
            turn=self._produce_turns.take() if api_key == ApiKey.PRODUCE else None,
        )
        nursery.start_soon(self._handle, spec, ctx, body, slot)
        return slot

    def _answer_sasl(self, session: SaslSession, frame: bytes, api_key: int, version: int) -> _Slot:
        """SaslHandshake and SaslAuthenticate are answered here, in the reader, so the state
        they change is in place before the next request is read."""
        handshake = api_key == SASL_HANDSHAKE
        low, high = SASL_HANDSHAKE_VERSIONS if handshake else SASL_AUTHENTICATE_VERSIONS
        if not low <= version <= high:
            raise _CloseConnection(f"unsupported version of {codec.api_name(api_key)} v{version}")
        header, body = codec.parse_request(frame, api_key, version)
        self.client_id = header.client_id or self.client_id
        answer: SaslAnswer
        if api_key == SASL_HANDSHAKE:
            answer = session.handshake(version, body.mechanism)
        else:
            answer = session.authenticate(version, bytes(body.auth_bytes), _now_ms())
        if answer.authenticated_as is not None:
            self.principal = answer.authenticated_as
            self.user = user_of(answer.authenticated_as)
        slot = _Slot(header.correlation_id, close_after=answer.close_after)
        response = codec.build(codec.response_class(api_key, version), answer.response)
        slot.segments = codec.encode_response(response, header.correlation_id)
        slot.done.set()
        return slot

    # ------------------------------------------------------------------ handling
    async def _handle(self, spec: ApiSpec, ctx: RequestContext, body: Any, slot: _Slot) -> None:
        response_cls = codec.response_class(ctx.api_key, ctx.api_version)
        started_s = time.perf_counter()
        result: Any = None
        failed: ErrorCode | None = None
        try:
            with self._state.quotas.request_timer() as handler_time_ms:
                result = await spec.handler(ctx, body)
            ctx.throttle(
                self._state.quotas.record_request(ctx.client_id, self.user, handler_time_ms())
            )
            if result is not None:
                result = {**result, "throttle_time": ctx.throttle_ms}
                slot.segments = codec.encode_response(
                    codec.build(response_cls, result), ctx.correlation_id
                )
        except KafkaError as exc:
            failed = exc.code
            log.info("%s from %s failed: %s", response_cls.__name__, self.peer, exc)
            slot.segments = self._error_response(response_cls, ctx, exc.code)
        except Exception:
            log.exception(
                "handler of %s v%d (client %r, %s) failed",
                codec.api_name(ctx.api_key),
                ctx.api_version,
                ctx.client_id,
                self.peer,
            )
            failed = ErrorCode.unknown_server_error
            slot.segments = self._error_response(response_cls, ctx, failed)
        finally:
            if ctx.turn is not None:
                ctx.turn.done()  # however the handler ended, the next Produce may go
            slot.done.set()
        self.mute(ctx.throttle_ms)
        metrics = self._state.metrics
        if metrics is not None:
            errors = [failed] if failed is not None else response_error_codes(result)
            metrics.observe(ctx.api_key, time.perf_counter() - started_s, errors)

    def _error_response(
        self, response_cls: type[Any], ctx: RequestContext, code: ErrorCode
    ) -> list[codec.Segment] | None:
        try:
            response = codec.zero_response(response_cls, code)
            return codec.encode_response(response, ctx.correlation_id)
        except Exception:
            log.exception("cannot encode an error response for %s", response_cls.__name__)
            return None

    # ------------------------------------------------------------------ writing
    async def _write_responses(
        self, receive_slots: trio.MemoryReceiveChannel[_Slot], cancel_scope: trio.CancelScope
    ) -> None:
        carried: _Slot | None = None
        try:
            while True:
                slot = carried if carried is not None else await receive_slots.receive()
                carried = None
                await slot.done.wait()
                # Pipelining clients often have several answers ready at once: small ones
                # that are already finished go out together, in order, in one send.
                frames: list[bytes] = []
                released: list[_Slot] = []
                alone: _Slot | None = None  # a finished response too big to coalesce
                while True:
                    frame = None if slot.segments is None else small_frame(slot.segments)
                    if slot.segments is not None and frame is None:
                        alone = slot  # large or zero-copy: sent on its own below
                        break
                    if frame is not None:
                        frames.append(frame)
                    released.append(slot)
                    if sum(map(len, frames)) >= COALESCE_MAX_BYTES:
                        break
                    try:
                        following = receive_slots.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                    if not following.done.is_set():
                        carried = following
                        break
                    slot = following
                if frames:
                    await send_responses(self._stream, frames)
                for answered in released:
                    self._answered(answered)
                if alone is not None:
                    assert alone.segments is not None
                    await send_response(self._stream, alone.segments, self._use_sendfile)
                    self._answered(alone)
        except trio.EndOfChannel:
            pass  # the reader is done: no more responses
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.info("cannot write to %s: %s", self.peer, exc)
        # A writer that stops (peer gone) ends the connection.
        cancel_scope.cancel()

    def _answered(self, slot: _Slot) -> None:
        self._inflight.release()
        self._reader.frame_answered(slot.request_bytes)


def _now_ms() -> int:
    return int(trio.current_time() * 1000)


def _peer_name(stream: Any) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
    except (AttributeError, OSError):
        return "?"
    return f"{host}:{port}"


async def serve(
    backend: KafkaBackend,
    host: str,
    port: int,
    config: NodeConfig,
    *,
    registry: ApiRegistry | None = None,
    quotas: QuotaHook | None = None,
    guard: ListenerGuard | None = None,
    security: ListenerSecurity = PLAINTEXT,
    endpoints: EndpointLookup | None = None,
    metrics: RequestMetrics | None = None,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the Kafka protocol on host:port until cancelled.

    Use with `await nursery.start(serve, ...)`; the started value is the list of bound
    listeners (port 0 picks a free port: read it from listeners[0].socket.getsockname()).
    `guard` defaults to one built from `config`; pass one to watch its counters.
    `security` names the listener and says how it authenticates; `endpoints` gives each
    broker's endpoint per listener name (None: one listener, the registered endpoint).
    `metrics` counts and times each request per API (None: not measured).
    """
    registry = registry or default_registry()
    credential_lookup = None
    if security.sasl:
        if not security.sasl_mechanisms:
            raise ValueError(f"listener {security.name} is SASL but enables no mechanism")
        # ApiVersions on a SASL listener advertises the SASL APIs (librdkafka looks for
        # SaslAuthenticate there); the session answers them, never the registry's handler.
        registry = registry.copy()
        registry.register(SASL_HANDSHAKE, *SASL_HANDSHAKE_VERSIONS, handle_sasl_unexpected)
        registry.register(SASL_AUTHENTICATE, *SASL_AUTHENTICATE_VERSIONS, handle_sasl_unexpected)
        credential_lookup = security.credential_lookup or backend_lookup(backend)
    state = ServerState(
        backend=backend,
        config=config,
        registry=registry,
        quotas=quotas or NoQuotas(),
        # The one default listener keeps the name its log lines always had.
        guard=guard
        or ListenerGuard(
            "Kafka" if security is PLAINTEXT else f"Kafka {security.name}",
            ListenerLimits.from_node_config(config),
            log,
        ),
        security=security,
        endpoints=endpoints,
        credential_lookup=credential_lookup,
        metrics=metrics,
    )
    listeners = await trio.open_tcp_listeners(port, host=host)

    async def handle_connection(raw: trio.SocketStream) -> None:
        peer = _peer_name(raw)
        stream: trio.abc.Stream = raw
        principal = ANONYMOUS_PRINCIPAL
        if security.ssl_context is not None:
            accepted = await _tls_accept(raw, security, peer)
            if accepted is None:
                return
            stream, principal = accepted
        connection = Connection(state, stream, peer=peer, principal=principal, guard_key=raw)
        state.connections_open += 1
        log.debug("connection from %s", connection.peer)
        try:
            await connection.run()
        except Exception:
            # Never let one connection take the listener (and the node) down.
            log.exception("connection from %s failed", connection.peer)
        finally:
            state.connections_open -= 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(state.guard.serve_listeners, handle_connection, listeners)
        task_status.started(listeners)
        await trio.sleep_forever()


async def _tls_accept(
    raw: trio.SocketStream, security: ListenerSecurity, peer: str
) -> tuple[tls.TLSStream, str] | None:
    """The TLS handshake under its deadline; the stream and its certificate's principal, or
    None (after one info line and closing) when the peer does not complete it."""
    assert security.ssl_context is not None
    stream, failure = await tls.handshake(
        raw, security.ssl_context, security.handshake_timeout_ms / 1000, server_side=True
    )
    principal = ANONYMOUS_PRINCIPAL
    if stream is not None:
        certificate = stream.getpeercert()
        if certificate and security.principal_of_certificate is not None:
            try:
                principal = security.principal_of_certificate(certificate)
            except ValueError as exc:
                failure = f"client certificate maps to no principal: {exc}"
    if stream is None or failure:
        log.info("%s listener: TLS handshake with %s failed: %s", security.name, peer, failure)
        await trio.aclose_forcefully(raw)
        return None
    return stream, principal
