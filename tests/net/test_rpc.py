import functools
import socket

import msgpack
import pytest
import trio

from raftlog.net.framing import frame
from raftlog.net.rpc import PeerSet, RpcError, RpcLimits, serve_rpc


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _start_server(nursery, handler, **limits):
    listeners = await nursery.start(
        functools.partial(serve_rpc, handler, "127.0.0.1", 0, limits=RpcLimits(**limits))
    )
    return listeners[0].socket.getsockname()[1]


async def test_calls_casts_and_errors():
    casts = trio.Event()
    seen = []

    async def handler(sender_id, method, body):
        if method == "echo":
            return {"from": sender_id, "body": body}
        if method == "boom":
            raise ValueError("bad thing")
        seen.append((sender_id, method, body))
        casts.set()
        return None

    async with trio.open_nursery() as nursery:
        port = await _start_server(nursery, handler)
        peers = PeerSet(sender_id=7)
        await nursery.start(peers.run)
        peer = peers.peer(1, "127.0.0.1", port)
        assert await peer.call("echo", [1, b"x"]) == {"from": 7, "body": [1, b"x"]}
        assert peer.cast("note", {"a": 1})
        with trio.fail_after(5):
            await casts.wait()
        assert seen == [(7, "note", {"a": 1})]
        # The peer learns the type only: an exception's text may hold internal state.
        with pytest.raises(RpcError, match=r"failed boom: ValueError$"):
            await peer.call("boom", None)
        # The connection survives a failed handler.
        assert (await peer.call("echo", 2))["body"] == 2
        nursery.cancel_scope.cancel()


async def test_frames_read_together_start_their_handlers_in_order():
    """Casts queued back to back reach the server in one read; each handler must start (take
    its first step) in the order its frame came, run after run (trio shuffles the tasks of
    one scheduler batch, so a missing yield between two starts shows up as a reordering)."""
    started: list[int] = []
    count = 40
    done = trio.Event()

    async def handler(sender_id, method, body):
        if method != "note":
            return None
        started.append(body)
        if len(started) == count:
            done.set()

    async with trio.open_nursery() as nursery:
        port = await _start_server(nursery, handler)
        peers = PeerSet(sender_id=3)
        await nursery.start(peers.run)
        peer = peers.peer(1, "127.0.0.1", port)
        with trio.fail_after(5):
            await peer.call("ping", None)  # connected
        for i in range(count):
            assert peer.cast("note", i)
        with trio.fail_after(5):
            await done.wait()
        assert started == list(range(count))
        nursery.cancel_scope.cancel()


async def test_concurrent_calls_are_correlated():
    async def handler(sender_id, method, body):
        await trio.sleep(0.001 * (10 - body))  # answer out of order
        return body * 10

    async with trio.open_nursery() as nursery:
        port = await _start_server(nursery, handler)
        peers = PeerSet(sender_id=1)
        await nursery.start(peers.run)
        peer = peers.peer(2, "127.0.0.1", port)
        results = {}

        async def one(i):
            results[i] = await peer.call("x", i)

        async with trio.open_nursery() as calls:
            for i in range(10):
                calls.start_soon(one, i)
        assert results == {i: i * 10 for i in range(10)}
        nursery.cancel_scope.cancel()


async def test_unreachable_peer_times_out_then_reconnects():
    port = _free_port()

    async def handler(sender_id, method, body):
        return "up"

    async with trio.open_nursery() as nursery:
        peers = PeerSet(sender_id=1, limits=RpcLimits(reconnect_backoff_max_s=0.05))
        await nursery.start(peers.run)
        peer = peers.peer(2, "127.0.0.1", port)
        with pytest.raises(RpcError, match="not reachable"):
            await peer.call("x", None, timeout_s=0.2)
        assert not peer.cast("x", None)
        await nursery.start(serve_rpc, handler, "127.0.0.1", port)
        assert await peer.call("x", None, timeout_s=10) == "up"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "bad_bytes",
    [
        frame(b"\xc1garbage"),  # not msgpack
        frame(msgpack.packb([1, 2])),  # wrong envelope
        b"\x7f\xff\xff\xff",  # absurd size
    ],
)
async def test_malformed_frames_close_only_that_connection(bad_bytes):
    async def handler(sender_id, method, body):
        return "ok"

    async with trio.open_nursery() as nursery:
        port = await _start_server(nursery, handler, max_frame_bytes=1 << 20)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(bad_bytes)
        with trio.fail_after(5):
            assert await stream.receive_some(100) == b""  # server closed it
        peers = PeerSet(sender_id=1)
        await nursery.start(peers.run)
        assert await peers.peer(1, "127.0.0.1", port).call("x", None) == "ok"
        nursery.cancel_scope.cancel()


