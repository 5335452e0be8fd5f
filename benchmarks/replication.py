"""Replication benchmark: what acks=all on three replicas costs, against baselines measured in
the same run on the same machine.

    python -m benchmarks.replication [--seconds 10] [--partitions 6] [--plot FILE.png]
                                     [--flush-policy always|interval] [--dir DIR]

Phase 1, three real nodes: three sides alternate in slices, so drift on a shared machine hits
them alike. Every side has the same partition count and the same producer settings
(confluent-kafka, 1 KiB records); they differ only in acks and the replication factor:
  acks=all RF 3, acks=1 RF 3 (the same replication work, without waiting for the ISR) and
  acks=1 RF 1 (no replication).
  `ack_wait_ratio` = all RF3 / 1 RF3: what waiting for the followers costs (Kafka 2014: 0.54).
  A turn on the RF 3 topic ends once its records are on every in-sync replica (loadgen's
  `settle`), its clock still running: an acks=1 producer outruns its followers, and without
  this the backlog it left fell to the acks=all turn after it (which then ran at a quarter of
  its speed while the followers caught up), so neither side measured its own work.
  `replica_efficiency` = 3 x all RF3 / 1 RF1: what replication costs beyond the triple work
  that three replicas sharing one machine's cores and disk cannot avoid.
  `ratio` = all RF3 / 1 RF1, as issue 4 reported it (capped near 1/3 on one machine).
  `cpu_s_per_gib`: CPU seconds of the three node processes (/proc) during the acks=all slices,
  per GiB acknowledged: the number that carries over to bigger machines.
Then acks=all RF 3 at half the throughput just measured: latency p50/p99/p99.9, plotted over
time to `--plot`.
Phase 2, one node against the floor (benchmarks/floor.py, its own process): acks=1 RF 1 to a
single-node cluster and to a server that only appends the Produce bytes with the same group
commit, alternating in slices. `floor_ratio` = node / floor.
The throughput sides are driven by benchmarks.loadgen (the Produce requests a busy librdkafka
producer sends, one full batch per partition, five in flight per broker, built once), so the
client leaves the shared cores to the servers and every side is bound by its server. The
latency phase always uses confluent-kafka (linger.ms 5): a lingering producer sizes its
batches to the load, so its delivery latency is what an application sees at half load.
`--client confluent` uses a confluent-kafka producer (a `produce()` call per record) instead:
the view of a stock client, whose own CPU then caps the fastest sides.
The last stdout line is one JSON object; stderr shows progress and which targets hold.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from rich.table import Table

from benchmarks.common import console, emit_result, mb_per_s, progress
from benchmarks.loadgen import ACKS as LOADGEN_ACKS
from benchmarks.loadgen import produce_load
from raftlog.constants import MIB
from raftlog.testing.cluster import ProcessCluster, free_ports

REPO = Path(__file__).resolve().parents[1]
# benchmarks/out/ is where benchmark artefacts go (git ignores it).
DEFAULT_PLOT = REPO / "benchmarks" / "out" / "replication-latency.png"
RECORD_BYTES = 1024
GIB = 1024 * MIB
SLICES = 2  # alternations of the sides in each phase
WARM_UP_S = 0.5  # at most; a quarter of --seconds when that is shorter
FLUSH_TIMEOUT_S = 60.0
FLOOR_READY_TIMEOUT_S = 30.0
FLOOR_STOP_TIMEOUT_S = 10.0
# The paced producer wakes this often (the producer's linger.ms: bursts between two wake-ups
# would share a batch anyway, and fewer wake-ups leave the nodes more of the shared CPU).
PACE_INTERVAL_MS = 5
REPLICATED = "bench-rf3"
UNREPLICATED = "bench-rf1"
# Loose ISR timing: a follower that falls behind for a moment under full load is not dropped
# (that would turn acks=all into acks=1-with-one-follower and flatter the ratios).
NODE_OVERRIDES: dict[str, Any] = {"replica_lag_time_max_ms": 10_000}
PRODUCER_SETTINGS: dict[str, Any] = {
    "linger.ms": 5,
    # The cap idempotent producers run with: under load, batches grow instead of requests.
    "max.in.flight.requests.per.connection": 5,
    "batch.size": 256 * 1024,
    "queue.buffering.max.kbytes": 64 * 1024,
    "compression.type": "none",
    "enable.idempotence": False,  # idempotence forces acks=all: the acks=1 sides could not use it
    "message.timeout.ms": 60_000,
}
# Issue 19's targets: (result field, comparison, bound).
TARGETS: tuple[tuple[str, str, float], ...] = (
    ("ack_wait_ratio", ">=", 0.7),
    ("replica_efficiency", ">=", 0.9),
    ("floor_ratio", ">=", 0.6),
    ("p99_ms_at_half_load", "<=", 10.0),
    ("p999_ms_at_half_load", "<=", 25.0),
)


@dataclass(frozen=True)
class Side:
    name: str  # the result field prefix, e.g. "acks_all_rf3"
    topic: str
    acks: str


ACKS_ALL_RF3 = Side("acks_all_rf3", REPLICATED, "all")
ACKS1_RF3 = Side("acks1_rf3", REPLICATED, "1")
ACKS1_RF1 = Side("acks1_rf1", UNREPLICATED, "1")
NODE_ACKS1_RF1 = Side("single_node_acks1_rf1", UNREPLICATED, "1")
FLOOR_ACKS1 = Side("floor", UNREPLICATED, "1")


@dataclass
class Totals:
    acked_bytes: int = 0
    elapsed_s: float = 0.0
    cpu_s: float = 0.0  # of the server processes, while this side ran
    errors: int = 0

    @property
    def mb_s(self) -> float:
        return mb_per_s(self.acked_bytes, self.elapsed_s)

    @property
    def cores_busy(self) -> float | None:
        """CPU seconds per second while this side ran: near 1.0 a one-process server was
        CPU-bound; well below, something else (the client, the disk, the machine) held it."""
        return round(self.cpu_s / self.elapsed_s, 2) if self.elapsed_s else None

    @property
    def cpu_s_per_gib(self) -> float | None:
        return round(self.cpu_s / (self.acked_bytes / GIB), 1) if self.acked_bytes else None


# ---------------------------------------------------------------------- measuring
def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds of the processes so far (all their threads), from /proc."""
    ticks = 0
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat").read_text()
        # Fields after "(comm)" (which may hold spaces) start at field 3, state; utime and
        # stime are fields 14 and 15 (proc(5)).
        after_comm = stat[stat.rindex(")") + 2 :].split()
        ticks += int(after_comm[14 - 3]) + int(after_comm[15 - 3])
    return ticks / os.sysconf("SC_CLK_TCK")


