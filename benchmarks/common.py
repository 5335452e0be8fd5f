"""Shared benchmark helpers: rich progress on stderr, one JSON line last on stdout, and a
loopback TCP socket sink for sendfile/network benchmarks.

Every benchmark measures its own baseline in the same run and reports ratios (DESIGN.md rule 9);
absolute numbers on shared machines drift.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import trio
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from raftlog.constants import MIB

SINK_RECV_BYTES = 1 * MIB
# Progress and logs go to stderr so that stdout's last line is the JSON result.
console = Console(stderr=True)


@contextmanager
def progress(description: str, total_seconds: float) -> Iterator[Any]:
    """A time-based rich progress bar on stderr; call `tick()` on what this yields as often
    as convenient (it redraws at most every 100 ms of its own accord)."""
    columns = (TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(description, total=total_seconds)
        started = time.monotonic()

        class Updater:
            def tick(self) -> None:
                elapsed = time.monotonic() - started
                bar.update(task, completed=min(elapsed, total_seconds))

        yield Updater()
        bar.update(task, completed=total_seconds)


def emit_result(result: dict[str, Any]) -> None:
    """Print the result as exactly one JSON object on the last stdout line."""
    sys.stdout.flush()
    print(json.dumps(result, sort_keys=False), flush=True)


def mb_per_s(num_bytes: int, seconds: float) -> float:
    return round(num_bytes / MIB / seconds, 2) if seconds > 0 else 0.0


class SocketSink:
    """A loopback TCP connection whose far end is drained (and discarded) by a trio task."""

    def __init__(self, sender: socket.socket, receiver: socket.socket) -> None:
        self.sender = sender
        self.receiver = receiver
        self.bytes_received = 0

    @property
    def fd(self) -> int:
        return self.sender.fileno()

    async def _drain(self) -> None:
        sock = trio.socket.from_stdlib_socket(self.receiver)
        buffer = bytearray(SINK_RECV_BYTES)
        while True:
            n = await sock.recv_into(buffer)
            if n == 0:
                return
            self.bytes_received += n

    async def sendfile(self, file_fd: int, offset: int, count: int) -> int:
        """Send `count` bytes of a file with os.sendfile (zero copy), waiting when full."""
        sent_total = 0
        while sent_total < count:
            try:
                sent = os.sendfile(self.fd, file_fd, offset + sent_total, count - sent_total)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self.sender)
                continue
            if sent == 0:
                raise EOFError("sendfile reached the end of the file early")
            sent_total += sent
        return sent_total


@asynccontextmanager
async def socket_sink() -> AsyncIterator[SocketSink]:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    sender = socket.create_connection(listener.getsockname())
    receiver, _ = listener.accept()
    listener.close()
    sender.setblocking(False)
    receiver.setblocking(False)
    sink = SocketSink(sender, receiver)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sink._drain)
            yield sink
            nursery.cancel_scope.cancel()
    finally:
        sender.close()
        receiver.close()


def stream_acked_bytes_per_s(
    producer: Any,
    topic: str,
    value: bytes,
    seconds: float,
    timeout_s: float,
    partition: int = 0,
    ready: Callable[[], None] | None = None,
) -> float:
    """A confluent-kafka producer sending `value` to `partition` of `topic` as fast as it can
    for `seconds`: acknowledged bytes/s inside the window. Connects first (setup, a handshake,
    taking a producer id are not throughput), then calls `ready` (e.g. a barrier other
    producers wait on too); raises on any delivery error."""
    acked = 0
    failed: list[Any] = []

    def on_delivery(error: Any, message: Any) -> None:
        nonlocal acked
        if error is None:
            acked += len(message.value())
        else:
            failed.append(error)

    producer.list_topics(topic, timeout=timeout_s)
    if ready is not None:
        ready()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(1000):
            try:
                producer.produce(topic, value, partition=partition, on_delivery=on_delivery)
            except BufferError:
                break
        producer.poll(0.001)
    in_window = acked
    producer.flush(timeout_s)
    if failed:
        raise RuntimeError(f"{len(failed)} produce errors, first: {failed[0]}")
    return in_window / seconds
