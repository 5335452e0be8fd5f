"""A minimal Kafka broker for client tests: decodes requests with kio, answers from handlers.

Only what the client tests need: ApiVersions (with the v0 fallback of KIP-511), Metadata,
and any handler a test installs. Responses use the header version Kafka prescribes.
"""

from __future__ import annotations

import io
import ssl
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
from raftlog.net.framing import FrameReader, FrameTooLarge, frame
from raftlog.security.acl import ScramCredential, ScramMechanism
from raftlog.security.sasl import (
    SaslAuthenticationFailed,
    SaslServer,
    UnsupportedSaslMechanism,
    new_server,
)

# A handler returns this to make the broker drop the connection instead of answering.
HANG_UP: dict[str, Any] = {"hang_up": True}

Handler = Callable[["Request"], Awaitable[dict[str, Any] | None]]


# What an unauthenticated connection may send before SASL completes (as in Kafka).
_BEFORE_AUTH = ("api_versions", "sasl_handshake", "sasl_authenticate")


@dataclass
class Session:
    """One connection's SASL state."""

    server: SaslServer | None = None
    principal: str | None = None


@dataclass
class Request:
    api: str
    version: int
    header: Any
    body: Any
    session: Session = field(default_factory=Session)


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
    # TLS on the listener when set.
    ssl_context: ssl.SSLContext | None = None
    # SASL required when set: (user, mechanism) -> credential, checked by
    # raftlog.security.sasl's servers; requests before authentication hang up.
    scram_credentials: dict[tuple[str, ScramMechanism], ScramCredential] | None = None
    sasl_enabled_mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
    sasl_session_lifetime_ms: int = 0
    principals: list[str] = field(default_factory=list)

    async def serve(
        self, task_status: trio.TaskStatus[FakeBroker] = trio.TASK_STATUS_IGNORED
    ) -> None:
        tcp_listeners = await trio.open_tcp_listeners(0, host=self.host)
        self.port = tcp_listeners[0].socket.getsockname()[1]
        listeners: list[trio.abc.Listener[Any]] = list(tcp_listeners)
        if self.ssl_context is not None:
            listeners = [trio.SSLListener(tcp, self.ssl_context) for tcp in tcp_listeners]
        if not self.brokers:
            self.brokers = [(self.node_id, self.host, self.port)]
        task_status.started(self)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        reader = FrameReader(stream, 1 << 20)
        send_lock = trio.Lock()
        try:
            async with stream, trio.open_nursery() as nursery:
                await self._read_requests(stream, reader, send_lock, nursery)
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away or a handler hung up: both are normal here
        except* FrameTooLarge:
            pass  # not Kafka (a TLS hello on a plaintext port): hang up, as Kafka does

    async def _read_requests(
        self,
        stream: trio.abc.Stream,
        reader: FrameReader,
        send_lock: trio.Lock,
        nursery: trio.Nursery,
    ) -> None:
        session = Session()
        while (data := await reader.read_frame()) is not None:
            api_key, version = struct.unpack_from(">hh", data, 0)
            request_cls = load_request_schema(api_key, version)
            header_cls = RequestHeaderV2 if request_cls.__flexible__ else RequestHeaderV1
            header, used = entity_reader(header_cls)(data, 0)
            body, _ = entity_reader(request_cls)(data, used)
            request = Request(request_cls.__name__, version, header, body, session)
            self.requests.append(request)
            if (
                self.scram_credentials is not None
                and session.principal is None
                and _api_of(api_key) not in _BEFORE_AUTH
            ):
                await stream.aclose()  # Kafka closes a connection that skips SASL
                return
            if _api_of(api_key) == "sasl_authenticate":
                # In order: the next SASL message depends on this one's answer.
                await self._answer(stream, send_lock, request, api_key)
                continue
            # Answered concurrently, so a slow handler does not hold up pipelined
            # requests; answers may leave out of order and the client must match them
            # by correlation id.
            nursery.start_soon(self._answer, stream, send_lock, request, api_key)

    async def _answer(
        self,
        stream: trio.abc.Stream,
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

    async def _on_sasl_handshake(self, request: Request) -> dict[str, Any]:
        enabled = list(self.sasl_enabled_mechanisms)
        credentials = self.scram_credentials or {}
        try:
            request.session.server = new_server(
                request.body.mechanism, lambda user, m: credentials.get((user, m)), enabled
            )
        except UnsupportedSaslMechanism:
            return {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": enabled}
        return {"error_code": ErrorCode.none, "mechanisms": enabled}

    async def _on_sasl_authenticate(self, request: Request) -> dict[str, Any]:
        server = request.session.server
        if server is None:
            return {
                "error_code": ErrorCode.illegal_sasl_state,
                "error_message": "no handshake",
                "auth_bytes": b"",
            }
        try:
            reply = server.step(bytes(request.body.auth_bytes))
        except SaslAuthenticationFailed as exc:
            return {
                "error_code": ErrorCode.sasl_authentication_failed,
                "error_message": str(exc),
                "auth_bytes": b"",
            }
        if server.complete:
            request.session.principal = server.principal
            self.principals.append(str(server.principal))
        return {
            "error_code": ErrorCode.none,
            "error_message": None,
            "auth_bytes": reply,
            "session_lifetime": self.sasl_session_lifetime_ms,
        }

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
