"""What librdkafka's test suite holds, read from its test table, and what one run said.

tests/test.c declares every test in one table: `_TEST(0045_subscribe_update, FLAGS, ...,
.scenario = "noautocreate")`. A test with TEST_F_LOCAL needs no broker (unit and mock-cluster
tests): those are librdkafka's business, not a broker's. The test-runner selects tests by
their four-digit number (TESTS=0045 runs every 0045 test of the current scenario), so a
number and a scenario make one run; its summary table gives each test's verdict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SCENARIO = "default"
# The scenarios raftlog runs: the others (ak23: Kafka 2.3) describe a broker version.
SCENARIOS = ("default", "noautocreate")

_ENTRY = re.compile(r"_TEST\(\s*(\d{4}_\w+)\s*,(.*?)\)\s*,\s*(?=_TEST\(|\{\s*NULL|$)", re.S)
_SCENARIO = re.compile(r'\.scenario\s*=\s*"([^"]*)"')
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# One row of the runner's summary: "| 0001_multiobj   |   PASSED |  12.345s | <failstr>"
_SUMMARY_ROW = re.compile(
    r"^\|\s*(\d{4}_\w+)\s*\|\s*(PASSED|FAILED|SKIPPED|RUNNING|DNS)\s*\|\s*([\d.]+)s\s*\|(.*)$"
)
# A failure as a test reports it the moment it fails (the runner may stop before its summary):
# ### Test "0030_offset_commit (do_nonexist_commit:497)" failed at 0030-offset_commit.c:479:...
# Test assertion failed: ...
_FAILURE = re.compile(r'^### Test "(\d{4}_\w+)[^"]*" failed at ([^ ]+?)(?:\(\))? at .*###$')
# What a test that shells out to Apache Kafka's scripts says without them.
_NEEDS_KAFKA_CLI = re.compile(r"KAFKA_PATH and \S+ must be set|kafka-topics\.sh|KAFKA_PATH")
# A test that starts one of librdkafka's Java helpers (test_run_java) only warns when
# KAFKA_PATH is unset, then fails on what the helper did not do: noted with its failure.
_JAVA_WITHOUT_KAFKA_PATH = re.compile(
    r"^\[(\d{4}_\w+)\s*/\s*[\d.]+s\]\s*WARN: (test_run_java\(\w+\): KAFKA_PATH must be set)"
)


@dataclass(frozen=True)
class TestCase:
    name: str  # 0045_subscribe_update
    local: bool  # TEST_F_LOCAL: no broker involved
    known_issue: bool  # TEST_F_KNOWN_ISSUE: librdkafka skips it itself
    manual: bool  # TEST_F_MANUAL: run only when asked for by name
    scenarios: tuple[str, ...]

    @property
    def number(self) -> str:
        return self.name.split("_", 1)[0]


@dataclass(frozen=True)
class Outcome:
    """One test's verdict in one run of the runner."""

    name: str
    state: str  # PASSED, FAILED, SKIPPED, RUNNING (still running at the deadline), DNS
    seconds: float
    detail: str  # the runner's failure or skip text


def read_tests(tests_dir: Path) -> list[TestCase]:
    """Every test of tests/test.c's table, in its order."""
    text = (tests_dir / "test.c").read_text(encoding="utf-8", errors="replace")
    start = text.find("struct test tests[]")
    if start < 0:
        raise ValueError(f"{tests_dir / 'test.c'} has no tests[] table")
    table = text[start:]
    table = table[table.find("{") + 1 :]
    cases = []
    for match in _ENTRY.finditer(table):
        name, rest = match.group(1), match.group(2)
        flags = rest.split(",", 1)[0]
        scenario = _SCENARIO.search(rest)
        scenarios = tuple(scenario.group(1).split(",")) if scenario else (DEFAULT_SCENARIO,)
        cases.append(
            TestCase(
                name=name,
                local="TEST_F_LOCAL" in flags,
                known_issue="TEST_F_KNOWN_ISSUE" in flags.replace("TEST_F_KNOWN_ISSUE_", "_"),
                manual="TEST_F_MANUAL" in flags,
                scenarios=scenarios,
            )
        )
    if not cases:
        raise ValueError(f"no _TEST entries found in {tests_dir / 'test.c'}")
    return cases


def broker_facing(cases: list[TestCase]) -> list[TestCase]:
    """The tests that talk to a broker in a scenario raftlog runs (manual ones left out)."""
    return [
        c
        for c in cases
        if not c.local and not c.manual and any(s in SCENARIOS for s in c.scenarios)
    ]


def parse_summary(output: str) -> dict[str, Outcome]:
    """name -> Outcome from the runner's summary table (ANSI colours stripped), and for a
    test the summary leaves out (the runner aborts on a failure before it prints one) its
    first failure report."""
    outcomes: dict[str, Outcome] = {}
    failures: dict[str, Outcome] = {}
    no_java: dict[str, str] = {}
    lines = [_ANSI.sub("", raw).strip() for raw in output.splitlines()]
    for index, line in enumerate(lines):
        java = _JAVA_WITHOUT_KAFKA_PATH.match(line)
        if java:
            no_java.setdefault(java.group(1), java.group(2))
            continue
        row = _SUMMARY_ROW.match(line)
        if row:
            name, state, seconds, detail = row.groups()
            outcomes[name] = Outcome(name, state, float(seconds), detail.strip(" |"))
            continue
        failure = _FAILURE.match(line)
        if failure and failure.group(1) not in failures:
            name, where = failure.groups()
            message = lines[index + 1] if index + 1 < len(lines) else ""
            failures[name] = Outcome(name, "FAILED", 0.0, f"{message} ({where})")
    for name, outcome in failures.items():
        outcomes.setdefault(name, outcome)
    for name, warning in no_java.items():
        failed = outcomes.get(name)
        if failed is not None and failed.state == "FAILED":
            outcomes[name] = Outcome(
                name, failed.state, failed.seconds, f"{warning}, then: {failed.detail}"
            )
    return outcomes


def needs_kafka_cli(text: str) -> bool:
    """The test shelled out to Apache Kafka's scripts (KAFKA_PATH), which raftlog lacks."""
    return bool(_NEEDS_KAFKA_CLI.search(text))
