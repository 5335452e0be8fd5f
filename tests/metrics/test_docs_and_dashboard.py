"""docs/operations.md ("Metrics") and docs/grafana-dashboard.json name only metrics a node
exports, and the dashboard is a well-formed Grafana dashboard."""

from __future__ import annotations

import json
import re
from pathlib import Path

from raftlog.metrics.collectors import GroupLagCollector, HealthCollector, QuotaCollector
from raftlog.metrics.health import ControllerHealth, NodeHealth, QuorumHealth, ReplicaHealth
from raftlog.metrics.instruments import NodeMetrics

DOCS = Path(__file__).resolve().parents[2] / "docs"
METRIC_NAME = re.compile(r"\braftlog_[a-z0-9_]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}


def exported_families() -> dict[str, str]:
    """name -> type of every family a node's registry exports."""
    metrics = NodeMetrics(str)
    health = NodeHealth(
        1, ReplicaHealth(), ControllerHealth(), QuorumHealth(1, 1, 0, 0, "leader"), 0
    )
    metrics.registry.register(HealthCollector(lambda: health))
    metrics.registry.register(QuotaCollector(lambda: []))
    metrics.registry.register(GroupLagCollector(lambda: []))
    return {family.name: family.type for family in metrics.registry.collect()}


def exported_names() -> set[str]:
    """The families and the sample names Prometheus stores for them."""
    names: set[str] = set()
    for name, kind in exported_families().items():
        names.add(name)
        names.update(name + suffix for suffix in SUFFIXES.get(kind, ()))
    return names


def metrics_section() -> str:
    text = (DOCS / "operations.md").read_text()
    start = text.index("## Metrics\n")
    return text[start : text.index("\n## ", start + 1)]


def test_the_metrics_section_names_only_exported_metrics() -> None:
    named = set(METRIC_NAME.findall(metrics_section()))
    assert len(named) > 20
    unknown = named - exported_names()
    assert not unknown, f"operations.md names metrics no node exports: {sorted(unknown)}"


def test_every_exported_metric_is_documented() -> None:
    section = metrics_section()
    written = set(METRIC_NAME.findall(section))
    # The table shortens siblings after a full name: `raftlog_x_partition_count`, `_leader_count`.
    shortened = set(re.findall(r"`(_[a-z0-9_]+)`", section))
    families = exported_families()
    missing = [
        name
        for name in sorted(families)
        if not {name, name + "_total"} & written
        and not any(name.endswith(tail) or (name + "_total").endswith(tail) for tail in shortened)
    ]
    assert not missing, f"exported but not in operations.md: {missing}"


def test_the_dashboard_is_grafana_json_over_exported_metrics() -> None:
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 30
    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    exported = exported_names()
    expressions = [target["expr"] for panel in panels for target in panel.get("targets", ())]
    assert expressions
    for expression in expressions:
        named = set(METRIC_NAME.findall(expression))
        assert named and named <= exported, expression
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
