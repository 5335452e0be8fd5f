"""One run: namespaces, cluster, workload under a nemesis, heal, final reads, check, report.

    run_dir = new_run_dir()             jepsen/store/<timestamp>[-name]/
    network = create_network(nodes)     namespaces + bridge (always torn down, also at exit)
    cluster up, topic created           real `raftlog node` processes
    workload || nemesis || progress     until the time limit
    heal everything, wait for recovery, final reads
    cluster down, namespaces gone
    check -> results.json, render -> PNGs + summary.txt

Everything a run writes lives in its run directory: history.jsonl (streamed while running),
harness.log (this harness and librdkafka), nodes/<name>/{node.toml,node.log,data/}.
"""

from __future__ import annotations

import atexit
import logging
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio

from jepsen.cluster import Cluster, ClusterOptions
from jepsen.history import COMPLETION_TYPES, HistoryWriter, Op, Recorder
from jepsen.nemesis import Nemesis, split_kind
from jepsen.netns import create_network, missing_prerequisites
from jepsen.store import HISTORY_FILE, NODES_DIR, RESULTS_FILE, STORE_ROOT, new_run_dir
from jepsen.txn_history import TxnRecorder
from jepsen.txn_workload import TxnWorkload, TxnWorkloadOptions
from jepsen.workload import Workload, WorkloadOptions

log = logging.getLogger("jepsen.runner")

HARNESS_LOG = "harness.log"
# Start-up: processes spawned -> quorum elected -> topic created with leaders.
STARTUP_TIMEOUT_S = 60.0
# After healing, the cluster gets this long to elect leaders again before final reads start
# anyway (a cluster that never recovers shows up as unseen writes, which is the verdict).
RECOVERY_TIMEOUT_S = 60.0
# history.jsonl is written by a flusher this often, so a crashed harness keeps most of it.
HISTORY_FLUSH_INTERVAL_S = 1.0
PROGRESS_REFRESH_S = 0.5
# The writer never flushes on its own (the flusher task does, in a worker thread).
NEVER_FLUSH_OPS = 2**62


@dataclass(frozen=True)
class RunOptions:
    nodes: int = 3
    time_limit_s: float = 60.0
    nemesis: tuple[str, ...] = ("kill", "partition")
    nemesis_interval_s: float = 10.0
    unsafe: bool = False
    # SASL_SSL clients, mutual TLS between nodes, the authorizer (jepsen.secure).
    secure: bool = False
    seed: int | None = None
    name: str | None = None
    senders: int = 4
    pollers: int = 2
    progress: bool = True
    store_root: Path = STORE_ROOT
    # "queue" (jepsen.workload) or "txn" (jepsen.txn_workload: transactions).
    workload: str = "queue"


@dataclass
class RunOutcome:
    run_dir: Path
    results: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return bool(self.results.get("valid"))


def unavailable_reason() -> str | None:
    """Why a run cannot happen on this machine or checkout (None: it can)."""
    try:
        import raftlog.node
        from raftlog.node import run_node  # noqa: F401
    except ImportError as exc:
        return f"the node cannot run yet (raftlog.node.run_node not importable: {exc})"
    # A node still being assembled may import but not yet open its Kafka listener (the
    # one the workload talks to): its source never reads the client listener's address.
    source = Path(raftlog.node.__file__).read_text(encoding="utf-8")
    if "client_address" not in source and "client_listener" not in source:
        return "the node does not serve Kafka clients yet (raftlog.node opens no client listener)"
    missing = missing_prerequisites()
    if missing:
        return "cannot create network namespaces: " + "; ".join(missing)
    return None


def run(opts: RunOptions) -> RunOutcome:
    """A whole run, blocking. Namespaces and processes are removed whatever happens."""
    if opts.nodes not in (3, 5):
        raise ValueError(f"--nodes must be 3 or 5, got {opts.nodes}")
    seed = opts.seed if opts.seed is not None else random.randrange(2**32)
    run_dir = new_run_dir(opts.store_root, opts.name)
    handler = _log_to(run_dir / HARNESS_LOG)
    cluster_opts = ClusterOptions(
        nodes=opts.nodes,
        unsafe=opts.unsafe,
        secure=opts.secure,
        spare=needs_spare(opts.nemesis),
    )
    net = create_network(cluster_opts.all_node_names)
    atexit.register(net.destroy)
    try:
        log.info("run %s seed %d options %s", run_dir.name, seed, opts)
        history_meta = {
            "run": run_dir.name,
            "seed": seed,
            "nodes": opts.nodes,
            "time_limit_s": opts.time_limit_s,
            "nemesis": list(opts.nemesis),
            "nemesis_interval_s": opts.nemesis_interval_s,
            "unsafe": opts.unsafe,
            "secure": opts.secure,
            "topic": cluster_opts.topic,
            "partitions": cluster_opts.partitions,
        }
        if opts.workload != "queue":
            history_meta["workload"] = opts.workload
        try:
            warnings = trio.run(_run_async, opts, cluster_opts, net, run_dir, seed, history_meta)
        except BaseExceptionGroup as group:
            raise _single_cause(group) from group
    finally:
        net.destroy()
        atexit.unregister(net.destroy)
        logging.getLogger().removeHandler(handler)
        handler.close()
    results = _check_and_render(run_dir, warnings)
    return RunOutcome(run_dir, results, warnings)


