"""Run librdkafka's broker-facing tests against local raftlog clusters.

Per scenario, one three-node cluster of real node processes with the settings of trivup's
scenario files (tests/scenarios/*.json: auto-created topics of 4 partitions, replication
factor 3; `noautocreate` turns auto-creation off). Each test number runs alone, with a
deadline, in librdkafka's own test-runner (`TESTS=<number> test-runner -L -p1 -D`: broker
tests only, one at a time, test topics deleted after). A node that exits while a test runs
is reported with that test, and the next test gets a fresh cluster.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from compat.source import Suite
from compat.suite import Outcome, TestCase, needs_kafka_cli, parse_summary

if TYPE_CHECKING:
    from raftlog.testing.cluster import ProcessCluster

# The broker version the tests gate features on (TEST_BRKVER): raftlog speaks Kafka 3.9's
# protocol versions or later.
KAFKA_VERSION = "3.9.0"
DEFAULT_DEADLINE_S = 600.0
# Test numbers whose subtests together outlast the default deadline on two cores: the
# deadline they get at least. 0113_cooperative_rebalance's 40-odd subtests take about 11
# minutes against raftlog (its u_ variations alone, 5 minutes of timed waits).
LONG_DEADLINES_S = {"0113": 1_200.0}
# librdkafka's group.protocol for the tests' consumers (TEST_CONSUMER_GROUP_PROTOCOL):
# classic (JoinGroup/SyncGroup) or consumer (KIP-848, ConsumerGroupHeartbeat).
GROUP_PROTOCOLS = ("classic", "consumer")
CLUSTER_NODES = 3


@dataclass(frozen=True)
class Verdict:
    """What one broker-facing test came to."""

    name: str
    scenario: str
    state: str  # passed, failed, timeout, skipped, needs-kafka-cli, node-exited
    seconds: float
    detail: str
    log: str  # the run's output file, relative to the results directory


# Kafka's default group.initial.rebalance.delay.ms, which trivup's brokers keep (its
# server.properties template leaves the key out); raftlog's own default is 0. Group tests
# count rebalance callbacks on that assumption: two consumers that subscribe a millisecond
# apart share the first generation (0113_cooperative_rebalance's unsubscribe subtest expects
# one assign callback each, not an assign-all, a revoke and a second assign).
KAFKA_INITIAL_REBALANCE_DELAY_MS = 3_000


def cluster_overrides(scenario: str) -> dict[str, object]:
    """Node settings of trivup's scenario files and Kafka's defaults they rely on, with a
    node's default timings (the test cluster's fast ones fence brokers that a busy two-core
    machine slows down)."""
    from raftlog.config import NodeConfig
    from raftlog.testing.cluster import FAST_TIMINGS

    defaults = NodeConfig()
    return {
        **{key: getattr(defaults, key) for key in FAST_TIMINGS},
        "num_partitions": 4,
        "default_replication_factor": 3,
        "auto_create_topics_enable": scenario != "noautocreate",
        "group_initial_rebalance_delay_ms": KAFKA_INITIAL_REBALANCE_DELAY_MS,
    }


def rack_of(node_id: int) -> str:
    """The broker.rack librdkafka's test clusters give each broker (cluster_testing.py:
    `broker.rack=RACK${appid}`); 0101_fetch_from_follower needs three distinct racks and
    aims its client.rack at one of them."""
    return f"RACK{node_id}"


def give_racks(cluster: ProcessCluster) -> None:
    """Rewrite each node's config, before it starts, with its own rack."""
    for node_id, node in cluster.nodes.items():
        config = dataclasses.replace(node.config, broker_rack=rack_of(node_id))
        config.validate()
        node.config_path.write_text(config.to_toml(), encoding="utf-8")
        node.config = config


def _test_conf(path: Path, bootstrap: str, timeout_multiplier: float) -> Path:
    path.write_text(
        f"bootstrap.servers={bootstrap}\ntest.timeout.multiplier={timeout_multiplier:g}\n",
        encoding="utf-8",
    )
    return path


def deadline_for(number: str, deadline_s: float) -> float:
    """The deadline of one test number: `deadline_s`, or more for a known long test."""
    return max(deadline_s, LONG_DEADLINES_S.get(number, 0.0))


