"""Transactions benchmark: what transactions cost producers, and read_committed a consumer.

    python -m benchmarks.transactions [--seconds 5] [--rounds 5] [--records-per-txn 100]
                                      [--producers 4]

One cluster of three real node processes (raftlog.testing.cluster), two RF 3 topics of
`--producers` partitions (min.insync.replicas 2), confluent-kafka clients with the same
settings on both sides of each pair, each producer in its own process on its own partition:

- produce throughput, acks=all, values of `--value-bytes` (1 KiB), `--producers` producers at
  once on each side: transactional producers, each committing transactions of
  `--records-per-txn` records one after the other (begin, produce, commit_transaction) /
  plain idempotent producers streaming the same records (txn_produce_ratio, target >= 0.5).
  Each transaction is on one partition, so it commits in one phase (docs/transactions.md):
  two replicated writes one after the other (its records, its COMMIT marker), as the next
  transaction on the same partition needs no record of its own. A transaction of two or more
  partitions adds a PrepareCommit record, a Complete and an Ongoing record, and a marker per
  partition.
  The same pair with one producer a side is measured too (txn_produce_ratio_one_producer):
  one transactional producer waits for every step of every transaction, so that ratio is
  bound by round trips, not by what a byte costs;
- consumer fetch throughput over the same committed transactional data, every partition from
  its start to its last record, passes repeated for `--fetch-seconds` (1 s):
  isolation.level=read_committed / read_uncommitted (read_committed_ratio, target >= 0.9).
  The clock stops at the last record, not at the partitions' EOF events: librdkafka reports
  EOF only after a fetch at the end offset has waited out fetch.wait.max.ms.

Each pair is measured in `--rounds` rounds, the two sides alternating which goes first, and a
ratio is the median of the rounds' ratios (as benchmarks/security.py). The last stdout line is
one JSON object: {"txn_produce_ratio", "read_committed_ratio", ... the raw MiB/s of each side
and round, the cores the nodes and the producers used in each window of the main pair
("node_cores", "producer_cores"), and the 1-minute load average before and after}. On two
cores the transactional side is bound by the nodes and the idempotent one by its clients, so
CPU others take on the host moves the ratio: those fields say how each run stood.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from benchmarks.common import console, emit_result, stream_acked_bytes_per_s
from benchmarks.replication import cpu_seconds
from benchmarks.security import _mib, _ratio, alternate
from raftlog.constants import KIB, MIB

TXN_TOPIC = "txn-bench"
PLAIN_TOPIC = "idempotent-bench"
PRODUCER_BATCH_BYTES = 256 * 1024
CLIENT_TIMEOUT_S = 60.0
# A fetch round stops at the end of the topic; it is never longer than this many seconds.
FETCH_MAX_S = 30.0
# One fetch measurement reads the topic again until it has read for this long (a pass over a
# few hundred MiB takes a fraction of a second); --fetch-seconds.
FETCH_MIN_S = 1.0
# How long one consume() call waits for a full batch of messages before returning what it has.
CONSUME_WAIT_S = 0.02
QUEUED_MAX_KBYTES = 1024 * 1024
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


def create_topics(bootstrap: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [
        NewTopic(name, partitions, 3, config={"min.insync.replicas": "2"})
        for name in (TXN_TOPIC, PLAIN_TOPIC)
    ]
    for future in admin.create_topics(topics).values():
        future.result(CLIENT_TIMEOUT_S)


def idempotent_produce_for(
    bootstrap: str, partition: int, seconds: float, value_bytes: int, ready: Callable[[], None]
) -> tuple[float, int]:
    """One idempotent producer streaming values to `partition` as fast as it can for
    `seconds`, starting once `ready()` returns: (acknowledged bytes/s in the window, 0)."""
    from confluent_kafka import Producer

    producer = Producer(_producer_config(bootstrap))
    value = b"i" * value_bytes
    # A producer id and a connection to the partition's leader before the clock starts.
    producer.produce(PLAIN_TOPIC, value, partition=partition)
    producer.flush(CLIENT_TIMEOUT_S)
    rate = stream_acked_bytes_per_s(
        producer, PLAIN_TOPIC, value, seconds, CLIENT_TIMEOUT_S, partition, ready
    )
    return rate, 0


def txn_produce_for(
    bootstrap: str,
    partition: int,
    seconds: float,
    value_bytes: int,
    records_per_txn: int,
    ready: Callable[[], None],
) -> tuple[float, int]:
    """One transactional producer committing transactions of `records_per_txn` values to
    `partition` one after the other for `seconds` (the last one finishes), starting once
    `ready()` returns: (committed bytes/s in the window, committed transactions including
    one before the window)."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            **_producer_config(bootstrap),
            "transactional.id": f"txn-bench-{partition}-{time.monotonic_ns()}",
            "transaction.timeout.ms": 60_000,
        }
    )
    value = b"t" * value_bytes
    # Find the coordinator, take a producer id and commit one transaction (connections to
    # the partition's leader, the coordinator's to it) before the clock starts.
    producer.init_transactions(CLIENT_TIMEOUT_S)
    producer.list_topics(TXN_TOPIC, timeout=CLIENT_TIMEOUT_S)
    producer.begin_transaction()
    for _ in range(records_per_txn):
        producer.produce(TXN_TOPIC, value, partition=partition)
    producer.commit_transaction(CLIENT_TIMEOUT_S)
    ready()
    committed = 0
    transactions = 1  # the warm-up's records are in the topic too
    started = time.monotonic()
    deadline = started + seconds
    while time.monotonic() < deadline:
        producer.begin_transaction()
        for _ in range(records_per_txn):
            while True:
                try:
                    producer.produce(TXN_TOPIC, value, partition=partition)
                    break
                except BufferError:
                    producer.poll(0.001)
        producer.commit_transaction(CLIENT_TIMEOUT_S)
        committed += records_per_txn * value_bytes
        transactions += 1
    elapsed = time.monotonic() - started
    return committed / elapsed, transactions


