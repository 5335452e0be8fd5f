"""Transactions benchmark: what transactions cost a producer, and read_committed a consumer.

    python -m benchmarks.transactions [--seconds 5] [--rounds 5] [--records-per-txn 100]

One cluster of three real node processes (raftlog.testing.cluster), two RF 3
single-partition topics (min.insync.replicas 2), confluent-kafka clients with the same
settings on both sides of each pair:

- produce throughput, acks=all, values of `--value-bytes` (1 KiB): a transactional producer
  committing transactions of `--records-per-txn` records one after the other (begin, produce,
  commit_transaction) / a plain idempotent producer streaming the same records
  (txn_produce_ratio, target >= 0.5);
- consumer fetch throughput over the same committed transactional data, from the start of the
  topic to its end: isolation.level=read_committed / read_uncommitted
  (read_committed_ratio, target >= 0.9).

Each pair is measured in `--rounds` rounds, the two sides alternating which goes first, and a
ratio is the median of the rounds' ratios (as benchmarks/security.py). The last stdout line is
one JSON object: {"txn_produce_ratio", "read_committed_ratio", ... the raw MiB/s of each side
and round}.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from benchmarks.common import console, emit_result, stream_acked_bytes_per_s
from benchmarks.security import _mib, _ratio, alternate
from raftlog.constants import KIB, MIB

TXN_TOPIC = "txn-bench"
PLAIN_TOPIC = "idempotent-bench"
PRODUCER_BATCH_BYTES = 256 * 1024
CLIENT_TIMEOUT_S = 60.0
# A fetch round stops at the end of the topic; it is never longer than this many seconds.
FETCH_MAX_S = 30.0
TARGETS = {"txn_produce_ratio": 0.5, "read_committed_ratio": 0.9}


def _producer_config(bootstrap: str) -> dict[str, Any]:
    """Settings both produce sides share."""
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "batch.size": PRODUCER_BATCH_BYTES,
        "queue.buffering.max.kbytes": 16 * 1024,
    }


def create_topics(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [
        NewTopic(name, 1, 3, config={"min.insync.replicas": "2"})
        for name in (TXN_TOPIC, PLAIN_TOPIC)
    ]
    for future in admin.create_topics(topics).values():
        future.result(CLIENT_TIMEOUT_S)


def idempotent_produce_for(bootstrap: str, seconds: float, value_bytes: int) -> float:
    """One idempotent producer streaming values as fast as it can for `seconds`;
    acknowledged bytes/s inside the window."""
    from confluent_kafka import Producer

    producer = Producer(_producer_config(bootstrap))
    value = b"i" * value_bytes
    return stream_acked_bytes_per_s(producer, PLAIN_TOPIC, value, seconds, CLIENT_TIMEOUT_S)


def txn_produce_for(
    bootstrap: str, seconds: float, value_bytes: int, records_per_txn: int, counts: list[int]
) -> float:
    """One transactional producer committing transactions of `records_per_txn` values one
    after the other for `seconds` (the last one finishes); committed bytes/s. Appends the
    number of committed transactions to `counts`."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            **_producer_config(bootstrap),
            "transactional.id": f"txn-bench-{time.monotonic_ns()}",
            "transaction.timeout.ms": 60_000,
        }
    )
    value = b"t" * value_bytes
    # Find the coordinator and take a producer id before the clock starts.
    producer.init_transactions(CLIENT_TIMEOUT_S)
    producer.list_topics(TXN_TOPIC, timeout=CLIENT_TIMEOUT_S)
    committed = 0
    transactions = 0
    started = time.monotonic()
    deadline = started + seconds
    while time.monotonic() < deadline:
        producer.begin_transaction()
        for _ in range(records_per_txn):
            while True:
                try:
                    producer.produce(TXN_TOPIC, value, partition=0)
                    break
                except BufferError:
                    producer.poll(0.001)
        producer.commit_transaction(CLIENT_TIMEOUT_S)
        committed += records_per_txn * value_bytes
        transactions += 1
    elapsed = time.monotonic() - started
    counts.append(transactions)
    return committed / elapsed


