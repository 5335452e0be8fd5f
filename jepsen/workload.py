"""Jepsen's Kafka queue workload: keyed sends and polls through confluent-kafka, recorded.

Keys are partitions of the run's topic (key k is partition k); values are unique integers.
Sender processes each own a producer (acks=all, idempotent; acks=1 in the unsafe
configuration) and send one value at a time. Poller processes each own a consumer with
manually assigned partitions; now and then they re-assign (sometimes seeking to the
beginning), and every client now and then crashes (closes and reopens). After the faults
are healed, ``final_reads`` makes every poller crash, assign every key from the beginning
and poll until it reaches each key's high watermark.

Every client gets ``client_config`` on top of its own settings: the security keys (SASL_SSL,
SCRAM, the CA) of a run with --secure, nothing otherwise.

librdkafka is blocking C with threads of its own: every client call runs through
trio.to_thread.run_sync and is bounded by a client timeout, and loops stop themselves at
their deadline or op budget, so no operation is ever cut off without its completion.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from jepsen.history import ASSIGN, CRASH, FINAL_POLL, POLL, SEND, Recorder

# librdkafka's own log (connection refused, timeouts) goes to the harness log, not stderr,
# where it would tear the progress display.
rdkafka_log = logging.getLogger("jepsen.librdkafka")
log = logging.getLogger(__name__)

# A produce gives up after this (librdkafka reports every message within it, success or not).
MESSAGE_TIMEOUT_MS = 10_000
REQUEST_TIMEOUT_MS = 5_000
# flush() waits this much past the message timeout for the delivery report to arrive.
DELIVERY_REPORT_SLACK_S = 3.0
SOCKET_TIMEOUT_MS = 5_000
# After a leader change clients relearn metadata this often at most.
METADATA_REFRESH_MS = 1_000
FETCH_WAIT_MAX_MS = 100
WATERMARK_TIMEOUT_S = 5.0
# Where a partition's log starts in a run (no retention or deletion happens in one).
LOG_START_OFFSET = 0
# A final read that failed to start (no leader yet) tries again after this pause.
FINAL_RETRY_BACKOFF_S = 0.5


# librdkafka's close can block for good (seen once in hundreds of runs: a consumer's close
# stuck minutes after a broker it used was killed and restarted, with the cluster healthy);
# a close gets this long, then its thread is left behind and the run goes on.
CLOSE_TIMEOUT_S = 30.0


async def close_client(client: Any, what: str) -> None:
    """Close a producer or consumer in a worker thread, giving up on it after
    CLOSE_TIMEOUT_S (shielded: a cancelled run still closes what it can)."""
    with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
        try:
            await trio.to_thread.run_sync(client.close, abandon_on_cancel=True)
        except KafkaException as exc:
            log.info("closing %s: %s", what, exc)
    if scope.cancelled_caught:
        log.warning("closing %s took over %.0f s; left behind", what, CLOSE_TIMEOUT_S)


@dataclass(frozen=True)
class SendResult:
    type: str  # ok / fail / info
    offset: int | None = None
    error: str | None = None


class KeyedProducer:
    """One producer; ``send`` produces one value to one partition and waits for its report."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        unsafe: bool,
        client_id: str,
        client_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.topic = topic
        config: dict[str, Any] = {
            **(client_config or {}),
            "bootstrap.servers": bootstrap_servers,
            "client.id": client_id,
            "acks": "1" if unsafe else "all",
            # Idempotence needs acks=all; the unsafe configuration turns both off.
            "enable.idempotence": not unsafe,
            "linger.ms": 0,
            "message.timeout.ms": MESSAGE_TIMEOUT_MS,
            "request.timeout.ms": REQUEST_TIMEOUT_MS,
            "socket.timeout.ms": SOCKET_TIMEOUT_MS,
            "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
            "retry.backoff.ms": 100,
            "logger": rdkafka_log,
        }
        self._producer = Producer(config)

    def send(self, key: int, value: int) -> SendResult:
        reports: list[tuple[Any, Any]] = []
        try:
            self._producer.produce(
                self.topic,
                value=str(value).encode(),
                key=str(key).encode(),
                partition=key,
                on_delivery=lambda err, msg: reports.append((err, msg)),
            )
        except BufferError as exc:
            # The local queue refused it: never left this process.
            return SendResult("fail", error=f"local queue full: {exc}")
        except KafkaException as exc:
            return SendResult("fail", error=f"produce refused locally: {exc}")
        self._producer.flush(MESSAGE_TIMEOUT_MS / 1000 + DELIVERY_REPORT_SLACK_S)
        if not reports:
            return SendResult("info", error="no delivery report before the timeout")
        err, msg = reports[0]
        if err is None:
            return SendResult("ok", offset=int(msg.offset()))
        # Any error after the message left the client is indeterminate: an earlier attempt
        # may have been appended (a timed-out request is not a refused one).
        return SendResult("info", error=str(err))

    def close(self) -> None:
        # Drop anything still queued so destruction does not wait on a dead cluster.
        self._producer.purge()
        self._producer.flush(0)


