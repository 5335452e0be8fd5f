"""GET /metrics over HTTP/1.x on trio: prometheus_client renders, this module only frames.

prometheus_client's own server runs in a thread of its own; a node has no threads of its own
(DESIGN.md rule 6), so this small handler serves the registry from the node's event loop. It
reads one request head (bounded in bytes and time), answers it and closes the connection:
200 with the exposition for GET /metrics, 404 for any other path, 405 for another method, 400
for anything it cannot parse. Connections past `MAX_CONNECTIONS` are closed at once.
"""

from __future__ import annotations

import logging

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from raftlog.errors import RemoteError

log = logging.getLogger("raftlog.metrics")

METRICS_PATH = "/metrics"
# A scraper's request head is a few hundred bytes; anything past this is not a scraper.
MAX_REQUEST_HEAD_BYTES = 8192
REQUEST_READ_TIMEOUT_S = 5.0
RESPONSE_WRITE_TIMEOUT_S = 10.0
# Scrapers open one connection per scrape; more at once than this is a flood.
MAX_CONNECTIONS = 64
_READ_CHUNK_BYTES = 4096


class BadRequest(RemoteError):
    """The bytes read are not an HTTP/1.x request head."""


def parse_request_head(head: bytes) -> tuple[str, str]:
    """(method, path without query) of an HTTP/1.x request head; raises BadRequest."""
    request_line = head.split(b"\r\n", 1)[0]
    parts = request_line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise BadRequest("not an HTTP/1.x request line")
    try:
        method, target = parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest("non-ASCII request line") from None
    if not method.isalpha() or not target.startswith("/"):
        raise BadRequest("malformed request line")
    return method, target.split("?", 1)[0]


def render_response(registry: CollectorRegistry, method: str, path: str) -> bytes:
    """The whole HTTP response (head and body) to one request."""
    if method != "GET":
        return _response(405, "Method Not Allowed", b"only GET\n", extra="Allow: GET\r\n")
    if path != METRICS_PATH:
        return _response(404, "Not Found", b"see /metrics\n")
    return _response(200, "OK", generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def _response(
    status: int,
    reason: str,
    body: bytes,
    *,
    content_type: str = "text/plain; charset=utf-8",
    extra: str = "",
) -> bytes:
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"{extra}Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


async def _read_head(stream: trio.abc.Stream) -> bytes:
    buffer = bytearray()
    while b"\r\n\r\n" not in buffer:
        if len(buffer) > MAX_REQUEST_HEAD_BYTES:
            raise BadRequest(f"request head over {MAX_REQUEST_HEAD_BYTES} bytes")
        chunk = await stream.receive_some(_READ_CHUNK_BYTES)
        if not chunk:
            raise BadRequest("connection closed before the request head ended")
        buffer += chunk
    return bytes(buffer)


async def handle_connection(
    registry: CollectorRegistry, stream: trio.abc.Stream, limiter: trio.CapacityLimiter
) -> None:
    """Answer one request on `stream`, then close it; never raises for what a peer sends."""
    try:
        limiter.acquire_nowait()
    except trio.WouldBlock:
        await trio.aclose_forcefully(stream)
        return
    try:
        response = None
        with trio.move_on_after(REQUEST_READ_TIMEOUT_S):
            try:
                method, path = parse_request_head(await _read_head(stream))
                response = render_response(registry, method, path)
            except BadRequest as exc:
                log.debug("metrics listener: bad request: %s", exc)
                response = _response(400, "Bad Request", b"bad request\n")
        if response is not None:
            with trio.move_on_after(RESPONSE_WRITE_TIMEOUT_S):
                await stream.send_all(response)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass  # the scraper went away: nothing to answer
    except Exception:
        # A collector that fails must not take the listener down; say so once per scrape.
        log.exception("metrics listener: cannot answer a scrape")
    finally:
        limiter.release()
        await trio.aclose_forcefully(stream)


async def serve_metrics(
    registry: CollectorRegistry,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve GET /metrics on host:port until cancelled; started value: the bound listeners
    (port 0 picks a free port)."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    limiter = trio.CapacityLimiter(MAX_CONNECTIONS)

    async def handle(stream: trio.SocketStream) -> None:
        await handle_connection(registry, stream, limiter)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, listeners)
        task_status.started(listeners)
        await trio.sleep_forever()
