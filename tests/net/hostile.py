"""Hostile peers for the listener-limit tests: trio tasks on real loopback sockets.

Each one does what an attacker would: claim a huge frame and send half of it, trickle a frame
one byte at a time, or connect and say nothing. They report what the server did to them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import trio

CHUNK_BYTES = 1024 * 1024
_ZEROS = bytes(CHUNK_BYTES)


@dataclass
class Outcome:
    """What happened to one hostile connection."""

    sent_bytes: int = 0
    closed_at: float | None = None  # trio time the server cut the connection


async def connect(port: int, local_ip: str | None = None) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port, local_address=local_ip)


async def half_frame(port: int, claimed_bytes: int, outcome: Outcome) -> None:
    """Announce a `claimed_bytes` frame, send half of it and never the rest."""
    stream = await connect(port)
    try:
        await stream.send_all(struct.pack(">i", claimed_bytes))
        while outcome.sent_bytes < claimed_bytes // 2:
            size = min(CHUNK_BYTES, claimed_bytes // 2 - outcome.sent_bytes)
            await stream.send_all(memoryview(_ZEROS)[:size])
            outcome.sent_bytes += size
        await wait_closed(stream)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # cut off while sending
    finally:
        outcome.closed_at = trio.current_time()
        await trio.aclose_forcefully(stream)


async def trickle(port: int, data: bytes, interval_s: float, outcome: Outcome) -> None:
    """Send `data` one byte every `interval_s` until the server closes the connection."""
    stream = await connect(port)
    try:
        async with trio.open_nursery() as nursery:

            async def send() -> None:
                try:
                    for i in range(len(data)):
                        await stream.send_all(data[i : i + 1])
                        outcome.sent_bytes += 1
                        await trio.sleep(interval_s)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # cut off: wait_closed sees it too

            nursery.start_soon(send)
            await wait_closed(stream)
            nursery.cancel_scope.cancel()
    finally:
        outcome.closed_at = trio.current_time()
        await trio.aclose_forcefully(stream)


async def wait_closed(stream: trio.SocketStream) -> None:
    """Return when the server closes (EOF or reset); anything it sends is discarded."""
    try:
        while await stream.receive_some(65536):
            pass
    except trio.BrokenResourceError:
        pass
