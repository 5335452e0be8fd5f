"""What `cluster status` and `cluster up` ask the cluster: quorum, brokers, partitions.

Brokers missing from Metadata are fenced (KRaft lists only unfenced brokers there). A
partition is under-replicated when its ISR is smaller than its replica set and offline when
it has no leader. The verdict is healthy only when the quorum has a leader and nothing is
fenced, under-replicated, offline or (for a local cluster) not running.
"""

from __future__ import annotations

from typing import Any

from raftlog_cli.cluster_local import LocalCluster, running_pid
from raftlog_cli.common import CLI_LIMITS

from raftlog.client import Admin, Cluster, open_cluster
from raftlog.client.connection import ConnectionClosed, RequestTimeout
from raftlog.errors import KafkaError


async def gather_status(cluster: Cluster, local: LocalCluster | None) -> dict[str, Any]:
    admin = Admin(cluster)
    problems: list[str] = []
    quorum: dict[str, Any] | None
    try:
        quorum = await admin.describe_quorum()
    except (KafkaError, ConnectionClosed, RequestTimeout) as exc:
        quorum = None
        problems.append(f"metadata quorum: {exc}")
    await cluster.refresh_metadata(None)
    unfenced = dict(cluster.brokers)
    voter_leo = {v["replica_id"]: v["log_end_offset"] for v in (quorum or {}).get("voters", [])}
    leader_leo = max(voter_leo.values(), default=-1)
    if quorum and quorum["leader_id"] in voter_leo:
        leader_leo = voter_leo[quorum["leader_id"]]
    node_ids = set(unfenced) | set(voter_leo)
    if local is not None:
        node_ids |= {n.node_id for n in local.nodes}
    nodes = []
    for node_id in sorted(node_ids):
        process = "-"
        if local is not None and any(n.node_id == node_id for n in local.nodes):
            pid = running_pid(local.node(node_id))
            process = f"running ({pid})" if pid is not None else "stopped"
            if pid is None:
                problems.append(f"node {node_id} is not running")
        lag: int | None = None
        if node_id in voter_leo and voter_leo[node_id] >= 0 and leader_leo >= 0:
            lag = max(0, leader_leo - voter_leo[node_id])
        broker = "unfenced" if node_id in unfenced else "fenced"
        if broker == "fenced":
            problems.append(f"broker {node_id} is fenced")
        address = unfenced.get(node_id)
        nodes.append(
            {
                "node_id": node_id,
                "process": process,
                "voter": node_id in voter_leo,
                "voter_lag": lag,
                "broker": broker,
                "address": f"{address[0]}:{address[1]}" if address else None,
            }
        )
    under_replicated: list[str] = []
    offline: list[str] = []
    total = 0
    for name in sorted(cluster.topics):
        for p in cluster.topics[name].partitions:
            total += 1
            label = f"{name}-{p.partition}"
            if p.leader_id < 0:
                offline.append(label)
            elif len(p.isr) < len(p.replicas):
                under_replicated.append(label)
    if quorum is not None and quorum["leader_id"] < 0:
        problems.append("the metadata quorum has no leader")
    healthy = quorum is not None and not problems and not under_replicated and not offline
    return {
        "cluster_id": cluster.cluster_id,
        "healthy": healthy,
        "quorum": quorum
        and {k: quorum[k] for k in ("leader_id", "leader_epoch", "high_watermark")},
        "nodes": nodes,
        "partitions_total": total,
        "under_replicated": under_replicated,
        "offline": offline,
        "problems": [p for p in problems if not p.startswith("broker ")],
    }


async def probe_ready(bootstrap: str, expected_brokers: set[int]) -> tuple[bool, str]:
    """(ready, what is missing): a quorum leader and every expected broker unfenced."""
    try:
        async with open_cluster(bootstrap, client_id="raftlog-cli", limits=CLI_LIMITS) as c:
            quorum = await Admin(c).describe_quorum()
            if quorum["leader_id"] < 0:
                return False, "waiting for a controller to be elected"
            await c.refresh_metadata([])
            missing = expected_brokers - set(c.brokers)
            if missing:
                return False, (
                    f"controller {quorum['leader_id']} elected; waiting for brokers "
                    f"{sorted(missing)} to register"
                )
            return True, f"controller {quorum['leader_id']}, {len(c.brokers)} brokers unfenced"
    except (KafkaError, ConnectionClosed, RequestTimeout, OSError) as exc:
        return False, f"waiting for the nodes to answer ({type(exc).__name__})"
    except BaseExceptionGroup as group:
        return False, f"waiting for the nodes to answer ({group.exceptions[0]!r})"