def _producer_process(
    transactional: bool,
    bootstrap: str,
    partition: int,
    seconds: float,
    value_bytes: int,
    records_per_txn: int,
    barrier: Any,
    results: Any,
) -> None:
    """One producer of a side, in its own process (its own GIL, as separate applications
    would run): puts (partition, bytes/s, transactions, error or None) on `results`."""
    ready = lambda: barrier.wait(CLIENT_TIMEOUT_S)  # noqa: E731 - all start together
    try:
        if transactional:
            rate, transactions = txn_produce_for(
                bootstrap, partition, seconds, value_bytes, records_per_txn, ready
            )
        else:
            rate, transactions = idempotent_produce_for(
                bootstrap, partition, seconds, value_bytes, ready
            )
        results.put((partition, rate, transactions, None))
    except BaseException as exc:
        barrier.abort()  # the others stop waiting for this one
        results.put((partition, 0.0, 0, repr(exc)))


def produce_side(
    transactional: bool,
    bootstrap: str,
    producers: int,
    seconds: float,
    value_bytes: int,
    records_per_txn: int,
    transactions: list[int],
    node_pids: Sequence[int] = (),
    cores: list[tuple[float, float]] | None = None,
) -> float:
    """`producers` producers of one side at once, producer i on partition i, each in its own
    process, their windows starting together: the sum of their bytes/s. Appends the number of
    committed transactions to `transactions` (transactional side), and to `cores` the CPU
    the node processes (`node_pids`) and the producers used from the window's start until
    every producer answered, in cores: which of them bound the side."""
    context = multiprocessing.get_context("spawn")
    # The producers and this process, which starts the CPU clocks with their windows.
    barrier = context.Barrier(producers + 1)
    results = context.Queue()
    processes = [
        context.Process(
            target=_producer_process,
            args=(
                transactional,
                bootstrap,
                partition,
                seconds,
                value_bytes,
                records_per_txn,
                barrier,
                results,
            ),
            daemon=True,
        )
        for partition in range(producers)
    ]
    for process in processes:
        process.start()
    answers = []
    clocks: tuple[float, float, float] | None = None
    try:
        try:
            barrier.wait(2 * CLIENT_TIMEOUT_S)
            clocks = _cpu_clocks(node_pids, processes)
        except threading.BrokenBarrierError:
            pass  # a producer failed before its window: its answer says why
        for _ in processes:
            answers.append(results.get(timeout=seconds + 3 * CLIENT_TIMEOUT_S))
        if clocks is not None and cores is not None:
            # A producer that answered may have exited: /proc keeps its times until joined.
            end = _cpu_clocks(node_pids, processes)
            elapsed_s = end[0] - clocks[0]
            cores.append(
                (
                    round((end[1] - clocks[1]) / elapsed_s, 2),
                    round((end[2] - clocks[2]) / elapsed_s, 2),
                )
            )
    except queue.Empty:
        raise RuntimeError(f"{producers - len(answers)} producers never answered") from None
    finally:
        for process in processes:
            process.join(CLIENT_TIMEOUT_S)
            if process.is_alive():
                process.kill()
    errors = [error for *_, error in answers if error is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} producers failed, first: {errors[0]}")
    if transactional:
        transactions.append(sum(count for _, _, count, _ in answers))
    return sum(rate for _, rate, _, _ in answers)


