"""TLS on trio sockets: the stream, the handshake under a deadline, and node identities in
certificates.

The contexts come from raftlog.security.tls (built from the node's PEM files). A handshake
that fails or stalls yields one short reason (the ssl module's, never a traceback) for the
caller's single log line.

`TLSStream` is the ssl module's SSLObject over two memory BIOs, like trio.SSLStream, shaped
for frames: one receive decrypts every whole record the bytes already received hold (trio's
returns one 16 KiB record per call, and each call is a trip through the scheduler), and a
FrameReader can read the socket itself (`feed`, `read_decrypted`, `held_bytes`) so that
a TLS connection, like a plaintext one, reserves memory before it reads and holds none
while it waits (raftlog.net.framing). Its errors are trio's: trio.BrokenResourceError with
the ssl error as its cause, trio.ClosedResourceError after aclose.

Node certificates (internal_security_protocol = SSL) name their node in the subject's common
name: exactly "node-<id>" (e.g. CN=node-2). The internal listener binds each connection to
that id, and a node dialling a peer checks that the certificate it is shown names that peer.
"""

from __future__ import annotations

import os
import re
import ssl
from typing import Any

import trio

from raftlog.codec import I32_MAX

NODE_COMMON_NAME_PREFIX = "node-"
_NODE_COMMON_NAME = re.compile(r"node-(0|[1-9][0-9]{0,9})")
MAX_NODE_ID = I32_MAX


def node_common_name(node_id: int) -> str:
    return f"{NODE_COMMON_NAME_PREFIX}{node_id}"


def node_id_from_certificate(certificate: dict[str, Any] | None) -> int | None:
    """The node id a verified peer certificate names (subject CN "node-<id>"), else None.

    A subject with several common names names no node: which one would count is ambiguous.
    """
    if not certificate:
        return None
    common_names = [
        value for rdn in certificate.get("subject", ()) for key, value in rdn if key == "commonName"
    ]
    if len(common_names) != 1:
        return None
    match = _NODE_COMMON_NAME.fullmatch(common_names[0])
    if match is None:
        return None
    node_id = int(match.group(1))
    return node_id if node_id <= MAX_NODE_ID else None


def failure_reason(exc: BaseException) -> str:
    """One line for a failed handshake: the ssl module's reason when there is one."""
    cause = exc.__cause__ or exc
    if isinstance(cause, ssl.SSLError):
        return str(cause.reason or cause.__class__.__name__)
    return str(cause) or cause.__class__.__name__


# Socket reads during the handshake: a handshake's flights are a few KiB, and application
# bytes that arrive with the last one are held before any reader could account for them.
HANDSHAKE_RECEIVE_BYTES = 16 * 1024
# One receive_some's default size, and what it reads from the socket at most at once.
RECEIVE_BYTES = 256 * 1024


