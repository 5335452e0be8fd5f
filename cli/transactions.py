"""`raftlog transactions list|describe|describe-producers|abort`, like kafka-transactions.sh.

`abort` ends a hanging transaction: one whose producer is gone and whose coordinator will not
end it, which holds the partition's last stable offset (and every read_committed consumer)
back. It writes an ABORT marker for the producer on one partition. With --start-offset the
producer is found by where its open transaction began (see describe-producers); otherwise
--producer-id, --producer-epoch and --coordinator-epoch name it. The principal needs
CLUSTER_ACTION on the cluster, as with Kafka.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import click
from raftlog_cli.common import Options, common_options, connect, run_async
from raftlog_cli.errors import CliError, kafka_message
from raftlog_cli.render import Renderer

from raftlog.client import AbortTransactionSpec, TransactionAdmin
from raftlog.client.admin_txn import (
    MAX_COORDINATOR_EPOCH,
    MAX_PARTITION,
    MAX_PRODUCER_EPOCH,
    MAX_PRODUCER_ID,
)
from raftlog.errors import ErrorCode

LIST_COLUMNS = [
    ("transactional_id", "TRANSACTIONAL ID"),
    ("coordinator_id", "COORDINATOR"),
    ("producer_id", "PRODUCER ID"),
    ("state", "STATE"),
]
DESCRIBE_COLUMNS = [
    ("coordinator_id", "COORDINATOR"),
    ("transactional_id", "TRANSACTIONAL ID"),
    ("producer_id", "PRODUCER ID"),
    ("producer_epoch", "EPOCH"),
    ("state", "STATE"),
    ("transaction_timeout_ms", "TIMEOUT MS"),
    ("transaction_start_time_ms", "START TIME MS"),
    ("transaction_duration_ms", "DURATION MS"),
    ("topic_partitions", "PARTITIONS"),
]
PRODUCER_COLUMNS = [
    ("producer_id", "PRODUCER ID"),
    ("producer_epoch", "EPOCH"),
    ("coordinator_epoch", "COORDINATOR EPOCH"),
    ("last_sequence", "LAST SEQUENCE"),
    ("last_timestamp_ms", "LAST TIMESTAMP MS"),
    ("current_transaction_start_offset", "TXN START OFFSET"),
]
MAX_OFFSET = 2**63 - 1


@click.group("transactions")
def transactions_group() -> None:
    """List, describe and abort transactions (kafka-transactions.sh)."""


def _render(
    out: Renderer, columns: Sequence[tuple[str, str]], rows: list[dict[str, Any]], empty: str
) -> None:
    if out.json_mode:
        out.json(rows)
        return
    out.table(columns, rows, empty=empty)


@transactions_group.command("list")
@common_options
def list_transactions(opts: Options) -> None:
    """List the transactional ids every coordinator knows, with producer and state."""

    async def go() -> list[dict[str, Any]]:
        async with connect(opts) as cluster:
            listed = await TransactionAdmin(cluster).list_transactions()
        return [
            {
                "transactional_id": t.transactional_id,
                "coordinator_id": t.coordinator_id,
                "producer_id": t.producer_id,
                "state": t.state,
            }
            for t in listed
        ]

    _render(opts.out, LIST_COLUMNS, run_async(opts, go), "(no transactional ids)")


@transactions_group.command("describe")
@click.option("--transactional-id", required=True, metavar="ID", help="The transactional id.")
@common_options
def describe(transactional_id: str, opts: Options) -> None:
    """State, producer, timeout and partitions of one transactional id, at its coordinator."""
    if not transactional_id:
        raise click.UsageError("the transactional id is empty")

    async def go() -> dict[str, Any]:
        async with connect(opts) as cluster:
            found = await TransactionAdmin(cluster).describe_transactions([transactional_id])
        d = found[transactional_id]
        if d.error == ErrorCode.transactional_id_not_found:
            raise CliError(f"unknown transactional id {transactional_id!r}")
        if d.error != ErrorCode.none:
            raise CliError(kafka_message(d.error, f"transactional id {transactional_id!r}"))
        start = d.transaction_start_time_ms
        return {
            "coordinator_id": d.coordinator_id,
            "transactional_id": d.transactional_id,
            "producer_id": d.producer_id,
            "producer_epoch": d.producer_epoch,
            "state": d.state,
            "transaction_timeout_ms": d.transaction_timeout_ms,
            "transaction_start_time_ms": start,
            # As kafka-transactions.sh: how long the open transaction has run, by this
            # machine's clock against the coordinator's start time.
            "transaction_duration_ms": None
            if start is None
            else max(0, int(time.time() * 1000) - start),
            "topic_partitions": [f"{t}-{p}" for t, p in d.topic_partitions],
        }

    _render(opts.out, DESCRIBE_COLUMNS, [run_async(opts, go)], "(none)")


def _partition_option(func: Any) -> Any:
    func = click.option(
        "--partition",
        required=True,
        type=click.IntRange(0, MAX_PARTITION),
        help="The partition.",
    )(func)
    return click.option("--topic", required=True, help="The topic.")(func)


@transactions_group.command("describe-producers")
@_partition_option
@common_options
def describe_producers(topic: str, partition: int, opts: Options) -> None:
    """Active producers of one partition, from its leader: epochs, last sequence, and where
    an open transaction began (the offset `abort --start-offset` takes)."""

    async def go() -> list[dict[str, Any]]:
        async with connect(opts) as cluster:
            found = await TransactionAdmin(cluster).describe_producers([(topic, partition)])
        result = found[(topic, partition)]
        if result.error != ErrorCode.none:
            raise CliError(kafka_message(result.error, f"{topic}-{partition}"))
        return [
            {
                "producer_id": p.producer_id,
                "producer_epoch": p.producer_epoch,
                "coordinator_epoch": p.coordinator_epoch,
                "last_sequence": p.last_sequence,
                "last_timestamp_ms": p.last_timestamp_ms,
                "current_transaction_start_offset": p.current_transaction_start_offset,
            }
            for p in sorted(result.producers, key=lambda p: p.producer_id)
        ]

    rows = run_async(opts, go)
    _render(opts.out, PRODUCER_COLUMNS, rows, f"(no active producers on {topic}-{partition})")


@transactions_group.command("abort")
@_partition_option
@click.option(
    "--start-offset",
    type=click.IntRange(0, MAX_OFFSET),
    default=None,
    help="Abort the open transaction that began at this offset (see describe-producers).",
)
@click.option("--producer-id", type=click.IntRange(0, MAX_PRODUCER_ID), default=None)
@click.option("--producer-epoch", type=click.IntRange(0, MAX_PRODUCER_EPOCH), default=None)
@click.option("--coordinator-epoch", type=click.IntRange(0, MAX_COORDINATOR_EPOCH), default=None)
@common_options
def abort(
    topic: str,
    partition: int,
    start_offset: int | None,
    producer_id: int | None,
    producer_epoch: int | None,
    coordinator_epoch: int | None,
    opts: Options,
) -> None:
    """Abort a hanging transaction on one partition (writes an ABORT marker)."""
    named = (producer_id, producer_epoch, coordinator_epoch)
    if start_offset is not None and any(v is not None for v in named):
        raise click.UsageError(
            "give either --start-offset or --producer-id, --producer-epoch and "
            "--coordinator-epoch, not both"
        )
    if start_offset is None and any(v is None for v in named):
        raise click.UsageError(
            "give --start-offset, or all of --producer-id, --producer-epoch and --coordinator-epoch"
        )

    async def go() -> AbortTransactionSpec:
        async with connect(opts) as cluster:
            admin = TransactionAdmin(cluster)
            if start_offset is not None:
                spec = await admin.open_transaction_at(topic, partition, start_offset)
                if spec is None:
                    raise CliError(
                        f"no open transaction starts at offset {start_offset} of "
                        f"{topic}-{partition} (see 'raftlog transactions describe-producers')"
                    )
            else:
                assert producer_id is not None and producer_epoch is not None
                assert coordinator_epoch is not None
                spec = AbortTransactionSpec(
                    topic, partition, producer_id, producer_epoch, coordinator_epoch
                )
            await admin.abort_transaction(spec)
            return spec

    spec = run_async(opts, go)
    opts.out.message(
        f"Aborted the transaction of producer {spec.producer_id} (epoch {spec.producer_epoch}, "
        f"coordinator epoch {spec.coordinator_epoch}) on {topic}-{partition}",
        {
            "topic": topic,
            "partition": partition,
            "producer_id": spec.producer_id,
            "producer_epoch": spec.producer_epoch,
            "coordinator_epoch": spec.coordinator_epoch,
        },
    )
