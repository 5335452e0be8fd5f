"""The transactional workload (``python -m jepsen run --workload txn``), after Jepsen's Kafka
``:txn`` workload, through confluent-kafka (librdkafka).

Transaction processes (``senders`` of them) each own a transactional producer (its own
transactional.id) and a read_committed consumer of the run's topic in a group of its own
(manually assigned every partition, starting at the group's committed offsets). Each
transaction sends 1-4 unique values to distinct random partitions; about half of them
first poll the consumer and send its positions to the transaction
(``send_offsets_to_transaction``), consume-transform-produce style, so the group's offsets
commit or abort with it. Most commit; some abort on purpose. Every transaction is one
``txn`` op in the history (jepsen.txn_history says what ok, fail and info mean).

Poller processes each own a read_committed consumer that assigns a random set of partitions
from the beginning and polls, crashing (closing and reopening) now and then. After the
faults are healed, ``final_reads`` makes every poller read every partition from the
beginning to its end (the last stable offset, every transaction being decided by then).

Like the queue workload, every librdkafka call runs in a worker thread under a bounded
timeout, and loops stop at their deadline or op budget; an op is never cut off without its
completion.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from jepsen.history import ASSIGN, CRASH, FINAL_POLL, POLL, Recorder
from jepsen.secure import TXN_ID_PREFIX
from jepsen.txn_history import INIT, TXN
from jepsen.workload import (
    FINAL_RETRY_BACKOFF_S,
    LOG_START_OFFSET,
    METADATA_REFRESH_MS,
    REQUEST_TIMEOUT_MS,
    SOCKET_TIMEOUT_MS,
    WATERMARK_TIMEOUT_S,
    ValueSource,
    close_client,
    consumer_config,
    rdkafka_log,
)

log = logging.getLogger(__name__)

# An open transaction the coordinator has not heard from for this long is aborted by it: a
# producer that died mid-transaction holds the last stable offset back at most this long.
TRANSACTION_TIMEOUT_MS = 15_000
# A produce inside a transaction gives up after this (below the transaction timeout).
TXN_MESSAGE_TIMEOUT_MS = 8_000
# init_transactions, send_offsets_to_transaction, commit and abort each wait this long:
# longer than a leader's fail-over (the broker session timeout, 6 s), short enough that a
# transaction stuck on a cluster without quorum ends soon after the run's time limit.
TXN_CALL_TIMEOUT_S = 10.0
# flush() waits for every delivery report of a transaction this long.
TXN_FLUSH_TIMEOUT_S = TXN_MESSAGE_TIMEOUT_MS / 1000 + 2.0
# A commit that failed with a retriable error is tried again this many more times.
COMMIT_RETRIES = 1
# librdkafka's send_offsets_to_transaction can block past its timeout when the group
# coordinator goes away mid-call (librdkafka issues 5456 and 5511, open for 2.16; seen
# here blocking 28 s with the coordinator back after 1 s): a transaction still running
# after this long is abandoned with its thread, recorded as unknown (the thread may yet
# commit it), and the process starts over with a new producer whose init_transactions
# fences the old one. Three client calls' timeouts: a slow transaction that would still
# have finished is only recorded as unknown, which the checker allows either way.
TXN_ABANDON_AFTER_S = 3 * TXN_CALL_TIMEOUT_S
# After a failed init_transactions (no coordinator yet) the process waits this long.
INIT_RETRY_BACKOFF_S = 1.0
MAX_SENDS_PER_TXN = 4


@dataclass(frozen=True)
class TxnWorkloadOptions:
    topic: str = "jepsen"
    keys: int = 6  # one per partition
    txn_processes: int = 4
    pollers: int = 2
    # Per transaction: the chance it polls and commits its group's offsets with it, and the
    # chance it is aborted on purpose instead of committed.
    read_probability: float = 0.5
    abort_probability: float = 0.15
    # Per operation: the chance a client crashes (closes and reopens) before it.
    crash_probability: float = 0.01
    poll_max_records: int = 200
    poll_timeout_s: float = 0.25
    txn_poll_max_records: int = 50
    max_ops_per_process: int = 100_000
    final_read_timeout_s: float = 90.0
    max_final_polls: int = 10_000


@dataclass
class TxnOutcome:
    type: str  # ok / fail / info
    mops: list[list[Any]]
    error: str | None = None
    # The clients cannot be trusted with the next transaction (unknown state, positions
    # past what the group committed): the process replaces them.
    rebuild: bool = False


def _consumer_config(
    bootstrap: str, group_id: str, client_config: Mapping[str, Any], committed: bool = True
) -> dict[str, Any]:
    level = "read_committed" if committed else "read_uncommitted"
    return consumer_config(bootstrap, group_id, group_id, client_config, level)


def _reads(messages: Sequence[Any]) -> dict[str, list[list[int]]]:
    """{key: [[offset, value], ...]} of consumed messages; raises on an error record."""
    out: dict[str, list[list[int]]] = {}
    for msg in messages:
        err = msg.error()
        if err is not None:
            raise KafkaException(err)
        partition, at, value = msg.partition(), msg.offset(), msg.value()
        assert partition is not None and at is not None and value is not None, msg
        out.setdefault(str(int(partition)), []).append([int(at), int(value)])
    return out


def _report_into(reports: dict[int, tuple[Any, Any]], i: int) -> Any:
    def on_delivery(err: Any, msg: Any) -> None:
        reports[i] = (err, msg)

    return on_delivery


class TxnClient:
    """One transaction process's producer and consumer; every method blocks (run it in a
    worker thread)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        keys: int,
        transactional_id: str,
        group_id: str,
        client_config: Mapping[str, Any],
    ) -> None:
        self.topic = topic
        self.keys = keys
        self.producer = Producer(
            {
                **client_config,
                "bootstrap.servers": bootstrap,
                "client.id": transactional_id,
                "transactional.id": transactional_id,
                "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 1,
                "message.timeout.ms": TXN_MESSAGE_TIMEOUT_MS,
                "request.timeout.ms": REQUEST_TIMEOUT_MS,
                "socket.timeout.ms": SOCKET_TIMEOUT_MS,
                "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
                "retry.backoff.ms": 100,
                "logger": rdkafka_log,
            }
        )
        self.consumer = Consumer(_consumer_config(bootstrap, group_id, client_config))
        # No explicit offset: each partition starts at the group's committed offset (fetched
        # with require_stable under read_committed), or at the beginning without one.
        self.consumer.assign([TopicPartition(topic, k) for k in range(keys)])
        # What the running transaction did so far (read by the harness if it abandons it),
        # and the flag that tells a late thread not to commit after all.
        self.mops: list[list[Any]] = []
        self.abandoned = False

    def init(self) -> None:
        self.producer.init_transactions(TXN_CALL_TIMEOUT_S)

    def run(self, sends: Sequence[tuple[int, int]], read: bool, commit: bool) -> TxnOutcome:
        mops: list[list[Any]] = []
        self.mops = mops
        try:
            self.producer.begin_transaction()
        except KafkaException as exc:
            return TxnOutcome("fail", mops, f"begin_transaction: {exc}", rebuild=True)
        if read:
            try:
                polled = self.consumer.consume(
                    num_messages=TxnWorkloadOptions.txn_poll_max_records, timeout=0.25
                )
                mops.append(["poll", _reads(polled)])
            except (KafkaException, ValueError) as exc:
                return self._abort(mops, f"poll: {exc}")
        reports: dict[int, tuple[Any, Any]] = {}
        for i, (key, value) in enumerate(sends):
            try:
                self.producer.produce(
                    self.topic,
                    value=str(value).encode(),
                    key=str(key).encode(),
                    partition=key,
                    on_delivery=_report_into(reports, i),
                )
            except (BufferError, KafkaException) as exc:
                return self._abort(mops, f"produce refused locally: {exc}")
            mops.append(["send", key, value, None])
        try:
            self.producer.flush(TXN_FLUSH_TIMEOUT_S)
        except KafkaException as exc:
            # A fatal error (fenced: the coordinator aborted this transaction at its timeout
            # and bumped the epoch) surfaces here: it never asked to commit, so it did not.
            return self._abort(mops, f"flush: {exc}")
        first_send = len(mops) - len(sends)
        for i in range(len(sends)):
            err, msg = reports.get(i, (None, None))
            if msg is not None and err is None:
                mops[first_send + i][3] = int(msg.offset())
        failed = [str(reports[i][0]) for i in range(len(sends)) if reports.get(i, (1,))[0]]
        if len(reports) < len(sends) or failed:
            return self._abort(mops, f"delivery: {failed or 'no report before the timeout'}")
        if read:
            try:
                positions = [
                    tp
                    for tp in self.consumer.position(self.consumer.assignment())
                    if tp.offset >= 0
                ]
                self.producer.send_offsets_to_transaction(
                    positions, self.consumer.consumer_group_metadata(), TXN_CALL_TIMEOUT_S
                )
            except KafkaException as exc:
                return self._abort(mops, f"send_offsets_to_transaction: {exc}")
        if self.abandoned:
            return self._abort(mops, "abandoned by the harness")
        if not commit:
            return self._abort(mops, "aborted on purpose", on_purpose=True)
        return self._commit(mops, read)

    def _commit(self, mops: list[list[Any]], read: bool) -> TxnOutcome:
        # From here on the transaction may commit whatever the client hears back.
        for attempt in range(COMMIT_RETRIES + 1):
            try:
                self.producer.commit_transaction(TXN_CALL_TIMEOUT_S)
                return TxnOutcome("ok", mops)
            except KafkaException as exc:
                err = exc.args[0]
                if isinstance(err, KafkaError) and err.txn_requires_abort():
                    try:
                        self.producer.abort_transaction(TXN_CALL_TIMEOUT_S)
                    except KafkaException as abort_exc:
                        return TxnOutcome(
                            "info", mops, f"commit: {exc}; abort: {abort_exc}", rebuild=True
                        )
                    # The coordinator aborted it; the consumer is past what its group has.
                    return TxnOutcome("fail", mops, f"commit: {exc}; aborted", rebuild=read)
                retriable = isinstance(err, KafkaError) and err.retriable()
                if not retriable or attempt == COMMIT_RETRIES:
                    return TxnOutcome("info", mops, f"commit: {exc}", rebuild=True)
                log.info("commit_transaction: %s (retrying)", exc)
        raise AssertionError("unreachable: the loop returns on its last attempt")

    def _abort(self, mops: list[list[Any]], why: str, on_purpose: bool = False) -> TxnOutcome:
        """Abort a transaction that never asked to commit: it cannot have committed, whatever
        the abort answers (a coordinator aborts it at its timeout or at the next init)."""
        rebuild = not on_purpose or any(m[0] == "poll" for m in mops)
        try:
            self.producer.abort_transaction(TXN_CALL_TIMEOUT_S)
        except KafkaException as exc:
            return TxnOutcome("fail", mops, f"{why}; abort: {exc}", rebuild=True)
        return TxnOutcome("fail", mops, why, rebuild=rebuild)

    def close(self) -> None:
        try:
            self.producer.purge()
            self.producer.flush(0)
        except KafkaException as exc:  # a fenced producer says so again; it is being dropped
            log.info("closing a failed transactional producer: %s", exc)
        finally:
            self.consumer.close()