def _cpu_clocks(node_pids: Sequence[int], processes: Sequence[Any]) -> tuple[float, float, float]:
    """(monotonic seconds, CPU seconds of the nodes, CPU seconds of the producers)."""
    return (
        time.monotonic(),
        cpu_seconds(node_pids),
        cpu_seconds(process.pid for process in processes),
    )


def fetch_for(
    bootstrap: str, partitions: int, isolation_level: str, records: list[int], min_s: float
) -> float:
    """Whole passes of `fetch_all` until `min_s` of reading (at least one pass): consumed
    value bytes/s."""
    total_bytes = total_s = 0.0
    while total_s <= min_s:
        consumed, elapsed = fetch_all(bootstrap, partitions, isolation_level, records)
        if elapsed <= 0:
            break  # nothing to read: another pass would read nothing either
        total_bytes += consumed
        total_s += elapsed
    return total_bytes / total_s if total_s > 0 else 0.0


def fetch_all(
    bootstrap: str, partitions: int, isolation_level: str, records: list[int]
) -> tuple[int, float]:
    """One consumer reading every partition of TXN_TOPIC from its start to its end (at most
    FETCH_MAX_S) at `isolation_level`: (consumed value bytes, seconds from the start to the
    last record's arrival). Appends the number of records read to `records`."""
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
            # With its prefetch queue full, librdkafka stops fetching and looks again only
            # after fetch.queue.backoff.ms (1 s by default): a pause of the reader, not of the
            # broker. A queue that holds the whole topic and a short backoff leave it out.
            "queued.max.messages.kbytes": QUEUED_MAX_KBYTES,
            "queued.min.messages": 1_000_000,
            "fetch.queue.backoff.ms": 5,
        }
    )
    try:
        consumer.list_topics(TXN_TOPIC, timeout=CLIENT_TIMEOUT_S)
        consumer.assign([TopicPartition(TXN_TOPIC, p, OFFSET_BEGINNING) for p in range(partitions)])
        consumed = 0
        count = 0
        at_end: set[int] = set()
        started = time.monotonic()
        last_record = started
        # Each partition ends with a COMMIT marker, which no consumer returns: its end is its
        # EOF event, which comes only after a fetch at the end offset waited out
        # fetch.wait.max.ms, so the clock stops at the last record instead. consume() returns
        # early only with num_messages in hand; a short timeout keeps its wait for the rest
        # of a batch out of the measurement.
        while len(at_end) < partitions and time.monotonic() - started < FETCH_MAX_S:
            for message in consumer.consume(num_messages=10_000, timeout=CONSUME_WAIT_S):
                error = message.error()
                if error is None:
                    consumed += len(message.value() or b"")
                    count += 1
                    last_record = time.monotonic()
                elif error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition() or 0)
        elapsed = last_record - started
    finally:
        consumer.close()
    records.append(count)
    return consumed, elapsed


