"""The planning behind `raftlog cluster add-node` / `remove-node`, without processes: the
next node's id, ports and config; the refusals that keep replicas and the quorum safe; the
drain plan (least loaded brokers, racks spread, no broker twice in a replica set)."""

from __future__ import annotations

import json
import socket
import tomllib
from collections.abc import Mapping, Set
from pathlib import Path

import pytest
from click.testing import CliRunner
from raftlog_cli import cluster_local as local
from raftlog_cli.cluster_nodes import (
    ClusterView,
    drain_plan,
    plan_new_node,
    removal_refusals,
)
from raftlog_cli.errors import CliError
from raftlog_cli.main import cli

from raftlog.config import NodeConfig


def _view(
    assignments: Mapping[tuple[str, int], tuple[int, ...]],
    brokers: set[int],
    voters: Set[int] = frozenset({1, 2, 3}),
    racks: Mapping[int, str | None] | None = None,
) -> ClusterView:
    return ClusterView(
        live_brokers=frozenset(brokers),
        voters=frozenset(voters),
        assignments=assignments,
        leaders={key: replicas[0] for key, replicas in assignments.items()},
        racks=racks or dict.fromkeys(brokers),
    )


def test_next_node_takes_the_next_id_and_its_ports_from_the_base(tmp_path: Path) -> None:
    cluster = local.plan_cluster(tmp_path, 3, 20_000)
    node = plan_new_node(cluster)
    assert node.node_id == 4
    assert node.client_port == 20_003
    assert node.internal_port == 20_003 + local.INTERNAL_PORT_OFFSET
    assert node.metrics_port == 20_003 + local.METRICS_PORT_OFFSET
    assert node.node_dir == tmp_path.resolve() / "node-4"


def test_ids_are_not_reused_after_a_removal(tmp_path: Path) -> None:
    cluster = local.plan_cluster(tmp_path, 4, 20_000)
    without_one = local.LocalCluster(cluster.root, cluster.cluster_id, cluster.nodes[1:])
    node = plan_new_node(without_one)
    assert (node.node_id, node.client_port) == (5, 20_004)


def test_no_id_past_the_reserved_ports(tmp_path: Path) -> None:
    cluster = local.plan_cluster(tmp_path, local.MAX_LOCAL_NODES, 20_000)
    with pytest.raises(CliError, match="at most"):
        plan_new_node(cluster)


def test_joining_config_is_a_members_with_its_own_keys_and_the_broker_role(
    tmp_path: Path,
) -> None:
    cluster = local.plan_cluster(tmp_path, 3, 20_000)
    local.write_cluster(cluster, {"broker_session_timeout_ms": 3000})
    template = tomllib.loads(cluster.nodes[0].config_path.read_text())
    node = plan_new_node(cluster)
    config = local.joining_node_config(template, node)
    member = NodeConfig.load(cluster.nodes[0].config_path)
    assert config.node_id == 4 and config.roles == ["broker"]
    assert config.cluster_id == member.cluster_id
    assert config.controller_quorum_voters == member.controller_quorum_voters
    assert config.broker_session_timeout_ms == 3000  # --node-config carries over
    assert config.client_listener == f"{local.LOOPBACK}:{node.client_port}"
    assert config.internal_listener == f"{local.LOOPBACK}:{node.internal_port}"
    assert config.data_dir == str(node.node_dir / "data")


def _held_port_with_room() -> socket.socket:
    """A bound socket whose port leaves room for a four-node plan's internal ports above it
    (the ephemeral range can end above 65535 - INTERNAL_PORT_OFFSET)."""
    for _ in range(100):
        holder = socket.socket()
        holder.bind((local.LOOPBACK, 0))
        if holder.getsockname()[1] + local.INTERNAL_PORT_OFFSET < 65535:
            return holder
        holder.close()
    raise AssertionError("no free port below 65535 - INTERNAL_PORT_OFFSET in 100 tries")


def test_add_node_refuses_ports_in_use(tmp_path: Path) -> None:
    with _held_port_with_room() as holder:
        port = holder.getsockname()[1]
        # A cluster whose fourth node would take the client port held here.
        local.write_cluster(local.plan_cluster(tmp_path, 3, port - 3))
        result = CliRunner().invoke(cli, ["cluster", "add-node", "--dir", str(tmp_path)])
    assert result.exit_code == 1
    assert f"{port} is in use" in result.output, result.output