class Tally:
    def __init__(self) -> None:
        self.acked_bytes = 0
        self.errors = 0
        self.latencies_s: list[float] = []
        self.acked_at_s: list[float] = []  # time.monotonic() of each latency sample

    def on_delivery(self, error: Any, message: Any) -> None:
        if error is not None:
            self.errors += 1
            return
        self.acked_bytes += len(message.value())
        latency = message.latency()
        if latency is not None:
            self.latencies_s.append(latency)
            self.acked_at_s.append(time.monotonic())


def blast(producer: Producer, topic: str, seconds: float, value: bytes, bar: Any) -> Tally:
    """Produce as fast as the client takes records for `seconds`, then wait for every ack.
    The tally's acked bytes are all the acks; the caller times the whole call."""
    tally = Tally()
    deadline = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < deadline:
        try:
            producer.produce(topic, value=value, on_delivery=tally.on_delivery)
            sent += 1
        except BufferError:
            producer.poll(0.001)
        if sent % 256 == 0:
            producer.poll(0)
            bar.tick()
    remaining = producer.flush(FLUSH_TIMEOUT_S)
    if remaining or tally.errors:
        console.print(f"[red]{topic}: {remaining} unsent, {tally.errors} failed[/red]")
    tally.errors += remaining
    return tally


