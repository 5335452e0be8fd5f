"""Metadata-quorum benchmark: controller commits/s vs pysyncobj, and leader failover time.

    python -m benchmarks.quorum [--seconds 10] [--failovers 10] [--writers 64]

1. Three real raftlog nodes on loopback (fsync on, NodeConfig's default Raft timings). Many
   tasks issue small AlterClientQuotas writes concurrently through the project client to all
   three brokers, which forward them to the active controller; each reply means one metadata
   change committed by the quorum. Counted for `--seconds` → commits_per_s.
2. pysyncobj, three processes on loopback with a file journal and a full-dump file, commits
   the same number of small replicated commands with the same number in flight (issued on its
   leader, its best case) → pysyncobj_commits_per_s.
3. `--failovers` times: kill -9 the metadata leader (found with DescribeQuorum), time until a
   write commits through a survivor, restart the killed node and wait until it caught up.

The last stdout line is one JSON object: {"commits_per_s", "pysyncobj_commits_per_s",
"ratio", "failover_s_median", "failover_s_max", ...}. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from benchmarks.common import console, emit_result, progress
from raftlog.client import (
    Admin,
    ClusterLimits,
    ConnectionLimits,
    open_cluster,
)
from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode, KafkaError
from raftlog.quotas.entity import PRODUCER_BYTE_RATE, USER, QuotaEntity
from raftlog.testing.cluster import FAST_TIMINGS, ProcessCluster, free_ports

# Requests one client connection keeps in flight (the broker reads at most 16 ahead too).
CONNECTION_IN_FLIGHT = 16
# One failover round (kill → committed write) must finish within this.
FAILOVER_WRITE_TIMEOUT_S = 60.0
# Restart + catch-up of the killed node between rounds.
CATCH_UP_TIMEOUT_S = 120.0
# pysyncobj election + the commands must finish within this.
PYSYNCOBJ_TIMEOUT_S = 600.0
POLL_INTERVAL_S = 0.05
# One DescribeQuorum attempt against one node.
DESCRIBE_TIMEOUT_S = 5.0
# Waiting for a leader before a failover round.
LEADER_TIMEOUT_S = 60.0


def default_timings() -> dict[str, Any]:
    """NodeConfig's own defaults for every timing the test harness speeds up: the benchmark
    measures what a user gets, not the harness's fast settings."""
    defaults = {f.name: f.default for f in dataclasses.fields(NodeConfig)}
    return {key: defaults[key] for key in FAST_TIMINGS}


# Writers share a few quota entities: every write is still its own committed metadata change,
# but the brokers' quota table (rebuilt whole on every quota change) stays small, so the run
# measures the quorum rather than that rebuild. Topic configs are not used because applying
# one rewrites a checkpoint with fsync on every broker (see docs/results.md).
QUOTA_ENTITIES = 4


async def quota_write(admin: Admin, writer: int, value: int) -> None:
    """One small metadata write: AlterClientQuotas setting one user's producer byte rate.

    Raises KafkaError if the controller refuses it."""
    entity = QuotaEntity.of([(USER, f"bench-user-{writer % QUOTA_ENTITIES}")])
    # Byte rates must be positive; the offset keeps every value valid.
    results = await admin.alter_client_quotas([(entity, {PRODUCER_BYTE_RATE: 1_000_000 + value})])
    for result in results.values():
        if result.error != ErrorCode.none:
            raise KafkaError(result.error, result.message or "alter_client_quotas")


# --------------------------------------------------------------------------- raftlog commits
async def raftlog_commits(
    addresses: list[str], seconds: float, writers: int, bar: Any
) -> tuple[int, float, int]:
    """(commits, elapsed seconds, failed writes) of `writers` concurrent quota writers."""
    limits = ClusterLimits(connection=ConnectionLimits(max_in_flight_requests=CONNECTION_IN_FLIGHT))
    clients = max(1, math.ceil(writers / CONNECTION_IN_FLIGHT))
    commits = 0
    failures = 0
    async with trio.open_nursery() as outer:
        admins: list[Admin] = []
        ready = trio.Event()
        done = trio.Event()

        async def client(address: str) -> None:
            async with open_cluster(address, client_id="bench-quorum", limits=limits) as cluster:
                admins.append(Admin(cluster))
                if len(admins) == clients:
                    ready.set()
                await done.wait()

        for i in range(clients):
            outer.start_soon(client, addresses[i % len(addresses)])
        await ready.wait()
        deadline = trio.current_time() + seconds

        async def writer(index: int) -> None:
            nonlocal commits, failures
            admin = admins[index % len(admins)]
            value = index * 1_000_000
            while trio.current_time() < deadline:
                value += 1
                try:
                    await quota_write(admin, index, value)
                except KafkaError as exc:
                    failures += 1
                    console.log(f"write failed: {exc}")
                else:
                    commits += 1
                bar.tick()

        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            for i in range(writers):
                nursery.start_soon(writer, i)
        elapsed = trio.current_time() - started
        done.set()
    return commits, elapsed, failures


