"""Failover benchmark: how long a stock acks=all producer sees no acknowledgement when the
leader of its partition is killed (`kill -9`) or cut off the network.

    python -m benchmarks.failover [--kills 10] [--isolations 5] [--rate 200]
                                  [--timings default|fast] [--plot failover.png]

Three real node processes (raftlog.testing.cluster.ProcessCluster) with the production
defaults of every liveness setting (`--timings fast` uses the test harness's instead), one
RF 3 single-partition topic, and one confluent-kafka producer with nothing set but
`acks=all`, producing at a steady `--rate` from its own thread. Each event kills the node
that leads partition 0 at that moment (it may also be the metadata leader: both cases
happen), waits until messages sent after the kill are acknowledged, restarts the node and
waits until it is back in the ISR.

The unavailability window of an event is the longest gap between two consecutive
acknowledgements from one second before the event to the first acknowledgement of a message
sent after it: "the last ack before to the first ack after", without letting an ack already
on its way at the kill end the window early. The same gap measured over quiet stretches
(`steady_max_gap_s`) is the baseline: what the window would be if nothing happened.

Isolations (`--isolations`) run on a second cluster whose nodes live in network namespaces
(jepsen.netns: a bridge, and nftables drops between namespaces). The leader of partition 0
is cut off from the other nodes; the producer (in the root namespace) still reaches every
node, as Jepsen's clients do. Without root, `ip` or `nft` the isolate_* results are null and
`isolate_skipped` says why. An event not recovered within `--recovery-timeout` counts as that
long (a lower bound; `*_recovered` says which), and the network is healed after it.

Last stdout line: {"kill_median_s", "kill_max_s", "isolate_median_s", "isolate_max_s", ...
the per-event windows and which node was killed}. A PNG of ack latency over time with the
events marked goes to `--plot`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from benchmarks.common import console, emit_result
from raftlog.config import NodeConfig
from raftlog.testing.cluster import FAST_TIMINGS

TOPIC = "failover-bench"
VALUE_BYTES = 100
# Acks must flow this long (and the cluster be whole) before an event, so windows do not
# overlap the recovery from the previous one.
SETTLE_S = 3.0
# The window looks back this far before an event (an ack in flight at the kill is not "the
# last ack before").
LOOKBACK_S = 1.0
# An event whose producer has not recovered by then (--recovery-timeout) is reported with
# this as its window and `recovered` false: a lower bound.
RECOVERY_TIMEOUT_S = [60.0]
READY_TIMEOUT_S = 120.0
CLIENT_TIMEOUT_S = 30.0
TARGETS = {"kill_median_s": 2.0, "kill_max_s": 4.0}
# librdkafka's `debug` setting for the producer (--client-debug); empty: none.
CLIENT_DEBUG = [""]
NETNS_NODES = ("n1", "n2", "n3")
NETNS_CLIENT_PORT = 9092
NETNS_INTERNAL_PORT = 9093


def default_timings() -> dict[str, Any]:
    """The production defaults of every key the test harness shortens."""
    defaults = NodeConfig()
    return {key: getattr(defaults, key) for key in FAST_TIMINGS}


# ---------------------------------------------------------------------- the producer
@dataclass
class AckLog:
    """(sent, acked) monotonic times of every acknowledged message, and failures."""

    acks: list[tuple[float, float]] = field(default_factory=list)
    errors: list[tuple[float, str]] = field(default_factory=list)
    # offset -> value of every acknowledged message: what must still be there afterwards.
    acked_values: dict[int, bytes] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, sent: float, err: Any, offset: int = -1, value: bytes = b"") -> None:
        now = time.monotonic()
        with self.lock:
            if err is None:
                self.acks.append((sent, now))
                if offset >= 0:
                    self.acked_values[offset] = value
            else:
                self.errors.append((now, str(err)))

    def snapshot(self) -> list[tuple[float, float]]:
        with self.lock:
            return list(self.acks)

    def acked_sent_after(self, t: float) -> bool:
        with self.lock:
            return any(sent > t for sent, _ in reversed(self.acks[-200:]))


class SteadyProducer:
    """A stock acks=all producer sending `rate` messages a second from its own thread."""

    def __init__(self, bootstrap: str, rate: float, debug: str = "") -> None:
        from confluent_kafka import Producer

        settings = {"bootstrap.servers": bootstrap, "acks": "all"}
        if debug:  # librdkafka's own trace (e.g. "metadata,topic"), to see what it waited on
            settings["debug"] = debug
        self.producer = Producer(settings)
        self.period_s = 1.0 / rate
        self.log = AckLog()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-producer", daemon=True)

    def __enter__(self) -> SteadyProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.producer.flush(5)

    def _delivered(self, sent: float, err: Any, msg: Any) -> None:
        if err is None:
            self.log.record(sent, err, msg.offset(), msg.value())
        else:
            self.log.record(sent, err)

    def _run(self) -> None:
        next_s = time.monotonic()
        for seq in itertools.count():
            if self._stop.is_set():
                break
            sent = time.monotonic()
            self.producer.produce(
                TOPIC,
                # Every value distinct, so an acknowledged message can be found afterwards.
                str(seq).encode().rjust(VALUE_BYTES, b"x"),
                partition=0,
                on_delivery=functools.partial(self._delivered, sent),
            )
            next_s += self.period_s
            # Serves delivery reports while pacing; a late loop catches up without a burst.
            self.producer.poll(max(0.0, next_s - time.monotonic()))
            next_s = max(next_s, time.monotonic() - self.period_s)


def lost_acks(bootstrap: str, acked: dict[int, bytes]) -> list[int]:
    """Offsets of acknowledged messages that partition 0 no longer holds with their value
    (read from the start up to the high watermark): must be empty."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "failover-check", "enable.auto.commit": False}
    )
    try:
        _low, high = consumer.get_watermark_offsets(
            TopicPartition(TOPIC, 0), timeout=CLIENT_TIMEOUT_S
        )
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        held: dict[int, bytes | None] = {}
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(held) < high and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=1.0):
                offset = msg.offset()
                if msg.error() is None and offset is not None:
                    held[offset] = msg.value()
    finally:
        consumer.close()
    return sorted(o for o, value in acked.items() if held.get(o) != value)


