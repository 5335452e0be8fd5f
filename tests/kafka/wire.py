"""A raw Kafka connection for tests: requests encoded with kio, frames read by hand."""

from __future__ import annotations

import io
import struct
from typing import Any

import trio
from kio.serial import entity_reader, entity_writer

from raftlog.net.framing import FrameReader, frame
from raftlog.net.kafka.codec import response_class


def encode_request(body: Any, correlation_id: int, client_id: str = "wire-test") -> bytes:
    header_cls = type(body).__header_schema__
    buf = io.BytesIO()
    entity_writer(header_cls)(
        buf,
        header_cls(
            request_api_key=type(body).__api_key__,
            request_api_version=type(body).__version__,
            correlation_id=correlation_id,
            client_id=client_id,
        ),
    )
    entity_writer(type(body))(buf, body)
    return frame(buf.getvalue())


def decode_response(payload: bytes, api_key: int, version: int) -> tuple[int, Any]:
    cls = response_class(api_key, version)
    header, size = entity_reader(cls.__header_schema__)(payload, 0)
    body, _ = entity_reader(cls)(payload, size)
    return header.correlation_id, body


class WireClient:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.reader = FrameReader(stream, 64 * 1024 * 1024)
        self._next_correlation_id = 1

    @classmethod
    async def connect(cls, port: int) -> WireClient:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def send(self, body: Any) -> int:
        correlation_id = self._next_correlation_id
        self._next_correlation_id += 1
        await self.stream.send_all(encode_request(body, correlation_id))
        return correlation_id

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive(self, api_key: int, version: int) -> tuple[int, Any]:
        payload = await self.reader.read_frame()
        assert payload is not None, "connection closed"
        return decode_response(payload, api_key, version)

    async def request(self, body: Any) -> Any:
        correlation_id = await self.send(body)
        got_id, response = await self.receive(type(body).__api_key__, type(body).__version__)
        assert got_id == correlation_id
        return response

    async def is_closed_by_peer(self, timeout_s: float = 5.0) -> bool:
        """True when the server closes the connection (EOF or reset) within the timeout."""
        with trio.move_on_after(timeout_s):
            try:
                while True:
                    data = await self.stream.receive_some(65536)
                    if not data:
                        return True
            except trio.BrokenResourceError:
                return True
        return False

    async def aclose(self) -> None:
        await self.stream.aclose()


def raw_header(api_key: int, version: int, correlation_id: int, client_id: str = "x") -> bytes:
    """A v1 request header, for requests kio cannot model (unknown keys/versions)."""
    cid = client_id.encode()
    return struct.pack(">hhih", api_key, version, correlation_id, len(cid)) + cid
