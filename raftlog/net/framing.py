"""Length-prefixed frames over trio streams, shared by the Kafka and internal listeners.

Both protocols put a 4-byte big-endian size in front of every frame. A size above the
listener's limit is refused before any of the payload is buffered, so a bad peer cannot make
the node allocate an absurd amount of memory.

A listener's reader may also be given (raftlog.net.limits builds them from the node config):
- a `ByteAccount` drawing on the listener's `QueuedBytes`: every byte is reserved before it is
  received, in bounded chunks (never the size a frame claims), and stays charged until the
  caller says the frame was answered; a connection waiting for bytes holds nothing. When the
  pool is spent, reading pauses (back-pressure: the peer's bytes wait in its socket) until
  answers free memory;
- an idle timeout: no complete frame for that long raises `ConnectionIdle`;
- a read timeout: a frame whose bytes take longer than that from its first to its last byte
  raises `FrameReadTimeout` (a peer trickling bytes cannot hold a connection and its memory).
The read clock includes time paused for memory, so every partial frame ends within the read
timeout and the pool can never stay full of frames that will not complete. The idle clock does
not: that pause is this node's doing, and a connection that has not started a frame holds
nothing.
"""

from __future__ import annotations

import logging
import math
import os
import struct
from collections.abc import Callable, Sequence

import trio

from raftlog.constants import FRAME_SIZE_PREFIX_BYTES
from raftlog.errors import RemoteError
from raftlog.net.tls import TLSStream

_SIZE = struct.Struct(">i")
assert _SIZE.size == FRAME_SIZE_PREFIX_BYTES
# Receives shorter than this are appended to one buffer instead of kept as separate parts.
SMALL_RECEIVE_BYTES = 4096
# Buffers one gathered write takes at most (Linux's IOV_MAX).
SEND_MAX_PIECES = 1024


async def send_pieces(stream: trio.abc.SendStream, pieces: Sequence[bytes | bytearray]) -> None:
    """Write `pieces` in order, none of them copied to join them.

    On a plain socket: gathered writes straight to trio's non-blocking socket, waiting only
    while the kernel's send buffer is full. trio's own send adds a schedule point after every
    send that did not wait, a trip through the scheduler per response; the writers that call
    this yield anyway each time they take the next response from their queue. A closed or
    broken connection raises OSError. Other streams (TLS; tests' memory streams): joined, one
    send_all.
    """
    if not isinstance(stream, trio.SocketStream):
        await stream.send_all(b"".join(pieces))
        return
    sock = stream.socket
    views = [memoryview(piece) for piece in pieces if piece]
    first = 0  # views before this one are sent
    while first < len(views):
        try:
            # fileno() is -1 once the socket is closed: EBADF, never another file.
            sent = os.writev(sock.fileno(), views[first : first + SEND_MAX_PIECES])
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        while first < len(views) and sent >= views[first].nbytes:
            sent -= views[first].nbytes
            first += 1
        if sent:
            views[first] = views[first][sent:]


class FrameError(RemoteError):
    """The peer's frames break a limit; the connection is closed."""

    # How loudly a listener logs the close: a peer that broke a limit is worth a warning.
    log_level = logging.WARNING


class FrameTooLarge(FrameError):
    """The peer announced a frame larger than the limit (or a negative size)."""

    def __init__(self, size_bytes: int, max_frame_bytes: int) -> None:
        super().__init__(f"frame of {size_bytes} bytes exceeds limit {max_frame_bytes} bytes")
        self.size_bytes = size_bytes
        self.max_frame_bytes = max_frame_bytes


class ConnectionIdle(FrameError):
    """No complete frame arrived within the idle timeout."""

    # Routine: a client that went quiet, or a node's connection it rarely uses (a Raft leader
    # seldom sends to its followers).
    log_level = logging.INFO


class FrameReadTimeout(FrameError):
    """A frame's bytes arrived slower than the read timeout allows."""