async def test_peer_set_replaces_moved_peer():
    async def handler_a(sender_id, method, body):
        return "a"

    async def handler_b(sender_id, method, body):
        return "b"

    async with trio.open_nursery() as nursery:
        port_a = await _start_server(nursery, handler_a)
        port_b = await _start_server(nursery, handler_b)
        peers = PeerSet(sender_id=1)
        await nursery.start(peers.run)
        assert await peers.peer(3, "127.0.0.1", port_a).call("x", None) == "a"
        assert await peers.peer(3, "127.0.0.1", port_b).call("x", None) == "b"
        assert peers.get(3).address == ("127.0.0.1", port_b)
        nursery.cancel_scope.cancel()


async def test_a_peer_that_never_reads_answers_cannot_pile_up_requests():
    """The in-flight limit holds a request's slot until its answer is queued for writing: a
    peer that sends requests but never reads the answers stalls only itself."""
    from trio.testing import lockstep_stream_pair, wait_all_tasks_blocked

    from raftlog.net.rpc import KIND_REQUEST, _encode, _serve_connection

    inflight = 4
    calls = 0

    async def handler(sender_id, method, body):
        nonlocal calls
        calls += 1
        return b"x" * 1024

    # A lockstep stream: the server's first answer blocks until the client reads it (never).
    client, server = lockstep_stream_pair()

    async def flood():
        for correlation_id in range(1, 201):
            await client.send_all(_encode(KIND_REQUEST, correlation_id, 9, "x", None))

    async with trio.open_nursery() as nursery:
        limits = RpcLimits(max_inflight_per_connection=inflight)
        nursery.start_soon(_serve_connection, server, handler, limits)
        nursery.start_soon(flood)
        await wait_all_tasks_blocked()
        # One answer in the writer's send, `inflight` queued, `inflight` waiting for room.
        assert calls <= 2 * inflight + 1, calls
        nursery.cancel_scope.cancel()


async def _read_answers(stream: trio.abc.ReceiveStream) -> list[tuple]:
    """Every answer frame until the server closes the stream."""
    from raftlog.net.framing import FrameReader
    from raftlog.net.rpc import _decode

    reader = FrameReader(stream, 1 << 20)
    answers = []
    with trio.fail_after(5):
        try:
            while (payload := await reader.read_frame()) is not None:
                answers.append(_decode(payload))
        except trio.BrokenResourceError:
            pass  # closed with our frames unread: a reset rather than an orderly close
    return answers


async def test_a_connection_speaks_for_the_node_id_of_its_first_frame():
    """Issue 13: a second id on one connection closes it; handlers see the bound id only."""
    from raftlog.net.framing import FrameReader
    from raftlog.net.rpc import KIND_REQUEST, _decode, _encode

    seen = []

    async def handler(sender_id, method, body):
        seen.append(sender_id)
        return sender_id

    async with trio.open_nursery() as nursery:
        port = await _start_server(nursery, handler)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        reader = FrameReader(stream, 1 << 20)
        for correlation_id in (1, 2):
            await stream.send_all(_encode(KIND_REQUEST, correlation_id, 3, "x", None))
            with trio.fail_after(5):
                answer = _decode(await reader.read_frame())
            assert (answer[1], answer[4]) == (correlation_id, 3)
        await stream.send_all(_encode(KIND_REQUEST, 3, 2, "x", None))  # now claims node 2
        await stream.send_all(_encode(KIND_REQUEST, 4, 3, "x", None))
        assert await _read_answers(stream) == []  # closed, nothing more answered
        assert seen == [3, 3]
        # A client that is not a node (-1) cannot become one on the same connection either.
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        reader = FrameReader(stream, 1 << 20)
        await stream.send_all(_encode(KIND_REQUEST, 1, -1, "x", None))
        with trio.fail_after(5):
            assert _decode(await reader.read_frame())[4] == -1
        await stream.send_all(_encode(KIND_REQUEST, 2, 1, "x", None))
        assert await _read_answers(stream) == []
        assert seen == [3, 3, -1]
        nursery.cancel_scope.cancel()


