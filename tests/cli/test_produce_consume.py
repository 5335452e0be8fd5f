"""`raftlog produce` / `raftlog consume` / `raftlog groups` against the in-process server."""

from __future__ import annotations

import json

from raftlog.client import partition_for_key
from tests.cli.conftest import Cli
from tests.cli.group_handlers import GroupState, Member

RULE = "\u2500"


async def test_produce_then_consume_from_beginning(raftlog: Cli) -> None:
    await raftlog("topics", "create", "events")
    r = await raftlog("produce", "events", input="one\ntwo\n\nthree\n")
    assert (r.exit_code, r.stdout, r.stderr) == (
        0,
        "Produced 3 records to events (partition 0: offsets 0-2)\n",
        "",
    )
    r = await raftlog("consume", "events", "--from-beginning", "-n", "3")
    assert (r.exit_code, r.stdout, r.stderr) == (
        0,
        "one\ntwo\nthree\n",
        "Consumed 3 records from events\n",
    )
    r = await raftlog("consume", "events", "--offset", "1", "-n", "1", "--json")
    record = json.loads(r.stdout)
    assert record.pop("timestamp_ms") > 0
    assert record == {
        "topic": "events",
        "partition": 0,
        "offset": 1,
        "key": None,
        "value": "two",
        "headers": {},
    }
    assert r.stderr == ""


async def test_keys_go_to_their_partition(raftlog: Cli) -> None:
    await raftlog("topics", "create", "keyed", "--partitions", "3")
    r = await raftlog("produce", "keyed", "--key-separator", ":", "--acks", "1", input="k1:a\n")
    target = partition_for_key(b"k1", 3)
    assert r.stdout == f"Produced 1 record to keyed (partition {target}: offset 0)\n"
    r = await raftlog(
        "consume",
        "keyed",
        "--partition",
        str(target),
        "--from-beginning",
        "-n",
        "1",
        "--key-separator",
        "=",
    )
    assert r.stdout == "k1=a\n"
    r = await raftlog("produce", "keyed", "--partition", "2", "--json", input="x\n")
    assert json.loads(r.stdout) == {
        "topic": "keyed",
        "records": 1,
        "partitions": {"2": {"base_offset": 0 if target != 2 else 1, "records": 1}},
    }


async def test_consume_timeout_and_idle_stop(raftlog: Cli) -> None:
    await raftlog("topics", "create", "quiet")
    r = await raftlog("consume", "quiet", "--timeout-ms", "300")
    assert (r.exit_code, r.stdout, r.stderr) == (0, "", "Consumed 0 records from quiet\n")


async def test_produce_consume_errors(raftlog: Cli) -> None:
    r = await raftlog("produce", "missing", input="a\n")
    assert (r.exit_code, r.stderr) == (1, "error: unknown topic 'missing'\n")
    await raftlog("topics", "create", "t")
    r = await raftlog("produce", "t", "--key-separator", ":", input="nokey\n")
    assert (r.exit_code, r.stderr) == (1, "error: line 'nokey' has no key separator ':'\n")
    r = await raftlog("produce", "t", "--partition", "5", input="a\n")
    assert (r.exit_code, r.stderr) == (1, "error: topic 't' has no partition 5 (it has 1)\n")
    r = await raftlog("produce", "t", "--acks", "2", input="a\n")
    assert r.exit_code == 2
    assert r.stderr.startswith("error: Invalid value for '--acks': '2' is not one of")
    r = await raftlog("consume", "t", "--from-beginning", "--offset", "3")
    assert (r.exit_code, r.stderr) == (
        2,
        "error: --from-beginning and --offset exclude each other (see 'raftlog consume --help')\n",
    )
    r = await raftlog("consume", "missing", "-n", "1")
    assert (r.exit_code, r.stderr) == (1, "error: unknown topic 'missing'\n")


async def test_consume_with_group_joins_commits_and_resumes(grouped: Cli) -> None:
    await grouped("topics", "create", "orders")
    await grouped("produce", "orders", input="a\nb\nc\n")
    r = await grouped("consume", "orders", "--group", "billing", "--from-beginning", "-n", "2")
    assert (r.exit_code, r.stdout, r.stderr) == (0, "a\nb\n", "Consumed 2 records from orders\n")
    # Committed on exit; the next member of the group starts there (not at the end).
    r = await grouped("consume", "orders", "--group", "billing", "-n", "1")
    assert (r.exit_code, r.stdout) == (0, "c\n")
    r = await grouped("consume", "orders", "--group", "billing", "--timeout-ms", "300")
    assert (r.exit_code, r.stdout, r.stderr) == (0, "", "Consumed 0 records from orders\n")

    # The members left: the group is Empty, with its offsets.
    r = await grouped("groups", "describe", "billing", "--json")
    described = json.loads(r.stdout)
    assert (described["state"], described["protocol_type"], described["members"]) == (
        "Empty",
        "consumer",
        [],
    )
    assert [(o["partition"], o["committed_offset"]) for o in described["offsets"]] == [(0, 3)]


