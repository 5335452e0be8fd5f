"""What a handler gets besides its request: the backend, the connection and the quota seam."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

from raftlog.config import NodeConfig
from raftlog.net.kafka.backend import KafkaBackend
from raftlog.net.kafka.turns import Turn
from raftlog.security.authorizer import Authorizer


class QuotaHook(Protocol):
    """Quota policy seam (raftlog.quotas fills it in). Each method records usage and returns
    how long the client must be throttled, in ms (0: not throttled). `user` is the
    authenticated principal, "ANONYMOUS" on plaintext listeners."""

    def record_produce(self, client_id: str, user: str, produced_bytes: int) -> int: ...

    def record_fetch(self, client_id: str, user: str, fetched_bytes: int) -> int: ...

    def record_request(self, client_id: str, user: str, handler_time_ms: float) -> int: ...

    def request_timer(self) -> AbstractContextManager[Callable[[], float]]:
        """Wraps a handler; yields a function giving the ms the request has occupied the
        event loop (not wall time: a long-poll's wait is free), for record_request."""
        ...

    def record_mutations(
        self, client_id: str, user: str, count: int, strict: bool
    ) -> tuple[bool, int]:
        """Partition mutations (KIP-599): (accepted, throttle ms). Strict callers refuse a
        request that is not accepted with THROTTLING_QUOTA_EXCEEDED."""
        ...

    def fetch_max_bytes(self, client_id: str, user: str) -> int | None:
        """Largest fetch response a consumer quota allows per request (None: no cap)."""
        ...


def _no_time() -> float:
    return 0.0


class NoQuotas:
    """Default QuotaHook: never throttles."""

    def record_produce(self, client_id: str, user: str, produced_bytes: int) -> int:
        return 0

    def record_fetch(self, client_id: str, user: str, fetched_bytes: int) -> int:
        return 0

    def record_request(self, client_id: str, user: str, handler_time_ms: float) -> int:
        return 0

    def request_timer(self) -> AbstractContextManager[Callable[[], float]]:
        return nullcontext(_no_time)

    def record_mutations(
        self, client_id: str, user: str, count: int, strict: bool
    ) -> tuple[bool, int]:
        return True, 0

    def fetch_max_bytes(self, client_id: str, user: str) -> int | None:
        return None


class ConnectionHandle(Protocol):
    """The parts of a client connection a handler may use."""

    @property
    def peer(self) -> str: ...

    @property
    def client_id(self) -> str: ...

    @property
    def user(self) -> str:
        """The authenticated user's name ("alice"; "ANONYMOUS" when unauthenticated)."""
        ...

    @property
    def principal(self) -> str:
        """The full principal, Kafka's "User:alice" ("User:ANONYMOUS" when unauthenticated)."""
        ...

    @property
    def listener(self) -> str:
        """The name of the listener the connection came in on ("PLAINTEXT" by default)."""
        ...

    def mute(self, duration_ms: int) -> None:
        """Stop reading requests from this connection for duration_ms (quota throttling)."""
        ...


EndpointLookup = Callable[[str, int], "tuple[str, int] | None"]
"""endpoints(listener name, broker id): that broker's advertised endpoint on the named
listener, or None when it registered none by that name."""


@dataclass
class RequestContext:
    backend: KafkaBackend
    config: NodeConfig
    quotas: QuotaHook
    connection: ConnectionHandle
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str
    # The largest throttle any quota asked for while handling this request; the server
    # puts it in the response's throttle_time field and mutes the connection for it.
    throttle_ms: int = 0
    # (api_key, min_version, max_version) of every API this server answers; ApiVersions
    # returns it.
    api_table: Sequence[tuple[int, int, int]] = ()
    extras: dict[str, Any] = field(default_factory=dict)
    # Per-listener endpoints (None: one listener, so the registered endpoint is the answer).
    endpoints: EndpointLookup | None = None
    # The ACL authorizer (raftlog.net.kafka.authz asks it); None: authorization is off and
    # every request is allowed.
    authorizer: Authorizer | None = None
    # A Produce's place in its connection's order of appends (turns.py); None: no order.
    turn: Turn | None = None

    def throttle(self, throttle_ms: int) -> None:
        self.throttle_ms = max(self.throttle_ms, throttle_ms)

    def advertised(self, broker_id: int, host: str, port: int) -> tuple[str, int]:
        """Where this client should reach `broker_id`: its endpoint on the listener this
        request came in on (Kafka answers per listener), else its default endpoint."""
        if self.endpoints is None:
            return host, port
        return self.endpoints(self.connection.listener, broker_id) or (host, port)


# A handler turns a parsed kio request into a response dict (kio field names; `codec.build`
# makes it the right version) or None when Kafka sends no response (produce with acks=0).
Handler = Callable[[RequestContext, Any], Awaitable[dict[str, Any] | None]]