class ReadCommittedConsumer:
    """A poller's consumer: manually assigned partitions from the beginning."""

    def __init__(
        self, bootstrap: str, topic: str, name: str, client_config: Mapping[str, Any]
    ) -> None:
        self.topic = topic
        self._consumer = Consumer(_consumer_config(bootstrap, name, client_config))
        # Asks for high watermarks: a read_committed consumer's "end" is the last stable
        # offset, which a transaction whose markers are still being written holds back.
        self._probe = Consumer(
            _consumer_config(bootstrap, name + "-hw", client_config, committed=False)
        )

    def assign_from_beginning(self, keys: Sequence[int]) -> None:
        # Explicit offsets, as the queue workload does (a logical BEGINNING is not safe to
        # re-assign under librdkafka 2.16).
        self._consumer.assign([TopicPartition(self.topic, k, LOG_START_OFFSET) for k in keys])

    def poll(self, max_records: int, timeout_s: float) -> dict[str, list[list[int]]]:
        return _reads(self._consumer.consume(num_messages=max_records, timeout=timeout_s))

    def end_offsets(self, keys: Sequence[int]) -> dict[int, int]:
        """Each partition's high watermark: a read_committed consumer whose position got
        there has seen every transaction below it decided."""
        ends = {}
        for k in keys:
            _low, high = self._probe.get_watermark_offsets(
                TopicPartition(self.topic, k), timeout=WATERMARK_TIMEOUT_S, cached=False
            )
            ends[k] = int(high)
        return ends

    def positions(self, keys: Sequence[int]) -> dict[int, int]:
        tps = self._consumer.position([TopicPartition(self.topic, k) for k in keys])
        return {int(tp.partition): int(tp.offset) for tp in tps}

    def close(self) -> None:
        try:
            self._consumer.close()
        finally:
            self._probe.close()


