"""`raftlog groups reset-offsets` and `raftlog groups delete` on a real three-node cluster:
offsets replicated in `__consumer_offsets`, ListOffsets by timestamp answered by the real
partition logs, and two groups chosen so their coordinators are different nodes, so one
`groups delete` has to send DeleteGroups to each.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka.admin import AdminClient, NewTopic

from raftlog.client import Cluster, open_cluster
from raftlog.client.consumer_protocol import TopicPartition
from raftlog.client.group_member import GroupMember
from raftlog.client.groups import GroupAdmin
from raftlog.client.member_state import MemberConfig
from raftlog.client.producer import Producer
from raftlog.errors import KafkaError
from raftlog.records import Record
from raftlog.testing.cluster import ProcessCluster
from tests.cli.conftest import invoke
from tests.cli.test_cluster_e2e import node_serves_kafka
from tests.waiting import wait_until

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        not node_serves_kafka(), reason="raftlog.node does not serve the Kafka protocol yet"
    ),
]

TOPIC = "events"
PARTITIONS = 3
RECORDS = 10
# 2024-03-01T12:00:00Z; record i of every partition is stamped i seconds later.
BASE_MS = 1_709_294_400_000
CONDITION_DEADLINE_S = 60
# Group names tried when looking for two with different coordinators.
CANDIDATE_GROUPS = 64
ALL = [(TOPIC, p) for p in range(PARTITIONS)]


class Idle:
    async def on_partitions_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        pass

    async def on_partitions_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        pass


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[ProcessCluster]:
    started = ProcessCluster(tmp_path / "cluster", 3)
    await trio.to_thread.run_sync(started.__enter__)
    try:
        yield started
    finally:
        await trio.to_thread.run_sync(started.stop)


async def cli(bootstrap: str, *args: str) -> tuple[int, str, str]:
    r = await invoke([*args, "--bootstrap-server", bootstrap])
    return r.exit_code, r.stdout, r.stderr


async def commit_when_ready(admin: GroupAdmin, group: str, offsets: dict[Any, int]) -> None:
    """The first commits create `__consumer_offsets`; until its partitions have leaders the
    coordinator answers a retriable error, which may outlast one call's retries."""

    async def attempt() -> bool:
        try:
            await admin.commit_offsets(group, offsets)
        except KafkaError:
            return False
        return True

    await wait_until(f"a commit of {group}", attempt, CONDITION_DEADLINE_S)


async def groups_on_two_coordinators(admin: GroupAdmin) -> tuple[str, str]:
    seen: dict[int, str] = {}
    for i in range(CANDIDATE_GROUPS):
        group = f"g{i}"
        node_id, _ = await admin.find_coordinator(group)
        seen.setdefault(node_id, group)
        if len(seen) == 2:
            first, second = seen.values()
            return first, second
    raise AssertionError(f"{CANDIDATE_GROUPS} groups all have coordinator {list(seen)}")


async def produce_stamped(raftlog: Cluster) -> None:
    producer = Producer(raftlog)
    for p in range(PARTITIONS):
        for i in range(RECORDS):
            # One record a batch, so a time look-up lands on that record.
            record = Record(timestamp_ms=BASE_MS + i * 1000, value=f"{p}-{i}".encode())
            await producer.produce(TOPIC, [record], partition=p)


async def test_reset_and_delete_on_three_nodes(cluster: ProcessCluster) -> None:
    bootstrap = cluster.bootstrap_servers
    admin_client = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin_client.create_topics([NewTopic(TOPIC, PARTITIONS, 3)])
    await trio.to_thread.run_sync(lambda: futures[TOPIC].result(30))

    async with open_cluster(bootstrap) as raftlog:
        await produce_stamped(raftlog)
        admin = GroupAdmin(raftlog)
        await commit_when_ready(admin, "warm-up", {(TOPIC, 0): 0})
        first, second = await groups_on_two_coordinators(admin)
        for group in (first, second):
            await commit_when_ready(admin, group, dict.fromkeys(ALL, 5))

        # A dry run changes nothing.
        code, out, err = await cli(
            bootstrap,
            *("groups", "reset-offsets", "--group", first, "--all-topics"),
            *("--to-datetime", "2024-03-01T13:00:03+01:00", "--json"),
        )
        assert (code, err) == (0, "")
        assert [(o["previous_offset"], o["new_offset"]) for o in json.loads(out)["offsets"]] == [
            (5, 3)
        ] * PARTITIONS
        assert await admin.committed_positions(first, ALL) == dict.fromkeys(ALL, 5)

        # --execute: the first offset at or after 12:00:03Z is record 3 of each partition.
        code, _, err = await cli(
            bootstrap,
            *("groups", "reset-offsets", "--group", first, "--all-topics"),
            *("--to-datetime", "2024-03-01T12:00:03Z", "--execute"),
        )
        assert (code, err) == (0, "")
        code, out, _ = await cli(bootstrap, "groups", "describe", first, "--json")
        described = json.loads(out)
        assert [
            (o["partition"], o["committed_offset"], o["lag"]) for o in described["offsets"]
        ] == [(p, 3, 7) for p in range(PARTITIONS)]

        # Past the high watermark: clamped to it; only the named partition moves.
        code, _, err = await cli(
            bootstrap,
            *("groups", "reset-offsets", "--group", second, "--topic", f"{TOPIC}:1"),
            *("--to-offset", "100", "--execute"),
        )
        assert (code, err) == (0, "")
        assert await admin.committed_positions(second, ALL) == {
            (TOPIC, 0): 5,
            (TOPIC, 1): RECORDS,
            (TOPIC, 2): 5,
        }

        # A live member blocks both commands.
        config = MemberConfig(session_timeout_ms=10_000, heartbeat_interval_ms=500)
        member = GroupMember(raftlog, first, [TOPIC], Idle(), config)
        with trio.fail_after(CONDITION_DEADLINE_S):
            async with member.joined():
                code, _, err = await cli(
                    bootstrap,
                    *("groups", "reset-offsets", "--group", first, "--all-topics"),
                    *("--to-earliest", "--execute"),
                )
                assert code == 1
                assert err.startswith(
                    f"error: Assignments can only be reset if the group '{first}' is inactive, "
                    "but the current state is "
                ), err
                code, _, err = await cli(bootstrap, "groups", "delete", "--group", first)
                assert code == 1
                assert "not empty: it has active members" in err

        # Empty again: one delete reaches both coordinators; the unknown group is reported.
        code, out, err = await cli(
            bootstrap,
            *("groups", "delete", "--group", first, "--group", second, "--group", "ghost"),
            "--json",
        )
        assert code == 1
        assert [(r["group_id"], r["deleted"], r["error"]) for r in json.loads(out)] == [
            (first, True, None),
            (second, True, None),
            ("ghost", False, "GROUP_ID_NOT_FOUND"),
        ]
        assert err == "error: 1 of 3 groups not deleted: group 'ghost' does not exist\n"
        assert await admin.committed_positions(first, ALL) == {}
        assert await admin.committed_positions(second, ALL) == {}
        code, out, _ = await cli(bootstrap, "groups", "list", "--json")
        assert {g["group_id"] for g in json.loads(out)} == {"warm-up"}
