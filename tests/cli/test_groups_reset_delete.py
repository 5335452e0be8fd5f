"""`raftlog groups reset-offsets` and `raftlog groups delete` against a broker with the real
group coordinator (the `grouped` fixture: InProcessGroupService on the wire, topic "t" with
4 partitions). Offsets are read back through GroupAdmin.committed_positions (OffsetFetch) and
`groups describe --json`; an active member is the project's own GroupMember, joined in the
test's trio loop while the CLI runs in its worker thread.

Partitions 0-2 hold 10 records stamped 2024-03-01T12:00:00Z + i seconds; partition 3 holds
10 records stamped now - (10 - i) hours, so --by-duration has something recent to find.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import trio

from raftlog.client import Cluster, open_cluster
from raftlog.client.consumer_protocol import TopicPartition
from raftlog.client.group_member import GroupMember
from raftlog.client.groups import GroupAdmin, GroupDescription
from raftlog.client.member_state import MemberConfig
from raftlog.client.producer import Producer
from raftlog.records import Record
from tests.cli.conftest import Cli

TOPIC = "t"
GROUP = "billing"
PARTITIONS = 4
RECORDS = 10
# 2024-03-01T12:00:00Z: partitions 0-2 have a record at this time + i seconds.
BASE_MS = 1_709_294_400_000
HOUR_MS = 3_600_000
STEP_DEADLINE_S = 30
ALL = [(TOPIC, p) for p in range(PARTITIONS)]


@dataclass
class Setup:
    cli: Cli
    cluster: Cluster
    admin: GroupAdmin

    async def committed(self, group: str = GROUP) -> dict[tuple[str, int], int]:
        return await self.admin.committed_positions(group, ALL)


@pytest.fixture
async def setup(grouped: Cli) -> AsyncIterator[Setup]:
    async with open_cluster(grouped.broker.bootstrap) as cluster:
        producer = Producer(cluster)
        now_ms = int(time.time() * 1000)
        for p in range(PARTITIONS):
            for i in range(RECORDS):
                stamp = now_ms - (RECORDS - i) * HOUR_MS if p == 3 else BASE_MS + i * 1000
                # One record a batch, so a time look-up lands on that record.
                record = Record(timestamp_ms=stamp, value=f"{p}-{i}".encode())
                await producer.produce(TOPIC, [record], partition=p)
        admin = GroupAdmin(cluster)
        await admin.commit_offsets(GROUP, dict.fromkeys(ALL, 5))
        yield Setup(grouped, cluster, admin)


async def reset(s: Setup, *args: str) -> tuple[int, str, str]:
    r = await s.cli("groups", "reset-offsets", "--group", GROUP, *args)
    return r.exit_code, r.stdout, r.stderr


async def test_dry_run_prints_the_plan_and_commits_nothing(setup: Setup) -> None:
    code, out, err = await reset(setup, "--topic", "t:0,2", "--to-earliest")
    assert (code, err) == (0, "")
    assert out == (
        "GROUP     TOPIC   PARTITION   PREVIOUS-OFFSET   NEW-OFFSET\n" + "─" * 58 + "\n"
        "billing   t       0           5                 0\n"
        "billing   t       2           5                 0\n"
        "Dry run: nothing was committed (add --execute to commit these offsets).\n"
    )
    code, out, _ = await reset(setup, "--all-topics", "--to-latest", "--dry-run", "--json")
    assert code == 0
    assert json.loads(out) == {
        "group": GROUP,
        "executed": False,
        "offsets": [
            {
                "group": GROUP,
                "topic": TOPIC,
                "partition": p,
                "previous_offset": 5,
                "new_offset": RECORDS,
            }
            for p in range(PARTITIONS)
        ],
    }
    assert await setup.committed() == dict.fromkeys(ALL, 5)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--to-earliest"], [0, 0, 0, 0]),
        (["--to-latest"], [10, 10, 10, 10]),
        (["--to-offset", "3"], [3, 3, 3, 3]),
        # Past the high watermark: clamped to it.
        (["--to-offset", "99"], [10, 10, 10, 10]),
        (["--shift-by", "-2"], [3, 3, 3, 3]),
        (["--shift-by", "-100"], [0, 0, 0, 0]),
        (["--shift-by", "4"], [9, 9, 9, 9]),
        (["--shift-by", "100"], [10, 10, 10, 10]),
        (["--to-current"], [5, 5, 5, 5]),
        # 2024-03-01T12:00:03Z is record 3 of partitions 0-2; partition 3's are all later.
        (["--to-datetime", "2024-03-01T12:00:03Z"], [3, 3, 3, 0]),
        (["--to-datetime", "2024-03-01T14:00:02.500+02:00"], [3, 3, 3, 0]),
        (["--to-datetime", "2024-03-01T07:00:00-05:00"], [0, 0, 0, 0]),
        # Nothing that recent anywhere: the high watermark.
        (["--to-datetime", "2999-01-01T00:00:00Z"], [10, 10, 10, 10]),
        # now - 5h30m: partition 3's record 5 (now - 5h); the 2024 records are all older.
        (["--by-duration", "PT5H30M"], [10, 10, 10, 5]),
        (["--by-duration", "P36500D"], [0, 0, 0, 0]),
    ],
)
async def test_each_spec_executes_to_its_offsets(
    setup: Setup, args: list[str], expected: list[int]
) -> None:
    code, out, err = await reset(setup, "--all-topics", *args, "--execute", "--json")
    assert (code, err) == (0, "")
    shown = json.loads(out)
    assert shown["executed"] is True
    assert [o["new_offset"] for o in shown["offsets"]] == expected
    assert await setup.committed() == dict(zip(ALL, expected, strict=True))


async def test_topic_scope_and_all_topics_scope(setup: Setup) -> None:
    code, out, _ = await reset(
        setup, "--topic", "t:1", "--topic", "t:3", "--to-offset", "7", "--execute"
    )
    assert code == 0
    assert "Dry run" not in out
    assert await setup.committed() == {(TOPIC, 0): 5, (TOPIC, 1): 7, (TOPIC, 2): 5, (TOPIC, 3): 7}
    # --all-topics is what the group has committed: only partitions 0 and 1 of "other".
    await setup.cli("topics", "create", "other", "--partitions", "3")
    await setup.admin.commit_offsets("sparse", {("other", 0): 0, ("other", 1): 0})
    r = await setup.cli(
        "groups", "reset-offsets", "--group", "sparse", "--all-topics", "--to-latest", "--json"
    )
    assert [(o["topic"], o["partition"]) for o in json.loads(r.stdout)["offsets"]] == [
        ("other", 0),
        ("other", 1),
    ]


async def test_describe_shows_the_reset(setup: Setup) -> None:
    await reset(setup, "--topic", "t", "--to-offset", "2", "--execute")
    r = await setup.cli("groups", "describe", GROUP, "--json")
    described = json.loads(r.stdout)
    assert described["state"] == "Empty"
    assert [(o["partition"], o["committed_offset"], o["lag"]) for o in described["offsets"]] == [
        (p, 2, 8) for p in range(PARTITIONS)
    ]


async def test_shift_by_without_a_committed_offset_is_refused(setup: Setup) -> None:
    await setup.cli("topics", "create", "fresh", "--partitions", "2")
    await setup.admin.commit_offsets("half", {("fresh", 0): 0})
    r = await setup.cli(
        "groups",
        "reset-offsets",
        "--group",
        "half",
        "--topic",
        "fresh",
        "--shift-by",
        "1",
        "--execute",
    )
    assert r.exit_code == 1
    assert r.stderr == (
        "error: --shift-by needs a committed offset, and fresh-1 has none (reset it with "
        "--to-earliest, --to-latest or --to-offset first)\n"
    )
    assert await setup.admin.committed_positions("half", [("fresh", 0), ("fresh", 1)]) == {
        ("fresh", 0): 0
    }
    # --to-current goes to the end where nothing is committed (empty "fresh": 0).
    r = await setup.cli(
        "groups", "reset-offsets", "--group", "half", "--topic", "fresh", "--to-current", "--json"
    )
    assert [o["previous_offset"] for o in json.loads(r.stdout)["offsets"]] == [0, None]


async def test_unknown_topic_or_partition_is_refused(setup: Setup) -> None:
    code, _, err = await reset(setup, "--topic", "nope", "--to-earliest", "--execute")
    assert (code, err) == (1, "error: unknown topic 'nope'\n")
    code, _, err = await reset(setup, "--topic", "t:0,4", "--to-earliest", "--execute")
    assert (code, err) == (1, "error: topic 't' has no partition 4 (it has 4)\n")
    assert await setup.committed() == dict.fromkeys(ALL, 5)


class Idle:
    async def on_partitions_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        pass

    async def on_partitions_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        pass


async def test_active_member_blocks_reset_and_delete(setup: Setup) -> None:
    config = MemberConfig(session_timeout_ms=10_000, heartbeat_interval_ms=200)
    member = GroupMember(setup.cluster, GROUP, [TOPIC], Idle(), config)
    with trio.fail_after(STEP_DEADLINE_S):
        async with member.joined():
            code, out, err = await reset(setup, "--all-topics", "--to-earliest", "--execute")
            assert (code, out) == (1, "")
            assert err == (
                "error: Assignments can only be reset if the group 'billing' is inactive, "
                "but the current state is Stable.\n"
            )
            r = await setup.cli("groups", "delete", "--group", GROUP)
            assert r.exit_code == 1
            assert "not empty: it has active members (stop them first)" in r.stdout
            assert r.stderr == (
                "error: 1 of 1 groups not deleted: group 'billing' is not empty: it has active "
                "members (stop them first)\n"
            )
    # The member committed nothing of its own: the offsets are still 5.
    assert await setup.committed() == dict.fromkeys(ALL, 5)
    # Once it has left, the group is Empty and both work.
    code, _, err = await reset(setup, "--all-topics", "--to-earliest", "--execute")
    assert (code, err) == (0, "")
    r = await setup.cli("groups", "delete", "--group", GROUP)
    assert (r.exit_code, r.stderr) == (0, "")


async def test_delete_empty_and_unknown_groups(setup: Setup) -> None:
    await setup.admin.commit_offsets("second", {(TOPIC, 0): 1})
    r = await setup.cli("groups", "delete", "--group", GROUP, "--group", "second")
    assert (r.exit_code, r.stderr) == (0, "")
    assert r.stdout == (
        "GROUP     RESULT\n" + "─" * 17 + "\nbilling   deleted\nsecond    deleted\n"
    )
    # The offsets went with the group.
    assert await setup.committed() == {}
    r = await setup.cli("groups", "describe", GROUP)
    assert (r.exit_code, r.stderr) == (1, "error: unknown consumer group 'billing'\n")
    r = await setup.cli("groups", "list", "--json")
    assert json.loads(r.stdout) == []

    await setup.admin.commit_offsets("third", {(TOPIC, 0): 1})
    r = await setup.cli("groups", "delete", "--group", "ghost", "--group", "third", "--json")
    assert r.exit_code == 1
    assert json.loads(r.stdout) == [
        {
            "group_id": "ghost",
            "deleted": False,
            "error": "GROUP_ID_NOT_FOUND",
            "result": "group 'ghost' does not exist",
        },
        {"group_id": "third", "deleted": True, "error": None, "result": "deleted"},
    ]
    assert r.stderr == "error: 1 of 2 groups not deleted: group 'ghost' does not exist\n"
    r = await setup.cli("groups", "delete", "--group", "third")
    assert (r.exit_code, r.stderr) == (
        1,
        "error: 1 of 1 groups not deleted: group 'third' does not exist\n",
    )


async def test_delete_groups_api(setup: Setup) -> None:
    results = await setup.admin.delete_groups(["ghost", GROUP, GROUP])
    assert {g: code.name for g, code in results.items()} == {
        "ghost": "group_id_not_found",
        GROUP: "none",
    }


async def test_member_joining_after_the_state_check_commits_nothing(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state is read, then a member joins before the commit: the coordinator refuses the
    standalone commit, and the command says so (the stale read is made by reporting Empty)."""
    real_describe = GroupAdmin.describe_group

    async def stale_describe(self: GroupAdmin, group_id: str) -> GroupDescription:
        described = await real_describe(self, group_id)
        return dataclasses.replace(described, state="Empty", members=())

    monkeypatch.setattr(GroupAdmin, "describe_group", stale_describe)
    config = MemberConfig(session_timeout_ms=10_000, heartbeat_interval_ms=200)
    member = GroupMember(setup.cluster, GROUP, [TOPIC], Idle(), config)
    with trio.fail_after(STEP_DEADLINE_S):
        async with member.joined():
            code, out, err = await reset(setup, "--all-topics", "--to-earliest", "--execute")
            assert (code, out) == (1, "")
            assert err == (
                "error: Assignments can only be reset if the group 'billing' is inactive, but "
                "a member joined while resetting; nothing was committed.\n"
            )
            assert await setup.committed() == dict.fromkeys(ALL, 5)