def paced(
    producer: Producer, topic: str, seconds: float, rate_bytes_s: float, value: bytes, bar: Any
) -> Tally:
    """Produce at `rate_bytes_s` in bursts every PACE_INTERVAL_MS; record latencies."""
    tally = Tally()
    started = time.monotonic()
    interval_s = PACE_INTERVAL_MS / 1000
    per_tick = rate_bytes_s * interval_s / len(value)
    owed = 0.0
    next_tick = started
    while next_tick < started + seconds:
        owed += per_tick
        while owed >= 1:
            producer.produce(topic, value=value, on_delivery=tally.on_delivery)
            owed -= 1
        producer.poll(0)
        bar.tick()
        next_tick += interval_s
        pause = next_tick - time.monotonic()
        if pause > 0:
            producer.poll(pause)  # serves delivery callbacks while it waits
    tally.errors += producer.flush(FLUSH_TIMEOUT_S)
    return tally


# A side's turn: (seconds) -> (acked bytes, errors, seconds it produced for).
SliceRunner = Callable[[float], tuple[int, int, float]]


def confluent_slices(producer: Producer, topic: str, value: bytes, bar: Any) -> SliceRunner:
    def run_slice(seconds: float) -> tuple[int, int, float]:
        started = time.monotonic()
        tally = blast(producer, topic, seconds, value, bar)
        return tally.acked_bytes, tally.errors, time.monotonic() - started

    return run_slice


def loadgen_slices(bootstrap: str, side: Side) -> SliceRunner:
    def run_slice(seconds: float) -> tuple[int, int, float]:
        result = trio.run(
            functools.partial(
                produce_load,
                bootstrap,
                side.topic,
                acks=LOADGEN_ACKS[side.acks],
                seconds=seconds,
                record_bytes=RECORD_BYTES,
                # A replicated side's turn lasts until its records are on every in-sync replica:
                # an acks=1 turn would otherwise hand its followers' backlog to the next turn.
                settle=side.topic == REPLICATED,
            )
        )
        return result.acked_bytes, result.errors, result.seconds

    return run_slice


def alternate(
    sides: list[tuple[Side, SliceRunner, list[int]]], seconds: float, description: str
) -> dict[str, Totals]:
    """Each side produces `seconds` in total, in SLICES turns, the sides taking turns; the
    CPU of each side's server pids is counted over its own turns only."""
    totals = {side.name: Totals() for side, _, _ in sides}
    slice_s = seconds / SLICES
    with progress(description, len(sides) * seconds) as bar:
        for _ in range(SLICES):
            for side, run_slice, pids in sides:
                cpu_before = cpu_seconds(pids)
                acked_bytes, errors, elapsed_s = run_slice(slice_s)
                total = totals[side.name]
                total.elapsed_s += elapsed_s
                total.cpu_s += cpu_seconds(pids) - cpu_before
                total.acked_bytes += acked_bytes
                total.errors += errors
                bar.tick()
    return totals


def slice_runners(
    client: str, bootstrap: str, sides: list[Side], producers: list[Producer], value: bytes
) -> list[SliceRunner]:
    """How each side produces its turns: the side's confluent-kafka producer, or the load
    generator (benchmarks.loadgen) with the same acks, record size and batch size."""
    if client == "loadgen":
        return [loadgen_slices(bootstrap, side) for side in sides]
    return [
        confluent_slices(producer, side.topic, value, _NoBar())
        for side, producer in zip(sides, producers, strict=True)
    ]


def percentile_ms(samples_s: list[float], fraction: float) -> float | None:
    if not samples_s:
        return None
    ordered = sorted(samples_s)
    index = min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)
    return round(ordered[max(0, index)] * 1000, 2)


# ---------------------------------------------------------------------- servers
def create_topics(cluster: ProcessCluster, topics: list[NewTopic]) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    for future in admin.create_topics(topics).values():
        future.result(30)

    def leaders_known() -> bool:
        described = cluster.describe()["topics"]
        return all(
            len(described.get(t.topic, [])) == t.num_partitions
            and all(p["leader_id"] > 0 for p in described[t.topic])
            for t in topics
        )

    cluster.wait_for(leaders_known, "leaders for the benchmark topics")


def make_producer(bootstrap_servers: str, acks: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap_servers, "acks": acks, **PRODUCER_SETTINGS})


def node_pids(cluster: ProcessCluster) -> list[int]:
    return [n.process.pid for n in cluster.nodes.values() if n.process is not None]


