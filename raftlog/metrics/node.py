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

from raftlog.config import NodeConfig
from raftlog.metadata.image import MetadataDelta, MetadataImage
from raftlog.metadata.raft.driver import QuorumDriver
from raftlog.metadata.service import MetadataService
from raftlog.metrics.collectors import HealthCollector
from raftlog.metrics.endpoint import serve_metrics
from raftlog.metrics.health import NodeHealth, node_health
from raftlog.metrics.instruments import NodeMetrics
from raftlog.net.kafka.codec import api_name
from raftlog.replication.manager import ReplicaManager

log = logging.getLogger("raftlog.metrics")


class MeteredNode(Protocol):
    """What the wiring needs of raftlog.node.Node (which it may not import)."""

    config: NodeConfig
    metrics: NodeMetrics
    quorum: QuorumDriver | None
    metadata: MetadataService | None
    replicas: ReplicaManager | None


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


def attach(node: MeteredNode) -> None:
    """Register the collectors (they read the node's components at scrape time, so a
    broker started later is seen) and forget the series of deleted topics."""
    metrics = node.metrics
    assert node.metadata is not None
    metrics.registry.register(HealthCollector(lambda: health_of(node)))

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