# --------------------------------------------------------------------------- pysyncobj
async def pysyncobj_commits(root: Path, commands: int, window: int) -> dict[str, Any]:
    """Run three pysyncobj worker processes; the leader's result line."""
    ports = free_ports(3)
    addresses = [f"127.0.0.1:{p}" for p in ports]
    result: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        processes: list[trio.Process] = []
        for i, address in enumerate(addresses):
            partners = ",".join(a for a in addresses if a != address)
            command = [
                sys.executable,
                "-m",
                "benchmarks.quorum_pysyncobj",
                "--self",
                address,
                "--partners",
                partners,
                "--dir",
                str(root / f"pysyncobj-{i + 1}"),
                "--commands",
                str(commands),
                "--window",
                str(window),
            ]
            run = functools.partial(
                trio.run_process,
                command,
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                check=False,
            )
            processes.append(await nursery.start(run))

        async def read_result(process: trio.Process) -> None:
            buffer = b""
            assert process.stdout is not None
            async for chunk in process.stdout:
                buffer += chunk
                if b"\n" in buffer:
                    result.update(json.loads(buffer.split(b"\n", 1)[0]))
                    nursery.cancel_scope.cancel()
                    return

        with trio.move_on_after(PYSYNCOBJ_TIMEOUT_S):
            for process in processes:
                nursery.start_soon(read_result, process)
            await trio.sleep_forever()
        nursery.cancel_scope.cancel()
    if not result:
        raise TimeoutError(
            f"pysyncobj did not finish {commands} commands in {PYSYNCOBJ_TIMEOUT_S}s"
        )
    return result


# --------------------------------------------------------------------------- failover
async def quorum_state(addresses: list[str]) -> dict[str, Any] | None:
    """DescribeQuorum through any of `addresses`; None while nobody can answer."""
    limits = ClusterLimits(max_retries=0)
    for address in addresses:
        try:
            with trio.fail_after(DESCRIBE_TIMEOUT_S):
                async with open_cluster(address, client_id="bench-quorum", limits=limits) as c:
                    admin = Admin(c, timeout_ms=int(DESCRIBE_TIMEOUT_S * 1000))
                    state = await admin.describe_quorum()
        except Exception:  # a node that is starting or electing refuses; try the next one
            continue
        if state["leader_id"] >= 0:
            return state
    return None


QuorumPredicate = Callable[[dict[str, Any]], bool]


async def wait_quorum(
    addresses: list[str], predicate: QuorumPredicate, what: str, timeout_s: float
) -> dict[str, Any]:
    """The first DescribeQuorum answer that satisfies predicate; TimeoutError after timeout_s."""
    with trio.move_on_after(timeout_s):
        while True:
            state = await quorum_state(addresses)
            if state is not None and predicate(state):
                return state
            await trio.sleep(POLL_INTERVAL_S)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")


