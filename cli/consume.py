"""`raftlog consume TOPIC`: print committed records, alone or as a consumer-group member.

Each selected partition is read by its own task; records reach the printer through a
bounded channel, so a slow terminal slows the fetchers instead of growing memory.

With --group the command is a real member of the group (raftlog.client.group_consumer): it
joins, prints the records of the partitions the group assigns it, from the committed offset
(--from-beginning or the end where nothing is committed), follows reassignments, commits
periodically and on exit, and leaves the group on exit, -n, --timeout-ms or Ctrl-C — so two
`raftlog consume --group G` processes split the topic's partitions between them.
"""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import click
import trio
from raftlog_cli.common import Options, common_options, connect, run_async
from raftlog_cli.errors import CliError, kafka_message, leaf_exception, unknown_topic

from raftlog.client import Admin, Cluster, Consumer, IsolationLevel
from raftlog.client.group_consumer import GroupConsumerConfig, open_group_consumer
from raftlog.client.group_member import GroupMemberError, MemberConfig
from raftlog.errors import ErrorCode
from raftlog.records import Record

# Records buffered between the fetch tasks and the printer.
RECORD_CHANNEL_MAX_RECORDS = 1_000
CONSUME_FETCH_MAX_WAIT_MS = 200
# Kafka's consumer defaults for the group member's failure detection and commit period.
DEFAULT_SESSION_TIMEOUT_MS = 10_000
DEFAULT_HEARTBEAT_INTERVAL_MS = 3_000
GROUP_COMMIT_INTERVAL_MS = 5_000


@click.command("consume")
@click.argument("topic")
@click.option(
    "--from-beginning",
    is_flag=True,
    help="Start at the earliest offset (with --group: where the group has committed nothing).",
)
@click.option("--offset", type=click.IntRange(min=0), default=None, help="Start at this offset.")
@click.option(
    "-n", "--max-messages", type=click.IntRange(min=1), default=None, help="Stop after N records."
)
@click.option(
    "--group",
    default=None,
    help="Join consumer group GROUP: read the partitions it assigns, from its committed "
    "offsets; commit and leave on exit.",
)
@click.option("--partition", type=click.IntRange(min=0), default=None, help="Only this partition.")
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=0),
    default=None,
    help="Stop when no record arrives for this long (default: wait forever).",
)
@click.option("--key-separator", default=None, help="Print KEY SEP VALUE instead of the value.")
@click.option(
    "--session-timeout-ms",
    type=click.IntRange(min=1),
    default=DEFAULT_SESSION_TIMEOUT_MS,
    show_default=True,
    help="With --group: the coordinator drops this member after this long without a heartbeat.",
)
@click.option(
    "--heartbeat-interval-ms",
    type=click.IntRange(min=1),
    default=DEFAULT_HEARTBEAT_INTERVAL_MS,
    show_default=True,
    help="With --group: how often to heartbeat (and so how soon a rebalance is noticed).",
)
@click.option(
    "--isolation-level",
    type=click.Choice(["read_uncommitted", "read_committed"]),
    default="read_uncommitted",
    show_default=True,
    help="read_committed: only records of committed transactions, up to the last stable "
    "offset (kafka-console-consumer's --isolation-level).",
)
@common_options
def consume_command(
    topic: str,
    from_beginning: bool,
    offset: int | None,
    max_messages: int | None,
    group: str | None,
    partition: int | None,
    timeout_ms: int | None,
    key_separator: str | None,
    session_timeout_ms: int,
    heartbeat_interval_ms: int,
    isolation_level: str,
    opts: Options,
) -> None:
    """Print records of TOPIC (from the end unless told otherwise) until -n, --timeout-ms or
    Ctrl-C. --json prints one JSON object per record."""
    if from_beginning and offset is not None:
        raise click.UsageError("--from-beginning and --offset exclude each other")
    out = opts.out
    level = IsolationLevel.parse(isolation_level)
    if group is not None:
        if offset is not None or partition is not None:
            raise click.UsageError(
                "--offset and --partition do not combine with --group (the group assigns "
                "partitions; its committed offsets say where to start)"
            )
        if heartbeat_interval_ms >= session_timeout_ms:
            raise click.UsageError("--heartbeat-interval-ms must be below --session-timeout-ms")
        member = MemberConfig(
            session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=heartbeat_interval_ms
        )
        config = GroupConsumerConfig(
            member=member,
            reset="earliest" if from_beginning else "latest",
            auto_commit_interval_ms=GROUP_COMMIT_INTERVAL_MS,
            buffer_max_records=RECORD_CHANNEL_MAX_RECORDS,
            fetch_max_wait_ms=CONSUME_FETCH_MAX_WAIT_MS,
            isolation_level=level,
        )

        async def go_group() -> int:
            try:
                return await _consume_group(
                    opts, topic, group, config, max_messages, timeout_ms, key_separator
                )
            except (GroupMemberError, BaseExceptionGroup) as exc:
                # The member's own errors already say what went wrong in a line.
                leaf = leaf_exception(exc)
                if isinstance(leaf, GroupMemberError):
                    raise CliError(str(leaf)) from None
                raise

        out.consumed(run_async(opts, go_group), topic)
        return

    async def go() -> int:
        async with connect(opts) as cluster:
            partitions = await _partitions(cluster, topic, partition)
            if offset is not None and len(partitions) > 1:
                raise click.UsageError("--offset needs --partition (the topic has several)")
            starts = await _start_offsets(cluster, topic, partitions, from_beginning, offset, level)
            send, receive = trio.open_memory_channel[tuple[int, Record]](RECORD_CHANNEL_MAX_RECORDS)

            async def next_record() -> tuple[str, int, Record]:
                p, record = await receive.receive()
                return topic, p, record

            async with trio.open_nursery() as nursery:
                consumer = Consumer(
                    cluster, max_wait_ms=CONSUME_FETCH_MAX_WAIT_MS, isolation_level=level
                )
                for p in partitions:
                    nursery.start_soon(_fetch_loop, consumer, topic, p, starts[p], send.clone())
                send.close()
                printed = _Printed()
                await _print_records(
                    printed, out, next_record, max_messages, timeout_ms, key_separator
                )
                nursery.cancel_scope.cancel()
            return printed.count

    count = run_async(opts, go)
    out.consumed(count, topic)


