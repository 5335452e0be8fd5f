"""Wiring a node's metrics: its registry, the collectors over its state, the endpoint.

node.py calls `node_metrics()` when it builds a Node (the Raft driver, the replica manager and
the Kafka listeners take their instruments from it) and starts `run_metrics` once the metadata
quorum runs, so the endpoint is up while the broker starts.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import trio
from prometheus_client import disable_created_metrics

from raftlog.clock import clock_ms
from raftlog.config import NodeConfig
from raftlog.groups.node_service import NodeGroupService
from raftlog.metadata.image import MetadataDelta, MetadataImage
from raftlog.metadata.raft.driver import QuorumDriver
from raftlog.metadata.service import MetadataService
from raftlog.metrics.collectors import GroupLagCollector, HealthCollector, QuotaCollector
from raftlog.metrics.endpoint import serve_metrics
from raftlog.metrics.health import GroupLag, NodeHealth, group_lag, node_health
from raftlog.metrics.instruments import MAX_LABEL_SETS, NodeMetrics
from raftlog.net.kafka.codec import api_name
from raftlog.quotas.broker_hook import BrokerQuotas
from raftlog.quotas.manager import QuotaUsage
from raftlog.replication.manager import ReplicaManager

log = logging.getLogger("raftlog.metrics")


class MeteredNode(Protocol):
    """What the wiring needs of raftlog.node.Node (which it may not import)."""

    config: NodeConfig
    metrics: NodeMetrics
    quorum: QuorumDriver | None
    metadata: MetadataService | None
    replicas: ReplicaManager | None
    quotas: BrokerQuotas | None
    groups: NodeGroupService | None


def node_metrics() -> NodeMetrics:
    # Without this every counter and histogram also exports a `_created` timestamp series,
    # which doubles what Prometheus stores and no alert uses (a process-wide switch; the
    # registries in this process are all nodes').
    disable_created_metrics()
    return NodeMetrics(api_name)


def health_of(node: MeteredNode) -> NodeHealth:
    """The node's figures, as /metrics shows them (and as a status view should)."""
    assert node.quorum is not None and node.metadata is not None
    return node_health(
        node.config.node_id,
        node.quorum,
        node.metadata.image,
        None if node.replicas is None else node.replicas.replicas,
        is_controller=node.config.is_controller,
    )


def quota_usage_of(node: MeteredNode) -> list[QuotaUsage]:
    """The quota manager's sensors (what `raftlog quotas describe --usage` lists)."""
    return [] if node.quotas is None else node.quotas.manager.usage(clock_ms())


def group_lag_of(node: MeteredNode) -> list[GroupLag]:
    """Lag of the groups this node coordinates, for the partitions it hosts."""
    if node.groups is None or node.replicas is None:
        return []
    partitions = node.replicas.replicas.partitions
    committed = node.groups.shell.coordinator.committed_offsets()

    def high_watermark_of(topic: str, partition: int) -> int | None:
        hosted = partitions.get((topic, partition))
        return None if hosted is None else hosted.replica.high_watermark

    return group_lag(
        {key: c.offset for key, c in committed.items()},
        high_watermark_of,
        max_rows=MAX_LABEL_SETS,
    )


def attach(node: MeteredNode) -> None:
    """Register the collectors (they read the node's components at scrape time, so a
    broker started later is seen) and forget the series of deleted topics."""
    metrics = node.metrics
    assert node.metadata is not None
    metrics.registry.register(HealthCollector(lambda: health_of(node)))
    metrics.registry.register(QuotaCollector(lambda: quota_usage_of(node)))
    metrics.registry.register(GroupLagCollector(lambda: group_lag_of(node)))

    def on_metadata(image: MetadataImage, delta: MetadataDelta) -> None:
        for topic in delta.deleted_topics.values():
            metrics.replication.forget_topic(topic.name)

    node.metadata.add_listener(on_metadata)


async def run_metrics(
    node: MeteredNode, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
) -> None:
    """attach(), then serve metrics_listener until cancelled (returns at once without one)."""
    attach(node)
    address = node.config.metrics_address
    if address is None:
        task_status.started()
        return
    host, port = address
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(serve_metrics, node.metrics.registry, host, port)
        bound_port = listeners[0].socket.getsockname()[1]
        log.info("metrics on http://%s:%d/metrics", host, bound_port)
        task_status.started(bound_port)
