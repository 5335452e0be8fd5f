"""Resource limits of a listener: connection caps, queued request bytes, idle and read timeouts.

One `ListenerGuard` per listener (the Kafka one and the internal one each have their own, so a
flood of client connections cannot stall replication). It
- refuses a connection above `max_connections` or `max_connections_per_ip` by closing it at
  once, as Kafka does, with a rate-limited log line;
- owns the listener's `QueuedBytes` (`queued_max_request_bytes`) and gives each connection's
  FrameReader an account on it and the idle and read timeouts;
- returns a connection's bytes to the pool when the connection ends, whatever the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from raftlog.config import NodeConfig
from raftlog.constants import MS_PER_S
from raftlog.net.framing import ByteAccount, FrameReader, QueuedBytes

# At most one line per this interval for each kind of refusal; the line counts the others.
REFUSAL_LOG_INTERVAL_S = 10.0


@dataclass(frozen=True)
class ListenerLimits:
    """The limits one listener enforces; defaults are NodeConfig's."""

    max_connections: int = NodeConfig.max_connections
    max_connections_per_ip: int = NodeConfig.max_connections_per_ip
    queued_max_request_bytes: int = NodeConfig.queued_max_request_bytes
    connections_max_idle_ms: int = NodeConfig.connections_max_idle_ms
    request_read_timeout_ms: int = NodeConfig.request_read_timeout_ms

    @classmethod
    def from_node_config(cls, config: NodeConfig) -> ListenerLimits:
        return cls(
            max_connections=config.max_connections,
            max_connections_per_ip=config.max_connections_per_ip,
            queued_max_request_bytes=config.queued_max_request_bytes,
            connections_max_idle_ms=config.connections_max_idle_ms,
            request_read_timeout_ms=config.request_read_timeout_ms,
        )


DEFAULT_LISTENER_LIMITS = ListenerLimits()


class RateLimitedLog:
    """Logs the first event, then at most one line per interval that counts the rest."""

    def __init__(self, logger: logging.Logger, interval_s: float = REFUSAL_LOG_INTERVAL_S) -> None:
        self._log = logger
        self._interval_s = interval_s
        self._next_at = -float("inf")
        self._suppressed = 0

    def warning(self, message: str, *args: Any) -> None:
        now = trio.current_time()
        if now < self._next_at:
            self._suppressed += 1
            return
        if self._suppressed:
            message += f" ({self._suppressed} more since the last such line)"
        self._log.warning(message, *args)
        self._suppressed = 0
        self._next_at = now + self._interval_s


class ConnectionCaps:
    """Counts a listener's open connections, in total and per peer IP."""

    def __init__(self, max_connections: int, max_connections_per_ip: int) -> None:
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip
        self.open = 0
        self.per_ip: dict[str, int] = {}
        self.refused = 0

    def admit(self, ip: str) -> tuple[str, int] | None:
        """Count the connection in and return None, or return the limit that refuses it
        (its config key and value)."""
        if self.open >= self.max_connections:
            self.refused += 1
            return "max_connections", self.max_connections
        if self.per_ip.get(ip, 0) >= self.max_connections_per_ip:
            self.refused += 1
            return "max_connections_per_ip", self.max_connections_per_ip
        self.open += 1
        self.per_ip[ip] = self.per_ip.get(ip, 0) + 1
        return None

    def release(self, ip: str) -> None:
        self.open -= 1
        left = self.per_ip[ip] - 1
        if left:
            self.per_ip[ip] = left
        else:
            del self.per_ip[ip]


class ListenerGuard:
    """The runtime side of one listener's `ListenerLimits`."""

    def __init__(self, name: str, limits: ListenerLimits, logger: logging.Logger) -> None:
        self.name = name
        self.limits = limits
        self._log = logger
        self.caps = ConnectionCaps(limits.max_connections, limits.max_connections_per_ip)
        # One rate limit per refusing key, so a flood from one IP hides no other refusal.
        self._refusals = {
            key: RateLimitedLog(logger) for key in ("max_connections", "max_connections_per_ip")
        }
        self._pauses = RateLimitedLog(logger)
        self.queued = QueuedBytes(limits.queued_max_request_bytes, on_full=self._paused)
        self._accounts: dict[int, ByteAccount] = {}

    def _paused(self, queued: QueuedBytes) -> None:
        self._pauses.warning(
            "%s listener: %d request bytes read and not yet answered "
            "(queued_max_request_bytes); reading paused until answers free memory",
            self.name,
            queued.used_bytes,
        )

    async def serve_listeners(
        self,
        handler: Callable[[trio.SocketStream], Awaitable[None]],
        listeners: list[trio.SocketListener],
    ) -> None:
        """trio.serve_listeners with the connection caps and per-connection cleanup."""

        async def guarded(stream: trio.SocketStream) -> None:
            ip = peer_ip(stream)
            refused = self.caps.admit(ip)
            if refused is not None:
                key, value = refused
                self._refusals[key].warning(
                    "%s listener: closing new connection from %s: %s (%d) reached",
                    self.name,
                    ip,
                    key,
                    value,
                )
                await trio.aclose_forcefully(stream)
                return
            try:
                await handler(stream)
            finally:
                self.caps.release(ip)
                account = self._accounts.pop(id(stream), None)
                if account is not None:
                    account.close()

        await trio.serve_listeners(guarded, listeners)

    def frame_reader(
        self, stream: trio.abc.ReceiveStream, max_frame_bytes: int, *, key: object = None
    ) -> FrameReader:
        """A reader for one connection served by `serve_listeners`, under this guard's limits.

        `key` is the stream `serve_listeners` accepted when `stream` wraps it (TLS): the
        connection's bytes are returned to the pool under that stream when it ends."""
        account = self.queued.account()
        owner = id(key if key is not None else stream)
        previous = self._accounts.get(owner)
        if previous is not None:
            previous.close()
        self._accounts[owner] = account
        return FrameReader(
            stream,
            max_frame_bytes,
            account=account,
            idle_timeout_s=self.limits.connections_max_idle_ms / MS_PER_S,
            read_timeout_s=self.limits.request_read_timeout_ms / MS_PER_S,
        )


def peer_ip(stream: Any) -> str:
    try:
        return str(stream.socket.getpeername()[0])
    except (AttributeError, OSError):  # not a socket (a test's memory stream), or gone
        return "?"
