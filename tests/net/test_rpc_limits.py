"""Issue 13, bounded resources on the internal listener: serve_rpc on real loopback sockets
under a MockClock. The same limits as the Kafka listener (tests/kafka/test_limits.py), through
the same framing code; a node's own PeerClient keeps getting answers throughout.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from raftlog.constants import MIB
from raftlog.net.limits import ListenerGuard, ListenerLimits
from raftlog.net.rpc import PeerClient, PeerSet, RpcLimits, _encode, serve_rpc
from tests.net import hostile
from tests.waiting import wait_until

MAX_FRAME_BYTES = 8 * MIB
QUEUED_MAX_REQUEST_BYTES = 2 * MIB
READ_TIMEOUT_MS = 2_000
ATTACKERS = 20


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def echo(sender_id: int, method: str, body: Any) -> Any:
    return body


async def start(nursery: trio.Nursery, **values: int) -> tuple[int, ListenerGuard, PeerClient]:
    listener = ListenerLimits(
        **{
            "queued_max_request_bytes": QUEUED_MAX_REQUEST_BYTES,
            "request_read_timeout_ms": READ_TIMEOUT_MS,
            **values,
        }
    )
    limits = RpcLimits(max_frame_bytes=MAX_FRAME_BYTES, listener=listener)
    guard = ListenerGuard("internal", listener, logging.getLogger("raftlog.rpc"))
    listeners = await nursery.start(
        partial(serve_rpc, echo, "127.0.0.1", 0, limits=limits, guard=guard)
    )
    port = listeners[0].socket.getsockname()[1]
    peers = PeerSet(sender_id=2)
    await nursery.start(peers.run)
    peer = peers.peer(1, "127.0.0.1", port)
    assert await peer.call("echo", b"x") == b"x"
    return port, guard, peer


async def test_half_finished_frames_are_bounded_and_dropped(
    clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        port, guard, peer = await start(nursery)
        outcomes = [hostile.Outcome() for _ in range(ATTACKERS)]
        for outcome in outcomes:
            nursery.start_soon(hostile.half_frame, port, MAX_FRAME_BYTES, outcome)
        await wait_until(
            "reading to pause on a full pool",
            lambda: guard.queued.used_bytes == QUEUED_MAX_REQUEST_BYTES and guard.queued.waiting,
        )
        # Answered once the partial frames holding the pool are dropped at their deadline.
        assert await peer.call("echo", b"y", timeout_s=3 * READ_TIMEOUT_MS / 1000) == b"y"
        await wait_until(
            "every attacker to be cut off",
            lambda: all(o.closed_at is not None for o in outcomes),
            timeout_s=ATTACKERS * READ_TIMEOUT_MS / 1000,
        )
        # What the node read never passed the pool. (What each attacker got the kernel to take
        # is no measure: loopback socket buffers can hold its whole half frame.)
        assert guard.queued.peak_bytes == QUEUED_MAX_REQUEST_BYTES
        await wait_until("only the peer's connection left", lambda: guard.caps.open == 1)
        assert guard.queued.used_bytes == 0
        # A frame almost as large as the pool still goes through once memory is free.
        big = bytes(QUEUED_MAX_REQUEST_BYTES - 1024)
        assert await peer.call("echo", big) == big
        assert guard.queued.used_bytes == 0
        nursery.cancel_scope.cancel()


async def test_slow_idle_and_excess_connections_are_closed(
    clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raftlog.rpc")
    idle_ms = 10_000
    async with trio.open_nursery() as nursery:
        port, guard, peer = await start(
            nursery, connections_max_idle_ms=idle_ms, max_connections_per_ip=2
        )
        request = _encode(0, 0, 9, "raft", {"vote": 1})
        slow = hostile.Outcome()
        started = trio.current_time()
        nursery.start_soon(hostile.trickle, port, request, 1.0, slow)
        silent = await hostile.connect(port, local_ip="127.0.0.2")
        await wait_until("three connections in", lambda: guard.caps.open == 3)
        # A third connection from 127.0.0.1 (the peer's and the slow one are there already).
        refused = await hostile.connect(port)
        with trio.fail_after(0.1):
            await hostile.wait_closed(refused)
        while slow.closed_at is None:
            assert await peer.call("echo", 1) == 1
            quiet_since = trio.current_time()  # the peer's last call
            await trio.sleep(0.5)
        assert slow.closed_at - started == pytest.approx(READ_TIMEOUT_MS / 1000, abs=0.01)
        await hostile.wait_closed(silent)
        assert trio.current_time() - started == pytest.approx(idle_ms / 1000, abs=0.01)
        # The peer, busy until the slow sender was cut off, then quiet: it is closed as idle
        # too, and reconnects.
        await wait_until(
            "the quiet peer to be closed",
            lambda: sum("no complete request" in m for m in caplog.messages) == 2,
            timeout_s=2 * idle_ms / 1000,
        )
        assert trio.current_time() - quiet_since >= idle_ms / 1000
        assert await peer.call("echo", 2) == 2
        nursery.cancel_scope.cancel()
    messages = "\n".join(caplog.messages)
    assert "took longer than 2000 ms" in messages
    assert "no complete request for 10000 ms" in messages
    assert "max_connections_per_ip (2) reached" in messages
