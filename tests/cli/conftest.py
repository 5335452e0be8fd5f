"""CLI tests run `raftlog ...` with click's CliRunner against a real Kafka server (the
in-process server of tests/kafka on its memory backend). `raftlog` has the test-only group
handlers of group_handlers.py (groups filled in by the test); `grouped` has the real group
coordinator, for consumers that join groups.

The server lives in the test's trio loop; the CLI calls trio.run itself, so each invocation
runs in a worker thread (one at a time: CliRunner swaps sys.stdout for the call).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from click.testing import CliRunner, Result
from raftlog_cli.main import cli

from raftlog.metadata.raft.describe import QuorumDescription, ReplicaProgress
from raftlog.net.kafka.handlers_quorum import register_quorum_apis
from tests.cli.group_handlers import GroupStore, group_registry
from tests.kafka.conftest import Broker, start_broker
from tests.kafka.test_groups_wire import start_group_broker
from tests.kafka.test_quorum_handlers import CLUSTER_ID, ScriptedQuorum

# One CLI call against a local in-process broker; far above what any call needs.
CLI_CALL_DEADLINE_S = 30


@dataclass
class Cli:
    broker: Broker
    groups: GroupStore

    async def __call__(
        self, *args: str, input: str | None = None, bootstrap: bool = True
    ) -> Result:
        argv: Sequence[str] = list(args)
        if bootstrap:
            argv = [*argv, "--bootstrap-server", self.broker.bootstrap]
        return await invoke(argv, input=input)


async def invoke(argv: Sequence[str], input: str | None = None) -> Result:
    runner = CliRunner()
    with trio.fail_after(CLI_CALL_DEADLINE_S):
        return await trio.to_thread.run_sync(
            lambda: runner.invoke(
                cli, list(argv), input=input, catch_exceptions=False, prog_name="raftlog"
            ),
            abandon_on_cancel=True,
        )


async def describe_single_voter() -> QuorumDescription:
    """The metadata quorum of the one-node server: node 1 leads it alone, caught up."""
    return QuorumDescription(1, 3, 42, (ReplicaProgress(1, 42, 1000, 1000),))


@pytest.fixture
async def raftlog(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Cli]:
    store = GroupStore()
    registry = group_registry(store)
    # DescribeQuorum as a node serves it (handlers_quorum), for `cluster status`.
    register_quorum_apis(registry, ScriptedQuorum(), describe_single_voter, CLUSTER_ID)
    broker = await start_broker(nursery, tmp_path, registry=registry)
    store.port = broker.port
    yield Cli(broker, store)
    broker.backend.close()


@pytest.fixture
async def grouped(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Cli]:
    """The CLI against a broker with the real group coordinator (InProcessGroupService), for
    commands that join groups: `raftlog consume --group`."""
    started = await start_group_broker(nursery, tmp_path)
    yield Cli(started.broker, GroupStore())
    started.broker.backend.close()