def needs_spare(nemesis: tuple[str, ...]) -> bool:
    """Whether the run's nemeses include membership faults (which use a spare node)."""
    return any((split_kind(entry) or ("",))[0] == "membership" for entry in nemesis)


class RunError(RuntimeError):
    """The run could not complete (the cluster did not start, a tool failed); the run
    directory keeps what was recorded and the node logs."""


def _single_cause(group: BaseExceptionGroup) -> BaseException:
    """Nurseries wrap errors in groups; a person wants the one error that stopped the run."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for sub in exc.exceptions:
                walk(sub)
        else:
            leaves.append(exc)

    walk(group)
    if len(leaves) == 1 and isinstance(leaves[0], Exception):
        return RunError(str(leaves[0]))
    if any(isinstance(e, KeyboardInterrupt) for e in leaves):
        return KeyboardInterrupt()
    return RunError("; ".join(repr(e) for e in leaves))


def _log_to(path: Path) -> logging.Handler:
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    return handler


def _check_and_render(run_dir: Path, warnings: list[str]) -> dict[str, Any]:
    from jepsen.checker import check, write_results
    from jepsen.history import read_history
    from jepsen.report import render

    history = read_history(run_dir / HISTORY_FILE)
    results = check(history)
    results.setdefault("warnings", []).extend(warnings)
    write_results(run_dir / RESULTS_FILE, results)
    render(run_dir, history, results)
    return results


class HistorySink:
    """Collects recorded entries in trio and writes them from a worker thread, one batch at
    a time: the writer is only ever touched by the flushing call, never concurrently."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.writer = HistoryWriter(path, meta, flush_every_ops=NEVER_FLUSH_OPS)
        self.pending: list[Op] = []
        self.counts: Counter[tuple[str, str]] = Counter()

    def append(self, op: Op) -> None:
        self.pending.append(op)
        if op.type in COMPLETION_TYPES and not op.is_nemesis:
            self.counts[(op.f, op.type)] += 1

    async def flush(self) -> None:
        batch, self.pending = self.pending, []

        def write() -> None:
            for op in batch:
                self.writer.append(op)
            self.writer.flush()

        await trio.to_thread.run_sync(write)

    async def flush_forever(self) -> None:
        while True:
            await trio.sleep(HISTORY_FLUSH_INTERVAL_S)
            await self.flush()


async def _run_async(
    opts: RunOptions,
    cluster_opts: ClusterOptions,
    net: Any,
    run_dir: Path,
    seed: int,
    meta: dict[str, Any],
) -> list[str]:
    warnings: list[str] = []
    rng = random.Random(seed)
    cluster = Cluster.create(net, run_dir / NODES_DIR, cluster_opts)
    sink = HistorySink(run_dir / HISTORY_FILE, meta)
    status = Status(opts, cluster, sink)
    try:
        async with trio.open_nursery() as outer:
            if opts.progress:
                outer.start_soon(status.display)
            outer.start_soon(sink.flush_forever)
            status.phase = "starting cluster"
            await cluster.start_all()
            await _create_topic(cluster)

            t0 = trio.current_time()
            recorder = (TxnRecorder if opts.workload == "txn" else Recorder)(
                lambda: int((trio.current_time() - t0) * 1e9), time.time, sink=sink.append
            )
            workload: Workload | TxnWorkload
            if opts.workload == "txn":
                workload = TxnWorkload(
                    cluster.bootstrap_servers,
                    TxnWorkloadOptions(
                        topic=cluster_opts.topic,
                        keys=cluster_opts.partitions,
                        txn_processes=opts.senders,
                        pollers=opts.pollers,
                    ),
                    recorder,
                    random.Random(rng.getrandbits(64)),
                    run_dir.name,
                    client_config=cluster.librdkafka_config(),
                )
            else:
                workload = Workload(
                    cluster.bootstrap_servers,
                    WorkloadOptions(
                        topic=cluster_opts.topic,
                        keys=cluster_opts.partitions,
                        senders=opts.senders,
                        pollers=opts.pollers,
                        unsafe=opts.unsafe,
                    ),
                    recorder,
                    random.Random(rng.getrandbits(64)),
                    run_dir.name,
                    client_config=cluster.librdkafka_config(),
                )
            nemesis = Nemesis(
                cluster,
                opts.nemesis,
                recorder,
                random.Random(rng.getrandbits(64)),
                opts.nemesis_interval_s,
            )
            status.nemesis, status.t0 = nemesis, t0
            status.phase = "workload"
            async with trio.open_nursery() as inner:
                inner.start_soon(nemesis.run)
                await workload.run(t0 + opts.time_limit_s)
                status.phase = "healing"
                inner.cancel_scope.cancel()  # nemesis.run heals everything on its way out
            status.phase = "waiting for recovery"
            try:
                await cluster.wait_ready(RECOVERY_TIMEOUT_S)
            except TimeoutError as exc:
                warnings.append(f"cluster had not recovered before the final reads: {exc}")
                log.warning("%s", warnings[-1])
            status.phase = "final reads"
            done = await workload.final_reads()
            unfinished = sorted(p for p, ok in done.items() if not ok)
            if unfinished:
                warnings.append(f"final reads of processes {unfinished} did not reach the end")
            status.phase = "stopping cluster"
            await cluster.stop_all()
            outer.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await cluster.stop_all(grace_s=1.0)
            await sink.flush()
            await trio.to_thread.run_sync(sink.writer.close)
            status.close()
    return warnings


