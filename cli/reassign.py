"""`raftlog topics reassign` and `raftlog topics elect-leaders`: Kafka's
kafka-reassign-partitions.sh and kafka-leader-election.sh, with their flags and JSON.

reassign --generate   proposes a plan moving the topics of --topics-to-move-json-file onto
                      --broker-list (replicas spread over racks first, as topic creation does)
reassign --execute    starts the plan of --reassignment-json-file (prints the current
                      assignment first: keep it to roll back); --wait follows it to the end
                      with a progress bar; --throttle limits the copying (reassign_throttle.py)
reassign --verify     says, per partition, whether the plan is complete, still in progress,
                      or neither (the replicas differ from the plan); once all are complete it
                      removes a throttle
reassign --cancel     cancels the plan's reassignments still in progress
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import click
import trio
from raftlog_cli.common import Options, common_options, connect, run_async
from raftlog_cli.errors import CliError, kafka_message
from raftlog_cli.reassign_throttle import (
    MAX_THROTTLE_BYTES_PER_S,
    ClearedThrottles,
    clear_throttles,
    set_throttles,
    throttle_plan,
)
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from raftlog.client import Admin
from raftlog.client.admin_reassign import (
    ElectionType,
    PartitionResult,
    Plan,
    PlanError,
    TopicPartition,
    parse_plan,
    parse_topics_to_move,
    plan_json,
)
from raftlog.errors import ErrorCode
from raftlog.metadata.controller.placement import placement

# How often --execute --wait asks for progress, and how long it waits by default.
WAIT_POLL_INTERVAL_S = 0.5
DEFAULT_WAIT_TIMEOUT_S = 600


def generate_plan(
    current: Mapping[TopicPartition, Sequence[int]],
    brokers: Sequence[int],
    racks: Mapping[int, str | None],
) -> Plan:
    """A new assignment of every partition in `current` over `brokers`, keeping each one's
    replication factor; replicas spread over racks first when the brokers have racks."""
    if not brokers:
        raise PlanError("the broker list is empty")
    if len(set(brokers)) != len(brokers):
        raise PlanError(f"the broker list {list(brokers)} names a broker twice")
    plan: Plan = {}
    for start, (topic, partition) in enumerate(sorted(current)):
        rf = len(current[(topic, partition)])
        if rf > len(brokers):
            raise PlanError(
                f"{topic}-{partition} has {rf} replicas, more than the {len(brokers)} brokers given"
            )
        # One placement per partition keeps each one's factor (they may differ); the start
        # rotates so leaders spread over the brokers.
        (replicas,) = placement(list(brokers), racks, 1, rf, start)
        plan[(topic, partition)] = replicas
    return plan


def _read(path: str, flag: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(64 * 1024 * 1024)
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror}", param_hint=flag) from None


def _plan_from(path: str | None) -> Plan:
    if path is None:
        raise click.UsageError("--reassignment-json-file is required with this action")
    try:
        return parse_plan(_read(path, "'--reassignment-json-file'"))
    except PlanError as exc:
        raise CliError(f"{path}: {exc}") from None


def _broker_list(text: str | None) -> list[int]:
    if not text:
        raise click.UsageError("--generate needs --broker-list, e.g. --broker-list 1,2,3")
    try:
        brokers = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise click.BadParameter(
            f"expected broker ids separated by commas, got {text!r}", param_hint="'--broker-list'"
        ) from None
    if not brokers or any(b < 0 for b in brokers):
        raise click.BadParameter("broker ids are 0 or more", param_hint="'--broker-list'")
    return brokers


def _failures(results: Sequence[PartitionResult]) -> list[str]:
    return [
        f"{r.topic}-{r.partition}: {kafka_message(r.error, r.message or r.error.name)}"
        for r in results
        if r.error != ErrorCode.none
    ]


async def _current(admin: Admin, topics: Sequence[str]) -> dict[TopicPartition, tuple[int, ...]]:
    infos = await admin.describe_topics(list(topics))
    missing = [t for t in topics if t not in infos or infos[t].error != ErrorCode.none]
    if missing:
        raise CliError(f"unknown topics: {', '.join(sorted(missing))}")
    return {
        (name, p.partition): p.replicas for name, info in infos.items() for p in info.partitions
    }


@click.command("reassign")
@click.option("--generate", "action", flag_value="generate", help="Propose a plan.")
@click.option("--execute", "action", flag_value="execute", help="Start the plan.")
@click.option("--verify", "action", flag_value="verify", help="Check the plan's progress.")
@click.option("--cancel", "action", flag_value="cancel", help="Cancel the plan's moves.")
@click.option("--reassignment-json-file", metavar="FILE", help="The plan (Kafka's format).")
@click.option("--topics-to-move-json-file", metavar="FILE", help="Topics for --generate.")
@click.option("--broker-list", metavar="ID,ID,...", help="Target brokers for --generate.")
@click.option("--wait", is_flag=True, help="With --execute: follow the moves to the end.")
@click.option(
    "--throttle",
    "throttle_bytes_per_s",
    type=click.IntRange(min=1, max=MAX_THROTTLE_BYTES_PER_S),
    default=None,
    metavar="BYTES_PER_S",
    help="With --execute: limit the copying to this many bytes/s per broker "
    "(leader/follower.replication.throttled.rate); --verify removes it once the moves are done.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.IntRange(min=1, max=7 * 24 * 3600),
    default=DEFAULT_WAIT_TIMEOUT_S,
    show_default=True,
    help="Seconds --wait waits.",
)
@common_options
def reassign(
    action: str | None,
    reassignment_json_file: str | None,
    topics_to_move_json_file: str | None,
    broker_list: str | None,
    wait: bool,
    throttle_bytes_per_s: int | None,
    timeout_s: int,
    opts: Options,
) -> None:
    """Move partitions to other brokers (kafka-reassign-partitions.sh)."""
    if action is None:
        raise click.UsageError("give one of --generate, --execute, --verify or --cancel")
    if wait and action != "execute":
        raise click.UsageError("--wait goes with --execute")
    if throttle_bytes_per_s is not None and action != "execute":
        raise click.UsageError("--throttle goes with --execute (--verify removes it)")
    if action == "generate":
        _generate(topics_to_move_json_file, broker_list, opts)
    elif action == "execute":
        _execute(_plan_from(reassignment_json_file), wait, timeout_s, opts, throttle_bytes_per_s)
    elif action == "verify":
        _verify(_plan_from(reassignment_json_file), opts)
    else:
        _cancel(_plan_from(reassignment_json_file), opts)


def _generate(topics_file: str | None, broker_list: str | None, opts: Options) -> None:
    if topics_file is None:
        raise click.UsageError("--generate needs --topics-to-move-json-file")
    try:
        topics = parse_topics_to_move(_read(topics_file, "'--topics-to-move-json-file'"))
    except PlanError as exc:
        raise CliError(f"{topics_file}: {exc}") from None
    brokers = _broker_list(broker_list)

    async def go() -> tuple[dict[TopicPartition, tuple[int, ...]], Plan]:
        async with connect(opts) as cluster:
            admin = Admin(cluster)
            current = await _current(admin, topics)
            racks = await admin.broker_racks()
            unknown = [b for b in brokers if b not in racks]
            if unknown:
                raise CliError(f"brokers {unknown} are not live brokers of the cluster")
            try:
                return current, generate_plan(current, brokers, racks)
            except PlanError as exc:
                raise CliError(str(exc)) from None

    current, proposed = run_async(opts, go)
    if opts.json:
        opts.out.json(
            {"current": json.loads(plan_json(current)), "proposed": json.loads(plan_json(proposed))}
        )
        return
    opts.out.text("Current partition replica assignment")
    opts.out.text(plan_json(current))
    opts.out.text("")
    opts.out.text("Proposed partition reassignment configuration")
    opts.out.text(plan_json(proposed))


def _execute(
    plan: Plan, wait: bool, timeout_s: int, opts: Options, throttle_bytes_per_s: int | None = None
) -> None:
    if any(replicas is None for replicas in plan.values()):
        raise CliError("the plan cancels partitions (replicas null): use --cancel for that")
    topics = sorted({topic for topic, _ in plan})

    async def go() -> tuple[dict[TopicPartition, tuple[int, ...]], list[PartitionResult]]:
        async with connect(opts) as cluster:
            admin = Admin(cluster)
            current = await _current(admin, topics)
            if throttle_bytes_per_s is not None:
                # Before the moves start, so that none copies unthrottled (Kafka's order).
                await set_throttles(admin, throttle_plan(current, plan), throttle_bytes_per_s)
            results = await admin.alter_partition_reassignments(plan)
            return {k: v for k, v in current.items() if k in plan}, results

    current, results = run_async(opts, go)
    failed = _failures(results)
    throttled = {} if throttle_bytes_per_s is None else {"throttle": throttle_bytes_per_s}
    if not opts.json:
        opts.out.text("Current partition replica assignment (save it to roll back)")
        opts.out.text(plan_json(current))
        opts.out.text("")
        if throttle_bytes_per_s is not None:
            opts.out.text(
                f"The moves' replication is throttled to {throttle_bytes_per_s} bytes/s per "
                "broker; the throttle stays until --verify (or --wait) finds every move done."
            )
    if failed:
        raise CliError("reassignment refused for " + "; ".join(failed))
    if not wait:
        opts.out.message(
            f"Started reassignment of {len(plan)} partitions",
            {"started": len(plan), "rollback": json.loads(plan_json(current)), **throttled},
        )
        return
    _wait(plan, timeout_s, opts)
    cleared = _clear(plan, opts) if throttle_bytes_per_s is not None else None
    opts.out.message(
        f"Reassignment of {len(plan)} partitions complete"
        + ("" if cleared is None else "; throttle removed"),
        {"completed": len(plan), "rollback": json.loads(plan_json(current)), **throttled},
    )


def _clear(plan: Plan, opts: Options) -> ClearedThrottles:
    async def go() -> ClearedThrottles:
        async with connect(opts) as cluster:
            return await clear_throttles(Admin(cluster), {topic for topic, _ in plan})

    return run_async(opts, go)


async def _status(admin: Admin, plan: Plan) -> dict[TopicPartition, str]:
    """Per partition: "complete", "in progress", or what differs from the plan."""
    ongoing = await admin.list_partition_reassignments(list(plan))
    infos = await admin.describe_topics(sorted({t for t, _ in plan}))
    status = {}
    for (topic, partition), target in plan.items():
        info = infos.get(topic)
        state = None
        if info is not None:
            state = next((p for p in info.partitions if p.partition == partition), None)
        if (topic, partition) in ongoing:
            status[(topic, partition)] = "in progress"
        elif state is None:
            status[(topic, partition)] = "unknown partition"
        elif target is None or tuple(state.replicas) == target:
            status[(topic, partition)] = "complete"
        else:
            status[(topic, partition)] = (
                f"not in progress, and its replicas {list(state.replicas)} are not the "
                f"plan's {list(target)}"
            )
    return status


def _wait(plan: Plan, timeout_s: int, opts: Options) -> None:
    show_bar = not opts.json and sys.stderr.isatty()

    async def go() -> dict[TopicPartition, str]:
        async with connect(opts) as cluster:
            admin = Admin(cluster)
            status: dict[TopicPartition, str] = {}
            with trio.move_on_after(timeout_s):
                with _bar(show_bar, len(plan)) as advance:
                    while True:
                        status = await _status(admin, plan)
                        done = sum(1 for s in status.values() if s == "complete")
                        advance(done)
                        if all(s != "in progress" for s in status.values()):
                            return status
                        # Polling a remote state the cluster does not push to clients.
                        await trio.sleep(WAIT_POLL_INTERVAL_S)
            raise CliError(
                f"the reassignment did not finish within {timeout_s} s "
                f"({sum(1 for s in status.values() if s == 'complete')} of {len(plan)} "
                f"partitions moved); --verify follows it, --cancel stops it"
            )

    status = run_async(opts, go)
    wrong = [f"{t}-{p}: {s}" for (t, p), s in sorted(status.items()) if s != "complete"]
    if wrong:
        raise CliError("reassignment ended otherwise than planned: " + "; ".join(wrong))


class _bar:
    """A rich progress bar on stderr (or nothing): the context yields advance(done)."""

    def __init__(self, show: bool, total: int) -> None:
        self._progress: Progress | None = None
        self._total = total
        if show:
            self._progress = Progress(
                TextColumn("moving partitions"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=sys.stderr),
                transient=True,
            )

    def __enter__(self) -> Any:
        progress = self._progress
        if progress is None:
            return lambda done: None
        progress.start()
        task = progress.add_task("moving", total=self._total)
        return lambda done: progress.update(task, completed=done)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


def _verify(plan: Plan, opts: Options) -> None:
    async def go() -> tuple[dict[TopicPartition, str], ClearedThrottles | None]:
        async with connect(opts) as cluster:
            admin = Admin(cluster)
            status = await _status(admin, plan)
            if any(s != "complete" for s in status.values()):
                return status, None
            # Every move is done: a throttle of the plan has nothing left to limit.
            return status, await clear_throttles(admin, {topic for topic, _ in plan})

    status, cleared = run_async(opts, go)
    if opts.json:
        opts.out.json(
            [{"topic": t, "partition": p, "status": s} for (t, p), s in sorted(status.items())]
        )
    else:
        for (topic, partition), state in sorted(status.items()):
            opts.out.text(f"Reassignment of partition {topic}-{partition}: {state}")
        if cleared is not None and (cleared.topics or cleared.brokers):
            opts.out.text(
                "Throttle removed (topics: "
                f"{', '.join(cleared.topics) or 'none'}; brokers: "
                f"{', '.join(str(b) for b in cleared.brokers) or 'none'})"
            )
    wrong = [k for k, s in status.items() if s not in ("complete", "in progress")]
    if wrong:
        raise CliError(f"{len(wrong)} partitions are neither moved nor moving")


def _cancel(plan: Plan, opts: Options) -> None:
    async def go() -> list[PartitionResult]:
        async with connect(opts) as cluster:
            return await Admin(cluster).alter_partition_reassignments(dict.fromkeys(plan))

    results = run_async(opts, go)
    cancelled = [r for r in results if r.error == ErrorCode.none]
    idle = [r for r in results if r.error == ErrorCode.no_reassignment_in_progress]
    failed = _failures([r for r in results if r not in idle])
    if failed:
        raise CliError("cancel refused for " + "; ".join(failed))
    opts.out.message(
        f"Cancelled {len(cancelled)} reassignments ({len(idle)} partitions had none in progress)",
        {"cancelled": len(cancelled), "not_in_progress": len(idle)},
    )


# ------------------------------------------------------------------ elect-leaders
@click.command("elect-leaders")
@click.option(
    "--election-type",
    type=click.Choice(["PREFERRED", "UNCLEAN"], case_sensitive=False),
    required=True,
    help="PREFERRED: the first replica leads again; UNCLEAN: a replica outside the ISR "
    "leads when no ISR member is alive (acknowledged records may be lost).",
)
@click.option("--topic", default=None, help="Only this topic's partitions.")
@click.option("--partition", type=click.IntRange(min=0), default=None, help="With --topic.")
@click.option("--all-topic-partitions", is_flag=True, help="Every partition of every topic.")
@common_options
def elect_leaders(
    election_type: str,
    topic: str | None,
    partition: int | None,
    all_topic_partitions: bool,
    opts: Options,
) -> None:
    """Elect partition leaders (kafka-leader-election.sh)."""
    if all_topic_partitions == (topic is not None):
        raise click.UsageError("give either --topic (with --partition) or --all-topic-partitions")
    if partition is not None and topic is None:
        raise click.UsageError("--partition goes with --topic")
    kind = ElectionType[election_type.upper()]

    async def go() -> list[PartitionResult]:
        async with connect(opts) as cluster:
            admin = Admin(cluster)
            named: list[TopicPartition] | None = None
            if topic is not None:
                if partition is not None:
                    named = [(topic, partition)]
                else:
                    current = await _current(admin, [topic])
                    named = sorted(current)
            return await admin.elect_leaders(kind, named)

    results = run_async(opts, go)
    rows = [
        {
            "topic": r.topic,
            "partition": r.partition,
            "result": "elected" if r.error == ErrorCode.none else r.error.name,
            "message": r.message,
        }
        for r in sorted(results, key=lambda r: (r.topic, r.partition))
    ]
    if opts.json:
        opts.out.json(rows)
    else:
        opts.out.table(
            [("topic", "TOPIC"), ("partition", "PARTITION"), ("result", "RESULT")],
            rows,
            empty="No election was needed.",
        )
    refused = [r for r in results if r.error not in (ErrorCode.none, ErrorCode.election_not_needed)]
    if refused:
        raise CliError(f"{len(refused)} elections failed")
