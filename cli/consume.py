"""`raftlog consume TOPIC`: print committed records, optionally as a (simple) group member.

Each selected partition is read by its own task; records reach the printer through a
bounded channel, so a slow terminal slows the fetchers instead of growing memory. With
--group the start position is the group's committed offset, and the offsets consumed are
committed on exit (as a standalone consumer: the group must have no active members).
"""

from __future__ import annotations

import math

import click
import trio
from raftlog_cli.common import Options, common_options, connect, run_async
from raftlog_cli.errors import CliError, kafka_message, unknown_topic

from raftlog.client import Admin, Cluster, Consumer
from raftlog.client.groups import GroupAdmin
from raftlog.errors import ErrorCode
from raftlog.records import Record

# Records buffered between the fetch tasks and the printer.
RECORD_CHANNEL_MAX_RECORDS = 1_000
CONSUME_FETCH_MAX_WAIT_MS = 200


@click.command("consume")
@click.argument("topic")
@click.option("--from-beginning", is_flag=True, help="Start at the earliest offset.")
@click.option("--offset", type=click.IntRange(min=0), default=None, help="Start at this offset.")
@click.option(
    "-n", "--max-messages", type=click.IntRange(min=1), default=None, help="Stop after N records."
)
@click.option("--group", default=None, help="Start at GROUP's committed offsets; commit on exit.")
@click.option("--partition", type=click.IntRange(min=0), default=None, help="Only this partition.")
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=0),
    default=None,
    help="Stop when no record arrives for this long (default: wait forever).",
)
@click.option("--key-separator", default=None, help="Print KEY SEP VALUE instead of the value.")
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
    opts: Options,
) -> None:
    """Print records of TOPIC (from the end unless told otherwise) until -n, --timeout-ms or
    Ctrl-C. --json prints one JSON object per record."""
    if from_beginning and offset is not None:
        raise click.UsageError("--from-beginning and --offset exclude each other")
    out = opts.out

    async def go() -> int:
        async with connect(opts) as cluster:
            partitions = await _partitions(cluster, topic, partition)
            if offset is not None and len(partitions) > 1:
                raise click.UsageError("--offset needs --partition (the topic has several)")
            groups = GroupAdmin(cluster) if group else None
            starts = await _start_offsets(cluster, topic, partitions, from_beginning, offset)
            if groups is not None and group is not None:
                committed = await groups.committed_offsets(group, [(topic, p) for p in partitions])
                for c in committed:
                    if c.offset >= 0:
                        starts[c.partition] = c.offset
            positions = dict(starts)
            count = 0
            send, receive = trio.open_memory_channel[tuple[int, Record]](RECORD_CHANNEL_MAX_RECORDS)
            limit = max_messages if max_messages is not None else math.inf
            try:
                async with trio.open_nursery() as nursery:
                    consumer = Consumer(cluster, max_wait_ms=CONSUME_FETCH_MAX_WAIT_MS)
                    for p in partitions:
                        nursery.start_soon(_fetch_loop, consumer, topic, p, starts[p], send.clone())
                    send.close()
                    idle_s = math.inf if timeout_ms is None else timeout_ms / 1000
                    while count < limit:
                        with trio.move_on_after(idle_s):
                            p, record = await receive.receive()
                            positions[p] = record.offset + 1
                            count += 1
                            out.record(
                                topic,
                                p,
                                record.offset,
                                record.timestamp_ms,
                                record.key,
                                record.value,
                                record.headers,
                                key_separator=key_separator,
                            )
                            continue
                        break  # idle for --timeout-ms
                    nursery.cancel_scope.cancel()
            finally:
                if groups is not None and group is not None:
                    moved = {(topic, p): o for p, o in positions.items() if o != starts[p]}
                    if moved:
                        with trio.CancelScope(shield=True):
                            await groups.commit_offsets(group, moved)
            return count

    count = run_async(opts, go)
    out.consumed(count, topic)


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
    cluster: Cluster, topic: str, partitions: list[int], from_beginning: bool, offset: int | None
) -> dict[int, int]:
    admin = Admin(cluster)
    starts = {}
    for p in partitions:
        if offset is not None:
            starts[p] = offset
        else:
            spec = "earliest" if from_beginning else "latest"
            starts[p] = (await admin.list_offsets(topic, p, spec)).offset
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
