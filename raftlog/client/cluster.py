"""The client's view of a cluster: bootstrap, metadata cache, connections, leader retries.

`open_cluster()` connects to a bootstrap server, loads metadata and yields a Cluster whose
connections (one per broker, opened on demand) live in its nursery. `retrying()` runs an
operation and, when it fails with a leadership error (the leader moved, the epoch is stale,
the controller changed) or a dropped connection, refreshes metadata, backs off and runs it
again — a bounded number of times, then the error reaches the caller.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import trio

from raftlog.client.auth import client_ssl_context
from raftlog.client.connection import (
    BrokerConnection,
    ConnectionClosed,
    ConnectionLimits,
    RequestTimeout,
    serve_connection,
)
from raftlog.client.properties import PLAINTEXT, ClientSecurity
from raftlog.client.protocol import error_of
from raftlog.config_listeners import parse_host_port
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
T = TypeVar("T")

# Errors that mean "your picture of who leads is out of date" or "ask again shortly" (a new
# leader still settling its high watermark, KIP-207): refresh metadata and retry.
RETRIABLE_CODES = frozenset(
    {
        ErrorCode.offset_not_available,
        ErrorCode.not_leader_or_follower,
        ErrorCode.leader_not_available,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.unknown_leader_epoch,
        ErrorCode.not_controller,
        ErrorCode.request_timed_out,
    }
)


@dataclass(frozen=True)
class ClusterLimits:
    """Retry bounds and per-connection limits."""

    max_retries: int = 5
    retry_backoff_ms: int = 50
    retry_backoff_max_ms: int = 1_000
    connection: ConnectionLimits = field(default_factory=ConnectionLimits)


@dataclass(frozen=True)
class PartitionInfo:
    topic: str
    partition: int
    leader_id: int  # -1: no leader right now
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    # Replicas the answering broker knows to be offline: fenced brokers', and its own when
    # they lost or damaged data (a broker knows that only of itself).
    offline_replicas: tuple[int, ...] = ()


@dataclass(frozen=True)
class TopicInfo:
    name: str
    error: ErrorCode
    partitions: tuple[PartitionInfo, ...]
    is_internal: bool = False


def parse_bootstrap(servers: str | Sequence[str]) -> list[tuple[str, int]]:
    """ "host:port,host:port" or a list of "host:port" -> [(host, port)]."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    addresses = [parse_host_port(item.strip(), "bootstrap_servers") for item in items if item]
    if not addresses:
        raise ValueError("bootstrap_servers names no server")
    return addresses