class QueuedBytes:
    """The bytes a listener has read and not yet answered, across all its connections.

    `reserve` never takes the total above `limit_bytes`: it grants what is left (at most what
    was asked) and waits while nothing is left.
    """

    def __init__(
        self, limit_bytes: int, on_full: Callable[[QueuedBytes], None] | None = None
    ) -> None:
        if limit_bytes <= 0:
            raise ValueError(f"limit_bytes must be positive, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self.peak_bytes = 0
        self.waiting = 0
        self._on_full = on_full
        self._lot = trio.lowlevel.ParkingLot()

    def try_reserve(self, want_bytes: int) -> int:
        """Reserve what is left (at most `want_bytes`) without waiting; 0 when nothing is."""
        granted = max(0, min(want_bytes, self.limit_bytes - self.used_bytes))
        self.used_bytes += granted
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)
        return granted

    async def reserve(self, want_bytes: int) -> int:
        if self.used_bytes >= self.limit_bytes:
            if self._on_full is not None:
                self._on_full(self)
            self.waiting += 1
            try:
                while self.used_bytes >= self.limit_bytes:
                    await self._lot.park()
            finally:
                self.waiting -= 1
        granted = min(want_bytes, self.limit_bytes - self.used_bytes)
        self.used_bytes += granted
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)
        return granted

    def release(self, count_bytes: int) -> None:
        assert 0 <= count_bytes <= self.used_bytes, (count_bytes, self.used_bytes)
        self.used_bytes -= count_bytes
        if count_bytes:
            self._lot.unpark_all()

    def account(self) -> ByteAccount:
        return ByteAccount(self)


class ByteAccount:
    """One connection's share of a `QueuedBytes`; `close` returns whatever it still holds."""

    def __init__(self, pool: QueuedBytes) -> None:
        self._pool = pool
        self.held_bytes = 0
        self._closed = False

    def try_reserve(self, want_bytes: int) -> int:
        if self._closed:
            raise trio.ClosedResourceError("the connection's byte account is closed")
        granted = self._pool.try_reserve(want_bytes)
        self.held_bytes += granted
        return granted

    async def reserve(self, want_bytes: int) -> int:
        if self._closed:
            raise trio.ClosedResourceError("the connection's byte account is closed")
        granted = await self._pool.reserve(want_bytes)
        self.held_bytes += granted
        return granted

    def release(self, count_bytes: int) -> None:
        # Answers may finish after the connection closed (and its bytes were returned).
        count_bytes = min(count_bytes, self.held_bytes)
        self.held_bytes -= count_bytes
        self._pool.release(count_bytes)

    def close(self) -> None:
        self._closed = True
        self.release(self.held_bytes)


