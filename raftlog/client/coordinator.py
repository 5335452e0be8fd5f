"""Finding the coordinator of a group or a transactional id, and retrying while it moves.

FindCoordinator names the broker that coordinates a key: a group id (key type 0) or a
transactional id (key type 1). That broker may still refuse a request sent to it: the
coordinator moved (NOT_COORDINATOR), is loading its partition (COORDINATOR_LOAD_IN_PROGRESS)
or has none yet (COORDINATOR_NOT_AVAILABLE). `with_coordinator` then finds it again and
retries, a bounded number of times with a growing back-off (`CoordinatorRetries`), as
Cluster.retrying does for partition leadership.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import trio

from raftlog.client.cluster import Cluster, raise_for
from raftlog.client.connection import BrokerConnection, ConnectionClosed, call_negotiated
from raftlog.errors import ErrorCode, KafkaError

__all__ = [
    "COORDINATOR_RETRIABLE",
    "FIND_COORDINATOR_VERSIONS",
    "GROUP_KEY_TYPE",
    "TRANSACTION_KEY_TYPE",
    "CoordinatorRetries",
    "find_coordinator",
    "with_coordinator",
]

T = TypeVar("T")

GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1
# v4 (KIP-699) asks for a list of keys; this module always asks for one.
FIND_COORDINATOR_VERSIONS: dict[str, tuple[int, int]] = {"find_coordinator": (1, 4)}
# The coordinator is loading or moved: ask FindCoordinator again and retry.
COORDINATOR_RETRIABLE = frozenset(
    {
        ErrorCode.coordinator_not_available,
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_load_in_progress,
    }
)


@dataclass(frozen=True)
class CoordinatorRetries:
    """How `with_coordinator` retries: a KafkaError whose code is in `retriable_codes` or
    one of `transport_errors`, at most `max_retries` times, waiting
    min(backoff_ms * n, backoff_max_ms) before retry n."""

    retriable_codes: frozenset[ErrorCode] = COORDINATOR_RETRIABLE
    transport_errors: tuple[type[Exception], ...] = (ConnectionClosed, OSError)
    max_retries: int = 5
    backoff_ms: int = 100
    backoff_max_ms: int = 1_000


async def find_coordinator(
    cluster: Cluster, key: str, key_type: int
) -> tuple[int, tuple[str, int]]:
    """FindCoordinator once: the coordinator's node id and address (KafkaError if the
    answer is an error, e.g. COORDINATOR_NOT_AVAILABLE while it loads)."""
    connection = await cluster.any_broker()
    response = await call_negotiated(
        connection,
        "find_coordinator",
        {"key": key, "key_type": key_type, "coordinator_keys": [key]},
        FIND_COORDINATOR_VERSIONS,
    )
    if hasattr(response, "coordinators"):
        # v4 answers a list; one key asked, one answer expected (never index a short list).
        if len(response.coordinators) != 1:
            raise KafkaError(
                ErrorCode.unknown_server_error,
                f"find_coordinator answered {len(response.coordinators)} keys for 1",
            )
        entry = response.coordinators[0]
    else:
        entry = response
    raise_for(entry.error_code, f"find_coordinator {key}", entry.error_message)
    return int(entry.node_id), (str(entry.host), int(entry.port))


async def with_coordinator(
    cluster: Cluster,
    key: str,
    key_type: int,
    operation: Callable[[int, BrokerConnection], Awaitable[T]],
    retries: CoordinatorRetries = CoordinatorRetries(),
) -> T:
    """operation(coordinator node id, connection to it), the coordinator found afresh for
    each attempt; retried as `retries` says, the last failure raised."""
    attempt = 0
    while True:
        try:
            node_id, address = await find_coordinator(cluster, key, key_type)
            return await operation(node_id, await cluster.connect(address))
        except KafkaError as exc:
            if exc.code not in retries.retriable_codes or attempt >= retries.max_retries:
                raise
        except retries.transport_errors:
            if attempt >= retries.max_retries:
                raise
        attempt += 1
        # A back-off between attempts, not a wait for state: the next attempt re-checks.
        await trio.sleep(min(retries.backoff_ms * attempt, retries.backoff_max_ms) / 1000)
