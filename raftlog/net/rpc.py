"""Internal RPC between nodes: length-prefixed msgpack frames over TCP.

Two kinds of traffic share one connection per peer:
- casts: one-way messages (Raft's Vote/Fetch/... and their answers), fire-and-forget. The Raft
  core tolerates loss, so a full send queue drops the cast instead of blocking the caller.
- calls: request/response with a correlation id (controller requests, partition fetches).

Every frame is msgpack of a list: [kind, correlation_id, sender_id, method, body], declared
through raftlog.codec; each method declares its body. No pickle ever crosses a socket. Byte
strings of TAIL_MIN_BYTES or more in a body (records) follow the envelope raw, as its tails
(see TAILED_FRAME_MARKER), so that neither side's msgpack copies them.

A server-side connection speaks for one node id only (its `PeerIdentity`): the id is bound at
the first frame, a later frame claiming another id closes the connection, and handlers get the
bound id, never a per-frame claim. A handler that finds a body naming another node raises
`IdentityMismatch`, which also closes the connection. Errors answered to a peer carry the
exception's type only; the detail goes to this node's log.

With internal_security_protocol = SSL both sides use mutual TLS: `serve_rpc(ssl_context=...)`
accepts only peers with a certificate from the cluster CA, and its `identify` seam binds the
connection to the node id the certificate names (net/tls.py: CN "node-<id>") before any frame
is read; `PeerSet(ssl_context=...)` dials with this node's certificate and checks that the
peer's certificate names the node it meant to reach.
"""

from __future__ import annotations

import logging
import math
import random
import ssl
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import msgpack
import trio

from raftlog.codec import Array, Codec, DecodeError, MaxLen, NodeId, Opaque, Range, Size
from raftlog.constants import FRAME_SIZE_PREFIX_BYTES
from raftlog.errors import RemoteError
from raftlog.net import tls
from raftlog.net.framing import (
    SEND_MAX_PIECES,
    FrameError,
    FrameReader,
    FrameTooLarge,
    send_pieces,
)
from raftlog.net.limits import (
    DEFAULT_LISTENER_LIMITS,
    ListenerGuard,
    ListenerLimits,
    RateLimitedLog,
)
from raftlog.security.principal import distinguished_name

log = logging.getLogger("raftlog.rpc")
_failed_calls = RateLimitedLog(log)

KIND_CAST = 0
KIND_REQUEST = 1
KIND_RESPONSE = 2
KIND_ERROR = 3
# Method names are short constants ("raft", "replica.fetch"); a longer one is garbage.
MAX_METHOD_CHARS = 64

Handler = Callable[[int, str, Any], Awaitable[Any]]
"""handler(sender_id, method, body) -> response body (ignored for casts)."""
UnreachableListener = Callable[[int], None]
"""listener(peer_id): a connection attempt to that peer just failed."""
Identify = Callable[[trio.abc.Stream], "PeerIdentity | None"]
"""identify(stream): the identity a new connection speaks for (an authenticated listener's
seam: it returns PeerIdentity(node id proved), already bound), or None to refuse it (identify
logs why; the listener closes it). Under TLS `stream` is the net.tls.TLSStream after its
handshake, so getpeercert() holds the verified certificate."""


def identify_by_certificate(stream: trio.abc.Stream) -> PeerIdentity | None:
    """`identify` for internal mutual TLS: the connection speaks for the node its verified
    certificate names (subject CN "node-<id>", net/tls.py); a certificate naming no node is
    refused with one log line. The cluster CA that signed the certificate vouches for the id:
    a broker joining for the first time is not registered yet and must still reach the
    quorum, so the id is not checked against the registered brokers here."""
    certificate = stream.getpeercert()  # type: ignore[attr-defined]
    node_id = tls.node_id_from_certificate(certificate)
    if node_id is None:
        subject = certificate.get("subject") if certificate else None
        log.warning(
            "internal listener: closing a connection from %s whose certificate (%s) names no "
            "node; node certificates need the subject CN node-<id>",
            _peer_name(getattr(stream, "transport_stream", stream)),
            distinguished_name(subject) if subject else "none",
        )
        return None
    return PeerIdentity(node_id)