class Cluster:
    """Metadata cache and connection pool; create it with open_cluster()."""

    def __init__(
        self,
        nursery: trio.Nursery,
        bootstrap: list[tuple[str, int]],
        *,
        client_id: str | None,
        limits: ClusterLimits,
        security: ClientSecurity = PLAINTEXT,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._nursery = nursery
        self.bootstrap = bootstrap
        self.client_id = client_id
        self.limits = limits
        self.security = security
        # One TLS context for every connection: its files are read once.
        if ssl_context is None and security.uses_tls:
            ssl_context = client_ssl_context(security)
        self._ssl_context = ssl_context
        self._connections: dict[tuple[str, int], BrokerConnection] = {}
        self._connect_locks: dict[tuple[str, int], trio.Lock] = {}
        self.brokers: dict[int, tuple[str, int]] = {}
        self.topics: dict[str, TopicInfo] = {}
        self.cluster_id: str | None = None
        self.controller_id = -1

    # ------------------------------------------------------------------ connections
    async def connect(self, address: tuple[str, int]) -> BrokerConnection:
        """The open connection to address, opening one if needed."""
        lock = self._connect_locks.setdefault(address, trio.Lock())
        async with lock:
            connection = self._connections.get(address)
            if connection is not None and connection.session_expiring:
                # Requests in flight on it fail and are retried on the new one.
                log.debug("SASL session to %s:%d is expiring; reconnecting", *address)
                await connection.aclose()
            if connection is None or connection.closed:
                connection = await self._nursery.start(
                    partial(
                        serve_connection,
                        address[0],
                        address[1],
                        client_id=self.client_id,
                        limits=self.limits.connection,
                        security=self.security,
                        ssl_context=self._ssl_context,
                    )
                )
                self._connections[address] = connection
            return connection

    async def broker(self, node_id: int) -> BrokerConnection:
        if node_id not in self.brokers:
            raise KafkaError(ErrorCode.leader_not_available, f"broker {node_id} is not known")
        return await self.connect(self.brokers[node_id])

    async def any_broker(self) -> BrokerConnection:
        """A connection to some broker: a known one first, then the bootstrap list."""
        candidates = list(self.brokers.values()) + self.bootstrap
        last_error: Exception | None = None
        for address in dict.fromkeys(candidates):
            try:
                return await self.connect(address)
            except (OSError, trio.TooSlowError, ConnectionClosed) as exc:
                last_error = exc
        raise ConnectionClosed(f"no broker reachable (last error: {last_error})")

    async def controller(self) -> BrokerConnection:
        """The connection admin requests go to (KRaft brokers forward them when needed)."""
        if self.controller_id in self.brokers:
            return await self.broker(self.controller_id)
        return await self.any_broker()

    async def leader(self, topic: str, partition: int) -> tuple[BrokerConnection, PartitionInfo]:
        if topic not in self.topics:
            await self.refresh_metadata([topic])
        info = self.partition(topic, partition)
        if info.leader_id < 0:
            raise KafkaError(ErrorCode.leader_not_available, f"{topic}-{partition} has no leader")
        return await self.broker(info.leader_id), info

    def partition(self, topic: str, partition: int) -> PartitionInfo:
        topic_info = self.topics.get(topic)
        if topic_info is None or topic_info.error != ErrorCode.none:
            code = topic_info.error if topic_info else ErrorCode.unknown_topic_or_partition
            raise KafkaError(code, f"topic {topic!r}")
        for info in topic_info.partitions:
            if info.partition == partition:
                return info
        raise KafkaError(ErrorCode.unknown_topic_or_partition, f"{topic}-{partition}")

    # ------------------------------------------------------------------ metadata
    async def refresh_metadata(self, topics: Sequence[str] | None = None) -> None:
        """Reload brokers, controller and the given topics (None: all topics)."""
        connection = await self.any_broker()
        values: dict[str, Any] = {
            "topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
            "allow_auto_topic_creation": False,
        }
        response = await connection.call("metadata", values)
        self.brokers = {int(b.node_id): (b.host, int(b.port)) for b in response.brokers}
        self.cluster_id = getattr(response, "cluster_id", None)
        self.controller_id = int(getattr(response, "controller_id", -1))
        fresh: dict[str, TopicInfo] = {}
        for topic in response.topics:
            partitions = tuple(
                PartitionInfo(
                    topic=topic.name,
                    partition=int(p.partition_index),
                    leader_id=int(p.leader_id),
                    leader_epoch=int(getattr(p, "leader_epoch", -1)),
                    replicas=tuple(int(r) for r in p.replica_nodes),
                    isr=tuple(int(r) for r in p.isr_nodes),
                    offline_replicas=tuple(int(r) for r in getattr(p, "offline_replicas", ())),
                )
                for p in topic.partitions
            )
            fresh[topic.name] = TopicInfo(
                name=topic.name,
                error=error_of(topic.error_code),
                partitions=tuple(sorted(partitions, key=lambda p: p.partition)),
                is_internal=bool(getattr(topic, "is_internal", False)),
            )
        if topics is None:
            self.topics = fresh
        else:
            self.topics.update(fresh)

    # ------------------------------------------------------------------ retries
    async def retrying(
        self,
        operation: Callable[[], Awaitable[T]],
        *,
        refresh_topics: Sequence[str] | None = None,
    ) -> T:
        """Run operation; on a leadership error or lost connection refresh and retry."""
        attempt = 0
        while True:
            try:
                return await operation()
            except KafkaError as exc:
                if exc.code not in RETRIABLE_CODES or attempt >= self.limits.max_retries:
                    raise
                reason: Exception = exc
            except (ConnectionClosed, RequestTimeout, OSError) as exc:
                if attempt >= self.limits.max_retries:
                    raise
                reason = exc
            backoff_ms = min(
                self.limits.retry_backoff_ms * 2**attempt, self.limits.retry_backoff_max_ms
            )
            attempt += 1
            log.info("retry %d after %s (backoff %d ms)", attempt, reason, backoff_ms)
            # A back-off between attempts, not a wait for state: the next attempt re-checks.
            await trio.sleep(backoff_ms / 1000)
            try:
                await self.refresh_metadata(refresh_topics)
            except (KafkaError, ConnectionClosed, RequestTimeout, OSError) as exc:
                log.info("metadata refresh failed during retry: %s", exc)

    async def aclose(self) -> None:
        for connection in list(self._connections.values()):
            await connection.aclose()
        self._connections.clear()


def raise_for(code: Any, what: str, message: str | None = None) -> None:
    """Raise KafkaError unless code is NONE."""
    error = error_of(code)
    if error != ErrorCode.none:
        raise KafkaError(error, f"{what}: {message}" if message else what)


@asynccontextmanager
async def open_cluster(
    bootstrap_servers: str | Sequence[str],
    *,
    client_id: str | None = "raftlog",
    limits: ClusterLimits | None = None,
    security: ClientSecurity = PLAINTEXT,
) -> AsyncIterator[Cluster]:
    """Connect to the cluster and load its metadata; connections close on exit.

    security: TLS and SASL settings for every connection (see raftlog.client.properties).
    """
    limits = limits or ClusterLimits()
    bootstrap = parse_bootstrap(bootstrap_servers)
    # Built before the nursery so a bad CA or key file is raised as itself.
    ssl_context = client_ssl_context(security) if security.uses_tls else None
    async with trio.open_nursery() as nursery:
        cluster = Cluster(
            nursery,
            bootstrap,
            client_id=client_id,
            limits=limits,
            security=security,
            ssl_context=ssl_context,
        )
        try:
            await cluster.refresh_metadata()
            yield cluster
        finally:
            with trio.CancelScope(shield=True):
                await cluster.aclose()
            nursery.cancel_scope.cancel()
