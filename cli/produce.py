"""`raftlog produce TOPIC`: one record per input line, from stdin or --file."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import IO

import click
from raftlog_cli.common import Options, common_options, connect, run_async
from raftlog_cli.errors import CliError, kafka_message, unknown_topic

from raftlog.client import ACKS_ALL, ACKS_LEADER, ACKS_NONE, Producer, partition_for_key
from raftlog.errors import ErrorCode
from raftlog.records import Record

# Records per produce request: big enough to amortise a round trip, small enough that one
# batch stays far below the broker's request size limit for ordinary lines.
PRODUCE_BATCH_MAX_RECORDS = 500
ACKS_CHOICES = {"all": ACKS_ALL, "-1": ACKS_ALL, "1": ACKS_LEADER, "0": ACKS_NONE}


def parse_line(line: str, key_separator: str | None) -> Record:
    text = line.rstrip("\n").removesuffix("\r")
    if key_separator is None:
        return Record(value=text.encode())
    key, sep, value = text.partition(key_separator)
    if not sep:
        raise CliError(f"line {text[:40]!r} has no key separator {key_separator!r}")
    return Record(key=key.encode(), value=value.encode())


def chunks(records: Iterable[Record], size: int) -> Iterator[list[Record]]:
    iterator = iter(records)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


@click.command("produce")
@click.argument("topic")
@click.option(
    "--file", "input_file", type=click.File("r"), default="-", help="Read lines from FILE."
)
@click.option(
    "--key-separator", default=None, help="Split each line into KEY SEP VALUE at the first SEP."
)
@click.option(
    "--acks",
    type=click.Choice(list(ACKS_CHOICES)),
    default="all",
    show_default=True,
    help="all: every in-sync replica has it; 1: the leader; 0: no answer.",
)
@click.option(
    "--partition", type=click.IntRange(min=0), default=None, help="Send every record here."
)
@common_options
def produce_command(
    topic: str,
    input_file: IO[str],
    key_separator: str | None,
    acks: str,
    partition: int | None,
    opts: Options,
) -> None:
    """Produce each input line as one record to TOPIC (keyed records go to the partition of
    their key, like Kafka's default partitioner; others round-robin per batch)."""
    if key_separator == "":
        raise click.BadParameter("must not be empty", param_hint="--key-separator")
    lines = [line for line in input_file if line.strip("\r\n")]
    records = [parse_line(line, key_separator) for line in lines]

    async def go() -> dict[int, tuple[int, int]]:
        by_partition: dict[int, tuple[int, int]] = {}
        if not records:
            return by_partition
        async with connect(opts) as cluster:
            await cluster.refresh_metadata([topic])
            info = cluster.topics.get(topic)
            if info is None or info.error != ErrorCode.none or not info.partitions:
                if info is None or info.error == ErrorCode.unknown_topic_or_partition:
                    raise unknown_topic(topic)
                raise CliError(kafka_message(info.error, f"topic {topic!r}"))
            count = len(info.partitions)
            if partition is not None and partition >= count:
                raise CliError(f"topic {topic!r} has no partition {partition} (it has {count})")
            producer = Producer(cluster, acks=ACKS_CHOICES[acks])
            round_robin = itertools.count()
            for chunk in chunks(records, PRODUCE_BATCH_MAX_RECORDS):
                groups: dict[int, list[Record]] = {}
                default_partition = next(round_robin) % count
                for record in chunk:
                    if partition is not None:
                        target = partition
                    elif record.key is not None:
                        target = partition_for_key(record.key, count)
                    else:
                        target = default_partition
                    groups.setdefault(target, []).append(record)
                for target, batch in sorted(groups.items()):
                    result = await producer.produce(topic, batch, partition=target)
                    first, seen = by_partition.get(target, (result.base_offset, 0))
                    by_partition[target] = (first, seen + len(batch))
        return by_partition

    opts.out.produced(topic, run_async(opts, go))
