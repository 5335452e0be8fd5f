"""Blocking one-shot look at a node through the Kafka protocol (for harnesses and tests)."""

from __future__ import annotations

import dataclasses
from typing import Any

import trio

from raftlog.client.cluster import ClusterLimits, open_cluster


def probe_metadata(address: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """{"cluster_id", "controller_id", "brokers": [{node_id, host, port}], "topics": {...}}
    as the node at `address` sees them; raises on timeout or connection failure."""

    async def probe() -> dict[str, Any]:
        with trio.fail_after(timeout_s):
            limits = ClusterLimits(max_retries=0)
            async with open_cluster(address, client_id="raftlog-probe", limits=limits) as c:
                return {
                    "cluster_id": c.cluster_id,
                    "controller_id": c.controller_id,
                    "brokers": [
                        {"node_id": b, "host": h, "port": p}
                        for b, (h, p) in sorted(c.brokers.items())
                    ],
                    "topics": {
                        name: [dataclasses.asdict(p) for p in t.partitions]
                        for name, t in c.topics.items()
                    },
                }

    return trio.run(probe)
