"""The argument forms of `raftlog groups reset-offsets` (datetimes with zones, durations,
partition lists), hostile ones included, the pure plan (clamping, --shift-by, fall-backs), and
click refusing bad arguments before anything connects (no broker runs in these tests: the
bootstrap address is a closed port, so reaching the network would show as a different error).
"""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from click.testing import CliRunner
from raftlog_cli.groups_reset import (
    PartitionInputs,
    PlannedOffset,
    ResetError,
    ResetKind,
    ResetSpec,
    parse_datetime_ms,
    parse_duration_ms,
    parse_topic_partitions,
    plan_resets,
    scope_partitions,
)
from raftlog_cli.main import cli

# 2024-03-01T12:30:45Z in epoch milliseconds.
NOON_MS = 1_709_296_245_000


# ------------------------------------------------------------------------------ datetimes
@pytest.mark.parametrize(
    ("text", "expected_ms"),
    [
        ("2024-03-01T12:30:45Z", NOON_MS),
        ("2024-03-01T12:30:45.000Z", NOON_MS),
        ("2024-03-01T12:30:45.123Z", NOON_MS + 123),
        ("2024-03-01T12:30:45.5Z", NOON_MS + 500),
        ("2024-03-01T12:30:45.05Z", NOON_MS + 50),
        ("2024-03-01T14:30:45+02:00", NOON_MS),
        ("2024-03-01T07:00:45-05:30", NOON_MS),
        ("2024-03-01T12:30:45+00:00", NOON_MS),
        ("2024-03-01T12:30:45-00:00", NOON_MS),
        ("1970-01-01T00:00:00Z", 0),
        ("1970-01-01T01:00:00+01:00", 0),
        ("2024-02-29T00:00:00Z", 1_709_164_800_000),
        ("9999-12-31T23:59:59.999Z", 253_402_300_799_999),
    ],
)
def test_datetime_forms(text: str, expected_ms: int) -> None:
    assert parse_datetime_ms(text) == expected_ms


def test_datetime_without_zone_is_local_time() -> None:
    local = datetime(2024, 3, 1, 12, 30, 45).astimezone()
    assert parse_datetime_ms("2024-03-01T12:30:45") == int(local.timestamp() * 1000)
    assert parse_datetime_ms("2024-03-01T12:30:45.250") == int(local.timestamp() * 1000) + 250


@pytest.mark.parametrize(
    "text",
    [
        "",
        "2024-03-01",
        "2024-03-01T12:30",
        "2024-03-01 12:30:45Z",
        "2024-3-01T12:30:45Z",
        "2024-03-01T12:30:45.Z",
        "2024-03-01T12:30:45.1234Z",
        "2024-03-01T12:30:45z",
        "2024-03-01T12:30:45+0200",
        "2024-03-01T12:30:45+02",
        "2024-03-01T12:30:45+24:00",
        "2024-03-01T12:30:45+02:60",
        "2024-02-30T00:00:00Z",
        "2023-02-29T00:00:00Z",
        "2024-13-01T00:00:00Z",
        "2024-03-01T24:00:00Z",
        "2024-03-01T12:60:00Z",
        "2024-03-01T12:30:61Z",
        "0000-01-01T00:00:00Z",
        "1969-12-31T23:59:59.999Z",  # -1: ListOffsets' "latest" sentinel
        "1969-12-31T23:59:59.998Z",  # -2: "earliest"
        "1970-01-01T00:00:00+00:01",
        "\uff12\uff10\uff12\uff14-03-01T12:30:45Z",  # full-width digits
        "2024-03-01T12:30:45Z\n",
        " 2024-03-01T12:30:45Z",
        "2024-03-01T12:30:45Z" + "0" * 100,
        "now",
        "-1",
    ],
)
def test_datetime_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_datetime_ms(text)


# ------------------------------------------------------------------------------ durations
@pytest.mark.parametrize(
    ("text", "expected_ms"),
    [
        ("PT0S", 0),
        ("PT1S", 1_000),
        ("PT0.5S", 500),
        ("PT1.001S", 1_001),
        ("PT0.123456789S", 123),
        ("PT30M", 1_800_000),
        ("PT6H", 21_600_000),
        ("P1D", 86_400_000),
        ("P1DT2H3M4S", 93_784_000),
        ("P2DT0H", 172_800_000),
        ("pt15m", 900_000),
        ("PT90M", 5_400_000),
        ("P999999999999D", 999_999_999_999 * 86_400_000),
    ],
)
def test_duration_forms(text: str, expected_ms: int) -> None:
    assert parse_duration_ms(text) == expected_ms