async def _consume_group(
    opts: Options,
    topic: str,
    group: str,
    config: GroupConsumerConfig,
    max_messages: int | None,
    timeout_ms: int | None,
    key_separator: str | None,
) -> int:
    """Print records as a member of group until -n, --timeout-ms (counted from the first
    assignment) or Ctrl-C/SIGTERM; the member commits and leaves on every one of those."""
    out = opts.out
    printed = _Printed()  # counted as they are printed: Ctrl-C may end the loop midway
    async with connect(opts) as cluster:
        await _partitions(cluster, topic, None)  # an unknown topic is an error, not a wait
        async with trio.open_nursery() as nursery:
            stop = trio.CancelScope()
            if threading.current_thread() is threading.main_thread():
                # Signals end the read loop, so the member still commits and leaves; only the
                # main thread can receive them (tests run the CLI in a worker thread).
                nursery.start_soon(_stop_on_signals, stop)
            with stop:
                async with open_group_consumer(cluster, group, [topic], config) as consumer:

                    async def next_record() -> tuple[str, int, Record]:
                        item = await consumer.receive()
                        return item.topic, item.partition, item.record

                    await _print_records(
                        printed, out, next_record, max_messages, timeout_ms, key_separator
                    )
            nursery.cancel_scope.cancel()
    return printed.count


@dataclass
class _Printed:
    count: int = 0


async def _print_records(
    printed: _Printed,
    out: Any,
    next_record: Callable[[], Awaitable[tuple[str, int, Record]]],
    max_messages: int | None,
    timeout_ms: int | None,
    key_separator: str | None,
) -> None:
    """Print records until -n of them or --timeout-ms without one, counting into `printed`."""
    limit = max_messages if max_messages is not None else math.inf
    idle_s = math.inf if timeout_ms is None else timeout_ms / 1000
    while printed.count < limit:
        with trio.move_on_after(idle_s):
            topic, partition, record = await next_record()
            printed.count += 1
            out.record(
                topic,
                partition,
                record.offset,
                record.timestamp_ms,
                record.key,
                record.value,
                record.headers,
                key_separator=key_separator,
            )
            continue
        break  # idle for --timeout-ms


async def _stop_on_signals(stop: trio.CancelScope) -> None:
    """SIGINT/SIGTERM stop reading; the member then commits and leaves. Later signals are
    absorbed: that close is already bounded (MemberConfig.close_timeout_ms)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            stop.cancel()


async def _partitions(cluster: Cluster, topic: str, partition: int | None) -> list[int]:
    await cluster.refresh_metadata([topic])
    info = cluster.topics.get(topic)
    if info is None or info.error != ErrorCode.none:
        if info is None or info.error == ErrorCode.unknown_topic_or_partition:
            raise unknown_topic(topic)
        raise CliError(kafka_message(info.error, f"topic {topic!r}"))
    all_partitions = [p.partition for p in info.partitions]
    if partition is None:
        return all_partitions
    if partition not in all_partitions:
        raise CliError(
            f"topic {topic!r} has no partition {partition} (it has {len(all_partitions)})"
        )
    return [partition]


async def _start_offsets(
    cluster: Cluster,
    topic: str,
    partitions: list[int],
    from_beginning: bool,
    offset: int | None,
    level: IsolationLevel,
) -> dict[int, int]:
    admin = Admin(cluster)
    starts = {}
    for p in partitions:
        if offset is not None:
            starts[p] = offset
        else:
            spec = "earliest" if from_beginning else "latest"
            starts[p] = (await admin.list_offsets(topic, p, spec, level)).offset
    return starts


async def _fetch_loop(
    consumer: Consumer,
    topic: str,
    partition: int,
    start: int,
    send: trio.MemorySendChannel[tuple[int, Record]],
) -> None:
    async with send:
        async for records in consumer.poll(topic, partition, start):
            for record in records:
                await send.send((partition, record))
