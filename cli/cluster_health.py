"""What `cluster status` and `cluster up` ask the cluster: quorum, brokers, partitions.

Brokers missing from Metadata are fenced (KRaft lists only unfenced brokers there). A
partition is under-replicated when its ISR is smaller than its replica set and offline when
it has no leader. The verdict is healthy only when the quorum has a leader and nothing is
fenced, under-replicated, offline or (for a local cluster) not running.

Each under-replicated or offline partition comes with the reason of every replica missing
from its ISR: its broker is fenced, the replica is unsafe (it lost or damaged records, or its
disk failed: it stays out of the ISR and of elections until it has fetched them back), or it
is catching up. Only a broker knows its own replicas are unsafe (Metadata's
offline_replicas), so every unfenced broker is asked.

Where the nodes' metrics endpoints are known (a local cluster), the figures a dashboard
alerts on come from them and nowhere else: each node's /metrics (raftlog.metrics.scrape)
gives its leader and partition counts, the partitions it leads under-replicated or under
min ISR, and, from the active controller, the offline partitions; the cluster's counts are
their sums and decide the verdict. The partition names and reasons above are the detail
behind those counts, read from Metadata (metrics do not name partitions).
"""

from __future__ import annotations

from typing import Any

from raftlog_cli.cluster_local import LocalCluster, running_pid
from raftlog_cli.common import CLI_LIMITS
from raftlog_cli.errors import leaf_exception

from raftlog.client import Admin, Cluster, open_cluster
from raftlog.client.auth import AuthenticationFailed, TlsHandshakeFailed
from raftlog.client.cluster import PartitionInfo
from raftlog.client.connection import ConnectionClosed, RequestTimeout
from raftlog.client.properties import PLAINTEXT, ClientSecurity
from raftlog.errors import KafkaError
from raftlog.metrics.scrape import ScrapeError, scrape, status_figures

# The per-node figures a status shows, summed into the cluster's (status_figures' keys).
SUMMED_FIGURES = (
    "under_replicated_partitions",
    "under_min_isr_partitions",
    "offline_partitions",
    "active_controller",
)

UNSAFE_REASON = "unsafe (lost or damaged records, or a failed disk; repairing from the leader)"


async def unsafe_replicas(cluster: Cluster) -> dict[str, set[int]]:
    """{"topic-partition": broker ids whose own replica there is unsafe}, as each unfenced
    broker says of itself."""
    unsafe: dict[str, set[int]] = {}
    for broker_id in sorted(cluster.brokers):
        try:
            connection = await cluster.broker(broker_id)
            response = await connection.call(
                "metadata", {"topics": None, "allow_auto_topic_creation": False}
            )
        except (KafkaError, ConnectionClosed, RequestTimeout, OSError):
            continue  # unreachable now: its replicas show as whatever the others say
        for topic in response.topics:
            for p in topic.partitions:
                if broker_id in getattr(p, "offline_replicas", ()):
                    unsafe.setdefault(f"{topic.name}-{p.partition_index}", set()).add(broker_id)
    return unsafe


def replica_reasons(
    p: PartitionInfo, unfenced: dict[int, tuple[str, int]], unsafe: set[int]
) -> str:
    """Why each replica outside the ISR (or every replica, with no leader) is not serving."""
    reasons = []
    for replica in p.replicas:
        if replica in unsafe:
            reasons.append(f"replica {replica}: {UNSAFE_REASON}")
        elif replica not in unfenced:
            reasons.append(f"replica {replica}: broker fenced")
        elif replica not in p.isr:
            reasons.append(f"replica {replica}: catching up")
        elif p.leader_id < 0:
            reasons.append(f"replica {replica}: in the ISR, not elected yet")
    return "; ".join(reasons)


