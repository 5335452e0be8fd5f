"""Length-prefixed frames over trio streams, shared by the Kafka and internal listeners.

Both protocols put a 4-byte big-endian size in front of every frame. A size above the
listener's limit is refused before any of the payload is buffered, so a bad peer cannot make
the node allocate an absurd amount of memory.
"""

from __future__ import annotations

import struct

import trio

from raftlog.errors import RemoteError

_SIZE = struct.Struct(">i")
# Receives shorter than this are appended to one buffer instead of kept as separate parts.
SMALL_RECEIVE_BYTES = 4096


class FrameTooLarge(RemoteError):
    """The peer announced a frame larger than the limit (or a negative size)."""

    def __init__(self, size_bytes: int, max_frame_bytes: int) -> None:
        super().__init__(f"frame of {size_bytes} bytes exceeds limit {max_frame_bytes} bytes")
        self.size_bytes = size_bytes
        self.max_frame_bytes = max_frame_bytes


class FrameReader:
    """Reads whole frames from a stream; keeps leftover bytes between calls."""

    def __init__(
        self,
        stream: trio.abc.ReceiveStream,
        max_frame_bytes: int,
        receive_chunk_bytes: int = 256 * 1024,
    ) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self.max_frame_bytes = max_frame_bytes
        self._receive_chunk_bytes = receive_chunk_bytes

    async def _fill(self, needed_bytes: int) -> bool:
        while len(self._buffer) < needed_bytes:
            chunk = await self._stream.receive_some(self._receive_chunk_bytes)
            if not chunk:
                return False
            self._buffer += chunk
        return True

    async def read_frame(self) -> bytes | None:
        """Return the next frame's payload, or None on a clean end of stream.

        Raises FrameTooLarge for an oversized size prefix and trio.BrokenResourceError
        when the stream ends in the middle of a frame.
        """
        if not await self._fill(4):
            if self._buffer:
                raise trio.BrokenResourceError("stream ended inside a frame header")
            return None
        (size_bytes,) = _SIZE.unpack_from(self._buffer, 0)
        if size_bytes < 0 or size_bytes > self.max_frame_bytes:
            raise FrameTooLarge(size_bytes, self.max_frame_bytes)
        end = 4 + size_bytes
        if len(self._buffer) >= end:
            payload = bytes(memoryview(self._buffer)[4:end])
            del self._buffer[:end]
            return payload
        # The rest of a large frame: receive exactly its bytes, at most one chunk at a time
        # (each receive allocates what it asks for), and copy them once, in the join. Small
        # receives are coalesced, so a peer trickling bytes cannot make the list of parts
        # cost much more memory than the frame itself.
        parts: list[bytes | bytearray] = [bytes(memoryview(self._buffer)[4:])]
        small = bytearray()
        have_bytes = len(self._buffer) - 4
        self._buffer = bytearray()
        while have_bytes < size_bytes:
            chunk = await self._stream.receive_some(
                min(self._receive_chunk_bytes, size_bytes - have_bytes)
            )
            if not chunk:
                raise trio.BrokenResourceError("stream ended inside a frame")
            have_bytes += len(chunk)
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