async def test_a_handler_refusing_the_identity_closes_the_connection():
    from raftlog.net.rpc import KIND_REQUEST, IdentityMismatch, PeerIdentity, _encode

    async def handler(sender_id, method, body):
        if body != sender_id:
            raise IdentityMismatch("the body names another node")
        return "ok"

    async with trio.open_nursery() as nursery:
        port = await _start_server(nursery, handler)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(_encode(KIND_REQUEST, 1, 3, "x", 3))
        await stream.send_all(_encode(KIND_REQUEST, 2, 3, "x", 2))
        answers = await _read_answers(stream)
        # The refused request is never answered, and the connection is closed.
        assert all(a[1] == 1 for a in answers)
        nursery.cancel_scope.cancel()
    # An identity bound before the first frame (what authentication will provide) holds too.
    identity = PeerIdentity(5)
    assert not identity.admit(3) and identity.admit(5) and identity.node_id == 5


async def test_an_identity_given_by_the_listener_holds_from_the_first_frame():
    """The seam for an authenticated listener: identify() binds the id before any frame."""
    from raftlog.net.framing import FrameReader
    from raftlog.net.rpc import KIND_REQUEST, PeerIdentity, _decode, _encode

    async def handler(sender_id, method, body):
        return sender_id

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(
                serve_rpc, handler, "127.0.0.1", 0, identify=lambda _stream: PeerIdentity(4)
            )
        )
        port = listeners[0].socket.getsockname()[1]
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        reader = FrameReader(stream, 1 << 20)
        await stream.send_all(_encode(KIND_REQUEST, 1, 4, "x", None))
        with trio.fail_after(5):
            assert _decode(await reader.read_frame())[4] == 4
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(_encode(KIND_REQUEST, 1, 2, "x", None))  # claims another node
        assert await _read_answers(stream) == []
        nursery.cancel_scope.cancel()


async def test_large_answers_queued_together_arrive_whole_and_in_order():
    # Answers of megabytes, many queued at once: the writer gathers their pieces into
    # sendmsg calls that the socket takes in part; every byte must arrive in its place.
    sizes = [3 * 1024 * 1024 + i for i in range(8)]

    async def handler(sender_id, method, body):
        return bytes([body % 251]) * sizes[body] + body.to_bytes(4, "big")

    async with trio.open_nursery() as nursery:
        port = await _start_server(nursery, handler, send_coalesce_max_bytes=16 * 1024 * 1024)
        peers = PeerSet(sender_id=7)
        await nursery.start(peers.run)
        peer = peers.peer(1, "127.0.0.1", port)
        answers = {}

        async def call(i):
            answers[i] = await peer.call("big", i, timeout_s=30)

        async with trio.open_nursery() as calls:
            for i in range(len(sizes)):
                calls.start_soon(call, i)
        for i, size in enumerate(sizes):
            assert answers[i] == bytes([i % 251]) * size + i.to_bytes(4, "big")
        nursery.cancel_scope.cancel()


