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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import trio

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode, KafkaError, RemoteError
from raftlog.net.framing import FrameError, FrameReader
from raftlog.net.kafka import codec
from raftlog.net.kafka.apis import ApiKey, ApiRegistry, ApiSpec, default_registry
from raftlog.net.kafka.backend import KafkaBackend
from raftlog.net.kafka.context import NoQuotas, QuotaHook, RequestContext
from raftlog.net.kafka.fetch_send import (
    COALESCE_MAX_BYTES,
    send_response,
    send_responses,
    sendfile_capable,
    small_frame,
)
from raftlog.net.limits import ListenerGuard, ListenerLimits

log = logging.getLogger("raftlog.kafka")

ANONYMOUS_USER = "ANONYMOUS"


class _CloseConnection(RemoteError):
    """The request cannot be answered; Kafka closes the connection in this case."""


@dataclass
class _Slot:
    """One request's place in the connection's response order."""

    correlation_id: int
    done: trio.Event = field(default_factory=trio.Event)
    segments: list[codec.Segment] | None = None  # None: no response (acks=0)
    request_bytes: int = 0  # the request's payload, counted in queued_max_request_bytes


@dataclass
class ServerState:
    backend: KafkaBackend
    config: NodeConfig
    registry: ApiRegistry
    quotas: QuotaHook
    guard: ListenerGuard
    connections_open: int = 0


class Connection:
    """One client connection (implements context.ConnectionHandle)."""

    def __init__(self, state: ServerState, stream: trio.SocketStream | trio.abc.Stream) -> None:
        self._state = state
        self._stream = stream
        self._use_sendfile = sendfile_capable(stream)
        self._inflight = trio.Semaphore(state.config.max_inflight_requests_per_connection)
        self._muted_until = 0.0
        self.client_id = ""
        self.user = ANONYMOUS_USER
        self.peer = _peer_name(stream)
        self._reader = state.guard.frame_reader(stream, state.config.socket_request_max_bytes)

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
                    await self._read_requests(nursery, send_slots)
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
    ) -> None:
        reader: FrameReader = self._reader
        while True:
            try:
                frame = await reader.read_frame()
            except FrameError as exc:
                log.log(exc.log_level, "closing connection from %s: %s", self.peer, exc)
                return
            except trio.BrokenResourceError as exc:
                log.info("connection from %s ended mid-frame: %s", self.peer, exc)
                return
            if frame is None:
                return
            # Throttled (quota): hold the request until the mute ends, like Kafka muting the
            # channel. Checked after the read because the throttle is usually decided while
            # the reader was already waiting for this frame.
            if self._muted_until > trio.current_time():
                await trio.sleep_until(self._muted_until)
            await self._inflight.acquire()
            try:
                slot = self._dispatch(frame, nursery)
            except (_CloseConnection, codec.MalformedRequest) as exc:
                log.warning("closing connection from %s: %s", self.peer, exc)
                return
            slot.request_bytes = len(frame)
            await send_slots.send(slot)

    def _dispatch(self, frame: bytes, nursery: trio.Nursery) -> _Slot:
        api_key, version = codec.peek_api(frame)
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
        )
        nursery.start_soon(self._handle, spec, ctx, body, slot)
        return slot

    # ------------------------------------------------------------------ handling
    async def _handle(self, spec: ApiSpec, ctx: RequestContext, body: Any, slot: _Slot) -> None:
        response_cls = codec.response_class(ctx.api_key, ctx.api_version)
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
            slot.segments = self._error_response(response_cls, ctx, ErrorCode.unknown_server_error)
        finally:
            slot.done.set()
        self.mute(ctx.throttle_ms)

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
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the Kafka protocol on host:port until cancelled.

    Use with `await nursery.start(serve, ...)`; the started value is the list of bound
    listeners (port 0 picks a free port: read it from listeners[0].socket.getsockname()).
    `guard` defaults to one built from `config`; pass one to watch its counters.
    """
    state = ServerState(
        backend=backend,
        config=config,
        registry=registry or default_registry(),
        quotas=quotas or NoQuotas(),
        guard=guard or ListenerGuard("Kafka", ListenerLimits.from_node_config(config), log),
    )
    listeners = await trio.open_tcp_listeners(port, host=host)

    async def handle_connection(stream: trio.SocketStream) -> None:
        connection = Connection(state, stream)
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