class TxnWorkload:
    """Transaction processes 0..T-1 and pollers T..T+P-1 against ``bootstrap_servers``,
    recording every operation (the same interface as jepsen.workload.Workload)."""

    def __init__(
        self,
        bootstrap_servers: str,
        opts: TxnWorkloadOptions,
        recorder: Recorder,
        rng: random.Random,
        run_name: str = "run",
        client_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.bootstrap = bootstrap_servers
        self.client_config = dict(client_config or {})
        self.opts = opts
        self.recorder = recorder
        self.values = ValueSource()
        self.run_name = run_name
        total = opts.txn_processes + opts.pollers
        self.rngs = [random.Random(rng.getrandbits(64)) for _ in range(total)]
        self._pollers: dict[int, ReadCommittedConsumer] = {}
        self._generation = 0

    @property
    def txn_ids(self) -> range:
        return range(self.opts.txn_processes)

    @property
    def poller_ids(self) -> range:
        return range(self.opts.txn_processes, self.opts.txn_processes + self.opts.pollers)

    async def run(self, deadline: float) -> None:
        async with trio.open_nursery() as nursery:
            for p in self.txn_ids:
                nursery.start_soon(self._txn_process, p, deadline)
            for p in self.poller_ids:
                nursery.start_soon(self._poller, p, deadline)

    # ------------------------------------------------------------------ transactions
    def _new_txn_client(self, process: int) -> TxnClient:
        name = f"{TXN_ID_PREFIX}{self.run_name}-{process}"
        return TxnClient(
            self.bootstrap, self.opts.topic, self.opts.keys, name, name, self.client_config
        )

    async def _open_txn_client(self, process: int, deadline: float) -> TxnClient | None:
        """A new client whose init_transactions succeeded (fencing the process's previous
        producer and settling its last transaction), or None at the deadline."""
        while trio.current_time() < deadline:
            client = await trio.to_thread.run_sync(self._new_txn_client, process)
            self.recorder.invoke(process, INIT)
            initialised = False
            try:
                with trio.move_on_after(TXN_ABANDON_AFTER_S):
                    await trio.to_thread.run_sync(client.init, abandon_on_cancel=True)
                    initialised = True
            except KafkaException as exc:
                self.recorder.info(process, error=str(exc))
                await close_client(client, f"transactional client {process}")
                await trio.sleep(INIT_RETRY_BACKOFF_S)
                continue
            if not initialised:  # its thread still holds the client: left behind
                self.recorder.info(process, error="init_transactions blocked; abandoned")
                continue
            self.recorder.ok(process)
            return client
        return None

    async def _crash(self, process: int, client: TxnClient | None, why: str) -> None:
        self.recorder.invoke(process, CRASH)
        if client is not None:
            await close_client(client, f"transactional client {process}")
        self.recorder.info(process, error=why)

    def _plan(self, rng: random.Random) -> tuple[list[tuple[int, int]], bool, bool]:
        count = rng.randint(1, min(MAX_SENDS_PER_TXN, self.opts.keys))
        keys = rng.sample(range(self.opts.keys), count)
        sends = [(k, self.values.take()) for k in keys]
        read = rng.random() < self.opts.read_probability
        commit = rng.random() >= self.opts.abort_probability
        return sends, read, commit

    async def _txn_process(self, process: int, deadline: float) -> None:
        rng = self.rngs[process]
        client = await self._open_txn_client(process, deadline)
        try:
            for _ in range(self.opts.max_ops_per_process):
                if client is None or trio.current_time() >= deadline:
                    break
                if rng.random() < self.opts.crash_probability:
                    await self._crash(process, client, "crashed by the workload")
                    client = await self._open_txn_client(process, deadline)
                    continue
                sends, read, commit = self._plan(rng)
                mops: list[list[Any]] = [["poll"]] if read else []
                mops += [["send", k, v] for k, v in sends]
                self.recorder.invoke(process, TXN, {"mops": mops, "commit": commit})
                running: TxnClient | None = client
                with trio.move_on_after(TXN_ABANDON_AFTER_S):
                    outcome = await trio.to_thread.run_sync(
                        client.run, sends, read, commit, abandon_on_cancel=True
                    )
                    running = None
                if running is not None:
                    running.abandoned = True
                    outcome = TxnOutcome(
                        "info",
                        [list(m) for m in running.mops],
                        f"a client call blocked over {TXN_ABANDON_AFTER_S:.0f} s; abandoned",
                    )
                    log.warning("transactional client %d: %s", process, outcome.error)
                    # Its thread still holds the client: closing it would block too.
                    client = None
                self.recorder.complete(
                    process,
                    outcome.type,
                    {"mops": outcome.mops, "commit": commit},
                    error=outcome.error,
                )
                if outcome.rebuild or client is None:
                    await self._crash(process, client, f"rebuilt after: {outcome.error}")
                    client = await self._open_txn_client(process, deadline)
        finally:
            if client is not None:
                await close_client(client, f"transactional client {process}")

    # ------------------------------------------------------------------ pollers
    def _new_poller(self, process: int) -> ReadCommittedConsumer:
        self._generation += 1
        name = f"jepsen-{self.run_name}-{process}-{self._generation}"
        return ReadCommittedConsumer(self.bootstrap, self.opts.topic, name, self.client_config)

    async def _crash_poller(self, process: int) -> ReadCommittedConsumer:
        self.recorder.invoke(process, CRASH)
        old = self._pollers.pop(process, None)
        if old is not None:
            await close_client(old, f"consumer {process}")
        consumer = await trio.to_thread.run_sync(self._new_poller, process)
        self._pollers[process] = consumer
        self.recorder.info(process, error="crashed by the workload")
        return consumer

    async def _assign(
        self, process: int, consumer: ReadCommittedConsumer, keys: Sequence[int]
    ) -> bool:
        self.recorder.invoke(
            process, ASSIGN, {"keys": [str(k) for k in keys], "seek_to_beginning": True}
        )
        try:
            await trio.to_thread.run_sync(consumer.assign_from_beginning, list(keys))
        except KafkaException as exc:
            self.recorder.info(process, error=str(exc))
            return False
        self.recorder.ok(process)
        return True

    async def _poll(self, process: int, consumer: ReadCommittedConsumer, f: str) -> bool:
        self.recorder.invoke(process, f)
        try:
            reads = await trio.to_thread.run_sync(
                consumer.poll, self.opts.poll_max_records, self.opts.poll_timeout_s
            )
        except (KafkaException, ValueError) as exc:
            self.recorder.info(process, error=str(exc))
            return False
        self.recorder.ok(process, reads)
        return True

    async def _poller(self, process: int, deadline: float) -> None:
        rng = self.rngs[process]
        healthy = False
        consumer: ReadCommittedConsumer | None = None
        for _ in range(self.opts.max_ops_per_process):
            if trio.current_time() >= deadline:
                break
            if consumer is None or not healthy or rng.random() < self.opts.crash_probability:
                consumer = await self._crash_poller(process)
                keys = sorted(rng.sample(range(self.opts.keys), rng.randint(1, self.opts.keys)))
                healthy = await self._assign(process, consumer, keys)
                continue
            healthy = await self._poll(process, consumer, POLL)

    # ------------------------------------------------------------------ final reads
    async def final_reads(self) -> dict[int, bool]:
        done: dict[int, bool] = {}
        async with trio.open_nursery() as nursery:
            for p in self.poller_ids:
                nursery.start_soon(self._final_read, p, done)
        for p in list(self._pollers):
            await close_client(self._pollers.pop(p), f"consumer {p}")
        return done

    async def _final_read(self, process: int, done: dict[int, bool]) -> None:
        keys = list(range(self.opts.keys))
        deadline = trio.current_time() + self.opts.final_read_timeout_s
        done[process] = False
        polls = 0
        while trio.current_time() < deadline and polls < self.opts.max_final_polls:
            polls += 1
            consumer = await self._crash_poller(process)
            if not await self._assign(process, consumer, keys):
                await trio.sleep(FINAL_RETRY_BACKOFF_S)
                continue
            try:
                ends = await trio.to_thread.run_sync(consumer.end_offsets, keys)
            except KafkaException as exc:
                log.info("final read %d: end offsets unavailable: %s", process, exc)
                await trio.sleep(FINAL_RETRY_BACKOFF_S)
                continue
            while trio.current_time() < deadline and polls < self.opts.max_final_polls:
                # The last record of a partition is usually a transaction marker the
                # consumer never returns; its position still moves past it. An empty
                # partition has nothing to read.
                positions = await trio.to_thread.run_sync(consumer.positions, keys)
                if all(end == 0 or positions.get(k, -1) >= end for k, end in ends.items()):
                    log.info("final read %d done: ends %s positions %s", process, ends, positions)
                    done[process] = True
                    return
                polls += 1
                if not await self._poll(process, consumer, FINAL_POLL):
                    break
