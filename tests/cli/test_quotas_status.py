"""`raftlog quotas ...` and `raftlog cluster status` against the in-process server."""

from __future__ import annotations

import functools
import json

import pytest
import trio

from raftlog.net.rpc import serve_rpc
from tests.cli.conftest import Cli

RULE = "\u2500"


async def test_quotas_alter_describe_delete(raftlog: Cli) -> None:
    r = await raftlog(
        "quotas",
        "alter",
        "--user",
        "alice",
        "--producer-byte-rate",
        "1024",
        "--consumer-byte-rate",
        "2048",
    )
    assert (r.exit_code, r.stdout, r.stderr) == (
        0,
        "Updated quotas of /config/users/alice: producer_byte_rate=1024, consumer_byte_rate=2048\n",
        "",
    )
    r = await raftlog("quotas", "alter", "--default-client", "--request-percentage", "50")
    assert r.stdout == "Updated quotas of /config/clients/<default>: request_percentage=50\n"
    r = await raftlog(
        "quotas",
        "alter",
        "--user",
        "bob",
        "--client-id",
        "etl",
        "--controller-mutation-rate",
        "2.5",
    )
    assert r.exit_code == 0

    r = await raftlog("quotas", "describe")
    rows = [
        ("ENTITY", "KEY", "VALUE"),
        ("/config/clients/<default>", "request_percentage", "50"),
        ("/config/users/alice", "consumer_byte_rate", "2048"),
        ("/config/users/alice", "producer_byte_rate", "1024"),
        ("/config/users/bob/clients/etl", "controller_mutation_rate", "2.5"),
    ]
    lines = [f"{a:<32}{b:<27}{c}" for a, b, c in rows]
    lines.insert(1, RULE * 64)
    assert r.stdout == "\n".join(lines) + "\n"
    r = await raftlog("quotas", "describe", "--user", "alice", "--json")
    assert json.loads(r.stdout) == [
        {
            "entity": "/config/users/alice",
            "components": {"user": "alice"},
            "quotas": {"consumer_byte_rate": 2048, "producer_byte_rate": 1024},
        }
    ]

    r = await raftlog("quotas", "delete", "--user", "alice", "--key", "producer-byte-rate")
    assert (r.exit_code, r.stdout) == (0, "Removed producer_byte_rate from /config/users/alice\n")
    r = await raftlog("quotas", "describe", "--user", "alice", "--json")
    assert json.loads(r.stdout)[0]["quotas"] == {"consumer_byte_rate": 2048}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--producer-byte-rate", "-5"], "producer_byte_rate must not be negative, got '-5'"),
        (["--consumer-byte-rate", "fast"], "consumer_byte_rate must be a number, got 'fast'"),
        (
            ["--producer-byte-rate", "1.5"],
            "producer_byte_rate must be a whole number of bytes/s, got '1.5'",
        ),
        (
            ["--request-percentage", "0"],
            "request_percentage must be positive (remove the key to lift the quota)",
        ),
    ],
)
async def test_quota_values_refused(raftlog: Cli, args: list[str], message: str) -> None:
    r = await raftlog("quotas", "alter", "--client-id", "c", *args)
    assert (r.exit_code, r.stdout, r.stderr) == (1, "", f"error: {message}\n")


async def test_quota_arguments_refused(raftlog: Cli) -> None:
    r = await raftlog("quotas", "delete", "--user", "a", "--key", "bogus")
    assert (r.exit_code, r.stderr) == (
        1,
        "error: unknown quota key 'bogus'; expected one of ['producer_byte_rate', "
        "'consumer_byte_rate', 'request_percentage', 'controller_mutation_rate']\n",
    )
    r = await raftlog("quotas", "alter", "--producer-byte-rate", "10")
    assert r.exit_code == 2
    assert r.stderr == (
        "error: name an entity: --user, --client-id, --default-user or --default-client "
        "(see 'raftlog quotas alter --help')\n"
    )
    r = await raftlog("quotas", "alter", "--user", "a")
    assert r.exit_code == 2
    assert r.stderr.startswith("error: give at least one quota value")
    r = await raftlog(
        "quotas", "alter", "--user", "a", "--default-user", "--producer-byte-rate", "1"
    )
    assert (r.exit_code, r.stderr) == (
        2,
        "error: --user and --default-user exclude each other (see 'raftlog quotas alter --help')\n",
    )