async def scrape_node_figures(local: LocalCluster) -> dict[int, dict[str, float] | None]:
    """Each running node's status figures from its own /metrics (None: it did not answer)."""
    figures: dict[int, dict[str, float] | None] = {}
    for node in local.nodes:
        if running_pid(node) is None:
            continue
        host, _, port = node.metrics_address.rpartition(":")
        try:
            figures[node.node_id] = status_figures(await scrape(host, int(port)))
        except ScrapeError:
            figures[node.node_id] = None
    return figures


def cluster_figures(figures: dict[int, dict[str, float] | None]) -> dict[str, int]:
    """The cluster's counts: each node reports what it leads (and only the active
    controller reports offline partitions), so the sums are the cluster's figures."""
    return {
        key: int(sum(f[key] for f in figures.values() if f is not None)) for key in SUMMED_FIGURES
    }


async def gather_status(
    cluster: Cluster,
    local: LocalCluster | None,
    figures: dict[int, dict[str, float] | None] | None = None,
) -> dict[str, Any]:
    """The status report. `figures` are the nodes' scraped status figures; by default a
    local cluster's are scraped, and without them the counts come from Metadata."""
    if figures is None and local is not None:
        figures = await scrape_node_figures(local)
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
        row: dict[str, Any] = {
            "node_id": node_id,
            "process": process,
            "voter": node_id in voter_leo,
            "voter_lag": lag,
            "broker": broker,
            "address": f"{address[0]}:{address[1]}" if address else None,
        }
        if figures is not None:
            own = figures.get(node_id)
            row["metrics"] = None if own is None else {k: int(v) for k, v in own.items()}
        nodes.append(row)
    under_replicated: list[str] = []
    offline: list[str] = []
    reasons: dict[str, str] = {}
    unsafe = await unsafe_replicas(cluster)
    total = 0
    for name in sorted(cluster.topics):
        for p in cluster.topics[name].partitions:
            total += 1
            label = f"{name}-{p.partition}"
            if p.leader_id < 0:
                offline.append(label)
            elif len(p.isr) < len(p.replicas):
                under_replicated.append(label)
            else:
                continue
            reasons[label] = replica_reasons(p, unfenced, unsafe.get(label, set()))
    if quorum is not None and quorum["leader_id"] < 0:
        problems.append("the metadata quorum has no leader")
    counts: dict[str, int] | None = None
    if figures and any(f is not None for f in figures.values()):
        counts = cluster_figures(figures)
        degraded = bool(counts["under_replicated_partitions"] or counts["offline_partitions"])
    else:
        degraded = bool(under_replicated or offline)
    healthy = quorum is not None and not problems and not degraded
    report = {
        "cluster_id": cluster.cluster_id,
        "healthy": healthy,
        "quorum": quorum
        and {k: quorum[k] for k in ("leader_id", "leader_epoch", "high_watermark")},
        "nodes": nodes,
        "partitions_total": total,
        "under_replicated": under_replicated,
        "offline": offline,
        "reasons": reasons,
        "problems": [p for p in problems if not p.startswith("broker ")],
    }
    if counts is not None:
        # The source of the counts above, named so a reader knows which one was used.
        report["metrics"] = counts
    return report


async def probe_ready(
    bootstrap: str, expected_brokers: set[int], security: ClientSecurity = PLAINTEXT
) -> tuple[bool, str]:
    """(ready, what is missing): a quorum leader and every expected broker unfenced.

    On a secure cluster a refused login means "not yet" until the caller's deadline: each
    node writes the seeded admin credential only once it has caught up with the metadata
    log. A failed TLS handshake is final (raised): waiting would not change certificates.
    """
    try:
        async with open_cluster(
            bootstrap, client_id="raftlog-cli", limits=CLI_LIMITS, security=security
        ) as c:
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
        leaf = leaf_exception(group)
        if isinstance(leaf, AuthenticationFailed):
            return False, "waiting for the admin user to be created"
        if isinstance(leaf, TlsHandshakeFailed):
            raise leaf from None
        return False, f"waiting for the nodes to answer ({leaf!r})"
