"""A minimal Kafka broker for client tests: decodes requests with kio, answers from handlers.

Only what the client tests need: ApiVersions (with the v0 fallback of KIP-511), Metadata,
and any handler a test installs. Responses use the header version Kafka prescribes.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer

from raftlog.client.protocol import API_KEYS, build, response_header_version
from raftlog.net.framing import FrameReader, frame

# A handler returns this to make the broker drop the connection instead of answering.
HANG_UP: dict[str, Any] = {"hang_up": True}

Handler = Callable[["Request"], Awaitable[dict[str, Any] | None]]


@dataclass
class Request:
    api: str
    version: int
    header: Any
    body: Any


@dataclass
class FakeBroker:
    node_id: int = 1
    host: str = "127.0.0.1"
    port: int = 0
    # api name -> (min, max) announced in ApiVersions.
    api_versions: dict[str, tuple[int, int]] = field(
        default_factory=lambda: {"api_versions": (0, 3), "metadata": (0, 12)}
    )
    handlers: dict[str, Handler] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    brokers: list[tuple[int, str, int]] = field(default_factory=list)
    topics: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)
    connections: int = 0

    async def serve(
        self, task_status: trio.TaskStatus[FakeBroker] = trio.TASK_STATUS_IGNORED
    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        if not self.brokers:
            self.brokers = [(self.node_id, self.host, self.port)]
        task_status.started(self)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        reader = FrameReader(stream, 1 << 20)
        send_lock = trio.Lock()
        try:
            async with stream, trio.open_nursery() as nursery:
                await self._read_requests(stream, reader, send_lock, nursery)
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away or a handler hung up: both are normal here

    async def _read_requests(
        self,
        stream: trio.SocketStream,
        reader: FrameReader,
        send_lock: trio.Lock,
        nursery: trio.Nursery,
    ) -> None:
        while (data := await reader.read_frame()) is not None:
            api_key, version = struct.unpack_from(">hh", data, 0)
            request_cls = load_request_schema(api_key, version)
            header_cls = RequestHeaderV2 if request_cls.__flexible__ else RequestHeaderV1
            header, used = entity_reader(header_cls)(data, 0)
            body, _ = entity_reader(request_cls)(data, used)
            request = Request(request_cls.__name__, version, header, body)
            self.requests.append(request)
            # Answered concurrently, so a slow handler does not hold up pipelined
            # requests; answers may leave out of order and the client must match them
            # by correlation id.
            nursery.start_soon(self._answer, stream, send_lock, request, api_key)

    async def _answer(
        self,
        stream: trio.SocketStream,
        send_lock: trio.Lock,
        request: Request,
        api_key: int,
    ) -> None:
        name = _api_of(api_key)
        handler = self.handlers.get(name) or getattr(self, f"_on_{name}", None)
        values = await handler(request) if handler else None
        if values is None:
            return  # no answer (acks=0, or a test simulating a stuck broker)
        if values is HANG_UP:
            await stream.aclose()
            return
        version = request.version
        if name == "api_versions" and values.get("error_code") == ErrorCode.unsupported_version:
            version = 0
        out = io.BytesIO()
        if response_header_version(api_key, version) == 1 and name != "api_versions":
            entity_writer(ResponseHeaderV1)(
                out, ResponseHeaderV1(correlation_id=request.header.correlation_id)
            )
        else:
            entity_writer(ResponseHeaderV0)(
                out, ResponseHeaderV0(correlation_id=request.header.correlation_id)
            )
        response_cls = load_response_schema(api_key, version)
        entity_writer(response_cls)(out, build(response_cls, values))
        async with send_lock:
            await stream.send_all(frame(out.getvalue()))

    async def _on_api_versions(self, request: Request) -> dict[str, Any]:
        keys = [
            {"api_key": API_KEYS[api], "min_version": lo, "max_version": hi}
            for api, (lo, hi) in self.api_versions.items()
        ]
        lo, hi = self.api_versions["api_versions"]
        code = ErrorCode.none if lo <= request.version <= hi else ErrorCode.unsupported_version
        return {"error_code": code, "api_keys": keys, "throttle_time": 0}

    async def _on_metadata(self, request: Request) -> dict[str, Any]:
        return {
            "throttle_time": 0,
            "brokers": [{"node_id": n, "host": h, "port": p} for n, h, p in self.brokers],
            "cluster_id": "fake",
            "controller_id": self.brokers[0][0],
            "topics": [
                {
                    "error_code": ErrorCode.none,
                    "name": name,
                    "topic_id": None,
                    "partitions": [
                        {
                            "error_code": ErrorCode.none,
                            "partition_index": index,
                            "leader_id": leader,
                            "leader_epoch": epoch,
                            "replica_nodes": [leader],
                            "isr_nodes": [leader],
                        }
                        for index, leader, epoch in partitions
                    ],
                }
                for name, partitions in self.topics.items()
            ],
        }


def _api_of(api_key: int) -> str:
    return api_key_map[api_key]