def fetch_all(bootstrap: str, isolation_level: str, records: list[int]) -> float:
    """One consumer reading TXN_TOPIC from its start to its end (at most FETCH_MAX_S) at
    `isolation_level`; consumed value bytes/s. Appends the records read to `records`."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"txn-bench-{time.monotonic_ns()}",
            "isolation.level": isolation_level,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.max.bytes": 50 * MIB,
            "max.partition.fetch.bytes": 10 * MIB,
        }
    )
    try:
        consumer.list_topics(TXN_TOPIC, timeout=CLIENT_TIMEOUT_S)
        consumer.assign([TopicPartition(TXN_TOPIC, 0, OFFSET_BEGINNING)])
        consumed = 0
        count = 0
        at_end = False
        started = time.monotonic()
        # The topic ends with a COMMIT marker, which no consumer returns: the end is the
        # partition EOF event, not the offset of a last record.
        while not at_end and time.monotonic() - started < FETCH_MAX_S:
            for message in consumer.consume(num_messages=10_000, timeout=0.5):
                error = message.error()
                if error is None:
                    consumed += len(message.value() or b"")
                    count += 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    at_end = True
        elapsed = time.monotonic() - started
    finally:
        consumer.close()
    records.append(count)
    return consumed / elapsed if elapsed > 0 else 0.0


def run(seconds: float, rounds: int, records_per_txn: int, value_bytes: int) -> dict[str, Any]:
    from raftlog.testing.cluster import ProcessCluster

    measurements = 2 * 2 * rounds
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with (
        tempfile.TemporaryDirectory(prefix="raftlog-txn-bench-") as tmp,
        Progress(*columns, console=console, transient=False) as bar,
    ):
        setup = bar.add_task("starting a 3-node cluster", total=1)
        with ProcessCluster(Path(tmp) / "cluster", 3) as cluster:
            bar.advance(setup)
            bootstrap = cluster.bootstrap_servers
            create_topics(bootstrap)
            task = bar.add_task("measuring", total=measurements)

            def advance(what: str) -> None:
                bar.update(task, advance=1, description=f"measuring: {what}")

            transactions: list[int] = []
            produce = alternate(
                rounds,
                {
                    "produce transactional": lambda: txn_produce_for(
                        bootstrap, seconds, value_bytes, records_per_txn, transactions
                    ),
                    "produce idempotent": lambda: idempotent_produce_for(
                        bootstrap, seconds, value_bytes
                    ),
                },
                advance,
            )
            committed_records: list[int] = []
            uncommitted_records: list[int] = []
            fetch = alternate(
                rounds,
                {
                    "fetch read_committed": lambda: fetch_all(
                        bootstrap, "read_committed", committed_records
                    ),
                    "fetch read_uncommitted": lambda: fetch_all(
                        bootstrap, "read_uncommitted", uncommitted_records
                    ),
                },
                advance,
            )
    expected = sum(transactions) * records_per_txn
    # Every transaction was committed: both isolation levels read every record.
    for name, counts in (
        ("read_committed", committed_records),
        ("read_uncommitted", uncommitted_records),
    ):
        if any(count != expected for count in counts):
            raise RuntimeError(f"{name} read {counts} records, {expected} were committed")
    result: dict[str, Any] = {
        "txn_produce_ratio": _ratio(
            produce["produce transactional"], produce["produce idempotent"]
        ),
        "read_committed_ratio": _ratio(
            fetch["fetch read_committed"], fetch["fetch read_uncommitted"]
        ),
        "txn_produce_mib_s": _mib(produce["produce transactional"]),
        "idempotent_produce_mib_s": _mib(produce["produce idempotent"]),
        "fetch_read_committed_mib_s": _mib(fetch["fetch read_committed"]),
        "fetch_read_uncommitted_mib_s": _mib(fetch["fetch read_uncommitted"]),
        "transactions_per_round": transactions,
        "transactions_per_s": [round(n / seconds, 1) for n in transactions],
        "fetched_records": expected,
        "records_per_txn": records_per_txn,
        "value_bytes": value_bytes,
        "rounds": rounds,
        "seconds": seconds,
        "targets": TARGETS,
    }
    for key, target in TARGETS.items():
        verdict = "[green]meets" if result[key] >= target else "[red]misses"
        console.print(f"{key} {result[key]:.3f} {verdict}[/] the target {target}")
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per produce measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records-per-txn", type=int, default=100)
    parser.add_argument("--value-bytes", type=int, default=KIB)
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.rounds < 1:
        parser.error("--seconds must be > 0 and --rounds >= 1")
    if not 1 <= args.records_per_txn <= 100_000 or not 1 <= args.value_bytes <= MIB:
        parser.error("--records-per-txn must be in 1..100000, --value-bytes in 1..1048576")
    emit_result(run(args.seconds, args.rounds, args.records_per_txn, args.value_bytes))


if __name__ == "__main__":
    main()