async def first_committed_write(addresses: list[str], value: int) -> str:
    """Send one write through every address at once; the address of the first that commits.

    Each attempt goes through a surviving broker, which forwards to whatever controller it
    can find; the broker and the client retry on their own, and a failed attempt is retried
    here until the deadline."""
    winner: list[str] = []
    limits = ClusterLimits(max_retries=20, retry_backoff_max_ms=200)

    async def attempt(address: str, cancel: trio.CancelScope) -> None:
        while True:
            try:
                async with open_cluster(address, client_id="bench-failover", limits=limits) as c:
                    await quota_write(Admin(c), 0, value)
                winner.append(address)
                cancel.cancel()
                return
            except Exception as exc:  # a refused connection or timeout: try again
                console.log(f"failover write via {address} failed: {describe_error(exc)}")
            await trio.sleep(POLL_INTERVAL_S)

    with trio.fail_after(FAILOVER_WRITE_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            for address in addresses:
                nursery.start_soon(attempt, address, nursery.cancel_scope)
    return winner[0]


def describe_error(exc: BaseException) -> str:
    """The innermost error of a (possibly nested) exception group, for one log line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def caught_up(node_id: int) -> QuorumPredicate:
    """Predicate: the restarted voter has acknowledged everything committed."""

    def check(state: dict[str, Any]) -> bool:
        ends = {v["replica_id"]: v["log_end_offset"] for v in state["voters"]}
        return ends.get(node_id, -1) >= state["high_watermark"]

    return check


def run_failovers(cluster: ProcessCluster, rounds: int) -> list[float]:
    """kill -9 the metadata leader `rounds` times; seconds until a survivor commits a write."""
    durations: list[float] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("failovers (kill -9 the leader)", total=rounds)
        for round_index in range(rounds):
            addresses = [n.client_address for n in cluster.nodes.values() if n.running]
            state = trio.run(wait_quorum, addresses, lambda s: True, "a leader", LEADER_TIMEOUT_S)
            leader = state["leader_id"]
            survivors = [n.client_address for n in cluster.nodes.values() if n.node_id != leader]
            started = time.monotonic()
            cluster.kill(leader, signal.SIGKILL)
            via = trio.run(first_committed_write, survivors, round_index)
            elapsed = time.monotonic() - started
            durations.append(elapsed)
            console.log(f"round {round_index + 1}: killed {leader}, write via {via} {elapsed:.3f}s")
            cluster.start(leader)
            cluster.wait_ready(CATCH_UP_TIMEOUT_S)
            trio.run(
                wait_quorum,
                [n.client_address for n in cluster.nodes.values()],
                caught_up(leader),
                f"node {leader} to catch up",
                CATCH_UP_TIMEOUT_S,
            )
            bar.update(task, advance=1)
    return durations


# --------------------------------------------------------------------------- main
def cpu_seconds(cluster: ProcessCluster) -> float | None:
    """CPU time (user + system) used so far by the node processes and this process, or None
    where /proc is not available. Diagnostic: on a shared machine it tells whether the
    commit rate is bounded by CPU or by waiting."""
    total = sum(os.times()[:2])
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    for node in cluster.nodes.values():
        if node.process is None:
            continue
        try:
            stat = Path(f"/proc/{node.process.pid}/stat").read_text()
        except OSError:
            return None
        fields = stat.rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks_per_s
    return total


def run(seconds: float, failovers: int, writers: int, root: Path) -> dict[str, Any]:
    overrides = default_timings()
    with ProcessCluster(root / "raftlog", 3, overrides) as cluster:
        addresses = [n.client_address for n in cluster.nodes.values()]
        # One committed write first, so connection set-up is not part of the measurement.
        trio.run(first_committed_write, addresses, 0)
        cpu_before = cpu_seconds(cluster)
        with progress(f"raftlog: {writers} concurrent controller writes", seconds) as bar:
            commits, elapsed, failed = trio.run(raftlog_commits, addresses, seconds, writers, bar)
        cpu_after = cpu_seconds(cluster)
        commits_per_s = commits / elapsed if elapsed > 0 else 0.0
        cpu_ms_per_commit = None
        if cpu_before is not None and cpu_after is not None and commits:
            cpu_ms_per_commit = round((cpu_after - cpu_before) * 1000 / commits, 3)
        console.log(
            f"raftlog: {commits} commits in {elapsed:.2f}s ({failed} failed), "
            f"{cpu_ms_per_commit} ms CPU per commit (3 nodes + client)"
        )

        with console.status(f"pysyncobj: {commits} commands, {writers} in flight"):
            baseline = trio.run(pysyncobj_commits, root / "pysyncobj", max(commits, 1), writers)
        console.log(f"pysyncobj: {baseline}")

        durations = run_failovers(cluster, failovers) if failovers > 0 else []
    baseline_per_s = float(baseline["commands_per_s"])
    return {
        "commits_per_s": round(commits_per_s, 1),
        "pysyncobj_commits_per_s": round(baseline_per_s, 1),
        "ratio": round(commits_per_s / baseline_per_s, 2) if baseline_per_s > 0 else 0.0,
        "failover_s_median": round(statistics.median(durations), 3) if durations else None,
        "failover_s_max": round(max(durations), 3) if durations else None,
        "commits": commits,
        "failed_writes": failed,
        "seconds": round(elapsed, 2),
        "cpu_ms_per_commit": cpu_ms_per_commit,
        "writers": writers,
        "failovers": len(durations),
        "failover_s": [round(d, 3) for d in durations],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the commit run")
    parser.add_argument("--failovers", type=int, default=10, help="kill -9 rounds (0: none)")
    parser.add_argument("--writers", type=int, default=64, help="concurrent metadata writers")
    parser.add_argument("--dir", help="working directory (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.dir:
        root = Path(args.dir)
        root.mkdir(parents=True, exist_ok=True)
        result = run(args.seconds, args.failovers, args.writers, root)
    else:
        with tempfile.TemporaryDirectory(prefix="raftlog-bench-quorum-") as tmp:
            result = run(args.seconds, args.failovers, args.writers, Path(tmp))
    emit_result(result)


if __name__ == "__main__":
    main()