class FrameReader:
    """Reads whole frames from a stream; keeps leftover bytes between calls."""

    def __init__(
        self,
        stream: trio.abc.ReceiveStream,
        max_frame_bytes: int,
        receive_chunk_bytes: int = 256 * 1024,
        *,
        account: ByteAccount | None = None,
        idle_timeout_s: float | None = None,
        read_timeout_s: float | None = None,
    ) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self.max_frame_bytes = max_frame_bytes
        self._receive_chunk_bytes = receive_chunk_bytes
        self._account = account
        self._idle_timeout_s = math.inf if idle_timeout_s is None else idle_timeout_s
        self._read_timeout_s = math.inf if read_timeout_s is None else read_timeout_s
        self._timed = account is not None or not (
            math.isinf(self._idle_timeout_s) and math.isinf(self._read_timeout_s)
        )
        self._idle_deadline = math.inf
        self._frame_deadline = math.inf
        self._frame_received_bytes = 0  # of the frame being read, for the timeout's message
        # A connection waiting for its peer must hold no memory, or idle connections alone
        # would spend the pool: a socket is read directly (non-blocking), reserving first
        # and returning the reservation before it waits for bytes.
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        # TLS: the same, with the socket's bytes fed to the TLS object; what it holds
        # (ciphertext, a record decrypted in part) is charged too (`_tls_charged_bytes`).
        self._tls = stream if isinstance(stream, TLSStream) else None
        self._tls_charged_bytes = 0

    def frame_answered(self, payload_bytes: int) -> None:
        """A frame `read_frame` returned has been answered: its bytes no longer count."""
        if self._account is not None:
            self._account.release(FRAME_SIZE_PREFIX_BYTES + payload_bytes)

    def _frame_started(self) -> None:
        self._frame_deadline = trio.current_time() + self._read_timeout_s

    def _deadline(self) -> float:
        """Until a frame's first byte the idle clock runs; from then on, the frame's."""
        return self._idle_deadline if math.isinf(self._frame_deadline) else self._frame_deadline

    def _timeout(self) -> FrameError:
        if not math.isinf(self._frame_deadline):
            return FrameReadTimeout(
                f"a frame took longer than {self._read_timeout_s * 1000:.0f} ms to arrive "
                f"({self._frame_received_bytes} bytes of it received)"
            )
        return ConnectionIdle(f"no complete request for {self._idle_timeout_s * 1000:.0f} ms")

    async def _receive(self, max_bytes: int) -> bytes | bytearray:
        if not self._timed:
            return await self._stream.receive_some(max_bytes)
        if self._account is not None and self._socket is not None:
            return await self._receive_from_socket(self._account, self._socket, max_bytes)
        if self._account is not None and self._tls is not None:
            return await self._receive_from_tls(self._account, self._tls, max_bytes)
        with trio.move_on_at(self._deadline()):
            if self._account is None:
                return await self._stream.receive_some(max_bytes)
            # Neither a socket nor TLS on one (a test's memory stream): the reservation is
            # held while it waits.
            granted = await self._account.reserve(max_bytes)
            chunk: bytes | bytearray = b""
            try:
                chunk = await self._stream.receive_some(granted)
            finally:
                self._account.release(granted - len(chunk))
            return chunk
        raise self._timeout()

    async def _wait_readable(self, sock: trio.socket.SocketType) -> None:
        with trio.move_on_at(self._deadline()) as scope:
            await trio.lowlevel.wait_readable(sock)
        if scope.cancelled_caught:
            raise self._timeout()

    async def _receive_from_socket(
        self, account: ByteAccount, sock: trio.socket.SocketType, max_bytes: int
    ) -> bytes:
        """What trio's receive_some does (one schedule point per receive that did not wait),
        with the reservation taken before the read and never held while waiting."""
        await trio.lowlevel.checkpoint_if_cancelled()
        waited = False
        while True:
            granted = account.try_reserve(max_bytes)
            if not granted:
                # The pool is spent: wait for the peer's bytes (its clock runs), then for
                # memory (only a started frame's clock runs: see the module docstring).
                await self._wait_readable(sock)
                with trio.move_on_at(self._frame_deadline):
                    granted = await account.reserve(max_bytes)
                if not granted:
                    raise self._timeout()
                waited = True
            try:
                # trio keeps its sockets non-blocking; fileno() is -1 once it is closed.
                chunk = os.read(sock.fileno(), granted)
            except BlockingIOError:
                account.release(granted)
                await self._wait_readable(sock)
                waited = True
                continue
            except OSError as exc:
                account.release(granted)
                raise trio.BrokenResourceError(f"receive failed: {exc}") from exc
            account.release(granted - len(chunk))
            if not waited:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return chunk

    async def _receive_from_tls(
        self, account: ByteAccount, stream: TLSStream, max_bytes: int
    ) -> bytes:
        """`_receive_from_socket` for TLS: every whole record already received is decrypted
        in one go (no reservation needed: plaintext is smaller than its ciphertext, whose
        charge it takes over); the socket is read only with a reservation, never held while
        waiting for the peer."""
        await trio.lowlevel.checkpoint_if_cancelled()
        waited = False
        while True:
            chunk = stream.read_decrypted(max_bytes)
            if chunk is not None:
                self._settle_tls_charge(account, stream, len(chunk))
                if stream.wants_flush:
                    await stream.flush()
                    waited = True
                if not waited:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return chunk
            granted = account.try_reserve(self._receive_chunk_bytes)
            if not granted:
                await self._wait_readable(stream.socket)
                with trio.move_on_at(self._frame_deadline):
                    granted = await account.reserve(self._receive_chunk_bytes)
                if not granted:
                    raise self._timeout()
                waited = True
            try:
                raw = os.read(stream.socket.fileno(), granted)
            except BlockingIOError:
                account.release(granted)
                await self._wait_readable(stream.socket)
                waited = True
                continue
            except OSError as exc:
                account.release(granted)
                raise trio.BrokenResourceError(f"receive failed: {exc}") from exc
            account.release(granted - len(raw))
            self._tls_charged_bytes += len(raw)
            stream.feed(raw)

    def _settle_tls_charge(self, account: ByteAccount, stream: TLSStream, plain_bytes: int) -> None:
        """After decrypting `plain_bytes`: they stay charged (until their frame is answered),
        as does what the TLS object still holds; the rest of the ciphertext's charge goes
        back. Bytes that came with the handshake were read before any reservation: charge
        them now if the pool allows."""
        held_bytes = stream.held_bytes
        surplus = self._tls_charged_bytes - held_bytes - plain_bytes
        if surplus > 0:
            account.release(surplus)
        elif surplus < 0:
            account.try_reserve(-surplus)
        self._tls_charged_bytes = held_bytes

    async def read_frame(self) -> bytes | None:
        """Return the next frame's payload, or None on a clean end of stream.

        Raises FrameTooLarge for an oversized size prefix, ConnectionIdle or FrameReadTimeout
        when a timeout given to the reader passes, and trio.BrokenResourceError when the
        stream ends in the middle of a frame.
        """
        if self._timed:
            self._idle_deadline = trio.current_time() + self._idle_timeout_s
            self._frame_deadline = math.inf
            if self._buffer:
                self._frame_started()
        while len(self._buffer) < FRAME_SIZE_PREFIX_BYTES:
            chunk = await self._receive(self._receive_chunk_bytes)
            if not chunk:
                if self._buffer:
                    raise trio.BrokenResourceError("stream ended inside a frame header")
                return None
            if self._timed and not self._buffer:
                self._frame_started()
            self._buffer += chunk
            self._frame_received_bytes = len(self._buffer)
        (size_bytes,) = _SIZE.unpack_from(self._buffer, 0)
        if size_bytes < 0 or size_bytes > self.max_frame_bytes:
            raise FrameTooLarge(size_bytes, self.max_frame_bytes)
        end = FRAME_SIZE_PREFIX_BYTES + size_bytes
        if len(self._buffer) >= end:
            payload = bytes(memoryview(self._buffer)[FRAME_SIZE_PREFIX_BYTES:end])
            del self._buffer[:end]
            return payload
        # The rest of a large frame: receive exactly its bytes, at most one chunk at a time
        # (each receive allocates what it asks for, never the size the frame claims), and copy
        # them once, in the join. Small receives are coalesced, so a peer trickling bytes
        # cannot make the list of parts cost much more memory than the frame itself.
        parts: list[bytes | bytearray] = [bytes(memoryview(self._buffer)[FRAME_SIZE_PREFIX_BYTES:])]
        small = bytearray()
        have_bytes = len(self._buffer) - FRAME_SIZE_PREFIX_BYTES
        self._buffer = bytearray()
        while have_bytes < size_bytes:
            chunk = await self._receive(min(self._receive_chunk_bytes, size_bytes - have_bytes))
            if not chunk:
                raise trio.BrokenResourceError("stream ended inside a frame")
            have_bytes += len(chunk)
            self._frame_received_bytes = FRAME_SIZE_PREFIX_BYTES + have_bytes
            if len(chunk) < SMALL_RECEIVE_BYTES:
                small += chunk
                continue
            if small:
                parts.append(small)
                small = bytearray()
            parts.append(chunk)
        parts.append(small)
        return b"".join(parts)


def frame(payload: bytes | bytearray | memoryview) -> bytes:
    """Prefix a payload with its 4-byte size."""
    return _SIZE.pack(len(payload)) + bytes(payload)