async def test_status_of_a_healthy_single_broker(raftlog: Cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    await raftlog("topics", "create", "t", "--partitions", "2")
    r = await raftlog("cluster", "status", "--dir", str(tmp_path / "none"))
    port = raftlog.broker.port
    assert (r.exit_code, r.stderr) == (0, "")
    assert r.stdout == (
        "Cluster raftlog-test-cluster: healthy\n"
        "Quorum: leader 1  epoch 3  high watermark 42\n"
        "NODE   PROCESS   VOTER LAG   BROKER     ADDRESS\n" + RULE * (50 + len(str(port))) + "\n"
        f"1      -         0           unfenced   127.0.0.1:{port}\n"
        "Partitions: 2 total, 0 under-replicated, 0 offline\n"
    )
    r = await raftlog("cluster", "status", "--json", "--dir", str(tmp_path / "none"))
    status = json.loads(r.stdout)
    assert status["healthy"] is True
    assert status["nodes"] == [
        {
            "node_id": 1,
            "process": "-",
            "voter": True,
            "voter_lag": 0,
            "broker": "unfenced",
            "address": f"127.0.0.1:{port}",
        }
    ]


async def test_status_degraded_exit_code(raftlog: Cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from raftlog.net.kafka.backend import PartitionInfo, TopicInfo

    await raftlog("topics", "create", "t")
    backend = raftlog.broker.backend
    original = backend._info

    def degraded(name: str) -> TopicInfo:
        info = original(name)
        # Replicas 1 and 2 but only 1 in sync: under-replicated; broker 2 is not registered.
        return TopicInfo(info.name, info.topic_id, [PartitionInfo(0, 1, 0, [1, 2], [1])])

    backend._info = degraded  # type: ignore[method-assign]
    r = await raftlog("cluster", "status", "--dir", str(tmp_path / "none"))
    assert r.exit_code == 1
    lines = r.stdout.splitlines()
    assert lines[0] == "Cluster raftlog-test-cluster: DEGRADED"
    assert lines[-2:] == [
        "Partitions: 1 total, 1 under-replicated, 0 offline",
        "  under-replicated: t-0 (replica 2: broker fenced)",
    ]


async def test_status_says_why_a_partition_is_offline(raftlog: Cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from raftlog.net.kafka.backend import PartitionInfo, TopicInfo

    await raftlog("topics", "create", "t")
    backend = raftlog.broker.backend
    original = backend._info

    def offline(name: str) -> TopicInfo:
        info = original(name)
        # No leader: broker 1's own replica lost records (it says so in offline_replicas),
        # broker 2 is not registered.
        return TopicInfo(info.name, info.topic_id, [PartitionInfo(0, -1, 0, [1, 2], [1], [1])])

    backend._info = offline  # type: ignore[method-assign]
    r = await raftlog("cluster", "status", "--dir", str(tmp_path / "none"))
    assert r.exit_code == 1
    assert r.stdout.splitlines()[-2:] == [
        "Partitions: 1 total, 0 under-replicated, 1 offline",
        "  offline: t-0 (replica 1: unsafe (lost or damaged records, or a failed disk; "
        "repairing from the leader); replica 2: broker fenced)",
    ]
    r = await raftlog("cluster", "status", "--json", "--dir", str(tmp_path / "none"))
    assert json.loads(r.stdout)["reasons"]["t-0"].startswith("replica 1: unsafe")


async def test_quota_usage_needs_internal_listeners(raftlog: Cli, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # no .raftlog here
    r = await raftlog("quotas", "describe", "--usage")
    assert (r.exit_code, r.stderr) == (
        1,
        "error: --usage needs the nodes' internal listeners: pass --internal-servers "
        "ID@HOST:PORT,... (no local cluster in .raftlog)\n",
    )
    r = await raftlog("quotas", "describe", "--usage", "--internal-servers", "nonsense")
    assert r.exit_code == 1
    assert r.stderr.startswith("error: --internal-servers: controller_quorum_voters: expected")


async def test_quota_usage_from_internal_listeners(raftlog: Cli) -> None:
    async def handler(sender_id, method, body):
        assert method == "quotas.usage"
        return [
            [
                "producer_byte_rate",
                "ANONYMOUS",
                "greedy",
                [["client-id", "greedy"]],
                1048576.0,
                1100000.25,
                1234,
            ]
        ]

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(serve_rpc, handler, "127.0.0.1", 0))
        port = listeners[0].socket.getsockname()[1]
        r = await raftlog(
            "quotas", "describe", "--usage", "--internal-servers", f"7@127.0.0.1:{port}"
        )
        nursery.cancel_scope.cancel()
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == [
        "NODE",
        "ENTITY",
        "KEY",
        "CLIENT",
        "ID",
        "QUOTA",
        "RATE",
        "THROTTLED",
        "MS",
    ]
    assert lines[2].split() == [
        "7",
        "/config/clients/greedy",
        "producer_byte_rate",
        "greedy",
        "1048576",
        "1100000.2",
        "1234",
    ]