def runner_env(
    suite: Suite, number: str, scenario: str, conf: Path, group_protocol: str = "classic"
) -> dict[str, str]:
    """The test-runner's environment for one test number."""
    env = {
        **os.environ,
        "TESTS": number,
        "TEST_SCENARIO": scenario,
        "TEST_KAFKA_VERSION": KAFKA_VERSION,
        "RDKAFKA_TEST_CONF": str(conf),
        "LD_LIBRARY_PATH": ":".join(
            filter(None, (suite.library_path, os.environ.get("LD_LIBRARY_PATH")))
        ),
    }
    env.pop("TEST_CONSUMER_GROUP_PROTOCOL", None)
    if group_protocol != "classic":
        # Unset, the runner leaves group.protocol at librdkafka's default (classic).
        env["TEST_CONSUMER_GROUP_PROTOCOL"] = group_protocol
    return env


def _run_number(
    suite: Suite,
    number: str,
    scenario: str,
    conf: Path,
    log_path: Path,
    deadline_s: float,
    group_protocol: str = "classic",
) -> tuple[str, bool]:
    """Run one test number; (its output, whether it hit the deadline)."""
    env = runner_env(suite, number, scenario, conf, group_protocol)
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            [str(suite.test_runner), "-L", "-p1", "-D"],
            cwd=suite.tests_dir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a deadline kills the runner and whatever it started
        )
        timed_out = False
        try:
            process.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return log_path.read_text(encoding="utf-8", errors="replace"), timed_out


def judge(
    cases: list[TestCase],
    scenario: str,
    outcomes: dict[str, Outcome],
    timed_out: bool,
    node_exited: str | None,
    elapsed_s: float,
    log: str,
) -> list[Verdict]:
    """One verdict per test of the number that belongs to `scenario`."""
    verdicts = []
    for case in cases:
        outcome = outcomes.get(case.name)
        if outcome is None:
            state = "timeout" if timed_out else "failed"
            detail = (
                f"the runner was stopped at its {elapsed_s:.0f} s deadline"
                if timed_out
                else "the runner reported nothing for it (crashed?)"
            )
            seconds = elapsed_s
        else:
            # A failure report carries no duration: the run's own stands in for it.
            seconds, detail = outcome.seconds or elapsed_s, outcome.detail
            if outcome.state == "PASSED":
                state = "passed"
            elif outcome.state in ("SKIPPED", "DNS"):
                state = "skipped"
            elif outcome.state == "RUNNING":
                state = "timeout"
            elif needs_kafka_cli(detail):
                state = "needs-kafka-cli"
            else:
                state = "failed"
        if node_exited is not None and state != "passed":
            state, detail = "node-exited", f"{node_exited}; {detail}"
        verdicts.append(Verdict(case.name, scenario, state, seconds, detail, log))
    return verdicts


def run_scenario(
    suite: Suite,
    scenario: str,
    cases: list[TestCase],
    results_dir: Path,
    *,
    deadline_s: float = DEFAULT_DEADLINE_S,
    timeout_multiplier: float = 1.0,
    group_protocol: str = "classic",
    on_verdicts: Callable[[list[Verdict]], None] = lambda verdicts: None,
) -> list[Verdict]:
    """Every test number of `cases` in `scenario`, each against a healthy cluster."""
    from raftlog.testing.cluster import ProcessCluster

    numbers: dict[str, list[TestCase]] = {}
    for case in cases:
        if scenario in case.scenarios:
            numbers.setdefault(case.number, []).append(case)
    verdicts: list[Verdict] = []
    results_dir.mkdir(parents=True, exist_ok=True)
    cluster: ProcessCluster | None = None
    with tempfile.TemporaryDirectory(prefix=f"raftlog-compat-{scenario}-") as tmp:
        try:
            for attempt, (number, group) in enumerate(numbers.items()):
                if cluster is None:
                    cluster = ProcessCluster(
                        Path(tmp) / f"cluster-{attempt}",
                        CLUSTER_NODES,
                        overrides=cluster_overrides(scenario),
                    )
                    give_racks(cluster)
                    cluster.__enter__()
                conf = _test_conf(
                    Path(tmp) / "test.conf", cluster.bootstrap_servers, timeout_multiplier
                )
                log_name = f"{scenario}-{number}.log"
                started = time.monotonic()
                output, timed_out = _run_number(
                    suite,
                    number,
                    scenario,
                    conf,
                    results_dir / log_name,
                    deadline_for(number, deadline_s),
                    group_protocol,
                )
                elapsed_s = time.monotonic() - started
                exited = [n for n, node in cluster.nodes.items() if not node.running]
                node_exited = f"node(s) {exited} exited during the test" if exited else None
                found = judge(
                    group,
                    scenario,
                    parse_summary(output),
                    timed_out,
                    node_exited,
                    elapsed_s,
                    log_name,
                )
                verdicts.extend(found)
                on_verdicts(found)
                if exited:
                    cluster.__exit__(None, None, None)
                    cluster = None
        finally:
            if cluster is not None:
                cluster.__exit__(None, None, None)
    return verdicts