class TLSStream(trio.abc.Stream):
    """TLS over a trio.SocketStream (see the module docstring). One task may receive while
    another sends; sends are serialized in order."""

    def __init__(
        self,
        transport: trio.SocketStream,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
    ) -> None:
        self.transport_stream = transport
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(
            self._incoming, self._outgoing, server_side=server_side, server_hostname=server_hostname
        )
        # Strict FIFO: whoever takes bytes out of the outgoing BIO first sends them first.
        self._send_lock = trio.StrictFIFOLock()
        self._receiving = False
        self._handshook = False
        self._broken = False
        self._closed = False

    @property
    def socket(self) -> trio.socket.SocketType:
        return self.transport_stream.socket

    def getpeercert(self) -> dict[str, Any] | None:
        """The peer's verified certificate, as ssl.SSLSocket.getpeercert() gives it."""
        return self._ssl.getpeercert()

    def version(self) -> str | None:
        return self._ssl.version()

    def _check_usable(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the TLS stream is closed")
        if self._broken:
            raise trio.BrokenResourceError("the TLS stream is broken")

    def _fail(self, exc: BaseException) -> trio.BrokenResourceError:
        self._broken = True
        broken = trio.BrokenResourceError(f"TLS: {failure_reason(exc)}")
        broken.__cause__ = exc
        return broken

    # ------------------------------------------------------------------ handshake
    async def do_handshake(self) -> None:
        """Complete the handshake (certificate and host name checks included)."""
        self._check_usable()
        while True:
            try:
                self._ssl.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                done = False
            except (ssl.SSLError, ssl.CertificateError) as exc:
                raise self._fail(exc) from exc
            await self._send_outgoing()
            if done:
                self._handshook = True
                return
            raw = await self._transport_receive(HANDSHAKE_RECEIVE_BYTES)
            self.feed(raw)

    # ------------------------------------------------------------------ receiving
    @property
    def held_bytes(self) -> int:
        """Bytes received from the socket and not yet returned as plaintext: ciphertext in
        the incoming BIO and plaintext decrypted but not read (a record read in part)."""
        return self._incoming.pending + self._ssl.pending()

    def feed(self, raw: bytes) -> None:
        """Bytes read from the socket; b"" is its end."""
        if raw:
            self._incoming.write(raw)
        else:
            self._incoming.write_eof()

    def read_decrypted(self, max_bytes: int) -> bytes | None:
        """Up to `max_bytes` of plaintext from the bytes already fed, without any I/O: None
        when they hold no whole record, b"" at the peer's close_notify. Raises
        trio.BrokenResourceError (cause: the ssl error) on bad records or an end of stream
        without close_notify."""
        self._check_usable()
        parts: list[bytes] = []
        got = 0
        while got < max_bytes:
            try:
                part = self._ssl.read(max_bytes - got)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLError as exc:
                if parts:
                    break  # deliver what came before; the error repeats on the next call
                raise self._fail(exc) from exc
            if not part:
                if parts:
                    break
                return b""
            parts.append(part)
            got += len(part)
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else b"".join(parts)

    @property
    def wants_flush(self) -> bool:
        """Decrypting produced bytes to send (a TLS 1.3 KeyUpdate's answer)."""
        return self._outgoing.pending > 0

    async def flush(self) -> None:
        """Send what decrypting queued (see wants_flush), in order with send_all."""
        async with self._send_lock:
            await self._send_outgoing()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if max_bytes is None:
            max_bytes = RECEIVE_BYTES
        if max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this TLS stream")
        self._receiving = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            yielded = False
            while (chunk := self.read_decrypted(max_bytes)) is None:
                self.feed(await self._transport_receive(RECEIVE_BYTES))
                yielded = True
            if self.wants_flush:
                await self.flush()
                yielded = True
            if not yielded:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return chunk
        finally:
            self._receiving = False

    async def _transport_receive(self, max_bytes: int) -> bytes:
        try:
            return bytes(await self.transport_stream.receive_some(max_bytes))
        except trio.BrokenResourceError:
            self._broken = True
            raise

    # ------------------------------------------------------------------ sending
    async def _send_outgoing(self) -> None:
        data = self._outgoing.read()
        if not data:
            return
        try:
            await self.transport_stream.send_all(data)
        except BaseException:
            # An unknown part of a record is on the wire: nothing can follow it.
            self._broken = True
            raise

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        async with self._send_lock:
            self._check_usable()
            if not data:
                await trio.lowlevel.checkpoint()
                return
            try:
                self._ssl.write(data)
            except ssl.SSLError as exc:
                raise self._fail(exc) from exc
            await self._send_outgoing()

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    # ------------------------------------------------------------------ closing
    async def aclose(self) -> None:
        """Send close_notify if that cannot block (best effort, as Kafka's brokers do), then
        close the socket."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        try:
            if self._handshook and not self._broken and not self._send_lock.locked():
                try:
                    self._ssl.unwrap()
                except ssl.SSLError:
                    pass
                notify = self._outgoing.read()
                if notify:
                    # trio keeps its sockets non-blocking; a full buffer drops the notify.
                    os.write(self.socket.fileno(), notify)
        except OSError:
            pass
        finally:
            await self.transport_stream.aclose()


async def handshake(
    transport: trio.SocketStream,
    context: ssl.SSLContext,
    timeout_s: float,
    *,
    server_side: bool,
    server_hostname: str | None = None,
) -> tuple[TLSStream | None, str]:
    """(the TLS stream, "") once the handshake completed within timeout_s, else (None,
    reason). The caller closes the transport on failure."""
    stream = TLSStream(transport, context, server_side=server_side, server_hostname=server_hostname)
    with trio.move_on_after(timeout_s) as scope:
        try:
            await stream.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            return None, failure_reason(exc)
    if scope.cancelled_caught:
        return None, f"not completed within {timeout_s * 1000:.0f} ms"
    return stream, ""
