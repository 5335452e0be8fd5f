import pytest
import trio
import trio.lowlevel
import trio.testing

from raftlog.net.framing import FrameReader, FrameTooLarge, frame


async def test_frames_split_across_reads():
    send, receive = trio.testing.memory_stream_pair()
    reader = FrameReader(receive, max_frame_bytes=1024)
    data = frame(b"hello") + frame(b"") + frame(b"x" * 300)
    for i in range(0, len(data), 7):
        await send.send_all(data[i : i + 7])
    await send.aclose()
    assert await reader.read_frame() == b"hello"
    assert await reader.read_frame() == b""
    assert await reader.read_frame() == b"x" * 300
    assert await reader.read_frame() is None


async def test_oversized_and_negative_sizes_are_refused():
    for prefix in (b"\x00\x01\x00\x00", b"\xff\xff\xff\xff"):
        send, receive = trio.testing.memory_stream_pair()
        await send.send_all(prefix)
        with pytest.raises(FrameTooLarge):
            await FrameReader(receive, max_frame_bytes=1024).read_frame()


async def test_truncated_frame_is_an_error():
    send, receive = trio.testing.memory_stream_pair()
    await send.send_all(frame(b"abcdef")[:-2])
    await send.aclose()
    with pytest.raises(trio.BrokenResourceError):
        await FrameReader(receive, max_frame_bytes=1024).read_frame()


async def test_large_frames_assemble_from_bounded_receives():
    send, receive = trio.testing.memory_stream_pair()
    reader = FrameReader(receive, max_frame_bytes=1 << 20, receive_chunk_bytes=1000)
    big = bytes(range(256)) * 1500  # 384 000 bytes: many receives of at most 1000 bytes
    data = frame(big) + frame(b"tail")
    async with trio.open_nursery() as nursery:

        async def writer():
            for i in range(0, len(data), 4096):
                await send.send_all(data[i : i + 4096])
            await send.aclose()

        nursery.start_soon(writer)
        assert await reader.read_frame() == big
        assert await reader.read_frame() == b"tail"
        assert await reader.read_frame() is None


async def test_queued_bytes_never_pass_the_limit_and_wake_waiters():
    from raftlog.net.framing import QueuedBytes

    pool = QueuedBytes(100)
    first, second = pool.account(), pool.account()
    assert await first.reserve(70) == 70
    assert await second.reserve(70) == 30  # what is left, not what was asked
    got = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _reserve_into(second, 10, got))
        await trio.testing.wait_all_tasks_blocked()
        assert got == [] and pool.waiting == 1  # nothing left: it waits
        first.release(20)
        await trio.testing.wait_all_tasks_blocked()
    assert got == [10] and pool.used_bytes == 90 and pool.peak_bytes == 100
    first.close()
    second.release(1000)  # more than it holds: clamped, as after a close
    assert pool.used_bytes == 0 and first.held_bytes == second.held_bytes == 0


async def _reserve_into(account, want, got):
    got.append(await account.reserve(want))


async def _socket_stream_pair(buffer_bytes: int) -> tuple[trio.SocketStream, trio.SocketStream]:
    import socket

    a, b = trio.socket.socketpair()
    for sock in (a, b):
        # Small kernel buffers: the writer meets short writes and a full buffer at once.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)
    return trio.SocketStream(a), trio.SocketStream(b)


async def test_send_pieces_writes_every_byte_in_order_through_short_writes_and_waits():
    from raftlog.net.framing import SEND_MAX_PIECES, send_pieces

    writer, reader = await _socket_stream_pair(4096)
    # More pieces than one gathered write takes, empty ones among them, some large.
    pieces = [bytes([i % 251]) * (i % 7 * 977) for i in range(SEND_MAX_PIECES + 300)]
    pieces += [b"", bytearray(b"tail") * 100_000]
    expected = b"".join(pieces)
    received = bytearray()

    async def read_slowly() -> None:
        while len(received) < len(expected):
            received.extend(await reader.receive_some(3000))
            await trio.lowlevel.checkpoint()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_slowly)
            await send_pieces(writer, pieces)
    assert bytes(received) == expected


async def test_send_pieces_to_a_closed_peer_raises_oserror_and_never_hangs():
    from raftlog.net.framing import send_pieces

    writer, reader = await _socket_stream_pair(4096)
    await reader.aclose()
    with trio.fail_after(10), pytest.raises(OSError):
        for _ in range(100):  # the first write may still land in the buffer
            await send_pieces(writer, [b"x" * 65536])
    await writer.aclose()
    with trio.fail_after(10), pytest.raises(OSError):
        await send_pieces(writer, [b"after close"])  # fileno() is -1: EBADF


async def test_send_pieces_on_other_streams_joins_and_sends_all():
    from raftlog.net.framing import send_pieces

    send, receive = trio.testing.memory_stream_pair()
    await send_pieces(send, [b"ab", bytearray(b"cd"), b""])
    assert await receive.receive_some(10) == b"abcd"