def window_s(acks: list[tuple[float, float]], event_s: float) -> float | None:
    """The longest gap between consecutive acks from LOOKBACK_S before the event up to the
    first ack of a message sent after it (None: no such ack yet)."""
    recovered = min((acked for sent, acked in acks if sent > event_s), default=None)
    if recovered is None:
        return None
    times = sorted(acked for _, acked in acks if event_s - LOOKBACK_S <= acked <= recovered)
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def max_gap_s(acks: list[tuple[float, float]], start_s: float, end_s: float) -> float:
    times = sorted(acked for _, acked in acks if start_s <= acked <= end_s)
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


@dataclass
class Event:
    kind: str  # "kill" or "isolate"
    node_id: int
    was_controller: bool
    at_s: float
    window_s: float | None = None
    recovered: bool = True


# ---------------------------------------------------------------------- cluster access
@dataclass
class Nodes:
    """What an event loop needs of a cluster, whichever harness runs it."""

    # (leader id, controller id) of partition 0 once every node is up, unfenced, in its ISR
    # and agrees on it (agreed_partition_0); None until then.
    agreed: Callable[[], tuple[int, int] | None]


def agreed_partition_0(views: list[dict[str, Any]], node_ids: set[int]) -> tuple[int, int] | None:
    """(leader, controller) of partition 0 if every node's view lists every node as a live
    broker and agrees on partition 0 (leader, leader epoch, a full ISR); else None. One
    node's view is not enough: a node just healed or restarted may still hold a stale one
    (it would name a leader that no longer leads, and the event would miss it)."""
    seen = set()
    for view in views:
        if {b["node_id"] for b in view["brokers"]} != node_ids:
            return None
        part = next(p for p in view["topics"][TOPIC] if p["partition"] == 0)
        if part["leader_id"] < 0 or set(part["isr"]) != node_ids:
            return None
        seen.add((part["leader_id"], part["leader_epoch"], view["controller_id"]))
    if len(seen) != 1:
        return None
    ((leader, _epoch, controller),) = seen
    return leader, controller


