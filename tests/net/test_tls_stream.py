"""TLSStream on real loopback sockets, against trio.SSLStream as the peer: whole records per
receive, both directions at once, the ends of a stream, and a FrameReader's memory account
over TLS (nothing held while idle; everything received charged; garbage refused)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from raftlog.net.framing import FrameReader, QueuedBytes, frame
from raftlog.net.tls import TLSStream, handshake
from raftlog.security import tls as contexts
from tests.net.test_tls_certs import issue, write_ca

HANDSHAKE_TIMEOUT_S = 10.0
TLS_RECORD_BYTES = 16 * 1024


@asynccontextmanager
async def tls_pair(tmp_path: Path) -> AsyncIterator[tuple[TLSStream, trio.SSLStream[Any]]]:
    """(this node's server-side TLSStream, a trio.SSLStream client) over loopback."""
    ca, ca_path = write_ca(tmp_path / "certs")
    server_files = issue(tmp_path / "certs", ca, ca_path, "broker-1")
    server_context = contexts.server_context(
        certfile=server_files.cert, keyfile=server_files.key, cafile=ca_path
    )
    client_context = contexts.client_context(cafile=ca_path, check_hostname=False)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        accepted: list[TLSStream] = []
        ready = trio.Event()

        async def accept() -> None:
            raw = await listeners[0].accept()
            stream, failure = await handshake(
                raw, server_context, HANDSHAKE_TIMEOUT_S, server_side=True
            )
            assert stream is not None, failure
            accepted.append(stream)
            ready.set()

        nursery.start_soon(accept)
        client = trio.SSLStream(await trio.open_tcp_stream("127.0.0.1", port), client_context)
        await client.do_handshake()
        with trio.fail_after(HANDSHAKE_TIMEOUT_S):
            await ready.wait()
        try:
            yield accepted[0], client
        finally:
            await trio.aclose_forcefully(accepted[0])
            await trio.aclose_forcefully(client)
            for listener in listeners:
                await listener.aclose()


async def _wait_readable_bytes(stream: TLSStream, at_least: int) -> None:
    """Until the kernel holds `at_least` bytes for the stream's socket (FIONREAD)."""
    import fcntl
    import struct
    import termios

    with trio.fail_after(10):
        while True:
            raw = fcntl.ioctl(stream.socket.fileno(), termios.FIONREAD, b"\0\0\0\0")
            if struct.unpack("i", raw)[0] >= at_least:
                return
            await trio.sleep(0.001)


async def test_one_receive_decrypts_every_whole_record_already_received(tmp_path: Path) -> None:
    payload = os.urandom(1024 * 1024)
    async with tls_pair(tmp_path) as (server, client), trio.open_nursery() as nursery:
        # In the background: the socket buffers may not hold all of it before it is read.
        nursery.start_soon(client.send_all, payload)
        await _wait_readable_bytes(server, 4 * TLS_RECORD_BYTES + 1024)
        first = await server.receive_some(1024 * 1024)
        # trio.SSLStream would return one 16 KiB record here.
        assert len(first) >= 4 * TLS_RECORD_BYTES
        received = bytearray(first)
        while len(received) < len(payload):
            received += await server.receive_some()
        assert received == payload


async def test_both_directions_at_once(tmp_path: Path) -> None:
    upstream, downstream = os.urandom(1024 * 1024), os.urandom(1024 * 1024)
    async with tls_pair(tmp_path) as (server, client):
        got_up, got_down = bytearray(), bytearray()

        async def read_all(stream: trio.abc.ReceiveStream, into: bytearray, size: int) -> None:
            while len(into) < size:
                into += await stream.receive_some(64 * 1024)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.send_all, downstream)
            nursery.start_soon(client.send_all, upstream)
            nursery.start_soon(read_all, server, got_up, len(upstream))
            nursery.start_soon(read_all, client, got_down, len(downstream))
        assert got_up == upstream and got_down == downstream


async def test_close_notify_is_a_clean_end_and_a_cut_is_a_broken_one(tmp_path: Path) -> None:
    async with tls_pair(tmp_path) as (server, client):
        await client.send_all(b"last words")
        await client.aclose()  # sends close_notify
        assert await server.receive_some() == b"last words"
        assert await server.receive_some() == b""
    async with tls_pair(tmp_path) as (server, client):
        await client.transport_stream.aclose()  # no close_notify: could be a truncation
        with pytest.raises(trio.BrokenResourceError):
            await server.receive_some()


async def test_a_frame_reader_over_tls_holds_nothing_while_idle_and_charges_what_it_read(
    tmp_path: Path,
) -> None:
    pool = QueuedBytes(8 * 1024 * 1024)
    payload = os.urandom(300 * 1024)
    async with tls_pair(tmp_path) as (server, client):
        reader = FrameReader(server, 1024 * 1024, account=pool.account(), idle_timeout_s=60)
        frames: list[bytes | None] = []

        async def read_one() -> None:
            frames.append(await reader.read_frame())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_one)
            await trio.testing.wait_all_tasks_blocked()
            # Waiting for a peer that sends nothing costs the pool nothing.
            assert pool.used_bytes == 0
            await client.send_all(frame(payload))
        assert frames == [payload]
        assert pool.used_bytes == 4 + len(payload) + server.held_bytes
        reader.frame_answered(len(payload))
        assert pool.used_bytes == server.held_bytes


async def test_bytes_that_are_not_tls_break_the_stream_and_return_their_charge(
    tmp_path: Path,
) -> None:
    pool = QueuedBytes(8 * 1024 * 1024)
    async with tls_pair(tmp_path) as (server, client):
        account = pool.account()
        reader = FrameReader(server, 1024 * 1024, account=account, idle_timeout_s=60)
        # A record header announcing application data, then bytes no key produced.
        await client.transport_stream.send_all(b"\x17\x03\x03\x01\x00" + os.urandom(256))
        with pytest.raises(trio.BrokenResourceError) as caught:
            await reader.read_frame()
        assert "TLS" in str(caught.value)
        account.close()
        assert pool.used_bytes == 0
