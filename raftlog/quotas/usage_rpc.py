"""Reading a node's quota usage over its internal listener ("quotas.usage").

Usage (per-entity byte rates, throttle time) is per broker state, not metadata, so it is not
on the Kafka wire; the CLI and the tests ask each broker's internal listener for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio

from raftlog.net.rpc import PeerClient
from raftlog.quotas.broker_hook import USAGE_FIELDS
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


def rows_from_wire(node_id: int, wire: list[list[Any]]) -> list[UsageRow]:
    """Decode the RPC answer; raises ValueError on a row of the wrong shape."""
    rows = []
    for item in wire:
        if not isinstance(item, list | tuple) or len(item) != len(USAGE_FIELDS):
            raise ValueError(f"quota usage row of the wrong shape: {item!r}")
        fields = dict(zip(USAGE_FIELDS, item, strict=True))
        entity = QuotaEntity.of(tuple(component) for component in fields["entity"])
        rows.append(
            UsageRow(
                node_id=node_id,
                quota_key=str(fields["quota_key"]),
                user=str(fields["user"]),
                client_id=str(fields["client_id"]),
                entity=entity,
                quota=float(fields["quota"]),
                rate=float(fields["rate"]),
                throttle_time_total_ms=int(fields["throttle_time_total_ms"]),
            )
        )
    return rows


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