class RpcError(RemoteError):
    """A call failed: the peer was unreachable, closed the connection, timed out or raised."""


class IdentityMismatch(RemoteError):
    """A message names a node other than the one its connection speaks for.

    Raised by a handler (a replica fetch naming another replica id, a heartbeat naming another
    broker); the server logs it and closes the connection instead of answering.
    """


class PeerIdentity:
    """The node id one incoming connection speaks for.

    Without authentication the id is bound from the first frame's sender id; an authenticated
    listener creates it already bound (`PeerIdentity(node_id)`) to the identity the peer proved,
    and every later check stays the same. -1 is bound like any other id: a client that is not a
    node cannot become one later on the same connection.
    """

    __slots__ = ("node_id",)

    def __init__(self, node_id: int | None = None) -> None:
        self.node_id = node_id

    def admit(self, claimed_id: int) -> bool:
        """Bind on first use; afterwards True only for the bound id."""
        if self.node_id is None:
            self.node_id = claimed_id
        return claimed_id == self.node_id


@dataclass(frozen=True)
class RpcLimits:
    max_frame_bytes: int = 64 * 1024 * 1024
    max_inflight_per_connection: int = 64
    send_queue_frames: int = 1024
    # Frames already queued are joined into one send of at most this many bytes: under load
    # one syscall (and one trio wait) per frame costs more than building the frames.
    send_coalesce_max_bytes: int = 256 * 1024
    connect_timeout_s: float = 2.0
    reconnect_backoff_min_s: float = 0.05
    reconnect_backoff_max_s: float = 1.0
    # The server side's connection caps, queued request bytes and timeouts (net/limits.py).
    listener: ListenerLimits = DEFAULT_LISTENER_LIMITS


@dataclass(frozen=True, slots=True)
class _Envelope:
    """Every frame: [kind, correlation_id, sender_id, method, body]."""

    __wire__: ClassVar[Array] = Array()
    kind: Annotated[int, Range(KIND_CAST, KIND_ERROR)]
    correlation_id: Size  # 0 for a cast
    sender_id: NodeId  # -1: a client that is not a node (the CLI)
    method: Annotated[str, MaxLen(MAX_METHOD_CHARS)]
    body: Annotated[Any, Opaque()]  # decoded by the method's own declaration


_CODEC = Codec()
_FRAME_SIZE = struct.Struct(">i")
assert _FRAME_SIZE.size == FRAME_SIZE_PREFIX_BYTES

# A frame as the pieces that go on the socket in order: the size prefix, then the payload
# (with tails: the envelope, then each tail). The writer hands the pieces to one gathered
# write, so no piece is copied to join them.
Frame = tuple[bytes, ...]

# Large byte strings in a body (a replica fetch answer's records) travel as tails: after the
# msgpack envelope, raw, referenced from where they belong by an extension holding their
# length, so msgpack never copies them into its buffer. Such a frame's payload is
#   TAILED_FRAME_MARKER, envelope length (u32), envelope, tail, tail, ...
# The marker is the one byte msgpack never uses (an envelope starts with an array header).
# The receiver takes the tails in the order the envelope references them and checks every
# length against what the frame holds; bytes no reference claims refuse the frame.
TAILED_FRAME_MARKER = 0xC1
TAIL_EXT = 100
TAIL_MIN_BYTES = 64 * 1024
# The body's containers the sender looks through for tails at most, and how deep (beyond
# either: sent inline).
TAIL_SEARCH_MAX_ITEMS = 4096
TAIL_SEARCH_MAX_DEPTH = 64
_U32 = struct.Struct(">I")
# Values that hold no bytes: skipped without a call (a body is mostly these).
_LEAVES = frozenset({int, str, bool, float, type(None)})


