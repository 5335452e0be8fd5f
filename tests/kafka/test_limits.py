"""Issue 13, bounded resources on the Kafka listener: the trio server in-process on real
loopback sockets, under a MockClock that jumps whenever every task waits.

Each test plays the attack the issue reproduced (half-finished 100 MiB frames, idle
connections, connection floods, one byte a second) next to a well-behaved client that must
keep being answered. tests/integration/test_bounded_resources_processes.py plays them all at
once against a real node process with stock clients.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing
from kio.schema.errors import ErrorCode

from raftlog.config import NodeConfig
from raftlog.constants import MIB
from raftlog.net.kafka.apis import ApiKey
from raftlog.net.kafka.server import serve
from raftlog.net.limits import ListenerGuard, ListenerLimits
from tests.kafka.memory_backend import MemoryBackend
from tests.kafka.test_wire import req
from tests.kafka.wire import WireClient, encode_request
from tests.net import hostile
from tests.waiting import wait_until

CLAIMED_FRAME_BYTES = 100 * MIB
QUEUED_MAX_REQUEST_BYTES = 4 * MIB
READ_TIMEOUT_MS = 5_000
# Shorter than the read timeout: waiting for memory is not being idle.
IDLE_MS = 3_000
ATTACKERS = 20

API_VERSIONS = req(ApiKey.API_VERSIONS, 3, client_software_name="t", client_software_version="1")


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def start(
    nursery: trio.Nursery, tmp_path: Path, **limits: int
) -> tuple[int, ListenerGuard, MemoryBackend]:
    backend = MemoryBackend(tmp_path)
    config = NodeConfig(socket_request_max_bytes=CLAIMED_FRAME_BYTES)
    values = {
        "queued_max_request_bytes": QUEUED_MAX_REQUEST_BYTES,
        "request_read_timeout_ms": READ_TIMEOUT_MS,
        "connections_max_idle_ms": IDLE_MS,
        **limits,
    }
    guard = ListenerGuard("Kafka", ListenerLimits(**values), logging.getLogger("raftlog.kafka"))
    listeners = await nursery.start(partial(serve, backend, "127.0.0.1", 0, config, guard=guard))
    return listeners[0].socket.getsockname()[1], guard, backend


async def api_versions_ok(client: WireClient) -> bool:
    response = await client.request(API_VERSIONS)
    return response.error_code == ErrorCode.none


async def test_half_finished_huge_frames_cost_at_most_queued_max_request_bytes(
    tmp_path: Path, clock: trio.testing.MockClock
) -> None:
    """20 frames claiming 100 MiB, each sent half-way: the bytes held never pass the limit
    (reading pauses instead), every attacker is cut off at the read deadline, their bytes
    are returned, and a client connected all along is answered once memory frees."""
    async with trio.open_nursery() as nursery:
        port, guard, backend = await start(nursery, tmp_path)
        bystander = await WireClient.connect(port)
        assert await api_versions_ok(bystander)
        outcomes = [hostile.Outcome() for _ in range(ATTACKERS)]
        started = trio.current_time()
        for outcome in outcomes:
            nursery.start_soon(hostile.half_frame, port, CLAIMED_FRAME_BYTES, outcome)
        await wait_until(
            "reading to pause on a full pool",
            lambda: guard.queued.used_bytes == QUEUED_MAX_REQUEST_BYTES and guard.queued.waiting,
            timeout_s=READ_TIMEOUT_MS / 1000,
        )
        # The bystander's request waits for memory like everyone else's, longer than the idle
        # limit (the pause is the node's doing, not the client's), and is answered once the
        # attackers' partial frames are dropped.
        with trio.fail_after(3 * READ_TIMEOUT_MS / 1000):
            assert await api_versions_ok(bystander)
        await wait_until(
            "every attacker to be cut off",
            lambda: all(o.closed_at is not None for o in outcomes),
            timeout_s=ATTACKERS * READ_TIMEOUT_MS / 1000,
        )
        assert guard.queued.peak_bytes == QUEUED_MAX_REQUEST_BYTES
        # Each was cut off by a read deadline, not held forever; none sent its whole half.
        assert all(o.closed_at - started >= READ_TIMEOUT_MS / 1000 for o in outcomes)  # type: ignore[operator]
        assert all(o.sent_bytes < CLAIMED_FRAME_BYTES // 2 for o in outcomes)
        # Only the bystander may be left (or not even it: it has been idle since its answer).
        await wait_until("the attackers to be counted out", lambda: guard.caps.open <= 1)
        assert guard.queued.used_bytes == 0
        assert await api_versions_ok(await WireClient.connect(port))
        nursery.cancel_scope.cancel()
    backend.close()


async def test_idle_connection_is_closed_with_a_log_line(
    tmp_path: Path, clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raftlog.kafka")
    idle_ms = 2_000
    async with trio.open_nursery() as nursery:
        port, guard, backend = await start(nursery, tmp_path, connections_max_idle_ms=idle_ms)
        silent = await hostile.connect(port)
        talker = await WireClient.connect(port)
        opened = trio.current_time()
        # A client that keeps sending requests is never idle, however long it stays.
        for _ in range(3 * idle_ms // 500):
            assert await api_versions_ok(talker)
            await trio.sleep(0.5)
        with trio.fail_after(1):
            await hostile.wait_closed(silent)
        assert trio.current_time() - opened >= 2 * idle_ms / 1000  # closed long before
        assert await api_versions_ok(talker)
        # The talker, quiet from now on, goes after the idle limit and not before.
        quiet_since = trio.current_time()
        await hostile.wait_closed(talker.stream)
        assert trio.current_time() - quiet_since == pytest.approx(idle_ms / 1000, abs=0.01)
        await wait_until("both connections to be counted out", lambda: guard.caps.open == 0)
        nursery.cancel_scope.cancel()
    backend.close()
    assert any(
        r.levelno == logging.INFO and "no complete request for 2000 ms" in r.getMessage()
        for r in caplog.records
    )


async def test_connection_caps_refuse_the_next_connection_at_once(
    tmp_path: Path, clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """max_connections_per_ip=2, max_connections=3: a third connection from one IP and a
    fourth in total are closed at once, with one log line per kind for a burst; a freed
    slot is usable again, and admitted clients are served throughout."""
    caplog.set_level(logging.WARNING, logger="raftlog.kafka")
    async with trio.open_nursery() as nursery:
        port, guard, backend = await start(
            nursery, tmp_path, max_connections=3, max_connections_per_ip=2
        )
        first = await WireClient.connect(port)
        second = await WireClient.connect(port)
        assert await api_versions_ok(first) and await api_versions_ok(second)
        for _ in range(5):
            refused = await hostile.connect(port)
            with trio.fail_after(1):
                await hostile.wait_closed(refused)
        other_ip = WireClient(await hostile.connect(port, local_ip="127.0.0.2"))
        assert await api_versions_ok(other_ip)
        for _ in range(5):
            refused = await hostile.connect(port, local_ip="127.0.0.3")
            with trio.fail_after(1):
                await hostile.wait_closed(refused)
        assert guard.caps.open == 3 and guard.caps.refused == 10
        lines = [
            r.getMessage() for r in caplog.records if "closing new connection" in r.getMessage()
        ]
        assert len(lines) == 2, lines  # rate-limited: one line per kind of refusal
        assert "max_connections_per_ip (2)" in lines[0] and "max_connections (3)" in lines[1]
        for client in (first, second, other_ip):
            assert await api_versions_ok(client)
        await first.stream.aclose()
        await wait_until("the slot to be freed", lambda: guard.caps.open == 2)
        again = await WireClient.connect(port)
        assert await api_versions_ok(again)
        nursery.cancel_scope.cancel()
    backend.close()


async def test_a_frame_sent_one_byte_a_second_is_cut_off_at_the_read_deadline(
    tmp_path: Path, clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    read_timeout_ms = 3_000
    slow_senders = 30
    async with trio.open_nursery() as nursery:
        port, guard, backend = await start(
            nursery, tmp_path, request_read_timeout_ms=read_timeout_ms
        )
        talker = await WireClient.connect(port)
        request = encode_request(API_VERSIONS, 1)
        outcomes = [hostile.Outcome() for _ in range(slow_senders)]
        started = trio.current_time()
        for outcome in outcomes:
            nursery.start_soon(hostile.trickle, port, request, 1.0, outcome)
        # A client sending whole requests meanwhile is answered every time.
        while not all(o.closed_at is not None for o in outcomes):
            assert await api_versions_ok(talker)
            await trio.sleep(0.25)
            assert trio.current_time() - started < 2 * read_timeout_ms / 1000
        for outcome in outcomes:
            assert outcome.closed_at is not None
            # Cut off at the deadline counted from the frame's first byte: 3 s, 4 bytes sent.
            assert outcome.closed_at - started == pytest.approx(read_timeout_ms / 1000, abs=0.01)
            assert outcome.sent_bytes == read_timeout_ms // 1000 + 1 < len(request)
        await wait_until("the slow senders to be counted out", lambda: guard.caps.open == 1)
        assert guard.queued.used_bytes == 0
        nursery.cancel_scope.cancel()
    backend.close()
    assert any("took longer than 3000 ms" in r.getMessage() for r in caplog.records)


async def test_idle_connections_hold_no_memory(
    tmp_path: Path, clock: trio.testing.MockClock
) -> None:
    """Connections waiting for their next request reserve nothing: 300 of them, each after
    a request larger than its share of a 64 KiB pool, leave it empty for everyone else."""
    pool_bytes = 64 * 1024
    async with trio.open_nursery() as nursery:
        port, guard, backend = await start(nursery, tmp_path, queued_max_request_bytes=pool_bytes)
        padded = req(
            ApiKey.API_VERSIONS, 3, client_software_name="t" * 1000, client_software_version="1"
        )
        clients = []
        for _ in range(300):
            client = await WireClient.connect(port)
            assert (await client.request(padded)).error_code == ErrorCode.none
            clients.append(client)
        await wait_until("the answered bytes to be returned", lambda: guard.queued.used_bytes == 0)
        assert guard.caps.open == 300
        for client in clients[::50]:
            assert await api_versions_ok(client)
        await wait_until("the bytes to be returned again", lambda: guard.queued.used_bytes == 0)
        nursery.cancel_scope.cancel()
    backend.close()