T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], what: str, timeout_s: float) -> T:
    """The first truthy value of `probe()`, polled until the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # a node still starting refuses connections
            value = probe()
            if value:
                return value
        time.sleep(0.1)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float) -> None:
    wait_for(lambda: predicate() or None, what, timeout_s)


def create_topic(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 3)])[TOPIC].result(CLIENT_TIMEOUT_S)


def run_events(
    kind: str,
    count: int,
    nodes: Nodes,
    producer: SteadyProducer,
    disrupt: Callable[[int], None],
    repair: Callable[[int], None],
    settle_s: float,
    on_event: Callable[[Event], None],
) -> tuple[list[Event], list[float]]:
    """`count` events; returns them and the max ack gap of each quiet stretch before one."""
    events: list[Event] = []
    quiet_gaps: list[float] = []
    for _ in range(count):
        wait_for(nodes.agreed, "the cluster to be whole again", READY_TIMEOUT_S)
        quiet_from = time.monotonic()
        flowing_after = quiet_from + settle_s
        wait_until(
            lambda: producer.log.acked_sent_after(flowing_after),  # noqa: B023 - used at once
            "acks to flow",
            READY_TIMEOUT_S,
        )
        leader, controller = wait_for(
            nodes.agreed, "the nodes to agree on the leader of partition 0", READY_TIMEOUT_S
        )
        quiet_gaps.append(max_gap_s(producer.log.snapshot(), quiet_from, time.monotonic()))
        disrupt(leader)
        # The event starts once the disruption is in place: applying nftables rules takes
        # tens of ms, and a message sent and acknowledged before the cut took effect would
        # end the event before it began.
        event = Event(kind, leader, leader == controller, time.monotonic())
        deadline = event.at_s + RECOVERY_TIMEOUT_S[0]
        while time.monotonic() < deadline and not producer.log.acked_sent_after(event.at_s):
            time.sleep(0.05)
        event.window_s = window_s(producer.log.snapshot(), event.at_s)
        if event.window_s is None:
            event.window_s, event.recovered = RECOVERY_TIMEOUT_S[0], False
        events.append(event)
        on_event(event)
        repair(leader)
    return events, quiet_gaps


# ---------------------------------------------------------------------- kills
def kill_events(
    root: Path, count: int, rate: float, timings: dict[str, Any], settle_s: float, bar: Any
) -> tuple[list[Event], list[float], list[tuple[float, float]], float, list[int]]:
    from raftlog.testing.cluster import ProcessCluster

    cluster = ProcessCluster(root, 3, overrides=timings)
    with cluster:
        create_topic(cluster.bootstrap_servers)

        def agreed() -> tuple[int, int] | None:
            running = {n.node_id for n in cluster.nodes.values() if n.running}
            return agreed_partition_0([cluster.describe(i) for i in sorted(running)], running)

        with SteadyProducer(cluster.bootstrap_servers, rate, CLIENT_DEBUG[0]) as producer:
            started = time.monotonic()
            events, quiet = run_events(
                "kill",
                count,
                Nodes(agreed),
                producer,
                cluster.kill,
                cluster.start,
                settle_s,
                lambda _e: bar(),
            )
            acks = producer.log.snapshot()
        wait_for(agreed, "the cluster to be whole again", READY_TIMEOUT_S)
        lost = lost_acks(cluster.bootstrap_servers, producer.log.acked_values)
    return events, quiet, acks, started, lost


# ---------------------------------------------------------------------- isolations
def netns_unavailable() -> str | None:
    try:
        from jepsen import netns
    except ImportError as exc:  # pragma: no cover - the harness ships with the repository
        return f"jepsen.netns cannot be imported: {exc}"
    missing = netns.missing_prerequisites()
    return "; ".join(missing) if missing else None


@contextlib.contextmanager
def netns_cluster(root: Path, timings: dict[str, Any]) -> Iterator[Any]:
    """Three nodes, each in its own namespace on a private bridge; yields the network
    (jepsen.netns.RunNetwork)."""
    import uuid

    from jepsen import netns

    net = netns.create_network(NETNS_NODES)
    processes: dict[str, Any] = {}
    configs: dict[str, Path] = {}
    try:
        voters = ",".join(
            f"{i}@{net.address(n)}:{NETNS_INTERNAL_PORT}" for i, n in enumerate(NETNS_NODES, 1)
        )
        cluster_id = uuid.uuid4().hex
        for i, name in enumerate(NETNS_NODES, 1):
            node_dir = root / name
            (node_dir / "data").mkdir(parents=True, exist_ok=True)
            address = net.address(name)
            config = NodeConfig.from_dict(
                {
                    "node_id": i,
                    "data_dir": str(node_dir / "data"),
                    "cluster_id": cluster_id,
                    "client_listener": f"{address}:{NETNS_CLIENT_PORT}",
                    "internal_listener": f"{address}:{NETNS_INTERNAL_PORT}",
                    "controller_quorum_voters": voters,
                    "default_replication_factor": 3,
                    **timings,
                }
            )
            configs[name] = node_dir / "node.toml"
            configs[name].write_text(config.to_toml())

        def start(name: str) -> None:
            if name in processes and processes[name].poll() is None:
                return
            argv = [sys.executable, "-m", "raftlog_cli.main", "node", "--config"]
            with (root / name / "node.log").open("ab") as log_file:
                processes[name] = subprocess.Popen(
                    net.exec_argv(name, [*argv, str(configs[name])]),
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )

        for name in NETNS_NODES:
            start(name)
        yield net
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.terminate()
        for process in processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        net.destroy()


def isolation_events(
    root: Path, count: int, rate: float, timings: dict[str, Any], settle_s: float, bar: Any
) -> tuple[list[Event], list[float], list[tuple[float, float]], float, list[int]]:
    import trio

    from raftlog.testing.probe import probe_metadata

    with netns_cluster(root, timings) as net:
        addresses = {
            i: f"{net.address(n)}:{NETNS_CLIENT_PORT}" for i, n in enumerate(NETNS_NODES, 1)
        }
        bootstrap = ",".join(addresses.values())
        name_of = {i: n for i, n in enumerate(NETNS_NODES, 1)}

        def agreed() -> tuple[int, int] | None:
            views = [probe_metadata(address) for address in addresses.values()]
            return agreed_partition_0(views, set(addresses))

        def isolate(node_id: int) -> None:
            victim = name_of[node_id]
            others = [n for n in NETNS_NODES if n != victim]
            grudge = {victim: others, **{n: [victim] for n in others}}
            trio.run(net.apply_grudge, grudge)

        def heal(_node_id: int) -> None:
            trio.run(net.heal)

        wait_until(
            lambda: all(
                {b["node_id"] for b in probe_metadata(a)["brokers"]} == set(addresses)
                for a in addresses.values()
            ),
            "the namespaced nodes to be up and unfenced",
            READY_TIMEOUT_S,
        )
        create_topic(bootstrap)
        with SteadyProducer(bootstrap, rate, CLIENT_DEBUG[0]) as producer:
            started = time.monotonic()
            events, quiet = run_events(
                "isolate",
                count,
                Nodes(agreed),
                producer,
                isolate,
                heal,
                settle_s,
                lambda _e: bar(),
            )
            acks = producer.log.snapshot()
        # Healed nodes rejoin as followers: everyone agrees again, with a full ISR.
        wait_for(agreed, "the cluster to be whole again", READY_TIMEOUT_S)
        lost = lost_acks(bootstrap, producer.log.acked_values)
    return events, quiet, acks, started, lost


# ---------------------------------------------------------------------- results
def plot(
    path: Path,
    runs: list[tuple[str, list[tuple[float, float]], list[Event], float]],
) -> None:
    """Ack latency against send time for each run, the events marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 3.5 * len(runs)), squeeze=False)
    for ax, (title, acks, events, started) in zip(axes[:, 0], runs, strict=True):
        ax.scatter(
            [sent - started for sent, _ in acks],
            [acked - sent for sent, acked in acks],
            s=2,
            color="tab:blue",
        )
        for event in events:
            color = "tab:red" if event.kind == "kill" else "tab:orange"
            ax.axvline(event.at_s - started, color=color, linewidth=1)
            ax.annotate(
                f"{event.kind} {event.node_id}: {event.window_s:.2f} s",
                (event.at_s - started, ax.get_ylim()[1] if ax.has_data() else 1),
                rotation=90,
                fontsize=7,
                va="top",
            )
        ax.set_title(title)
        ax.set_xlabel("send time (s)")
        ax.set_ylabel("ack latency (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(events: list[Event]) -> tuple[float | None, float | None]:
    windows = [e.window_s for e in events if e.window_s is not None]
    if not windows:
        return None, None
    return round(statistics.median(windows), 3), round(max(windows), 3)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--isolations", type=int, default=5)
    parser.add_argument("--rate", type=float, default=200.0, help="messages per second")
    parser.add_argument("--settle", type=float, default=SETTLE_S, help="seconds before events")
    parser.add_argument(
        "--recovery-timeout",
        type=float,
        default=RECOVERY_TIMEOUT_S[0],
        help="seconds an event may take; a longer one is reported as this, not recovered",
    )
    parser.add_argument("--timings", choices=("default", "fast"), default="default")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a node config key for both clusters (e.g. broker_unreachable_fence_ms=9000)",
    )
    parser.add_argument(
        "--client-debug", default="", help="librdkafka debug contexts for the producer (stderr)"
    )
    parser.add_argument("--plot", type=Path, default=Path("failover.png"))
    parser.add_argument("--dir", type=Path, default=None, help="keep node data and logs here")
    args = parser.parse_args(argv)
    if args.kills < 1 or args.isolations < 0 or args.rate <= 0:
        parser.error("need --kills >= 1, --isolations >= 0, --rate > 0")

    CLIENT_DEBUG[0] = args.client_debug
    RECOVERY_TIMEOUT_S[0] = args.recovery_timeout
    timings = default_timings() if args.timings == "default" else dict(FAST_TIMINGS)
    for item in args.set:
        key, _, value = item.partition("=")
        timings[key] = int(value) if value.lstrip("-").isdigit() else value
    skipped = None if args.isolations else "--isolations 0"
    if skipped is None:
        skipped = netns_unavailable()

    with contextlib.ExitStack() as stack:
        root = args.dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("kill -9 the leader of partition 0", total=args.kills)
            kills, kill_quiet, kill_acks, kill_started, kill_lost = kill_events(
                root / "kills",
                args.kills,
                args.rate,
                timings,
                args.settle,
                lambda: progress.advance(task),
            )
            isolations: list[Event] = []
            iso_quiet: list[float] = []
            iso_lost: list[int] = []
            runs = [("kill -9 of the leader of partition 0", kill_acks, kills, kill_started)]
            if skipped is None:
                task = progress.add_task("isolate the leader of partition 0", total=args.isolations)
                isolations, iso_quiet, iso_acks, iso_started, iso_lost = isolation_events(
                    root / "isolations",
                    args.isolations,
                    args.rate,
                    timings,
                    args.settle,
                    lambda: progress.advance(task),
                )
                runs.append(
                    ("leader of partition 0 cut off (netns)", iso_acks, isolations, iso_started)
                )
        plot(args.plot, runs)

    for event in kills + isolations:
        console.print(
            f"{event.kind} node {event.node_id}"
            f"{' (also the controller)' if event.was_controller else ''}: "
            f"{event.window_s:.3f} s{'' if event.recovered else ' (not recovered)'}"
        )
    kill_median, kill_max = summary(kills)
    iso_median, iso_max = summary(isolations)
    emit_result(
        {
            "kill_median_s": kill_median,
            "kill_max_s": kill_max,
            "isolate_median_s": iso_median,
            "isolate_max_s": iso_max,
            "kill_windows_s": [round(e.window_s or 0.0, 3) for e in kills],
            "kill_was_controller": [e.was_controller for e in kills],
            "isolate_windows_s": [round(e.window_s or 0.0, 3) for e in isolations],
            "isolate_was_controller": [e.was_controller for e in isolations],
            "kill_recovered": [e.recovered for e in kills],
            "isolate_recovered": [e.recovered for e in isolations],
            "recovery_timeout_s": args.recovery_timeout,
            "isolate_skipped": skipped,
            # Acknowledged messages no longer held with their value at the end: must be 0.
            "kill_lost_acks": len(kill_lost),
            "isolate_lost_acks": len(iso_lost),
            "steady_max_gap_s": round(max(kill_quiet + iso_quiet, default=0.0), 3),
            "rate_per_s": args.rate,
            "timings": args.timings,
            "overrides": args.set,
            "targets": TARGETS,
            "plot": str(args.plot),
        }
    )


if __name__ == "__main__":
    main()