def _lift_tails(value: Any, tails: list[bytes], budget: list[int], depth: int = 0) -> Any:
    """`value` with each large bytes in it replaced by a tail reference (appended to
    `tails`), visited in the order msgpack packs them; containers are copied only where
    something was replaced."""
    kind = type(value)
    if kind is bytes:
        if len(value) >= TAIL_MIN_BYTES:
            tails.append(value)
            return msgpack.ExtType(TAIL_EXT, _U32.pack(len(value)))
        return value
    if kind is msgpack.ExtType and value.code == TAIL_EXT:
        # The receiver would take it for a tail reference and misplace every later tail.
        raise ValueError(f"an RPC body may not hold msgpack extension {TAIL_EXT} itself")
    if depth >= TAIL_SEARCH_MAX_DEPTH:
        return value
    if kind is dict:
        budget[0] -= len(value)
        if budget[0] < 0:
            return value
        out = {}
        changed = False
        for key, item in value.items():
            if type(item) in _LEAVES:
                out[key] = item
                continue
            lifted = _lift_tails(item, tails, budget, depth + 1)
            changed = changed or lifted is not item
            out[key] = lifted
        return out if changed else value
    if kind is list or kind is tuple:
        budget[0] -= len(value)
        if budget[0] < 0:
            return value
        items = [
            item if type(item) in _LEAVES else _lift_tails(item, tails, budget, depth + 1)
            for item in value
        ]
        changed = any(a is not b for a, b in zip(items, value, strict=True))
        return items if changed else value
    return value


def _encode_frame(kind: int, correlation_id: int, sender_id: int, method: str, body: Any) -> Frame:
    tails: list[bytes] = []
    body = _lift_tails(body, tails, [TAIL_SEARCH_MAX_ITEMS])
    payload = _CODEC.encode(_Envelope(kind, correlation_id, sender_id, method, body))
    if not tails:
        return _FRAME_SIZE.pack(len(payload)), payload
    head = bytes([TAILED_FRAME_MARKER]) + _U32.pack(len(payload)) + payload
    size = len(head) + sum(len(tail) for tail in tails)
    return (_FRAME_SIZE.pack(size), head, *tails)


def _encode(kind: int, correlation_id: int, sender_id: int, method: str, body: Any) -> bytes:
    """One frame as one buffer."""
    return b"".join(_encode_frame(kind, correlation_id, sender_id, method, body))


def _decode(payload: bytes) -> tuple[int, int, int, str, Any]:
    """Raises DecodeError (a ValueError) for anything but a well-formed envelope."""
    if payload[:1] == bytes([TAILED_FRAME_MARKER]):
        envelope: _Envelope = _CODEC.from_wire(_Envelope, _unpack_tailed(payload))
    else:
        envelope = _CODEC.decode(_Envelope, payload)
    return (
        envelope.kind,
        envelope.correlation_id,
        envelope.sender_id,
        envelope.method,
        envelope.body,
    )


def _unpack_tailed(payload: bytes) -> Any:
    """The envelope of a frame with tails, each tail reference replaced by its bytes."""
    head_end = 1 + _U32.size
    if len(payload) < head_end:
        raise DecodeError(f"tailed frame of {len(payload)} bytes has no envelope length")
    (envelope_bytes,) = _U32.unpack_from(payload, 1)
    tails_start = head_end + envelope_bytes
    if tails_start > len(payload):
        raise DecodeError(
            f"tailed frame of {len(payload)} bytes claims an envelope of {envelope_bytes} bytes"
        )
    view = memoryview(payload)
    cursor = tails_start

    def take_tail(code: int, data: bytes) -> Any:
        nonlocal cursor
        if code != TAIL_EXT:
            return msgpack.ExtType(code, data)
        if len(data) != _U32.size:
            raise DecodeError(f"tail reference of {len(data)} bytes")
        (length,) = _U32.unpack(data)
        if length > len(payload) - cursor:
            raise DecodeError(
                f"tail of {length} bytes at byte {cursor} runs past the frame's {len(payload)}"
            )
        tail = bytes(view[cursor : cursor + length])
        cursor += length
        return tail

    try:
        wire = msgpack.unpackb(
            view[head_end:tails_start], raw=False, strict_map_key=False, ext_hook=take_tail
        )
    except DecodeError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise DecodeError(f"not valid msgpack: {exc}") from None
    if cursor != len(payload):
        raise DecodeError(f"{len(payload) - cursor} bytes of the frame's tails are not referenced")
    return wire