def consumer_config(
    bootstrap_servers: str,
    client_id: str,
    group_id: str,
    client_config: Mapping[str, Any],
    isolation_level: str = "read_uncommitted",
) -> dict[str, Any]:
    """The settings every workload consumer shares: no automatic commits or offset stores,
    reads from the log start when nothing is committed, the harness's timeouts and logger."""
    return {
        **client_config,
        "bootstrap.servers": bootstrap_servers,
        "client.id": client_id,
        "group.id": group_id,
        "isolation.level": isolation_level,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
        "fetch.wait.max.ms": FETCH_WAIT_MAX_MS,
        "socket.timeout.ms": SOCKET_TIMEOUT_MS,
        "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
        "logger": rdkafka_log,
    }


class KeyedConsumer:
    """A consumer with manually assigned partitions (no group membership), positions tracked
    so a re-assignment can keep them."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        group_id: str,
        client_id: str,
        client_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.topic = topic
        self.positions: dict[int, int] = {}  # next offset to read, per key, as far as we know
        self.assigned: list[int] = []
        # group.id is required by librdkafka even without subscribe(); never joined or
        # committed here.
        self._consumer = Consumer(
            consumer_config(bootstrap_servers, client_id, group_id, client_config or {})
        )

    def assign(self, keys: Sequence[int], seek_to_beginning: bool) -> None:
        if seek_to_beginning:
            self.positions.clear()
        self.positions = {k: v for k, v in self.positions.items() if k in keys}
        # Explicit offsets only, never the logical OFFSET_BEGINNING: librdkafka (2.16) keeps a
        # timed ListOffsets query for a logical offset alive across a re-assignment, and when
        # it fires it rewinds a partition that meanwhile got an explicit position back to the
        # beginning (reproduced against a single healthy node: assign all keys at BEGINNING,
        # re-assign a subset at once, read on; a kept key later restarts at 0). The checker
        # rightly calls that a nonmonotonic poll, but it is the client's. Offset 0 is where
        # every run's log starts (nothing is deleted); were it gone, auto.offset.reset
        # (earliest) still starts at the beginning.
        self._consumer.assign(
            [TopicPartition(self.topic, k, self.positions.get(k, LOG_START_OFFSET)) for k in keys]
        )
        self.assigned = list(keys)

    def poll(self, max_records: int, timeout_s: float) -> dict[str, list[list[int]]]:
        """Up to max_records: {key: [[offset, value], ...]} in delivery order. Raises
        KafkaException on any error record (the caller records info and rebuilds)."""
        out: dict[str, list[list[int]]] = {}
        for msg in self._consumer.consume(num_messages=max_records, timeout=timeout_s):
            if msg.error() is not None:
                raise KafkaException(msg.error())
            partition, at, value = msg.partition(), msg.offset(), msg.value()
            assert partition is not None and at is not None and value is not None, msg
            key, offset = int(partition), int(at)
            out.setdefault(str(key), []).append([offset, int(value)])
            self.positions[key] = offset + 1
        return out

    def end_offsets(self, keys: Sequence[int]) -> dict[int, int]:
        """High watermarks (what a final read must reach), asked of each partition's leader."""
        ends = {}
        for k in keys:
            _low, high = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, k), timeout=WATERMARK_TIMEOUT_S, cached=False
            )
            ends[k] = int(high)
        return ends

    def close(self) -> None:
        self._consumer.close()