def test_large_bytes_travel_as_tails_and_come_back_in_place():
    from raftlog.net.rpc import KIND_RESPONSE, TAIL_MIN_BYTES, _decode, _encode, _encode_frame

    big = [bytes([i]) * (TAIL_MIN_BYTES + i) for i in range(3)]
    body = {"partitions": [{"records": big[0], "n": 1}, {"records": b"small"}], "x": (big[1], 2)}
    body["last"] = big[2]
    pieces = _encode_frame(KIND_RESPONSE, 5, 0, "fetch", body)
    # Prefix, envelope, then the three tails as the very objects given (never copied).
    assert len(pieces) == 5 and all(a is b for a, b in zip(pieces[2:], big, strict=True))
    assert len(pieces[1]) < 200
    kind, correlation_id, _, _, decoded = _decode(_encode(KIND_RESPONSE, 5, 0, "x", body)[4:])
    assert (kind, correlation_id) == (KIND_RESPONSE, 5)
    assert decoded == {
        "partitions": [{"records": big[0], "n": 1}, {"records": b"small"}],
        "x": [big[1], 2],
        "last": big[2],
    }
    # Small bodies keep the plain format.
    assert len(_encode_frame(KIND_RESPONSE, 5, 0, "x", {"records": b"r" * 100})) == 2


def test_a_tailed_frame_that_lies_about_its_lengths_is_refused():
    from raftlog.codec import DecodeError
    from raftlog.net.rpc import KIND_RESPONSE, TAIL_EXT, TAIL_MIN_BYTES, _decode, _encode

    good = _encode(KIND_RESPONSE, 1, 0, "x", [b"a" * TAIL_MIN_BYTES])[4:]
    assert _decode(good)[4] == [b"a" * TAIL_MIN_BYTES]

    def tailed(envelope: list, tails: bytes) -> bytes:
        packed = msgpack.packb(envelope, use_bin_type=True)
        return b"\xc1" + len(packed).to_bytes(4, "big") + packed + tails

    def ref(length: int, size: int = 4) -> msgpack.ExtType:
        return msgpack.ExtType(TAIL_EXT, length.to_bytes(size, "big"))

    assert _decode(tailed([2, 1, 0, "x", [ref(3), ref(2)]], b"abcde"))[4] == [b"abc", b"de"]
    bad = {
        "no envelope length": good[:3],
        "envelope past the frame": good[:1] + len(good).to_bytes(4, "big") + good[5:],
        "a tail past the frame": good[:-1],
        "bytes no tail claims": good + b"extra",
        "tails claiming more than there is": tailed([2, 1, 0, "x", [ref(3), ref(3)]], b"abcde"),
        "a tail reference of the wrong size": tailed([2, 1, 0, "x", ref(3, 8)], b"abc"),
        "not msgpack": good[:1] + (3).to_bytes(4, "big") + b"\xc1\xc1\xc1",
    }
    for why, payload in bad.items():
        with pytest.raises(DecodeError):
            _decode(payload)
            pytest.fail(why)
    # A tail reference in a frame without tails is no tail: it stays an extension value.
    plain = msgpack.packb([2, 1, 0, "x", msgpack.ExtType(TAIL_EXT, (5).to_bytes(4, "big"))])
    assert _decode(plain)[4] == msgpack.ExtType(TAIL_EXT, (5).to_bytes(4, "big"))


def test_the_sender_refuses_a_body_holding_a_tail_reference_and_stops_deep():
    import msgpack

    from raftlog.net.rpc import (
        KIND_RESPONSE,
        TAIL_EXT,
        TAIL_MIN_BYTES,
        TAIL_SEARCH_MAX_DEPTH,
        _decode,
        _encode,
        _encode_frame,
    )

    forged = {"records": msgpack.ExtType(TAIL_EXT, (5).to_bytes(4, "big"))}
    with pytest.raises(ValueError, match="extension"):
        _encode_frame(KIND_RESPONSE, 1, 0, "fetch", forged)
    # Nested past the search depth, large bytes go inline and still arrive whole.
    deep: object = b"d" * TAIL_MIN_BYTES
    for _ in range(TAIL_SEARCH_MAX_DEPTH + 5):
        deep = [deep]
    assert len(_encode_frame(KIND_RESPONSE, 2, 0, "x", deep)) == 2
    assert _decode(_encode(KIND_RESPONSE, 2, 0, "x", deep)[4:])[4] == deep
