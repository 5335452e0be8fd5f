"""Reading a node's quota usage over its internal listener ("quotas.usage").

Usage (per-entity byte rates, throttle time) is per broker state, not metadata, so it is not
on the Kafka wire; the CLI and the tests ask each broker's internal listener for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio

from raftlog.net.rpc import PeerClient
from raftlog.quotas.broker_hook import USAGE_CODEC, UsageWire
from raftlog.quotas.entity import QuotaEntity

USAGE_METHOD = "quotas.usage"
# Sender id of a client that is not a node; the node ignores it for this method.
EXTERNAL_SENDER_ID = -1


@dataclass(frozen=True)
class UsageRow:
    """One tracked sensor on one broker (see QuotaManager.usage)."""

    node_id: int
    quota_key: str
    user: str
    client_id: str
    entity: QuotaEntity
    quota: float
    rate: float
    throttle_time_total_ms: int


def rows_from_wire(node_id: int, wire: Any) -> list[UsageRow]:
    """Decode the RPC answer; raises DecodeError (a ValueError) on a row of the wrong shape."""
    rows: UsageWire = USAGE_CODEC.from_wire(UsageWire, wire)
    return [
        UsageRow(
            node_id=node_id,
            quota_key=row.quota_key,
            user=row.user,
            client_id=row.client_id,
            entity=QuotaEntity.of(row.entity),
            quota=row.quota,
            rate=row.rate,
            throttle_time_total_ms=row.throttle_time_total_ms,
        )
        for row in rows
    ]


async def fetch_usage(node_id: int, host: str, port: int, timeout_s: float = 5.0) -> list[UsageRow]:
    """Ask one node (at its internal listener) for its quota usage; raises RpcError."""
    client = PeerClient(EXTERNAL_SENDER_ID, node_id, host, port)
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        try:
            wire = await client.call(
                USAGE_METHOD, None, timeout_s=timeout_s, connect_timeout_s=timeout_s
            )
        finally:
            client.close()
    return rows_from_wire(node_id, wire)
