"""`raftlog transactions ...` against three real node processes, with the transactions of
tests/client/test_admin_txn_processes.py (committed, aborted, and one hanging because its
producer was killed): list/describe/describe-producers show them, errors are one line with
exit code 1 (2 for usage), and `abort --start-offset` ends the hanging transaction so a
read_committed reader gets past it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from click.testing import CliRunner, Result
from raftlog_cli.main import cli

from raftlog.client import Consumer, IsolationLevel, open_cluster
from raftlog.testing.cluster import ProcessCluster
from tests.client.test_admin_txn_processes import (
    ABORTER,
    COMMITTER,
    CONDITION_DEADLINE_S,
    HANGER,
    TOPIC,
    Scenario,
    make_transactions,
)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    root = tmp_path_factory.mktemp("txn-cli")
    with ProcessCluster(root / "cluster", 3) as cluster:
        yield make_transactions(cluster, root)


def run(scenario: Scenario, *args: str) -> Result:
    argv = ["transactions", *args, "--bootstrap-server", scenario.bootstrap]
    return CliRunner().invoke(cli, argv, catch_exceptions=False, prog_name="raftlog")


def run_json(scenario: Scenario, *args: str) -> Any:
    result = run(scenario, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _committed_values(bootstrap: str) -> list[bytes | None]:
    async def read() -> list[bytes | None]:
        async with open_cluster(bootstrap) as cluster:
            consumer = Consumer(cluster, isolation_level=IsolationLevel.READ_COMMITTED)
            return [r.value for r in await consumer.fetch_range(TOPIC, 0, 0)]

    return trio.run(read)


def test_list_and_describe(scenario: Scenario) -> None:
    listed = {t["transactional_id"]: t for t in run_json(scenario, "list")}
    assert {k: listed[k]["state"] for k in (COMMITTER, ABORTER, HANGER)} == {
        COMMITTER: "CompleteCommit",
        ABORTER: "CompleteAbort",
        HANGER: "Ongoing",
    }
    table = run(scenario, "list")
    assert table.exit_code == 0
    lines = table.output.splitlines()
    assert lines[0].split() == ["TRANSACTIONAL", "ID", "COORDINATOR", "PRODUCER", "ID", "STATE"]
    hanger_line = next(line for line in lines if line.startswith(HANGER))
    assert hanger_line.split() == [
        HANGER,
        str(listed[HANGER]["coordinator_id"]),
        str(listed[HANGER]["producer_id"]),
        "Ongoing",
    ]

    (described,) = run_json(scenario, "describe", "--transactional-id", HANGER)
    assert described["state"] == "Ongoing"
    assert described["producer_id"] == listed[HANGER]["producer_id"]
    assert described["coordinator_id"] == listed[HANGER]["coordinator_id"]
    assert described["topic_partitions"] == [f"{TOPIC}-0"]
    assert described["transaction_duration_ms"] >= 0
    text = run(scenario, "describe", "--transactional-id", HANGER)
    assert text.exit_code == 0 and f"{TOPIC}-0" in text.output and "Ongoing" in text.output

    unknown = run(scenario, "describe", "--transactional-id", "nobody")
    assert unknown.exit_code == 1
    assert unknown.output == "error: unknown transactional id 'nobody'\n"
    missing = run(scenario, "describe")
    assert missing.exit_code == 2 and "--transactional-id" in missing.output


def test_describe_producers_and_abort(scenario: Scenario) -> None:
    listed = {t["transactional_id"]: t for t in run_json(scenario, "list")}
    producers = run_json(scenario, "describe-producers", "--topic", TOPIC, "--partition", "0")
    by_id = {p["producer_id"]: p for p in producers}
    hanger = by_id[listed[HANGER]["producer_id"]]
    start = hanger["current_transaction_start_offset"]
    assert start == 7
    assert by_id[listed[COMMITTER]["producer_id"]]["current_transaction_start_offset"] is None
    table = run(scenario, "describe-producers", "--topic", TOPIC, "--partition", "0")
    assert table.exit_code == 0
    assert table.output.splitlines()[0].split()[:2] == ["PRODUCER", "ID"]

    unknown = run(scenario, "describe-producers", "--topic", "no-such-topic", "--partition", "0")
    assert unknown.exit_code == 1
    assert unknown.output.startswith("error: unknown topic or partition")

    both = run(
        scenario, "abort", "--topic", TOPIC, "--partition", "0", "--start-offset", "7",
        "--producer-id", "1",
    )  # fmt: skip
    assert both.exit_code == 2 and "not both" in both.output
    partial = run(scenario, "abort", "--topic", TOPIC, "--partition", "0", "--producer-id", "1")
    assert partial.exit_code == 2 and "--coordinator-epoch" in partial.output
    negative = run(scenario, "abort", "--topic", TOPIC, "--partition", "-1", "--start-offset", "7")
    assert negative.exit_code == 2
    nothing = run(scenario, "abort", "--topic", TOPIC, "--partition", "0", "--start-offset", "6")
    assert nothing.exit_code == 1
    assert nothing.output.startswith("error: no open transaction starts at offset 6 of txns-0")

    assert _committed_values(scenario.bootstrap) == [b"c0", b"c1", b"c2"]
    aborted = run(scenario, "abort", "--topic", TOPIC, "--partition", "0", "--start-offset", "7")
    assert aborted.exit_code == 0, aborted.output
    assert aborted.output == (
        f"Aborted the transaction of producer {hanger['producer_id']} "
        f"(epoch {hanger['producer_epoch']}, coordinator epoch "
        f"{hanger['coordinator_epoch'] or 0}) on {TOPIC}-0\n"
    )
    scenario.cluster.wait_for(
        lambda: _committed_values(scenario.bootstrap) == [b"c0", b"c1", b"c2", b"c3"],
        "read_committed to read past the aborted transaction",
        CONDITION_DEADLINE_S,
    )
    after = run_json(scenario, "describe-producers", "--topic", TOPIC, "--partition", "0")
    assert all(p["current_transaction_start_offset"] is None for p in after)


def test_consume_at_each_isolation_level(scenario: Scenario) -> None:
    """`raftlog consume --isolation-level`: read_committed prints only committed records (the
    hanging transaction was aborted by the test before); read_uncommitted every data record,
    aborted ones included; transaction markers are never printed."""

    def values(level: str) -> list[str]:
        argv = [
            "consume", TOPIC, "--from-beginning", "--partition", "0", "--timeout-ms", "2000",
            "--isolation-level", level, "--json", "--bootstrap-server", scenario.bootstrap,
        ]  # fmt: skip
        result = CliRunner().invoke(cli, argv, catch_exceptions=False, prog_name="raftlog")
        assert result.exit_code == 0, result.output
        return [json.loads(line)["value"] for line in result.output.splitlines() if line]

    assert values("read_committed") == ["c0", "c1", "c2", "c3"]
    assert values("read_uncommitted") == ["c0", "c1", "c2", "a0", "a1", "h0", "c3"]
    bad = CliRunner().invoke(
        cli, ["consume", TOPIC, "--isolation-level", "serializable"], prog_name="raftlog"
    )
    assert bad.exit_code == 2