def run(
    seconds: float,
    rounds: int,
    records_per_txn: int,
    value_bytes: int,
    producers: int,
    fetch_seconds: float = FETCH_MIN_S,
) -> dict[str, Any]:
    from raftlog.testing.cluster import ProcessCluster

    # The one-producer pair is left out when --producers is 1: it would be the same pair.
    produce_pairs = (producers, 1) if producers > 1 else (producers,)
    measurements = 2 * rounds * (len(produce_pairs) + 1)
    load_before = round(os.getloadavg()[0], 2)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with (
        tempfile.TemporaryDirectory(prefix="raftlog-txn-bench-") as tmp,
        Progress(*columns, console=console, transient=False) as bar,
    ):
        setup = bar.add_task("starting a 3-node cluster", total=1)
        with ProcessCluster(Path(tmp) / "cluster", 3) as cluster:
            bar.advance(setup)
            bootstrap = cluster.bootstrap_servers
            node_pids = [n.process.pid for n in cluster.nodes.values() if n.process is not None]
            create_topics(bootstrap, producers)
            task = bar.add_task("measuring", total=measurements)

            def advance(what: str) -> None:
                bar.update(task, advance=1, description=f"measuring: {what}")

            transactions: list[int] = []
            produce: dict[int, dict[str, list[float]]] = {}
            # (node cores, producer cores) of each measurement of the main pair's sides.
            cores: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            for count in produce_pairs:

                def side(transactional: bool, count: int = count) -> Callable[[], float]:
                    return lambda: produce_side(
                        transactional,
                        bootstrap,
                        count,
                        seconds,
                        value_bytes,
                        records_per_txn,
                        transactions,
                        node_pids,
                        cores[transactional] if count == producers else None,
                    )

                produce[count] = alternate(
                    rounds,
                    {
                        f"produce transactional x{count}": side(True),
                        f"produce idempotent x{count}": side(False),
                    },
                    advance,
                )
            committed_records: list[int] = []
            uncommitted_records: list[int] = []
            # One untimed pass of each side first: connections, metadata and the cold caches
            # of each isolation level's first pass would otherwise fall on the first round of
            # one side.
            for isolation_level in ("read_uncommitted", "read_committed"):
                fetch_all(bootstrap, producers, isolation_level, [])
            fetch = alternate(
                rounds,
                {
                    "fetch read_committed": lambda: fetch_for(
                        bootstrap, producers, "read_committed", committed_records, fetch_seconds
                    ),
                    "fetch read_uncommitted": lambda: fetch_for(
                        bootstrap, producers, "read_uncommitted", uncommitted_records, fetch_seconds
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

    def pair(count: int) -> tuple[list[float], list[float]]:
        sides = produce[count]
        return sides[f"produce transactional x{count}"], sides[f"produce idempotent x{count}"]

    txn_side, idempotent_side = pair(producers)
    side_cores = {"transactional": cores[True], "idempotent": cores[False]}
    result: dict[str, Any] = {
        "txn_produce_ratio": _ratio(txn_side, idempotent_side),
        "read_committed_ratio": _ratio(
            fetch["fetch read_committed"], fetch["fetch read_uncommitted"]
        ),
        "txn_produce_ratio_one_producer": _ratio(*pair(1)),
        "producers": producers,
        "txn_produce_mib_s": _mib(txn_side),
        "idempotent_produce_mib_s": _mib(idempotent_side),
        "txn_produce_one_producer_mib_s": _mib(pair(1)[0]),
        "idempotent_produce_one_producer_mib_s": _mib(pair(1)[1]),
        "fetch_read_committed_mib_s": _mib(fetch["fetch read_committed"]),
        "fetch_read_uncommitted_mib_s": _mib(fetch["fetch read_uncommitted"]),
        # Which side the nodes bound and which the clients: the ratio follows the host
        # (docs/results.md, Transactions).
        "node_cores": {name: [n for n, _ in c] for name, c in side_cores.items()},
        "producer_cores": {name: [p for _, p in c] for name, c in side_cores.items()},
        "load_average_1m": [load_before, round(os.getloadavg()[0], 2)],
        "transactions_per_measurement": transactions,
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
    parser.add_argument(
        "--producers", type=int, default=4, help="producers at once on each produce side"
    )
    parser.add_argument(
        "--fetch-seconds",
        type=float,
        default=FETCH_MIN_S,
        help="each fetch measurement repeats whole passes over the topic for this long "
        "(0: one pass)",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.fetch_seconds <= 600:
        parser.error("--fetch-seconds must be in 0..600")
    if args.seconds <= 0 or args.rounds < 1:
        parser.error("--seconds must be > 0 and --rounds >= 1")
    if not 1 <= args.records_per_txn <= 100_000 or not 1 <= args.value_bytes <= MIB:
        parser.error("--records-per-txn must be in 1..100000, --value-bytes in 1..1048576")
    if not 1 <= args.producers <= 64:
        parser.error("--producers must be in 1..64")
    emit_result(
        run(
            args.seconds,
            args.rounds,
            args.records_per_txn,
            args.value_bytes,
            args.producers,
            args.fetch_seconds,
        )
    )


if __name__ == "__main__":
    main()