def test_removal_is_refused_when_replicas_would_not_fit() -> None:
    view = _view({("events", 0): (1, 2, 3), ("events", 1): (2, 3, 1)}, {1, 2, 3}, voters={1, 2})
    (reason,) = [r for r in removal_refusals(1, view) if "events" in r]
    assert "replication factor 3" in reason and "2 live brokers" in reason


def test_removal_is_refused_when_fewer_than_three_voters_would_remain() -> None:
    view = _view({("events", 0): (1, 2)}, {1, 2, 3, 4})
    reasons = removal_refusals(2, view)
    assert len(reasons) == 1 and "fewer than 3" in reasons[0] and "--voter" in reasons[0]
    # A broker that is not a voter can go; so can a voter when three others remain.
    assert removal_refusals(4, view) == []
    assert removal_refusals(2, _view({("events", 0): (1, 2)}, {1, 2, 3, 4}, {1, 2, 3, 4})) == []


def test_fenced_brokers_do_not_count_as_room() -> None:
    view = _view({("t", 0): (1, 2, 3)}, {1, 2, 3}, voters={1, 2, 3, 4})
    assert removal_refusals(1, view)  # broker 4 is not live: only 2 and 3 would remain


def test_drain_moves_every_replica_to_the_least_loaded_broker() -> None:
    assignments = {
        ("a", 0): (1, 2, 3),
        ("a", 1): (2, 3, 4),
        ("b", 0): (3, 1, 2),
        ("b", 1): (4, 2, 3),
    }
    plan = drain_plan(1, _view(assignments, {1, 2, 3, 4}))
    assert set(plan) == {("a", 0), ("b", 0)}
    for replicas in plan.values():
        assert 1 not in replicas and len(set(replicas)) == len(replicas) == 3
    # The node's replica goes last, so a current follower is the preferred leader.
    assert plan[("a", 0)] == (2, 3, 4)
    assert plan[("b", 0)] == (3, 2, 4)


def test_drain_spreads_by_load_across_moves() -> None:
    assignments = {("t", p): (1, 2) for p in range(4)}
    plan = drain_plan(1, _view(assignments, {1, 2, 3, 4}, voters={2, 3, 4}))
    targets = sorted(replicas[-1] for replicas in plan.values())
    assert targets == [3, 3, 4, 4]


def test_drain_prefers_a_rack_the_partition_is_not_on() -> None:
    racks: dict[int, str | None] = {1: "a", 2: "a", 3: "b", 4: "c", 5: "b"}
    # t-0 keeps 3 (rack b): 5 is on rack b too; 2 (rack a) and 4 (rack c) are not, and 2
    # holds no replica yet while 4 holds one.
    assignments = {("t", 0): (1, 3), ("u", 0): (4, 5)}
    plan = drain_plan(1, _view(assignments, {1, 2, 3, 4, 5}, racks=racks))
    assert plan[("t", 0)] == (3, 2)
    assignments = {("t", 0): (1, 2), ("u", 0): (4, 5)}
    plan = drain_plan(1, _view(assignments, {1, 2, 3, 4, 5}, racks=racks))
    assert plan[("t", 0)] == (2, 3)  # not rack a again (2 is there); 3 is the idlest of b, c


def test_cluster_json_round_trips_an_added_node(tmp_path: Path) -> None:
    cluster = local.plan_cluster(tmp_path, 3, 20_000)
    local.write_cluster(cluster)
    node = plan_new_node(cluster)
    grown = local.LocalCluster(cluster.root, cluster.cluster_id, (*cluster.nodes, node))
    local.save_cluster(grown)
    loaded = local.load_cluster(tmp_path)
    assert loaded is not None and [n.node_id for n in loaded.nodes] == [1, 2, 3, 4]
    data = json.loads((tmp_path / local.CLUSTER_FILE).read_text())
    assert data["bootstrap_servers"].endswith(node.client_address)


def test_remove_node_names_an_unknown_node(tmp_path: Path) -> None:
    local.write_cluster(local.plan_cluster(tmp_path, 3, 20_000))
    result = CliRunner().invoke(cli, ["cluster", "remove-node", "7", "--dir", str(tmp_path)])
    assert result.exit_code == 1 and "no node 7" in result.output
