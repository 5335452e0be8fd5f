"""`raftlog consume --group` on a real three-node cluster: two CLI processes split a
4-partition topic with no overlap (a stock client, confluent-kafka, sees both members and
their assignments in DescribeGroups); Ctrl-C on one makes it commit and leave, and the other
takes over every partition from the committed offsets — no record lost, none printed twice.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from raftlog.testing.cluster import ProcessCluster
from tests.cli.test_cluster_e2e import node_serves_kafka
from tests.waiting import wait_until

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        not node_serves_kafka(), reason="raftlog.node does not serve the Kafka protocol yet"
    ),
]

TOPIC = "events"
GROUP = "printers"
PARTITIONS = 4
PER_PARTITION = 10
CONDITION_DEADLINE_S = 30
EXIT_DEADLINE_S = 20
# Poll period of DescribeGroups / the members' output while waiting on a condition.
POLL_S = 0.2


@dataclass
class Member:
    """One `raftlog consume --group` process and the JSON records it printed."""

    process: trio.Process
    records: list[dict[str, Any]] = field(default_factory=list)
    stderr: bytearray = field(default_factory=bytearray)
    # Set when the reader of stdout and of stderr has seen its end.
    outputs_closed: list[trio.Event] = field(default_factory=lambda: [trio.Event(), trio.Event()])

    def values(self) -> list[str]:
        return [r["value"] for r in self.records]

    def partitions(self) -> set[int]:
        return {r["partition"] for r in self.records}


async def start_member(nursery: trio.Nursery, bootstrap: str) -> Member:
    argv = [
        sys.executable,
        "-m",
        "raftlog_cli.main",
        "consume",
        TOPIC,
        "--group",
        GROUP,
        "--from-beginning",
        "--json",
        "--session-timeout-ms",
        "6000",
        "--heartbeat-interval-ms",
        "200",
        "--bootstrap-server",
        bootstrap,
    ]
    process = await trio.lowlevel.open_process(
        argv,
        stdin=None,
        stdout=-1,
        stderr=-1,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    member = Member(process)

    async def read_stdout() -> None:
        assert process.stdout is not None
        pending = b""
        async for chunk in process.stdout:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            member.records.extend(json.loads(line) for line in lines if line)
        member.outputs_closed[0].set()

    async def read_stderr() -> None:
        assert process.stderr is not None
        async for chunk in process.stderr:
            member.stderr += chunk
        member.outputs_closed[1].set()

    nursery.start_soon(read_stdout)
    nursery.start_soon(read_stderr)
    return member


def describe(admin: AdminClient) -> dict[str, Any]:
    """State and member -> assigned partitions of GROUP, as confluent-kafka sees them."""
    description = admin.describe_consumer_groups([GROUP])[GROUP].result(10)
    return {
        "state": description.state.name,
        "assignor": description.partition_assignor,
        "members": {
            m.member_id: (
                m.client_id,
                sorted(tp.partition for tp in m.assignment.topic_partitions if tp.topic == TOPIC),
            )
            for m in description.members
        },
    }


def while_alive(probe: Callable[[], Any], members: list[Member]) -> Callable[[], Any]:
    """The probe run in a thread (it may block), failing at once if a member has exited."""

    async def check() -> Any:
        for m in members:
            assert m.process.returncode is None, f"member exited: {m.stderr.decode()}"
        return await trio.to_thread.run_sync(probe)

    return check


poll_pause = functools.partial(trio.sleep, POLL_S)


def produce(bootstrap: str, round_: int) -> set[str]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    values = set()
    for p in range(PARTITIONS):
        for i in range(PER_PARTITION):
            value = f"r{round_}-p{p}-{i}"
            producer.produce(TOPIC, value=value.encode(), partition=p)
            values.add(value)
    assert producer.flush(30) == 0
    return values


async def stop(member: Member) -> None:
    """Ctrl-C, then wait for the process to commit, leave and exit."""
    member.process.send_signal(signal.SIGINT)
    with trio.fail_after(EXIT_DEADLINE_S):
        await member.process.wait()
        for closed in member.outputs_closed:
            await closed.wait()


async def test_two_cli_members_split_then_one_takes_over(tmp_path: Path) -> None:
    cluster = ProcessCluster(tmp_path / "cluster", 3)
    await trio.to_thread.run_sync(cluster.__enter__)
    members: list[Member] = []
    try:
        bootstrap = cluster.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)])
        await trio.to_thread.run_sync(lambda: futures[TOPIC].result(30))

        async with trio.open_nursery() as nursery:
            a = await start_member(nursery, bootstrap)
            members.append(a)
            alone = await wait_until(
                "the first member to own every partition",
                while_alive(
                    lambda: (
                        (d := describe(admin))["state"] == "STABLE"
                        and [p for _, p in d["members"].values()] == [[0, 1, 2, 3]]
                        and d
                    ),
                    members,
                ),
                CONDITION_DEADLINE_S,
                wake=poll_pause,
            )
            assert alone["assignor"] == "range"
            assert [client for client, _ in alone["members"].values()] == ["raftlog-cli"]

            b = await start_member(nursery, bootstrap)
            members.append(b)
            split = await wait_until(
                "a 2/2 split",
                while_alive(
                    lambda: (
                        (d := describe(admin))["state"] == "STABLE"
                        and sorted(len(p) for _, p in d["members"].values()) == [2, 2]
                        and d
                    ),
                    members,
                ),
                CONDITION_DEADLINE_S,
                wake=poll_pause,
            )
            owned = [set(p) for _, p in split["members"].values()]
            assert not owned[0] & owned[1] and owned[0] | owned[1] == set(range(PARTITIONS))

            first = await trio.to_thread.run_sync(produce, bootstrap, 1)
            await wait_until(
                "round 1 printed",
                while_alive(lambda: len(a.records) + len(b.records) >= len(first), members),
                CONDITION_DEADLINE_S,
                wake=poll_pause,
            )
            assert sorted(a.values() + b.values()) == sorted(first)
            assert a.partitions() in map(set, owned) and b.partitions() in map(set, owned)
            assert not a.partitions() & b.partitions()

            await stop(b)
            assert b.process.returncode == 0, b.stderr.decode()
            # Exit 0 and a clean stderr: Ctrl-C ended the read loop, not the process.
            assert b.stderr == b""
            await wait_until(
                "the remaining member to own every partition",
                while_alive(
                    lambda: (
                        (d := describe(admin))["state"] == "STABLE"
                        and [p for _, p in d["members"].values()] == [[0, 1, 2, 3]]
                    ),
                    members[:1],
                ),
                CONDITION_DEADLINE_S,
                wake=poll_pause,
            )

            second = await trio.to_thread.run_sync(produce, bootstrap, 2)
            await wait_until(
                "round 2 printed",
                while_alive(
                    lambda: len(a.records) + len(b.records) >= len(first | second), members[:1]
                ),
                CONDITION_DEADLINE_S,
                wake=poll_pause,
            )
            assert sorted(a.values() + b.values()) == sorted(first | second), (
                "the takeover starts at the committed offsets: nothing lost, nothing twice"
            )

            await stop(a)
            assert a.process.returncode == 0, a.stderr.decode()
            empty = await trio.to_thread.run_sync(describe, admin)
            assert (empty["state"], empty["members"]) == ("EMPTY", {})
            nursery.cancel_scope.cancel()
    finally:
        for m in members:
            if m.process.returncode is None:
                m.process.kill()
        await trio.to_thread.run_sync(cluster.stop)
