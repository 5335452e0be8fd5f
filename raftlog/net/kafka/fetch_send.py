"""Writing a response made of byte segments and file regions to a socket.

Fetch responses carry record batches that are already on disk in wire format (RecordBatch
v2). `codec.encode_response` keeps those as `FileRegion` references; here they go from the
page cache to the socket with os.sendfile, never through Python memory. Where sendfile is
unavailable (not a plain socket, e.g. TLS later; a platform or file that refuses it) the
region is read in a worker thread and sent as bytes.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Sequence

import trio

from raftlog.net.framing import send_pieces
from raftlog.net.kafka.codec import Segment, frame_header
from raftlog.storage.segment import FileRegion

log = logging.getLogger("raftlog.kafka")

# Small byte segments are coalesced into one send up to this size; bigger ones go alone.
COALESCE_MAX_BYTES = 64 * 1024
_SENDFILE_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSOCK}


def sendfile_capable(stream: trio.abc.Stream) -> bool:
    return hasattr(os, "sendfile") and isinstance(stream, trio.SocketStream)


def small_frame(segments: Sequence[Segment]) -> bytes | None:
    """The whole frame as bytes when it is small and holds no file region, else None."""
    if any(isinstance(segment, FileRegion) for segment in segments):
        return None
    body = b"".join(segments)  # type: ignore[arg-type]  # no FileRegion here
    if len(body) >= COALESCE_MAX_BYTES:
        return None
    return bytes(frame_header(segments)) + body


async def send_responses(stream: trio.abc.SendStream, frames: Sequence[bytes]) -> None:
    """Several small, finished responses in one gathered write (one syscall instead of
    many)."""
    await send_pieces(stream, frames)


async def send_response(
    stream: trio.abc.SendStream, segments: Sequence[Segment], use_sendfile: bool
) -> None:
    """Send one size-prefixed response frame."""
    pending = bytearray(frame_header(segments))
    for segment in segments:
        if isinstance(segment, FileRegion):
            if pending:
                await stream.send_all(pending)
                pending = bytearray()
            await _send_region(stream, segment, use_sendfile)
        else:
            pending += segment
            if len(pending) >= COALESCE_MAX_BYTES:
                await stream.send_all(pending)
                pending = bytearray()
    if pending:
        await stream.send_all(pending)


async def _send_region(stream: trio.abc.SendStream, region: FileRegion, use_sendfile: bool) -> None:
    position, remaining_bytes = region.position, region.length_bytes
    if use_sendfile and isinstance(stream, trio.SocketStream):
        sock = stream.socket
        while remaining_bytes:
            try:
                sent_bytes = os.sendfile(sock.fileno(), region.fd, position, remaining_bytes)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(sock)
                continue
            except OSError as exc:
                if exc.errno not in _SENDFILE_UNSUPPORTED:
                    raise
                log.info("sendfile refused (%s); sending the region as bytes", exc)
                break
            if sent_bytes == 0:
                # The file is shorter than the region: the frame can no longer be completed.
                raise OSError(f"file region ended {remaining_bytes} bytes early")
            position += sent_bytes
            remaining_bytes -= sent_bytes
            await trio.lowlevel.checkpoint()
    if remaining_bytes:
        rest = FileRegion(region.file, position, remaining_bytes)
        await stream.send_all(await trio.to_thread.run_sync(rest.read_bytes))