@pytest.mark.parametrize(
    "text",
    [
        "",
        "P",
        "PT",
        "P1DT",
        "P1",
        "1D",
        "PT1",
        "-PT1H",
        "PT-1H",
        "P1W",
        "P1Y",
        "P1M",  # months are not a fixed length (java.time.Duration refuses them too)
        "PT1H2D",
        "PT1M1H",
        "PT1.S",
        "PT.5S",
        "PT1.0000000001S",
        "PT0.5M",
        "P1000000000000D",
        "PT1H ",
        "P\uff11D",  # full-width digit
        "P" + "9" * 100 + "D",
    ],
)
def test_duration_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_ms(text)


# ------------------------------------------------------------------------------ partition lists
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("orders", ("orders", None)),
        ("orders:0", ("orders", (0,))),
        ("orders:2,0,1", ("orders", (0, 1, 2))),
        ("orders:1,1", ("orders", (1,))),
        ("orders: 1, 2", ("orders", (1, 2))),
        ("a.b_c-d:2147483647", ("a.b_c-d", (2_147_483_647,))),
        ("x" * 249, ("x" * 249, None)),
    ],
)
def test_partition_lists(text: str, expected: tuple[str, tuple[int, ...] | None]) -> None:
    assert parse_topic_partitions(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        ":0",
        "t:",
        "t:x",
        "t:1,",
        "t:,1",
        "t:1,,2",
        "t:-1",
        "t:+1",
        "t:1.5",
        "t:0x1",
        "t:2147483648",
        "t:1:2",
        "t:\uff11",  # full-width digit
        "bad topic:0",
        "t/../x",
        ".",
        "..",
        "x" * 250,
        "t:" + "1," * 10_000 + "1",
    ],
)
def test_partition_lists_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_topic_partitions(text)


def test_scope_partitions() -> None:
    counts = {"a": 3, "b": 2}
    assert scope_partitions([("a", None), ("b", (1,)), ("a", (0,))], counts) == [
        ("a", 0),
        ("a", 1),
        ("a", 2),
        ("b", 1),
    ]
    with pytest.raises(ResetError, match="unknown topic 'c'"):
        scope_partitions([("c", None)], counts)
    with pytest.raises(ResetError, match="topic 'b' has no partition 2"):
        scope_partitions([("b", (2,))], counts)


# ------------------------------------------------------------------------------ the plan
# Partition 0: log 10..50, committed 20; partition 1: log 0..5, nothing committed.
INPUTS = {
    ("t", 0): PartitionInputs(log_start_offset=10, high_watermark=50, committed=20),
    ("t", 1): PartitionInputs(log_start_offset=0, high_watermark=5),
}


def planned(kind: ResetKind, value: int = 0, inputs: dict | None = None) -> list[tuple[int, int]]:
    plan = plan_resets(ResetSpec(kind, value), inputs or INPUTS)
    return [(p.partition, p.new_offset) for p in plan]


def test_plan_earliest_latest_current() -> None:
    assert planned(ResetKind.EARLIEST) == [(0, 10), (1, 0)]
    assert planned(ResetKind.LATEST) == [(0, 50), (1, 5)]
    # Where nothing is committed, --to-current goes to the end (as Kafka's tool).
    assert planned(ResetKind.CURRENT) == [(0, 20), (1, 5)]
    assert plan_resets(ResetSpec(ResetKind.CURRENT), INPUTS) == [
        PlannedOffset("t", 0, 20, 20),
        PlannedOffset("t", 1, None, 5),
    ]


def test_plan_to_offset_is_clamped_to_the_log() -> None:
    assert planned(ResetKind.OFFSET, 3) == [(0, 10), (1, 3)]
    assert planned(ResetKind.OFFSET, 30) == [(0, 30), (1, 5)]
    assert planned(ResetKind.OFFSET, 2**63 - 1) == [(0, 50), (1, 5)]


def test_plan_shift_by() -> None:
    only_0 = {("t", 0): INPUTS[("t", 0)]}
    assert planned(ResetKind.SHIFT, 5, only_0) == [(0, 25)]
    assert planned(ResetKind.SHIFT, -15, only_0) == [(0, 10)]
    assert planned(ResetKind.SHIFT, 1_000, only_0) == [(0, 50)]
    assert planned(ResetKind.SHIFT, -(2**63 - 1), only_0) == [(0, 10)]
    with pytest.raises(ResetError, match=r"--shift-by needs a committed offset.*t-1"):
        planned(ResetKind.SHIFT, 1)


