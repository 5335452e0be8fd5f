"""`raftlog cluster describe-quorum|add-voter|remove-voter` (KIP-853) against the in-process
Kafka server with a scripted metadata quorum (tests/kafka/test_quorum_handlers.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from raftlog.errors import ErrorCode
from raftlog.metadata.raft.membership import MembershipRefused
from raftlog.net.kafka.apis import default_registry
from raftlog.net.kafka.handlers_quorum import register_quorum_apis
from tests.cli.conftest import invoke
from tests.kafka.conftest import Broker, start_broker
from tests.kafka.test_quorum_handlers import CLUSTER_ID, ScriptedQuorum


@pytest.fixture
async def served(
    nursery: trio.Nursery, tmp_path: Path
) -> AsyncIterator[tuple[Broker, ScriptedQuorum]]:
    quorum = ScriptedQuorum()
    registry = default_registry()
    register_quorum_apis(registry, quorum, quorum.describe, CLUSTER_ID)
    broker = await start_broker(nursery, tmp_path, registry=registry)
    yield broker, quorum
    broker.backend.close()


async def test_describe_quorum_table(served: tuple[Broker, ScriptedQuorum]) -> None:
    broker, _ = served
    result = await invoke(["cluster", "describe-quorum", "--bootstrap-server", broker.bootstrap])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "leader 1, epoch 3, high watermark 10"
    assert "CONTROLLER://h1:9001" in result.output
    assert any(line.split()[:2] == ["7", "observer"] for line in lines)


async def test_add_then_remove_voter_json(served: tuple[Broker, ScriptedQuorum]) -> None:
    broker, quorum = served
    bootstrap = ["--bootstrap-server", broker.bootstrap]
    result = await invoke(
        ["cluster", "add-voter", "--node-id", "4", "--endpoint", "h4:9004", *bootstrap]
    )
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "node 4 is a voter"
    result = await invoke(["cluster", "remove-voter", "--node-id", "2", "--json", *bootstrap])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"node_id": 2, "voter": False}
    result = await invoke(["cluster", "describe-quorum", "--json", *bootstrap])
    described = json.loads(result.output)
    roles = {r["replica_id"]: r["role"] for r in described["replicas"]}
    assert roles == {1: "leader", 4: "voter", 7: "observer"}
    endpoints = {r["replica_id"]: r["endpoints"] for r in described["replicas"]}
    assert endpoints[4] == "CONTROLLER://h4:9004"
    assert sorted(quorum.voters) == [1, 4]


async def test_refusal_is_one_line_with_kafkas_name(served: tuple[Broker, ScriptedQuorum]) -> None:
    broker, quorum = served
    quorum.refuse = MembershipRefused(ErrorCode.request_timed_out, "a change is pending")
    result = await invoke(
        ["cluster", "remove-voter", "--node-id", "2", "--bootstrap-server", broker.bootstrap]
    )
    assert result.exit_code != 0
    assert "a change is pending" in result.output
    assert len(result.output.strip().splitlines()) == 1


async def test_bad_endpoint_is_a_usage_error(served: tuple[Broker, ScriptedQuorum]) -> None:
    broker, quorum = served
    bad = ["cluster", "add-voter", "--node-id", "4", "--endpoint", "h4:99999"]
    result = await invoke([*bad, "--bootstrap-server", broker.bootstrap])
    assert result.exit_code == 2 and "port out of range" in result.output
    assert quorum.calls == []
