"""`raftlog topics reassign` and `elect-leaders`: plans in kafka-reassign-partitions.sh's
format are checked before anything is sent, with an error that names the entry; bad flag
combinations are usage errors; generated plans keep each partition's replication factor and
spread replicas over racks. (The commands against a real cluster:
tests/integration/test_reassignment_processes.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from raftlog_cli.main import cli
from raftlog_cli.reassign import generate_plan

from raftlog.client.admin_reassign import (
    MAX_PLAN_PARTITIONS,
    PlanError,
    parse_plan,
    parse_topics_to_move,
    plan_json,
)

# Nothing listens there: every case below must fail before connecting.
NOWHERE = "127.0.0.1:1"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [*args, "--bootstrap-server", NOWHERE], prog_name="raftlog")
    return result.exit_code, result.output


def plan(*entries: dict) -> str:
    return json.dumps({"version": 1, "partitions": list(entries)})


def test_a_plan_round_trips_in_kafkas_format() -> None:
    text = plan(
        {"topic": "a", "partition": 1, "replicas": [3, 1], "log_dirs": ["any", "any"]},
        {"topic": "a", "partition": 0, "replicas": None},
    )
    parsed = parse_plan(text)
    assert parsed == {("a", 1): (3, 1), ("a", 0): None}
    assert parse_plan(plan_json(parsed)) == parsed
    assert json.loads(plan_json(parsed))["partitions"][1] == {
        "topic": "a",
        "partition": 1,
        "replicas": [3, 1],
        "log_dirs": ["any", "any"],
    }


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("not json", "not JSON"),
        ("[]", "JSON object"),
        (json.dumps({"version": 2, "partitions": []}), "version 2"),
        (json.dumps({"version": 1}), '"partitions"'),
        (plan({"topic": "", "partition": 0, "replicas": [1]}), '"topic"'),
        (plan({"topic": "a" * 250, "partition": 0, "replicas": [1]}), '"topic"'),
        (plan({"topic": "a", "partition": -1, "replicas": [1]}), '"partition"'),
        (plan({"topic": "a", "partition": 2**31, "replicas": [1]}), '"partition"'),
        (plan({"topic": "a", "partition": True, "replicas": [1]}), '"partition"'),
        (plan({"topic": "a", "partition": 0}), '"replicas" is missing'),
        (plan({"topic": "a", "partition": 0, "replicas": []}), "non-empty"),
        (plan({"topic": "a", "partition": 0, "replicas": [1, -2]}), "broker ids"),
        (plan({"topic": "a", "partition": 0, "replicas": [1, "2"]}), "broker ids"),
        (plan({"topic": "a", "partition": 0, "replicas": [1, 1]}), "named twice"),
        (plan({"topic": "a", "partition": 0, "replicas": list(range(40))}), "at most 32"),
        (
            plan({"topic": "a", "partition": 0, "replicas": [1, 2], "log_dirs": ["/d", "any"]}),
            "log_dirs",
        ),
        (
            plan(
                {"topic": "a", "partition": 0, "replicas": [1]},
                {"topic": "a", "partition": 0, "replicas": [2]},
            ),
            "partition is named twice",
        ),
    ],
)
def test_hostile_plans_are_refused_naming_the_entry(text: str, says: str) -> None:
    with pytest.raises(PlanError) as caught:
        parse_plan(text)
    assert says in str(caught.value)


def test_an_absurd_partition_count_is_refused() -> None:
    entries = [
        {"topic": "a", "partition": i, "replicas": [1]} for i in range(MAX_PLAN_PARTITIONS + 1)
    ]
    with pytest.raises(PlanError, match="at most"):
        parse_plan(json.dumps({"version": 1, "partitions": entries}))


def test_topics_to_move() -> None:
    text = json.dumps({"version": 1, "topics": [{"topic": "a"}, {"topic": "b"}, {"topic": "a"}]})
    assert parse_topics_to_move(text) == ["a", "b"]
    with pytest.raises(PlanError, match='"topics"'):
        parse_topics_to_move(json.dumps({"version": 1, "topics": []}))


def test_generated_plans_keep_the_factor_and_spread_over_racks() -> None:
    current = {("a", 0): (1, 2), ("a", 1): (2, 3), ("b", 0): (1, 2, 3)}
    racks = {4: "x", 5: "x", 6: "y", 7: "y"}
    proposed = generate_plan(current, [4, 5, 6, 7], racks)
    assert {k: len(v) for k, v in proposed.items()} == {("a", 0): 2, ("a", 1): 2, ("b", 0): 3}
    assert all(set(v) <= {4, 5, 6, 7} and len(set(v)) == len(v) for v in proposed.values())
    assert all({racks[b] for b in v} == {"x", "y"} for v in proposed.values())
    with pytest.raises(PlanError, match="more than the 2 brokers"):
        generate_plan(current, [4, 5], racks)
    with pytest.raises(PlanError, match="twice"):
        generate_plan(current, [4, 4, 5], racks)


def test_cli_refuses_bad_plans_and_arguments_before_connecting(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(plan({"topic": "a", "partition": 0, "replicas": [1, 1]}))
    code, out = run("topics", "reassign", "--execute", "--reassignment-json-file", str(bad))
    assert code == 1 and "partitions[0] (a-0): a broker is named twice" in out
    code, out = run("topics", "reassign", "--execute")
    assert code == 2 and "--reassignment-json-file is required" in out
    code, out = run("topics", "reassign")
    assert code == 2 and "give one of --generate, --execute, --verify or --cancel" in out
    code, out = run(
        "topics", "reassign", "--verify", "--wait", "--reassignment-json-file", str(bad)
    )
    assert code == 2 and "--wait goes with --execute" in out
    code, out = run(
        "topics", "reassign", "--execute", "--reassignment-json-file", str(tmp_path / "none.json")
    )
    assert code == 2 and "cannot read" in out
    topics = tmp_path / "topics.json"
    topics.write_text(json.dumps({"version": 1, "topics": [{"topic": "a"}]}))
    code, out = run("topics", "reassign", "--generate", "--topics-to-move-json-file", str(topics))
    assert code == 2 and "--broker-list" in out
    code, out = run(
        "topics", "reassign", "--generate", "--topics-to-move-json-file", str(topics),
        "--broker-list", "1,x",
    )  # fmt: skip
    assert code == 2 and "broker ids separated by commas" in out
    cancel = tmp_path / "cancel.json"
    cancel.write_text(plan({"topic": "a", "partition": 0, "replicas": None}))
    code, out = run("topics", "reassign", "--execute", "--reassignment-json-file", str(cancel))
    assert code == 1 and "use --cancel" in out


def test_elect_leaders_arguments() -> None:
    code, out = run("topics", "elect-leaders", "--election-type", "PREFERRED")
    assert code == 2 and "--all-topic-partitions" in out
    code, out = run(
        "topics", "elect-leaders", "--election-type", "PREFERRED", "--topic", "a",
        "--all-topic-partitions",
    )  # fmt: skip
    assert code == 2
    code, out = run("topics", "elect-leaders", "--election-type", "FAST", "--all-topic-partitions")
    assert code == 2 and "FAST" in out
