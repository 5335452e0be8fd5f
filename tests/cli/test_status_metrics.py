"""`raftlog cluster status` takes the figures a dashboard alerts on from the nodes' own
/metrics, not from a computation of its own: where the two could differ, the status says
what the endpoint says."""

from __future__ import annotations

from types import SimpleNamespace

import trio
from prometheus_client import CollectorRegistry
from raftlog_cli import cluster_health
from raftlog_cli.cluster import _render_metrics
from raftlog_cli.common import CLI_LIMITS
from raftlog_cli.render import Renderer

from raftlog.client import open_cluster
from raftlog.metrics.collectors import HealthCollector
from raftlog.metrics.endpoint import serve_metrics
from raftlog.metrics.health import ControllerHealth, NodeHealth, QuorumHealth, ReplicaHealth
from tests.cli.conftest import Cli

# What node 1's endpoint reports: it leads 2 partitions, one of them with a short ISR and
# below min.insync.replicas, and it is the active controller with nothing offline.
HEALTH = NodeHealth(
    node_id=1,
    replicas=ReplicaHealth(2, 2, 1, 1, 0),
    controller=ControllerHealth(1, 0, 1, 2, 0, 1),
    quorum=QuorumHealth(3, 1, 42, 43, "leader"),
    produce_purgatory_size=0,
)


async def _metrics_endpoint(nursery: trio.Nursery) -> int:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HealthCollector(lambda: HEALTH))
    listeners = await nursery.start(serve_metrics, registry, "127.0.0.1", 0)
    return int(listeners[0].socket.getsockname()[1])


async def test_status_counts_and_verdict_come_from_the_metrics_endpoint(
    raftlog: Cli, nursery: trio.Nursery, monkeypatch, capsys
) -> None:
    await raftlog("topics", "create", "t", "--partitions", "2")
    port = await _metrics_endpoint(nursery)
    # A local cluster of one running node whose metrics endpoint is the one above.
    node = SimpleNamespace(node_id=1, metrics_address=f"127.0.0.1:{port}")
    local = SimpleNamespace(nodes=[node], node=lambda node_id: node)
    monkeypatch.setattr(cluster_health, "running_pid", lambda n: 4242)

    async with open_cluster(
        raftlog.broker.bootstrap, client_id="raftlog-cli", limits=CLI_LIMITS
    ) as cluster:
        figures = await cluster_health.scrape_node_figures(local)  # type: ignore[arg-type]
        report = await cluster_health.gather_status(cluster, local, figures)  # type: ignore[arg-type]

    # Metadata alone finds every partition in sync; the endpoint says one is not, and the
    # status follows the endpoint (one source, the dashboard's).
    assert report["under_replicated"] == []
    assert report["metrics"] == {
        "under_replicated_partitions": 1,
        "under_min_isr_partitions": 1,
        "offline_partitions": 0,
        "active_controller": 1,
    }
    assert report["healthy"] is False
    (row,) = report["nodes"]
    assert row["metrics"]["leader_count"] == 2
    assert row["metrics"]["partition_count"] == 2
    assert row["metrics"]["metadata_epoch"] == 3

    capsys.readouterr()
    _render_metrics(SimpleNamespace(out=Renderer(json_mode=False)), report)  # type: ignore[arg-type]
    text = capsys.readouterr().out
    assert text.splitlines()[0] == (
        "Metrics: 1 under-replicated, 1 under min ISR, 0 offline, 1 active controller(s)"
    )
    assert "UNDER-REPLICATED" in text


async def test_a_node_whose_endpoint_does_not_answer_has_no_figures(
    raftlog: Cli, monkeypatch
) -> None:
    await raftlog("topics", "create", "t")
    node = SimpleNamespace(node_id=1, metrics_address="127.0.0.1:1")  # nothing listens
    local = SimpleNamespace(nodes=[node], node=lambda node_id: node)
    monkeypatch.setattr(cluster_health, "running_pid", lambda n: 4242)
    assert await cluster_health.scrape_node_figures(local) == {1: None}  # type: ignore[arg-type]
    async with open_cluster(
        raftlog.broker.bootstrap, client_id="raftlog-cli", limits=CLI_LIMITS
    ) as cluster:
        report = await cluster_health.gather_status(cluster, None, {1: None})
    # No figures at all: the counts come from Metadata, as for a remote cluster.
    assert "metrics" not in report
    assert report["healthy"] is True
    assert report["nodes"][0]["metrics"] is None
