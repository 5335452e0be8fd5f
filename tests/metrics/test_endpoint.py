"""The /metrics endpoint: what it answers, and that no peer input takes it down."""

from __future__ import annotations

import trio
import trio.testing
from prometheus_client import CollectorRegistry, Counter

from raftlog.metrics.endpoint import (
    MAX_REQUEST_HEAD_BYTES,
    REQUEST_READ_TIMEOUT_S,
    handle_connection,
    serve_metrics,
)


def registry_with_counter() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    Counter("raftlog_test_things", "Things.", registry=registry).inc(3)
    return registry


async def exchange(registry: CollectorRegistry, request: bytes, *, close: bool = False) -> bytes:
    """Send `request` over an in-memory stream to one handler; everything it answered."""
    client, server = trio.testing.memory_stream_pair()
    limiter = trio.CapacityLimiter(1)
    answer = bytearray()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handle_connection, registry, server, limiter)
        if request:
            await client.send_all(request)
        if close:
            await client.send_eof()
        while chunk := await client.receive_some(65536):
            answer += chunk
    assert limiter.borrowed_tokens == 0
    return bytes(answer)


async def test_get_metrics_renders_the_registry() -> None:
    request = b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"
    answer = await exchange(registry_with_counter(), request)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"Content-Type: text/plain; version=" in head
    assert f"Content-Length: {len(body)}".encode() in head
    assert b"raftlog_test_things_total 3.0" in body


async def test_other_paths_methods_and_garbage_get_errors() -> None:
    registry = registry_with_counter()
    assert (await exchange(registry, b"GET / HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404")
    assert (await exchange(registry, b"POST /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405")
    for garbage in (
        b"\x16\x03\x01\x02\x00\r\n\r\n",  # a TLS hello
        b"GET /metrics\r\n\r\n",  # HTTP/0.9
        b"GET metrics HTTP/1.1\r\n\r\n",
        b"G\xffT /metrics HTTP/1.1\r\n\r\n",
        b"GET /m\xe9trics HTTP/1.1\r\n\r\n",
    ):
        assert (await exchange(registry, garbage)).startswith(b"HTTP/1.1 400"), garbage
    # A head that never ends within the bound, and a peer that leaves mid-head.
    endless = b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"a" * (MAX_REQUEST_HEAD_BYTES * 2)
    assert (await exchange(registry, endless)).startswith(b"HTTP/1.1 400")
    assert (await exchange(registry, b"GET /met", close=True)).startswith(b"HTTP/1.1 400")


async def test_a_silent_client_is_dropped_after_the_read_timeout(autojump_clock) -> None:
    started = trio.current_time()
    assert await exchange(registry_with_counter(), b"") == b""
    assert trio.current_time() - started >= REQUEST_READ_TIMEOUT_S


async def test_a_failing_collector_answers_nothing_and_the_listener_lives_on() -> None:
    class Broken:
        def collect(self):  # type: ignore[no-untyped-def]
            raise RuntimeError("state went away")

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Broken())  # type: ignore[arg-type]
    assert await exchange(registry, b"GET /metrics HTTP/1.1\r\n\r\n") == b""


async def test_connections_past_the_cap_are_closed_at_once() -> None:
    client, server = trio.testing.memory_stream_pair()
    limiter = trio.CapacityLimiter(1)
    limiter.acquire_on_behalf_of_nowait(object())  # another connection holds the only slot
    await client.send_all(b"GET /metrics HTTP/1.1\r\n\r\n")
    await handle_connection(registry_with_counter(), server, limiter)
    assert await client.receive_some(100) == b""
    assert limiter.borrowed_tokens == 1


async def test_the_listener_serves_over_tcp() -> None:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(serve_metrics, registry_with_counter(), "127.0.0.1", 0)
        port = listeners[0].socket.getsockname()[1]
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /metrics HTTP/1.1\r\n\r\n")
        answer = b""
        while chunk := await stream.receive_some(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200") and b"raftlog_test_things_total" in answer
        await stream.aclose()
        nursery.cancel_scope.cancel()
