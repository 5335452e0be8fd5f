"""`raftlog topics reassign --throttle` (cli/reassign_throttle.py): which configs a throttle
sets, as kafka-reassign-partitions.sh sets them (the moving partitions' current replicas are
leader-throttled, the replicas they gain follower-throttled, every broker involved gets both
rates), what --verify removes, and the flag's bounds. Against a real cluster:
tests/integration/test_reassignment_throttle_processes.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner
from raftlog_cli.main import cli
from raftlog_cli.reassign_throttle import (
    MAX_THROTTLE_BYTES_PER_S,
    ClearedThrottles,
    ThrottlePlan,
    clear_throttles,
    set_throttles,
    throttle_plan,
)

from raftlog.client import ConfigOp, ResourceType
from raftlog.client.admin import ClusterDescription
from raftlog.replication.core.throttle import UNTHROTTLED_RATE, parse_throttled_replicas

NOWHERE = "127.0.0.1:1"
LEADER_LIST = "leader.replication.throttled.replicas"
FOLLOWER_LIST = "follower.replication.throttled.replicas"
LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"


def test_only_moving_partitions_are_throttled() -> None:
    current = {("a", 0): (1, 2), ("a", 1): (2, 3), ("a", 2): (3, 1), ("b", 0): (1,)}
    plan = {
        ("a", 0): (4, 2),  # 1 leaves, 4 joins
        ("a", 1): (3, 2),  # a reorder: nothing to copy
        ("a", 2): None,  # a cancel
        ("b", 0): (1, 5),  # the factor grows
    }
    throttle = throttle_plan(current, plan)
    assert throttle == ThrottlePlan(
        topics={"a": ("0:1,0:2", "0:4"), "b": ("0:1", "0:5")}, brokers=(1, 2, 4, 5)
    )
    # The lists are the brokers' format.
    for leader_list, follower_list in throttle.topics.values():
        parse_throttled_replicas(leader_list)
        parse_throttled_replicas(follower_list)
    assert throttle_plan(current, {("a", 1): (3, 2)}) == ThrottlePlan({}, ())


class RecordingAdmin:
    """The Admin calls the throttle makes, against configs held here."""

    def __init__(self, brokers: tuple[int, ...], configs: dict[tuple[int, str], dict]) -> None:
        self.brokers = brokers
        self.configs = configs
        self.ops: list[tuple[tuple[ResourceType, str], list[tuple[str, ConfigOp, Any]]]] = []

    async def incremental_alter_configs(self, resource: Any, ops: Any) -> None:
        await trio.lowlevel.checkpoint()
        self.ops.append((resource, list(ops)))
        values = self.configs.setdefault(resource, {})
        for key, op, value in ops:
            if op == ConfigOp.SET:
                values[key] = value
            else:
                values.pop(key, None)

    async def describe_configs(self, resources: Any) -> dict:
        await trio.lowlevel.checkpoint()
        out = {}
        for resource in resources:
            defaults = {}
            if resource[0] == ResourceType.BROKER:
                defaults = {
                    LEADER_RATE: str(UNTHROTTLED_RATE),
                    FOLLOWER_RATE: str(UNTHROTTLED_RATE),
                }
            out[resource] = {**defaults, **self.configs.get(resource, {})}
        return out

    async def describe_cluster(self) -> ClusterDescription:
        await trio.lowlevel.checkpoint()
        return ClusterDescription("c", 1, {b: ("127.0.0.1", 9092) for b in self.brokers})


async def test_set_then_clear_touches_only_what_is_set() -> None:
    admin = RecordingAdmin((1, 2, 3, 4), {})
    throttle = ThrottlePlan({"a": ("0:1,0:2", "0:4")}, (1, 2, 4))
    await set_throttles(admin, throttle, 524288)  # type: ignore[arg-type]
    topic = (ResourceType.TOPIC, "a")
    assert admin.ops[0] == (
        topic,
        [(LEADER_LIST, ConfigOp.SET, "0:1,0:2"), (FOLLOWER_LIST, ConfigOp.SET, "0:4")],
    )
    assert [resource for resource, _ in admin.ops[1:]] == [
        (ResourceType.BROKER, "1"),
        (ResourceType.BROKER, "2"),
        (ResourceType.BROKER, "4"),
    ]
    assert admin.configs[(ResourceType.BROKER, "4")] == {
        LEADER_RATE: "524288",
        FOLLOWER_RATE: "524288",
    }
    admin.ops.clear()
    cleared = await clear_throttles(admin, {"a", "untouched"})  # type: ignore[arg-type]
    assert cleared == ClearedThrottles(("a",), (1, 2, 4))
    assert admin.configs[topic] == {}
    assert all(not admin.configs[(ResourceType.BROKER, str(b))] for b in (1, 2, 4))
    assert (ResourceType.BROKER, "3") not in {resource for resource, _ in admin.ops}
    # Nothing left: a second verify writes nothing.
    admin.ops.clear()
    assert await clear_throttles(admin, {"a"}) == ClearedThrottles((), ())  # type: ignore[arg-type]
    assert admin.ops == []


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [*args, "--bootstrap-server", NOWHERE], prog_name="raftlog")
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--verify", "--throttle", "100"], "--throttle goes with --execute"),
        (["--cancel", "--throttle", "100"], "--throttle goes with --execute"),
        (["--execute", "--throttle", "0"], "--throttle"),
        (["--execute", "--throttle", "-5"], "--throttle"),
        (["--execute", "--throttle", str(MAX_THROTTLE_BYTES_PER_S + 1)], "--throttle"),
        (["--execute", "--throttle", "fast"], "--throttle"),
    ],
)
def test_throttle_flag_is_checked_before_connecting(
    tmp_path: Path, args: list[str], says: str
) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps({"version": 1, "partitions": [{"topic": "a", "partition": 0, "replicas": [1]}]})
    )
    code, out = run("topics", "reassign", *args, "--reassignment-json-file", str(plan))
    assert code == 2, out
    assert says in out