async def serve_rpc(
    handler: Handler,
    host: str,
    port: int,
    *,
    limits: RpcLimits = RpcLimits(),
    guard: ListenerGuard | None = None,
    identify: Identify | None = None,
    ssl_context: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept internal connections and dispatch frames to `handler` until cancelled.

    `guard` defaults to one built from `limits.listener`; pass one to watch its counters.
    `identify` gives each new connection its identity (default: bound at its first frame).
    `ssl_context` (server side; client certificates required for mutual TLS) wraps every
    connection in TLS, the handshake bounded by the listener's request_read_timeout_ms.
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    task_status.started(listeners)
    guard = guard or ListenerGuard("internal", limits.listener, log)
    handshake_timeout_s = limits.listener.request_read_timeout_ms / 1000

    async def serve_one(raw: trio.SocketStream) -> None:
        peer = _peer_name(raw)
        stream: trio.abc.Stream = raw
        if ssl_context is not None:
            secured, failure = await tls.handshake(
                raw, ssl_context, handshake_timeout_s, server_side=True
            )
            if secured is None:
                log.info("internal listener: TLS handshake with %s failed: %s", peer, failure)
                await trio.aclose_forcefully(raw)
                return
            stream = secured
        identity = None
        if identify is not None:
            identity = identify(stream)
            if identity is None:
                await trio.aclose_forcefully(stream)
                return
        await _serve_connection(
            stream, handler, limits, identity, guard=guard, peer=peer, guard_key=raw
        )

    await guard.serve_listeners(serve_one, listeners)


async def _serve_connection(
    stream: trio.abc.Stream,
    handler: Handler,
    limits: RpcLimits,
    identity: PeerIdentity | None = None,
    guard: ListenerGuard | None = None,
    peer: str | None = None,
    guard_key: object = None,
) -> None:
    peer = peer if peer is not None else _peer_name(stream)
    identity = identity if identity is not None else PeerIdentity()
    if guard is None:
        reader = FrameReader(stream, limits.max_frame_bytes)
    else:
        reader = guard.frame_reader(stream, limits.max_frame_bytes, key=guard_key)
    inflight = trio.Semaphore(limits.max_inflight_per_connection)
    # Responses go through one writer task that coalesces whatever is queued.
    responses_in, responses_out = trio.open_memory_channel[Frame](
        limits.max_inflight_per_connection
    )

    async def answer(
        kind: int, correlation_id: int, sender_id: int, method: str, body: Any, request_bytes: int
    ) -> None:
        # The in-flight slot is held until the answer is queued: released earlier, a peer
        # that never reads its answers would have this side read requests and run handlers
        # without bound while the answers piled up in memory.
        try:
            try:
                result = await handler(sender_id, method, body)
                if kind != KIND_REQUEST:
                    return
                out = _encode_frame(KIND_RESPONSE, correlation_id, 0, method, result)
            except IdentityMismatch as exc:
                log.warning(
                    "closing internal connection from %s (node %s): %s %s",
                    peer,
                    sender_id,
                    method,
                    exc,
                )
                nursery.cancel_scope.cancel()
                return
            except Exception as exc:  # a bad request must not kill the connection or the node
                # One line, rate-limited: a peer that sends bad frames in a loop must not
                # flood the log with tracebacks (the traceback is there at debug level).
                _failed_calls.warning(
                    "rpc %s from %s (node %s) failed: %s: %s",
                    method,
                    peer,
                    sender_id,
                    type(exc).__name__,
                    exc,
                )
                log.debug("rpc %s from %s failed", method, peer, exc_info=True)
                if kind != KIND_REQUEST:
                    return
                # The type only: the message may hold internal state (epochs, ids, paths).
                out = _encode_frame(KIND_ERROR, correlation_id, 0, method, type(exc).__name__)
            # Queued without a yield when there is room (the handler has yielded already);
            # a writer stuck behind a peer that does not read holds this answer here, with
            # its in-flight slot.
            try:
                responses_in.send_nowait(out)
            except trio.WouldBlock:
                await responses_in.send(out)
        finally:
            inflight.release()
            reader.frame_answered(request_bytes)

    async def write_responses() -> None:
        try:
            await _send_coalesced(stream, responses_out, limits.send_coalesce_max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write_responses)
        try:
            await _read_requests(reader, peer, identity, inflight, nursery, answer)
        except FrameError as exc:
            log.log(exc.log_level, "closing internal connection from %s: %s", peer, exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            nursery.cancel_scope.cancel()
            await trio.aclose_forcefully(stream)


async def _send_coalesced(
    stream: trio.abc.SendStream, frames: trio.MemoryReceiveChannel[Frame], max_bytes: int
) -> None:
    """Send frames in order, those already queued together in one gathered write of their
    pieces (send_pieces: no frame is copied to join them)."""
    async for first in frames:
        pieces = list(first)
        size = sum(len(piece) for piece in first)
        while size < max_bytes and len(pieces) < SEND_MAX_PIECES:
            try:
                more = frames.receive_nowait()
            except trio.WouldBlock:
                break
            pieces.extend(more)
            size += sum(len(piece) for piece in more)
        await send_pieces(stream, pieces)


async def _read_requests(
    reader: FrameReader,
    peer: str,
    identity: PeerIdentity,
    inflight: trio.Semaphore,
    nursery: trio.Nursery,
    answer: Callable[..., Awaitable[None]],
) -> None:
    while True:
        payload = await reader.read_frame()
        if payload is None:
            return
        try:
            kind, correlation_id, sender_id, method, body = _decode(payload)
        except DecodeError as exc:
            log.warning("closing internal connection from %s: malformed frame (%s)", peer, exc)
            return
        if kind not in (KIND_CAST, KIND_REQUEST):
            log.warning("closing internal connection from %s: unexpected kind %s", peer, kind)
            return
        if not identity.admit(sender_id):
            log.warning(
                "closing internal connection from %s: it speaks for node %s, a %s names node %s",
                peer,
                identity.node_id,
                method,
                sender_id,
            )
            return
        # Always a yield, even with a slot free: the answer started for the last frame takes
        # its first step before this one's starts, so a connection's requests begin in the
        # order they came (frames read together would otherwise share a scheduler batch,
        # whose order trio shuffles).
        await inflight.acquire()
        nursery.start_soon(answer, kind, correlation_id, sender_id, method, body, len(payload))


def _peer_name(stream: trio.abc.Stream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]  # type: ignore[attr-defined]
        return f"{host}:{port}"
    except (OSError, AttributeError):  # AttributeError: not a socket (a test's memory stream)
        return "?"


def _is_refusal(exc: BaseException) -> bool:
    """Whether a failed connect was refused by every address tried (trio raises one
    OSError whose cause groups the failures of each address)."""
    if isinstance(exc, ConnectionRefusedError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_refusal(inner) for inner in exc.exceptions)
    cause = exc.__cause__
    return cause is not None and _is_refusal(cause)


class PeerClient:
    """One outgoing connection to a peer, re-established with jittered backoff.

    Run `await nursery.start(peer.run)` once; then `cast` and `call` from any task.
    """

    def __init__(
        self,
        sender_id: int,
        peer_id: int,
        host: str,
        port: int,
        *,
        limits: RpcLimits = RpcLimits(),
        rng: random.Random | None = None,
        on_unreachable: UnreachableListener | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.sender_id = sender_id
        self._ssl_context = ssl_context
        self.peer_id = peer_id
        self._on_unreachable = on_unreachable
        self.address = (host, port)
        self.limits = limits
        self._rng = rng or random.Random()
        self._send_in, self._send_out = trio.open_memory_channel[Frame](limits.send_queue_frames)
        self._pending: dict[int, trio.MemorySendChannel[tuple[int, Any]]] = {}
        self._next_correlation_id = 0
        self._connected = trio.Event()
        self._cancel_scope = trio.CancelScope()
        self.dropped_casts = 0
        # Whether the last failed connect was refused (nothing listens at the address: the
        # peer's process is gone) rather than timed out or unroutable, which a slow peer or
        # a broken network also cause. Read by on_unreachable listeners that must tell them
        # apart (the controller fences a broker sooner only on refusals).
        self.last_connect_refused = False

    def close(self) -> None:
        """Stop reconnecting and fail every pending call."""
        self._cancel_scope.cancel()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def cast(self, method: str, body: Any) -> bool:
        """Queue a one-way message; False (and counted) if the queue is full or unconnected."""
        if not self._connected.is_set():
            self.dropped_casts += 1
            return False
        try:
            self._send_in.send_nowait(_encode_frame(KIND_CAST, 0, self.sender_id, method, body))
            return True
        except trio.WouldBlock:
            self.dropped_casts += 1
            return False

    async def call(
        self,
        method: str,
        body: Any,
        *,
        timeout_s: float = 5.0,
        connect_timeout_s: float | None = None,
    ) -> Any:
        """Send a request and wait for its response; raises RpcError on any failure.

        A peer that is not connected within connect_timeout_s (default: the limits') fails
        the call before anything was sent, so the caller may retry elsewhere without risk
        of the request running twice.
        """
        if connect_timeout_s is None:
            connect_timeout_s = self.limits.connect_timeout_s
        if not self._connected.is_set():
            with trio.move_on_after(min(connect_timeout_s, timeout_s)):
                await self._connected.wait()
            if not self._connected.is_set():
                raise RpcError(
                    f"node {self.peer_id} at {self.address[0]}:{self.address[1]} is not reachable"
                )
        self._next_correlation_id += 1
        correlation_id = self._next_correlation_id
        response_in, response_out = trio.open_memory_channel[tuple[int, Any]](1)
        self._pending[correlation_id] = response_in
        try:
            with trio.move_on_after(timeout_s) as scope:
                frame = _encode_frame(KIND_REQUEST, correlation_id, self.sender_id, method, body)
                # The usual case (connected, room in the queue) queues the frame without
                # yielding: each yield is a trip through the scheduler, and the call yields
                # anyway while it waits for the answer.
                if not self._connected.is_set():
                    await self._connected.wait()
                try:
                    self._send_in.send_nowait(frame)
                except trio.WouldBlock:
                    await self._send_in.send(frame)
                kind, result = await response_out.receive()
            if scope.cancelled_caught:
                raise RpcError(f"{method} to node {self.peer_id} timed out after {timeout_s}s")
        except trio.EndOfChannel:
            raise RpcError(f"connection to node {self.peer_id} closed during {method}") from None
        finally:
            self._pending.pop(correlation_id, None)
        if kind == KIND_ERROR:
            raise RpcError(f"node {self.peer_id} failed {method}: {result}")
        return result

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        with self._cancel_scope:
            await self._reconnect_forever()

    async def _reconnect_forever(self) -> None:
        backoff_s = self.limits.reconnect_backoff_min_s
        while True:
            stream: trio.abc.Stream | None = None
            raw: trio.SocketStream | None = None
            refused = False
            with trio.move_on_after(self.limits.connect_timeout_s):
                try:
                    raw = await trio.open_tcp_stream(*self.address)
                except OSError as exc:
                    raw = None
                    refused = _is_refusal(exc)
            self.last_connect_refused = refused
            stream = raw
            if raw is not None and self._ssl_context is not None:
                stream = await self._secure(raw)
                if stream is None:
                    # The peer is up but not the node we trust: no faster election for
                    # that, only the back-off.
                    await trio.sleep(backoff_s * (0.5 + self._rng.random()))
                    backoff_s = min(backoff_s * 2, self.limits.reconnect_backoff_max_s)
                    continue
            if stream is None:
                if self._on_unreachable is not None:
                    # A refused connect means the peer's process is gone (or not up yet);
                    # the Raft driver uses that to elect sooner than the fetch timeout.
                    self._on_unreachable(self.peer_id)
                await trio.sleep(backoff_s * (0.5 + self._rng.random()))
                backoff_s = min(backoff_s * 2, self.limits.reconnect_backoff_max_s)
                continue
            backoff_s = self.limits.reconnect_backoff_min_s
            try:
                await self._session(stream)
            finally:
                self._connected = trio.Event()
                await trio.aclose_forcefully(stream)
                self._fail_pending()
                self._drain_queue()

    async def _secure(self, raw: trio.SocketStream) -> trio.abc.Stream | None:
        """Mutual TLS with this node's certificate; the peer's must name `peer_id`. The
        identity checked is the node id, not a host name: node certificates need not list
        the addresses nodes are configured with."""
        assert self._ssl_context is not None
        stream, failure = await tls.handshake(
            raw, self._ssl_context, self.limits.connect_timeout_s, server_side=False
        )
        if stream is not None:
            named = tls.node_id_from_certificate(stream.getpeercert())
            if named != self.peer_id:
                failure = f"its certificate names node {named}, not node {self.peer_id}"
        if stream is None or failure:
            log.warning(
                "TLS connection to node %s at %s:%s refused: %s",
                self.peer_id,
                *self.address,
                failure,
            )
            await trio.aclose_forcefully(raw)
            return None
        return stream

    def _fail_pending(self) -> None:
        for channel in list(self._pending.values()):
            channel.close()
        self._pending.clear()

    def _drain_queue(self) -> None:
        # Frames queued for a dead connection are stale (Raft re-sends on its own timers).
        while True:
            try:
                self._send_out.receive_nowait()
            except trio.WouldBlock:
                return

    async def _session(self, stream: trio.abc.Stream) -> None:
        reader = FrameReader(stream, self.limits.max_frame_bytes)

        async def sender() -> None:
            await _send_coalesced(stream, self._send_out, self.limits.send_coalesce_max_bytes)

        async def receiver() -> None:
            while True:
                payload = await reader.read_frame()
                if payload is None:
                    return
                kind, correlation_id, _sender, _method, body = _decode(payload)
                channel = self._pending.pop(correlation_id, None)
                if channel is not None:
                    channel.send_nowait((kind, body))

        try:
            async with trio.open_nursery() as nursery:
                self._connected.set()

                async def run_then_cancel(fn: Callable[[], Awaitable[None]]) -> None:
                    await fn()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(run_then_cancel, sender)
                nursery.start_soon(run_then_cancel, receiver)
        except* (
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            OSError,
            FrameTooLarge,
            ValueError,  # DecodeError: a malformed frame
        ) as group:
            log.info(
                "connection to node %s at %s:%s lost: %s",
                self.peer_id,
                *self.address,
                group.exceptions[0],
            )


class PeerSet:
    """Outgoing clients to every known peer, keyed by node id."""

    def __init__(
        self,
        sender_id: int,
        limits: RpcLimits = RpcLimits(),
        rng: random.Random | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.sender_id = sender_id
        self.limits = limits
        # Client side of internal mutual TLS (None: plaintext).
        self.ssl_context = ssl_context
        self._rng = rng or random.Random()
        self._peers: dict[int, PeerClient] = {}
        self._nursery: trio.Nursery | None = None
        self._unreachable_listeners: list[UnreachableListener] = []

    def add_unreachable_listener(self, listener: UnreachableListener) -> None:
        """Call listener(peer_id) whenever a connection attempt to a peer fails."""
        self._unreachable_listeners.append(listener)

    def _peer_unreachable(self, peer_id: int) -> None:
        for listener in self._unreachable_listeners:
            listener(peer_id)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep(math.inf)

    def peer(self, node_id: int, host: str, port: int) -> PeerClient:
        """The client for a node, started on first use (or re-created when it moved)."""
        client = self._peers.get(node_id)
        if client is not None and client.address == (host, port):
            return client
        if self._nursery is None:
            raise RuntimeError("PeerSet.run must be started before peers are used")
        if client is not None:
            client.close()
        client = PeerClient(
            self.sender_id,
            node_id,
            host,
            port,
            limits=self.limits,
            rng=self._rng,
            on_unreachable=self._peer_unreachable,
            ssl_context=self.ssl_context,
        )
        self._peers[node_id] = client
        self._nursery.start_soon(client.run)
        return client

    def get(self, node_id: int) -> PeerClient | None:
        return self._peers.get(node_id)
