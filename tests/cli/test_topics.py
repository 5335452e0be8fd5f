"""`raftlog topics ...` against the in-process Kafka server: exact output."""

from __future__ import annotations

import json

from tests.cli.conftest import Cli

RULE = "\u2500"


async def test_create_list_describe_alter_add_delete(raftlog: Cli) -> None:
    r = await raftlog(
        "topics", "create", "events", "--partitions", "2", "--config", "retention.ms=1000"
    )
    assert (r.exit_code, r.stdout, r.stderr) == (
        0,
        "Created topic events (2 partitions, replication factor 1)\n",
        "",
    )

    r = await raftlog("topics", "list")
    assert r.exit_code == 0
    assert r.stdout == (
        "TOPIC    PARTITIONS   REPLICATION\n" + RULE * 33 + "\n" + "events   2            1\n"
    )

    r = await raftlog("topics", "list", "--json")
    assert json.loads(r.stdout) == [{"name": "events", "partitions": 2, "replication_factor": 1}]

    r = await raftlog("produce", "events", "--partition", "1", input="x\ny\n")
    assert r.stdout == "Produced 2 records to events (partition 1: offsets 0-1)\n"

    r = await raftlog("topics", "describe", "events")
    assert r.exit_code == 0
    assert r.stdout == (
        "Topic: events  partitions: 2  replication factor: 1\n"
        "Configs: cleanup.policy=delete, retention.ms=1000\n"
        "PARTITION   LEADER   EPOCH   REPLICAS   ISR   HW   LEO\n" + RULE * 54 + "\n"
        "0           1        0       1          1     0    0\n"
        "1           1        0       1          1     2    2\n"
    )

    r = await raftlog("topics", "describe", "events", "--json")
    described = json.loads(r.stdout)
    assert described["partitions"][1] == {
        "partition": 1,
        "leader": 1,
        "leader_epoch": 0,
        "replicas": [1],
        "isr": [1],
        "high_watermark": 2,
        "log_end_offset": 2,
    }

    r = await raftlog("topics", "alter", "events", "--config", "retention.ms=5000")
    assert (r.exit_code, r.stdout) == (0, "Updated topic events: retention.ms=5000\n")
    r = await raftlog("topics", "describe", "events", "--json")
    assert json.loads(r.stdout)["configs"]["retention.ms"] == "5000"

    r = await raftlog("topics", "add-partitions", "events", "--total", "4")
    assert (r.exit_code, r.stdout) == (0, "Topic events now has 4 partitions\n")

    r = await raftlog("topics", "delete", "events")
    assert (r.exit_code, r.stdout) == (0, "Deleted topic events\n")
    r = await raftlog("topics", "list")
    assert (r.exit_code, r.stdout) == (0, "(no topics)\n")


async def test_topic_errors_are_one_line(raftlog: Cli) -> None:
    r = await raftlog("topics", "describe", "nope")
    assert (r.exit_code, r.stdout, r.stderr) == (1, "", "error: unknown topic 'nope'\n")

    r = await raftlog("topics", "delete", "nope")
    assert (r.exit_code, r.stderr) == (1, "error: unknown topic 'nope'\n")

    r = await raftlog("topics", "alter", "nope", "--config", "a=b")
    assert (r.exit_code, r.stderr) == (1, "error: unknown topic 'nope'\n")

    await raftlog("topics", "create", "t")
    r = await raftlog("topics", "create", "t")
    assert (r.exit_code, r.stderr) == (1, "error: topic already exists: topic 't'\n")

    r = await raftlog("topics", "add-partitions", "t", "--total", "1")
    assert r.exit_code == 1
    assert r.stderr == ("error: invalid number of partitions: topic 't' (topic has 1 partitions)\n")


async def test_bad_arguments(raftlog: Cli) -> None:
    r = await raftlog("topics", "create", "t", "--partitions", "0")
    assert r.exit_code == 2
    assert r.stderr == (
        "error: Invalid value for '--partitions': 0 is not in the range x>=1. "
        "(see 'raftlog topics create --help')\n"
    )
    r = await raftlog("topics", "create", "t", "--config", "novalue")
    assert (r.exit_code, r.stderr) == (
        2,
        "error: Invalid value for --config: expected KEY=VALUE, got 'novalue' "
        "(see 'raftlog topics create --help')\n",
    )
    r = await raftlog("topics", "alter", "t")
    assert r.exit_code == 2
    assert r.stderr.startswith("error: nothing to change")
    assert r.stderr.count("\n") == 1


async def test_cluster_not_running() -> None:
    from tests.cli.conftest import invoke

    # Port 1 on loopback: nothing listens there, so the connection is refused at once.
    r = await invoke(["topics", "list", "--bootstrap-server", "127.0.0.1:1"])
    assert (r.exit_code, r.stdout) == (1, "")
    assert r.stderr == (
        "error: cannot reach the cluster at 127.0.0.1:1: is it running? "
        "(start one: raftlog cluster up)\n"
    )