@contextmanager
def floor_server(
    directory: Path, partitions: int, flush_policy: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`python -m benchmarks.floor` in its own process; yields (bootstrap servers, process)
    once it accepts connections."""
    directory.mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    log_path = directory / "floor.log"
    command = [
        sys.executable,
        "-m",
        "benchmarks.floor",
        "--port",
        str(port),
        "--dir",
        str(directory / "data"),
        "--partitions",
        str(partitions),
        "--flush-policy",
        flush_policy,
    ]
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(
            command, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        deadline = time.monotonic() + FLOOR_READY_TIMEOUT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the floor server did not start:\n{log_path.read_text()}")
            try:
                process.wait(0.05)  # the poll interval, noticing an exit at once
            except subprocess.TimeoutExpired:
                pass
        yield f"127.0.0.1:{port}", process
    finally:
        process.terminate()
        try:
            process.wait(FLOOR_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# ---------------------------------------------------------------------- phases
@dataclass
class HalfLoad:
    rate_bytes_s: float
    latencies_s: list[float]
    errors: int
    samples: list[tuple[float, float]] = field(default_factory=list)  # (s into phase, ms)


class Stopwatch:
    """Stage lines on stderr with the time since the run began (where a run's time goes)."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def stage(self, what: str) -> None:
        console.print(f"[dim]{time.monotonic() - self.started:6.1f} s[/dim] {what}")


def three_nodes(
    seconds: float,
    partitions: int,
    root: Path,
    overrides: dict[str, Any],
    value: bytes,
    clock: Stopwatch,
    next_cluster: ProcessCluster,
    client: str,
) -> tuple[dict[str, Totals], HalfLoad]:
    """Phase 1. `next_cluster` is started once nothing here is measured any more, so its
    start-up overlaps this cluster's shutdown."""
    clock.stage("starting three nodes")
    with ProcessCluster(root / "three-nodes", 3, overrides) as cluster:
        create_topics(
            cluster,
            [
                NewTopic(REPLICATED, partitions, 3, config={"min.insync.replicas": "2"}),
                NewTopic(UNREPLICATED, partitions, 1),
            ],
        )
        pids = node_pids(cluster)
        sides = [ACKS_ALL_RF3, ACKS1_RF3, ACKS1_RF1]
        producers = [make_producer(cluster.bootstrap_servers, side.acks) for side in sides]
        clock.stage("warming up")
        # Warm up connections and metadata on every side before anything is timed.
        runners = slice_runners(client, cluster.bootstrap_servers, sides, producers, value)
        for side, producer, run_slice in zip(sides, producers, runners, strict=True):
            blast(producer, side.topic, warm_up_s(seconds), value, _NoBar())
            run_slice(warm_up_s(seconds))
        totals = alternate(
            [(side, runner, pids) for side, runner in zip(sides, runners, strict=True)],
            seconds,
            "three nodes: acks=all RF3 | acks=1 RF3 | acks=1 RF1",
        )
        full = totals[ACKS_ALL_RF3.name]
        half_rate = full.acked_bytes / full.elapsed_s / 2 if full.elapsed_s else 0.0
        with progress(f"latency: acks=all RF3 at {half_rate / MIB:.1f} MB/s", seconds / 2) as bar:
            # Always a stock client: a lingering producer sizes its batches to the load,
            # which is what latency at half load means to an application.
            started = time.monotonic()
            tally = paced(producers[0], REPLICATED, seconds / 2, half_rate, value, bar)
            half = HalfLoad(
                half_rate,
                tally.latencies_s,
                tally.errors,
                [
                    (at - started, latency * 1000)
                    for at, latency in zip(tally.acked_at_s, tally.latencies_s, strict=True)
                ],
            )
        for producer in producers:
            producer.flush(0)
        del producers  # librdkafka's threads would keep calling the stopped nodes
        clock.stage("stopping three nodes, starting one")
        next_cluster.start()
    return totals, half


def node_against_floor(
    seconds: float,
    partitions: int,
    single: ProcessCluster,
    floor: tuple[str, subprocess.Popen[bytes]],
    value: bytes,
    clock: Stopwatch,
    client: str,
) -> dict[str, Totals]:
    """Phase 2, on a started single-node cluster and a running floor server."""
    floor_bootstrap, floor_process = floor
    with single:
        create_topics(single, [NewTopic(UNREPLICATED, partitions, 1)])
        node_producer = make_producer(single.bootstrap_servers, "1")
        floor_producer = make_producer(floor_bootstrap, "1")
        clock.stage("warming up")
        [node_runner] = slice_runners(
            client, single.bootstrap_servers, [NODE_ACKS1_RF1], [node_producer], value
        )
        [floor_runner] = slice_runners(
            client, floor_bootstrap, [FLOOR_ACKS1], [floor_producer], value
        )
        for producer, run_slice in ((node_producer, node_runner), (floor_producer, floor_runner)):
            blast(producer, UNREPLICATED, warm_up_s(seconds), value, _NoBar())
            run_slice(warm_up_s(seconds))
        totals = alternate(
            [
                (NODE_ACKS1_RF1, node_runner, node_pids(single)),
                (FLOOR_ACKS1, floor_runner, [floor_process.pid]),
            ],
            seconds,
            "one node | floor: acks=1 RF1",
        )
        del node_producer, floor_producer
        clock.stage("stopping")
    return totals


def warm_up_s(seconds: float) -> float:
    return min(WARM_UP_S, seconds / 4)


# ---------------------------------------------------------------------- results
def run(
    seconds: float,
    partitions: int,
    root: Path,
    flush_policy: str,
    plot_path: Path | None,
    client: str = "loadgen",
) -> dict[str, Any]:
    value = os.urandom(RECORD_BYTES)
    overrides = {**NODE_OVERRIDES, "flush_policy": flush_policy}
    clock = Stopwatch()
    with ExitStack() as stack:
        # The floor idles until it is driven (no timer under flush_policy=always): started
        # first, its start-up overlaps the nodes'.
        floor_running = stack.enter_context(floor_server(root / "floor", partitions, flush_policy))
        single = ProcessCluster(root / "one-node", 1, overrides)
        stack.callback(single.stop)
        totals, half = three_nodes(
            seconds, partitions, root, overrides, value, clock, single, client
        )
        totals.update(
            node_against_floor(seconds, partitions, single, floor_running, value, clock, client)
        )
    all_rf3 = totals[ACKS_ALL_RF3.name].mb_s
    one_rf3 = totals[ACKS1_RF3.name].mb_s
    one_rf1 = totals[ACKS1_RF1.name].mb_s
    node = totals[NODE_ACKS1_RF1.name].mb_s
    floor = totals[FLOOR_ACKS1.name].mb_s
    latencies = half.latencies_s
    plotted = plot_latency(plot_path, half) if plot_path is not None else None
    return {
        "acks_all_rf3_mb_s": all_rf3,
        "acks1_rf3_mb_s": one_rf3,
        "acks1_rf1_mb_s": one_rf1,
        "single_node_acks1_rf1_mb_s": node,
        "floor_mb_s": floor,
        "ratio": _ratio(all_rf3, one_rf1),
        "ack_wait_ratio": _ratio(all_rf3, one_rf3),
        "replica_efficiency": _ratio(3 * all_rf3, one_rf1),
        "floor_ratio": _ratio(node, floor),
        "p50_ms_at_half_load": percentile_ms(latencies, 0.50),
        "p99_ms_at_half_load": percentile_ms(latencies, 0.99),
        "p999_ms_at_half_load": percentile_ms(latencies, 0.999),
        "mean_ms_at_half_load": round(statistics.fmean(latencies) * 1000, 2) if latencies else None,
        "max_ms_at_half_load": round(max(latencies) * 1000, 2) if latencies else None,
        "half_load_mb_s": round(half.rate_bytes_s / MIB, 2),
        "latency_samples": len(latencies),
        "cpu_s_per_gib": totals[ACKS_ALL_RF3.name].cpu_s_per_gib,
        "acks1_rf3_cpu_s_per_gib": totals[ACKS1_RF3.name].cpu_s_per_gib,
        "acks1_rf1_cpu_s_per_gib": totals[ACKS1_RF1.name].cpu_s_per_gib,
        "single_node_cpu_s_per_gib": totals[NODE_ACKS1_RF1.name].cpu_s_per_gib,
        "floor_cpu_s_per_gib": totals[FLOOR_ACKS1.name].cpu_s_per_gib,
        "single_node_cores_busy": totals[NODE_ACKS1_RF1.name].cores_busy,
        "floor_cores_busy": totals[FLOOR_ACKS1.name].cores_busy,
        "delivery_errors": sum(t.errors for t in totals.values()) + half.errors,
        "seconds_per_side": seconds,
        "partitions": partitions,
        "record_bytes": RECORD_BYTES,
        "flush_policy": flush_policy,
        "client": client,
        "plot": str(plotted) if plotted is not None else None,
    }


def _ratio(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 3) if denominator else None


def plot_latency(path: Path, half: HalfLoad) -> Path | None:
    """Ack latency over time in the half-load phase, with its percentiles and the targets."""
    try:
        import matplotlib
    except ImportError:
        console.print("[yellow]matplotlib is not installed: no latency plot[/yellow]")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 4))
    ax.scatter([s for s, _ in half.samples], [ms for _, ms in half.samples], s=2)
    latencies = half.latencies_s
    for fraction, color in ((0.5, "tab:green"), (0.99, "tab:orange"), (0.999, "tab:red")):
        value = percentile_ms(latencies, fraction)
        if value is not None:
            ax.axhline(value, color=color, linewidth=1, label=f"p{fraction * 100:g} {value} ms")
    bounds = [bound for name, _, bound in TARGETS if name.endswith("_at_half_load")]
    for i, bound in enumerate(bounds):
        label = "targets (p99, p99.9)" if i == 0 else None
        ax.axhline(bound, color="grey", linestyle="--", linewidth=1, label=label)
    ax.set_yscale("log")
    ax.set_title(f"acks=all RF 3 at {half.rate_bytes_s / MIB:.1f} MB/s (half the measured maximum)")
    ax.set_xlabel("time into the phase (s)")
    ax.set_ylabel("ack latency (ms)")
    ax.legend(loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def show_targets(result: dict[str, Any]) -> None:
    table = Table(title="issue 19 targets")
    for column in ("measure", "value", "target", "holds"):
        table.add_column(column)
    for name, comparison, bound in TARGETS:
        value = result[name]
        if value is None:
            holds = "[yellow]no data[/yellow]"
        elif (value >= bound) if comparison == ">=" else (value <= bound):
            holds = "[green]yes[/green]"
        else:
            holds = "[red]no[/red]"
        table.add_row(name, str(value), f"{comparison} {bound:g}", holds)
    console.print(table)


class _NoBar:
    def tick(self) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="produce time per side")
    parser.add_argument("--partitions", type=int, default=6, help="partitions per topic")
    parser.add_argument("--dir", type=Path, default=None, help="node data (default: tmp)")
    parser.add_argument(
        "--plot",
        type=Path,
        default=DEFAULT_PLOT,
        help=f"where the half-load latency plot goes (default {DEFAULT_PLOT})",
    )
    parser.add_argument(
        "--flush-policy",
        choices=("always", "interval"),
        default="always",
        help="the nodes' (and the floor's) flush_policy: always (fsync before acks, the "
        "default) or interval (Kafka's default: trust replication)",
    )
    parser.add_argument(
        "--client",
        choices=("loadgen", "confluent"),
        default="loadgen",
        help="what produces on the throughput sides: a confluent-kafka producer (a produce() "
        "call per record) or benchmarks.loadgen (the same Produce requests built once, so the "
        "client takes little of the shared CPU); the latency phase always uses confluent-kafka",
    )
    args = parser.parse_args()
    if args.seconds <= 0 or not 1 <= args.partitions <= 1000:
        parser.error("--seconds must be positive and --partitions in 1..1000")
    if args.dir is not None:
        result = run(
            args.seconds, args.partitions, args.dir, args.flush_policy, args.plot, args.client
        )
    else:
        with tempfile.TemporaryDirectory(prefix="raftlog-bench-") as tmp:
            result = run(
                args.seconds, args.partitions, Path(tmp), args.flush_policy, args.plot, args.client
            )
    show_targets(result)
    emit_result(result)


if __name__ == "__main__":
    main()