# -- the workload -----------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadOptions:
    topic: str = "jepsen"
    keys: int = 6  # one per partition
    senders: int = 4
    pollers: int = 2
    unsafe: bool = False
    # Per operation: the chance a client crashes (close and reopen) before it.
    crash_probability: float = 0.01
    # Per poll: the chance a poller re-assigns first (and, half the time, seeks to 0).
    reassign_probability: float = 0.05
    poll_max_records: int = 500
    poll_timeout_s: float = 0.25
    # Bounded loops: no client runs more operations than this, whatever the time limit.
    max_ops_per_process: int = 200_000
    final_read_timeout_s: float = 90.0
    max_final_polls: int = 10_000


@dataclass
class ValueSource:
    """Unique values across the run (one trio thread increments it)."""

    next_value: int = 0

    def take(self) -> int:
        self.next_value += 1
        return self.next_value


class Workload:
    """Runs sender and poller processes against ``bootstrap_servers``, recording every
    operation. Process ids: senders 0..S-1, pollers S..S+P-1."""

    def __init__(
        self,
        bootstrap_servers: str,
        opts: WorkloadOptions,
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
        # One generator per process, seeded from the run's: a process's choices replay
        # whatever the interleaving of threads was.
        total = opts.senders + opts.pollers
        self.rngs = [random.Random(rng.getrandbits(64)) for _ in range(total)]
        self._consumers: dict[int, KeyedConsumer] = {}
        self._generation = 0

    @property
    def sender_ids(self) -> range:
        return range(self.opts.senders)

    @property
    def poller_ids(self) -> range:
        return range(self.opts.senders, self.opts.senders + self.opts.pollers)

    async def run(self, deadline: float) -> None:
        """Every client process until ``deadline`` (trio.current_time()) or its op budget."""
        async with trio.open_nursery() as nursery:
            for p in self.sender_ids:
                nursery.start_soon(self._sender, p, deadline)
            for p in self.poller_ids:
                nursery.start_soon(self._poller, p, deadline)

    # ------------------------------------------------------------------ senders
    def _new_producer(self, process: int) -> KeyedProducer:
        self._generation += 1
        return KeyedProducer(
            self.bootstrap,
            self.opts.topic,
            unsafe=self.opts.unsafe,
            client_id=f"jepsen-{process}-{self._generation}",
            client_config=self.client_config,
        )

    async def _sender(self, process: int, deadline: float) -> None:
        rng = self.rngs[process]
        producer = await trio.to_thread.run_sync(self._new_producer, process)
        try:
            for _ in range(self.opts.max_ops_per_process):
                if trio.current_time() >= deadline:
                    break
                if rng.random() < self.opts.crash_probability:
                    self.recorder.invoke(process, CRASH)
                    await close_client(producer, f"producer {process}")
                    producer = await trio.to_thread.run_sync(self._new_producer, process)
                    self.recorder.info(process, error="crashed by the workload")
                    continue
                key, value = rng.randrange(self.opts.keys), self.values.take()
                self.recorder.invoke(process, SEND, [key, value])
                result = await trio.to_thread.run_sync(producer.send, key, value)
                self.recorder.complete(
                    process, result.type, offset=result.offset, error=result.error
                )
                if result.type == "info":
                    # An unknown outcome may still be in flight inside librdkafka; a fresh
                    # producer keeps it from being confused with the next send.
                    await close_client(producer, f"producer {process}")
                    producer = await trio.to_thread.run_sync(self._new_producer, process)
        finally:
            await close_client(producer, f"producer {process}")

    # ------------------------------------------------------------------ pollers
    def _new_consumer(self, process: int) -> KeyedConsumer:
        self._generation += 1
        name = f"jepsen-{self.run_name}-{process}-{self._generation}"
        return KeyedConsumer(
            self.bootstrap,
            self.opts.topic,
            group_id=name,
            client_id=name,
            client_config=self.client_config,
        )

    async def _crash_consumer(self, process: int) -> KeyedConsumer:
        """Close the process's consumer (if any) and open a new one, recorded as a crash."""
        self.recorder.invoke(process, CRASH)
        old = self._consumers.pop(process, None)
        if old is not None:
            await close_client(old, f"consumer {process}")
        consumer = await trio.to_thread.run_sync(self._new_consumer, process)
        self._consumers[process] = consumer
        self.recorder.info(process, error="crashed by the workload")
        return consumer

    async def _assign(
        self, process: int, consumer: KeyedConsumer, keys: Sequence[int], seek: bool
    ) -> bool:
        value = {"keys": [str(k) for k in keys], "seek_to_beginning": seek}
        self.recorder.invoke(process, ASSIGN, value)
        try:
            await trio.to_thread.run_sync(consumer.assign, list(keys), seek)
        except KafkaException as exc:
            self.recorder.info(process, error=str(exc))
            return False
        self.recorder.ok(process)
        return True

    def _random_keys(self, rng: random.Random) -> list[int]:
        return sorted(rng.sample(range(self.opts.keys), rng.randint(1, self.opts.keys)))

    async def _poll(self, process: int, consumer: KeyedConsumer, f: str) -> bool:
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
        consumer = await self._crash_consumer(process)
        healthy = await self._assign(process, consumer, self._random_keys(rng), True)
        for _ in range(self.opts.max_ops_per_process):
            if trio.current_time() >= deadline:
                break
            if not healthy or rng.random() < self.opts.crash_probability:
                consumer = await self._crash_consumer(process)
                healthy = await self._assign(process, consumer, self._random_keys(rng), True)
                continue
            if rng.random() < self.opts.reassign_probability:
                seek = rng.random() < 0.5
                healthy = await self._assign(process, consumer, self._random_keys(rng), seek)
                continue
            healthy = await self._poll(process, consumer, POLL)

    # ------------------------------------------------------------------ final reads
    async def final_reads(self) -> dict[int, bool]:
        """Every poller reads every key from the beginning to its high watermark. Returns,
        per poller, whether it got to the end before its deadline."""
        done: dict[int, bool] = {}
        async with trio.open_nursery() as nursery:
            for p in self.poller_ids:
                nursery.start_soon(self._final_read, p, done)
        for p in list(self._consumers):
            await close_client(self._consumers.pop(p), f"consumer {p}")
        return done

    async def _final_read(self, process: int, done: dict[int, bool]) -> None:
        keys = list(range(self.opts.keys))
        deadline = trio.current_time() + self.opts.final_read_timeout_s
        done[process] = False
        polls = 0
        while trio.current_time() < deadline and polls < self.opts.max_final_polls:
            polls += 1  # a failed attempt spends the budget too, so this loop is bounded
            consumer = await self._crash_consumer(process)
            if not await self._assign(process, consumer, keys, True):
                await trio.sleep(FINAL_RETRY_BACKOFF_S)
                continue
            try:
                ends = await trio.to_thread.run_sync(consumer.end_offsets, keys)
            except KafkaException as exc:
                log.info("final read %d: watermarks unavailable: %s", process, exc)
                await trio.sleep(FINAL_RETRY_BACKOFF_S)
                continue
            while trio.current_time() < deadline and polls < self.opts.max_final_polls:
                if all(consumer.positions.get(k, 0) >= end for k, end in ends.items()):
                    done[process] = True
                    return
                polls += 1
                if not await self._poll(process, consumer, FINAL_POLL):
                    break  # rebuild and start over from the beginning