async def _create_topic(cluster: Cluster) -> None:
    """Wait for a quorum, create the topic (retrying while the controller settles), wait for
    every partition to have a leader."""
    await cluster.wait_ready(STARTUP_TIMEOUT_S, topic=False)
    last: Exception | None = None
    created = False
    with trio.move_on_after(STARTUP_TIMEOUT_S):
        while not created:
            try:
                await cluster.create_topic()
                created = True
            except Exception as exc:  # retried until the deadline, then reported
                last = exc
                log.info("create topic: %r (retrying)", exc)
                await trio.sleep(1.0)
    # A creation whose answer was lost (a timeout) may still have happened: the leaders say.
    if not created and not await cluster.partition_leaders():
        raise RuntimeError(f"could not create topic {cluster.opts.topic}: {last!r}")
    await cluster.wait_ready(STARTUP_TIMEOUT_S, topic=True)


class Status:
    """The live progress display (rich), refreshed from a trio task; no rich threads."""

    def __init__(self, opts: RunOptions, cluster: Cluster, sink: HistorySink) -> None:
        self.opts, self.cluster, self.sink = opts, cluster, sink
        self.phase = "setup"
        self.nemesis: Nemesis | None = None
        self.t0: float | None = None
        self._live: Any = None

    def render(self) -> Any:
        from rich.table import Table

        elapsed = 0.0 if self.t0 is None else trio.current_time() - self.t0
        table = Table(title=f"jepsen run: {self.phase}", show_header=True, expand=False)
        table.add_column("op")
        for t in COMPLETION_TYPES:
            table.add_column(t, justify="right")
        for f in sorted({f for f, _ in self.sink.counts}):
            table.add_row(f, *(str(self.sink.counts[(f, t)]) for t in COMPLETION_TYPES))
        nodes = " ".join(
            f"{n.name}:{'paused' if n.paused else 'up' if n.running else 'down'}"
            for n in self.cluster.nodes.values()
        )
        faults = ", ".join(
            f"{f.kind} {','.join(f.targets)}" for f in (self.nemesis.active if self.nemesis else [])
        )
        table.caption = (
            f"{min(elapsed, self.opts.time_limit_s):.0f}/{self.opts.time_limit_s:.0f} s  "
            f"nodes {nodes}  faults: {faults or 'none'}"
        )
        return table

    async def display(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self._live = Live(self.render(), console=Console(stderr=True), auto_refresh=False)
        self._live.start()
        while True:
            self._live.update(self.render(), refresh=True)
            await trio.sleep(PROGRESS_REFRESH_S)

    def close(self) -> None:
        if self._live is not None:
            self._live.update(self.render(), refresh=True)
            self._live.stop()
            self._live = None


def options_dict(opts: RunOptions) -> dict[str, Any]:
    out = asdict(opts)
    out["store_root"] = str(opts.store_root)
    return out


# -- the matrix -------------------------------------------------------------------------------

MATRIX_NEMESES = ("none", "kill", "pause", "partition", "membership", "all")
MATRIX_BEGIN = "<!-- jepsen-matrix:begin -->"
MATRIX_END = "<!-- jepsen-matrix:end -->"
# A --secure matrix keeps a table of its own, so neither replaces the other's.
SECURE_MATRIX_BEGIN = "<!-- jepsen-matrix-secure:begin -->"
SECURE_MATRIX_END = "<!-- jepsen-matrix-secure:end -->"


def matrix_markers(secure: bool, workload: str = "queue") -> tuple[str, str]:
    if workload != "queue":  # a table per workload, so neither replaces the other's
        kind = f"{workload}-secure" if secure else workload
        return f"<!-- jepsen-matrix-{kind}:begin -->", f"<!-- jepsen-matrix-{kind}:end -->"
    return (SECURE_MATRIX_BEGIN, SECURE_MATRIX_END) if secure else (MATRIX_BEGIN, MATRIX_END)


@dataclass
class MatrixRow:
    nemesis: str
    run: int
    run_dir: str
    valid: bool | None
    anomalies: str
    sends_ok: int
    faults: int
    error: str = ""


def matrix_row(nemesis: str, index: int, outcome: RunOutcome) -> MatrixRow:
    res = outcome.results
    return MatrixRow(
        nemesis=nemesis,
        run=index,
        run_dir=outcome.run_dir.name,
        valid=bool(res.get("valid")),
        anomalies=", ".join(f"{k} {res['anomaly_counts'][k]}" for k in res.get("anomaly_types", []))
        or "-",
        sends_ok=int(
            res.get("ops", {}).get("send", res.get("ops", {}).get("txn", {})).get("ok", 0)
        ),
        faults=int(res.get("faults", {}).get("count", 0)),
    )


def matrix_table(rows: list[MatrixRow], base: RunOptions) -> str:
    mode = "unsafe" if base.unsafe else "safe"
    begin, end = matrix_markers(base.secure, base.workload)
    command = "python -m jepsen matrix --secure" if base.secure else "python -m jepsen matrix"
    if base.workload != "queue":
        command += f" --workload {base.workload}"
    security = (
        ", secure (SASL_SSL SCRAM-SHA-512 clients, mutual TLS between nodes, ACL authorizer)"
        if base.secure
        else ""
    )
    lines = [
        begin,
        f"Latest `{command}`: {base.nodes} nodes, {base.time_limit_s:g} s per run, "
        f"nemesis interval {base.nemesis_interval_s:g} s, {mode} configuration{security}, "
        f"{time.strftime('%Y-%m-%d')}.",
        "",
        "| nemesis | run | verdict | anomalies | "
        + ("committed transactions" if base.workload == "txn" else "acknowledged sends")
        + " | faults | run directory |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        verdict = "error: " + r.error if r.error else ("valid" if r.valid else "**INVALID**")
        lines.append(
            f"| {r.nemesis} | {r.run} | {verdict} | {r.anomalies} | {r.sends_ok} | {r.faults} "
            f"| `{r.run_dir}` |"
        )
    lines.append(end)
    return "\n".join(lines)


def write_matrix_table(
    doc: Path, table: str, *, secure: bool = False, workload: str = "queue"
) -> None:
    """Replace the table between the markers in doc (appending them if absent)."""
    begin, end = matrix_markers(secure, workload)
    text = doc.read_text(encoding="utf-8") if doc.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1]
        text = head + table + tail
    else:
        text = text.rstrip("\n") + "\n\n" + table + "\n"
    doc.write_text(text, encoding="utf-8")


def run_matrix(
    base: RunOptions, runs_per_nemesis: int, doc: Path, nemeses: tuple[str, ...] = MATRIX_NEMESES
) -> list[MatrixRow]:
    """Every nemesis x runs_per_nemesis runs; the table is rewritten in doc after each run,
    so an interrupted matrix still leaves what it learned."""
    from jepsen.nemesis import parse_families

    rows: list[MatrixRow] = []
    for nemesis in nemeses:
        for i in range(1, runs_per_nemesis + 1):
            opts = RunOptions(
                **{
                    **options_dict(base),
                    "store_root": base.store_root,
                    "nemesis": tuple(parse_families(nemesis)),
                    "name": f"{nemesis}-{i}",
                    "seed": None if base.seed is None else base.seed + len(rows),
                }
            )
            try:
                rows.append(matrix_row(nemesis, i, run(opts)))
            except Exception as exc:  # one broken run must not hide the others
                log.exception("matrix run %s-%d failed", nemesis, i)
                rows.append(MatrixRow(nemesis, i, "-", None, "-", 0, 0, error=repr(exc)[:120]))
            write_matrix_table(
                doc, matrix_table(rows, base), secure=base.secure, workload=base.workload
            )
    return rows