async def test_consume_group_without_a_commit_starts_at_the_end(grouped: Cli) -> None:
    await grouped("topics", "create", "tail")
    await grouped("produce", "tail", input="old\n")
    r = await grouped("consume", "tail", "--group", "fresh", "--timeout-ms", "300", "--json")
    assert (r.exit_code, r.stdout) == (0, "")
    # The end it started at was committed, so nothing produced since is skipped.
    await grouped("produce", "tail", input="new\n")
    r = await grouped("consume", "tail", "--group", "fresh", "-n", "1", "--json")
    record = json.loads(r.stdout)
    assert (record["partition"], record["offset"], record["value"]) == (0, 1, "new")


async def test_consume_group_option_errors(grouped: Cli) -> None:
    await grouped("topics", "create", "t")
    r = await grouped("consume", "t", "--group", "g", "--partition", "0")
    assert r.exit_code == 2
    assert r.stderr.startswith("error: --offset and --partition do not combine with --group")
    r = await grouped(
        "consume",
        "t",
        "--group",
        "g",
        "--session-timeout-ms",
        "6000",
        "--heartbeat-interval-ms",
        "6000",
    )
    assert (r.exit_code, r.stderr) == (
        2,
        "error: --heartbeat-interval-ms must be below --session-timeout-ms "
        "(see 'raftlog consume --help')\n",
    )
    r = await grouped("consume", "missing", "--group", "g", "-n", "1")
    assert (r.exit_code, r.stderr) == (1, "error: unknown topic 'missing'\n")
    # The coordinator refuses sessions below its minimum (6 s by default).
    r = await grouped(
        "consume",
        "t",
        "--group",
        "g",
        "--session-timeout-ms",
        "1000",
        "--heartbeat-interval-ms",
        "100",
    )
    assert (r.exit_code, r.stderr) == (1, "error: cannot join group 'g': INVALID_SESSION_TIMEOUT\n")


async def test_groups_describe_members_and_lag(raftlog: Cli) -> None:
    await raftlog("topics", "create", "clicks", "--partitions", "2")
    await raftlog("produce", "clicks", "--partition", "0", input="a\nb\nc\nd\n")
    raftlog.groups.groups["web"] = GroupState(
        state="Stable",
        protocol="range",
        members=[Member("m-1", "app", "/10.0.0.7", [("clicks", 0), ("clicks", 1)])],
    )
    raftlog.groups.offsets[("web", "clicks", 0)] = 1
    r = await raftlog("groups", "describe", "web", "--json")
    assert json.loads(r.stdout) == {
        "group_id": "web",
        "state": "Stable",
        "protocol_type": "consumer",
        "protocol": "range",
        "coordinator_id": 1,
        "members": [
            {
                "member_id": "m-1",
                "client_id": "app",
                "client_host": "/10.0.0.7",
                "assignment": [["clicks", 0], ["clicks", 1]],
            }
        ],
        "offsets": [
            {
                "topic": "clicks",
                "partition": 0,
                "committed_offset": 1,
                "high_watermark": 4,
                "lag": 3,
            }
        ],
    }
    r = await raftlog("groups", "describe", "web")
    assert r.stdout == (
        "Group: web  state: Stable  coordinator: 1  members: 1\n"
        "Members:\n"
        "MEMBER   CLIENT-ID   HOST        ASSIGNMENT\n" + RULE * 50 + "\n"
        "m-1      app         /10.0.0.7   clicks-0,clicks-1\n"
        "Offsets:\n"
        "TOPIC    PARTITION   COMMITTED   HW   LAG\n" + RULE * 41 + "\n"
        "clicks   0           1           4    3\n"
    )

    r = await raftlog("groups", "describe", "ghost")
    assert (r.exit_code, r.stderr) == (1, "error: unknown consumer group 'ghost'\n")


async def test_groups_unsupported_by_server(nursery, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.cli.conftest import invoke
    from tests.kafka.conftest import start_broker

    broker = await start_broker(nursery, tmp_path)
    try:
        r = await invoke(["groups", "list", "--bootstrap-server", broker.bootstrap])
    finally:
        broker.backend.close()
    assert r.exit_code == 1
    assert r.stderr == (
        "error: the cluster does not support this operation "
        f"(broker 127.0.0.1:{broker.port} does not serve list_groups)\n"
    )