def test_plan_by_timestamp_falls_back_to_the_end() -> None:
    inputs = {
        ("t", 0): PartitionInputs(10, 50, committed=20, by_timestamp=42),
        ("t", 1): PartitionInputs(0, 5, by_timestamp=None),
        ("t", 2): PartitionInputs(7, 9, by_timestamp=3),  # found below log start: clamped
    }
    for kind in (ResetKind.DATETIME, ResetKind.DURATION):
        assert planned(kind, NOON_MS, inputs) == [(0, 42), (1, 5), (2, 7)]


def test_plan_refuses_a_log_the_cluster_cannot_have() -> None:
    with pytest.raises(ResetError):
        planned(ResetKind.EARLIEST, 0, {("t", 0): PartitionInputs(10, 5)})
    with pytest.raises(ResetError):
        planned(ResetKind.EARLIEST, 0, {("t", 0): PartitionInputs(-1, 5)})


# ------------------------------------------------------------------------------ click
# Nothing listens here: a command that got as far as connecting would fail differently.
NOWHERE = "127.0.0.1:1"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli, [*args, "--bootstrap-server", NOWHERE], prog_name="raftlog", catch_exceptions=False
    )
    return result.exit_code, result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--to-earliest"], "give --topic (repeatable) or --all-topics, not both or neither"),
        (
            ["--all-topics", "--topic", "t", "--to-earliest"],
            "give --topic (repeatable) or --all-topics, not both or neither",
        ),
        (["--all-topics"], "give one of --to-earliest, --to-latest, --to-offset"),
        (
            ["--all-topics", "--to-earliest", "--to-offset", "3"],
            "give only one reset spec, not --to-earliest and --to-offset",
        ),
        (
            ["--all-topics", "--shift-by", "1", "--to-current"],
            "give only one reset spec, not --shift-by and --to-current",
        ),
        (["--all-topics", "--to-offset", "-1"], "Invalid value for '--to-offset'"),
        (["--all-topics", "--to-offset", "x"], "Invalid value for '--to-offset'"),
        (["--all-topics", "--to-offset", str(2**63)], "Invalid value for '--to-offset'"),
        (["--all-topics", "--shift-by", str(2**63)], "Invalid value for '--shift-by'"),
        (
            ["--all-topics", "--to-datetime", "2024-02-30T00:00:00Z"],
            "Invalid value for '--to-datetime': not a valid date and time",
        ),
        (
            ["--all-topics", "--to-datetime", "yesterday"],
            "Invalid value for '--to-datetime': expected YYYY-MM-DDTHH:mm:SS",
        ),
        (
            ["--all-topics", "--by-duration", "1h"],
            "Invalid value for '--by-duration': expected a duration PnDTnHnMnS",
        ),
        (
            ["--topic", "t:x", "--to-earliest"],
            "Invalid value for '--topic': partitions of 't' must be numbers",
        ),
        (["--topic", "t:", "--to-earliest"], "Invalid value for '--topic'"),
        (
            ["--all-topics", "--to-earliest", "--dry-run", "--execute"],
            "--dry-run and --execute do not combine",
        ),
    ],
)
def test_bad_arguments_refused_before_connecting(args: list[str], message: str) -> None:
    code, stderr = run("groups", "reset-offsets", "--group", "g", *args)
    assert code == 2, stderr
    assert stderr.startswith("error: " + message), stderr
    assert stderr.endswith("(see 'raftlog groups reset-offsets --help')\n")


def test_missing_group_refused() -> None:
    code, stderr = run("groups", "reset-offsets", "--all-topics", "--to-earliest")
    assert code == 2 and "Missing option '--group'" in stderr
    code, stderr = run("groups", "delete")
    assert code == 2 and "Missing option '--group'" in stderr
    code, stderr = run("groups", "delete", "--group", "")
    assert code == 2 and "Invalid value for '--group'" in stderr


def test_a_valid_command_does_try_to_connect() -> None:
    """The control for the refusals above: valid arguments get as far as the network."""
    started = time.monotonic()
    code, stderr = run("groups", "reset-offsets", "--group", "g", "--all-topics", "--to-latest")
    assert code == 1
    assert stderr.startswith("error: cannot reach the cluster at 127.0.0.1:1"), stderr
    assert time.monotonic() - started < 30
