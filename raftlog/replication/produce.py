"""The leader's produce path: idempotence check, append, acks.

Order on the event loop, with no await between the check and the table update, so two
requests of one producer can never both pass the sequence check (KIP-98):
  min.insync.replicas -> validated_client_batches -> check_headers -> [stamp LogAppendTime]
  -> append_as_leader -> update the producer table.
The validated batches go to the append with their headers: each produced byte has its CRC
computed once and each header is parsed once on this path.
Every batch is validated as Kafka's LogValidator does (raftlog/batch_validation.py) before
anything is appended: a batch whose CRC holds but whose records do not match its header
would otherwise move the log end offset by what the header claims and stop every consumer
of the partition at it. One bad batch refuses the whole partition's data of the request.
A retry of one of the producer's last five batches (Verdict.DUPLICATE) is not appended: it is
answered with the original base offset, but only once that batch is covered the way `acks`
asks (HW for acks=all, fsync for acks=1), so a retry never promises more than the original.

KIP-890 part 1, the seam for the transaction coordinator: a transactional batch of a producer
that has no transaction open on this partition would start one. Before that, the produce path
asks `verify_transaction` (an async callable, since the coordinator may be another broker:
Kafka sends it AddPartitionsToTxn with verify_only) whether the coordinator added this
partition to the producer's ongoing transaction; any answer but NONE refuses the whole
partition's data with that code (INVALID_TXN_STATE when the partition is not in the
transaction), so a late or retried produce cannot open a transaction the coordinator does not
know, and a later marker cannot silently commit it. The default allows everything (no
coordinator yet). The question is asked before the check-append-update sequence, never inside
it, so the sequence rules keep their no-await guarantee.

KIP-890 part 2: a client of transaction version 2 sends no AddPartitionsToTxn for the
partitions it produces to; its Produce v12+ request (`producer.transaction_version` >= 2)
makes the question an add (`TxnProduce.add_partition`): the coordinator adds the partition
to the producer's transaction and answers once that is replicated, and only then is the batch
appended. A request below v12 keeps part 1's verification.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from raftlog.batch_validation import (
    InvalidRecordError,
    ValidatedBatches,
    validated_client_batches,
)
from raftlog.errors import ErrorCode, KafkaError
from raftlog.net.kafka.backend import ProduceResult
from raftlog.net.limits import RateLimitedLog
from raftlog.records import NO_TIMESTAMP, BatchHeader, stamp_log_append_time
from raftlog.replication.core.purgatory import (
    DelayedProduce,
    ProduceAnswer,
    ProduceWait,
    PurgatoryFullError,
    produce_answer,
)
from raftlog.replication.hosted import HostedPartition
from raftlog.replication.producer_state import ProducerStateTable, Verdict
from raftlog.replication.replicas import PendingProduce, Replicas
from raftlog.storage.config import LogConfig

log = logging.getLogger("raftlog.replication.produce")

# A produce that finds its replica's producer state loading waits at most this long (and
# never past its own timeout); then it is answered REQUEST_TIMED_OUT and the client retries.
MAX_PRODUCER_STATE_WAIT_MS = 30_000


@dataclass(frozen=True)
class TxnProduce:
    """A transactional produce that would open a transaction on a partition (KIP-890)."""

    transactional_id: str | None  # from the Produce request; None when the caller lacks it
    producer_id: int
    producer_epoch: int
    topic: str
    partition: int
    # KIP-890 part 2: add the partition to the transaction (a Produce v12+ batch), not only
    # verify that it is there.
    add_partition: bool = False


# The first transaction version whose produce adds its partition (KIP-890 part 2).
_TV2 = 2

VerifyTransaction = Callable[[TxnProduce], Awaitable[ErrorCode]]


async def allow_every_transaction(request: TxnProduce) -> ErrorCode:
    """The default verifier: no transaction coordinator checks anything."""
    return ErrorCode.none


async def refuse_without_coordinator(request: TxnProduce) -> ErrorCode:
    """A node's verifier while it has no transaction coordinator: no stock client can hold a
    transactional producer id then (FindCoordinator for a transactional id is unavailable),
    so a transactional batch is forged, and one left open would hold back the LSO (and every
    read_committed consumer and compaction) for ever."""
    return ErrorCode.invalid_txn_state


class ProducePath:
    """Produces to the partitions this broker leads (the Kafka backend calls `produce`)."""

    def __init__(
        self, replicas: Replicas, verify_transaction: VerifyTransaction = allow_every_transaction
    ) -> None:
        self.replicas = replicas
        # The transaction coordinator replaces it (KIP-890 part 1; see the module docstring).
        self.verify_transaction = verify_transaction
        # A client can send refused batches as fast as the network carries them: one line
        # per interval, counting the rest, keeps that from filling the log disk.
        self._refusals = RateLimitedLog(log)
        # Fenced and out-of-order producers: their own line, so they cannot hide the above.
        self._state_refusals = RateLimitedLog(log)

    async def _verify_opening(
        self,
        transactional_id: str | None,
        opening: list[tuple[int, int]],
        hosted: HostedPartition,
        topic: str,
        partition: int,
        add_partition: bool = False,
    ) -> ProduceResult | None:
        """Ask the coordinator about each producer whose batch would open a transaction
        (KIP-890); None when every one may. A marker for a producer that lands while it is
        asked voids the answer (idempotence.VerificationGuards; for an add only a marker
        that ends the batch's own transaction does): the caller appends with no await after
        this returns, so no marker can slip in between."""
        guards = hosted.producers.verifications
        held = [(producer_id, guards.start(producer_id)) for producer_id, _ in opening]
        epochs = dict(opening)
        try:
            for producer_id, producer_epoch in opening:
                verdict = await self.verify_transaction(
                    TxnProduce(
                        transactional_id,
                        producer_id,
                        producer_epoch,
                        topic,
                        partition,
                        add_partition,
                    )
                )
                if verdict != ErrorCode.none:
                    return ProduceResult(
                        verdict,
                        error_message=f"producer {producer_id} has no ongoing transaction "
                        f"with {topic}-{partition} in it",
                    )
            for producer_id, guard in held:
                if add_partition:
                    stands = guards.stands_after_add(producer_id, guard, epochs[producer_id])
                else:
                    stands = guards.holds(producer_id, guard)
                if not stands:
                    return ProduceResult(
                        ErrorCode.invalid_txn_state,
                        error_message=f"producer {producer_id}'s transaction on "
                        f"{topic}-{partition} ended while the batch was verified",
                    )
            return None
        finally:
            for producer_id, guard in held:
                guards.finish(producer_id, guard)

    async def produce(
        self,
        topic: str,
        partition: int,
        records: bytes,
        acks: int,
        timeout_ms: int,
        producer: object = None,
    ) -> ProduceResult:
        """Append as leader and answer when `acks` is met (see the module docstring).
        `producer.appended()`, when the sender gave one, is called once the batches are
        appended or refused, before any wait for acks (the connection's next Produce may
        go then: raftlog.net.kafka.turns)."""
        appended = getattr(producer, "appended", None) or _nothing
        try:
            return await self._produce(
                topic, partition, records, acks, timeout_ms, producer, appended
            )
        finally:
            appended()

    async def _produce(
        self,
        topic: str,
        partition: int,
        records: bytes,
        acks: int,
        timeout_ms: int,
        producer: object,
        appended: Callable[[], None],
    ) -> ProduceResult:
        replicas = self.replicas
        if acks not in (-1, 0, 1):
            return ProduceResult(ErrorCode.invalid_required_acks, error_message=f"acks={acks}")
        key = (topic, partition)
        hosted = replicas.partitions.get(key)
        if hosted is not None and hosted.replica.leader is not None and not hosted.producers.loaded:
            wait_ms = max(0, min(timeout_ms, MAX_PRODUCER_STATE_WAIT_MS))
            with trio.move_on_after(wait_ms / 1000):
                await hosted.producers.ready.wait()
            if not hosted.producers.loaded:
                return ProduceResult(
                    ErrorCode.request_timed_out,
                    error_message=f"{topic}-{partition}: producer state still loading",
                )
            hosted = replicas.partitions.get(key)  # the wait may have seen metadata change
        leader = None if hosted is None else hosted.replica.leader
        if hosted is None or leader is None or not hosted.producers.loaded:
            return ProduceResult(
                replicas.not_leader_error(topic, partition),
                current_leader=replicas.leader_hint(topic, partition),
            )
        min_isr = replicas.min_insync_replicas(topic)
        error = leader.check_produce(acks=acks, min_insync_replicas=min_isr)
        if error != ErrorCode.none:
            return ProduceResult(
                error,
                # The size only: which brokers are in the ISR is no client's business.
                error_message=f"{len(leader.isr)} in-sync replicas, below "
                f"min.insync.replicas {min_isr}",
            )
        now_ms = replicas.clock_ms()

        def validate(config: LogConfig) -> ValidatedBatches | ProduceResult:
            try:
                return validated_client_batches(
                    records,
                    max_message_bytes=config.max_message_bytes,
                    require_keys=config.compact,
                )
            except KafkaError as exc:
                client_id = getattr(producer, "client_id", None)
                self._refusals.warning(
                    "refused produce to %s-%d from client %r (%s): %s",
                    topic,
                    partition,
                    client_id,
                    exc.code.name,
                    exc.message,
                )
                return ProduceResult(
                    exc.code,
                    error_message=exc.message,
                    record_errors=exc.record_errors if isinstance(exc, InvalidRecordError) else (),
                )

        config = hosted.log.config
        validated = validate(config)
        if isinstance(validated, ProduceResult):
            return validated
        headers = validated.headers
        opening = _opening_transactions(hosted.producers.table, headers)
        if opening:
            refused = await self._verify_opening(
                getattr(producer, "transactional_id", None),
                opening,
                hosted,
                topic,
                partition,
                add_partition=getattr(producer, "transaction_version", 0) >= _TV2,
            )
            if refused is not None:
                return refused
            # The awaits may have seen the leadership or the producer state change.
            current = replicas.partitions.get(key)
            if current is not hosted or hosted.replica.leader is not leader:
                return ProduceResult(
                    replicas.not_leader_error(topic, partition),
                    current_leader=replicas.leader_hint(topic, partition),
                )
            if not hosted.producers.loaded:
                return ProduceResult(
                    ErrorCode.request_timed_out,
                    error_message=f"{topic}-{partition}: producer state reloading",
                )
            if hosted.log.config is not config:
                # The topic's config changed during the awaits (compaction turned on,
                # LogAppendTime): the batches are checked against what holds now.
                config = hosted.log.config
                validated = validate(config)
                if isinstance(validated, ProduceResult):
                    return validated
                headers = validated.headers
        table = hosted.producers.table
        check = table.check_headers([header for _, header in headers])
        if check.verdict is Verdict.ERROR:
            # The detail (another producer's epoch and sequence) is what forging a batch of
            # that producer needs: it goes to the log; the code alone tells a real producer
            # what to do.
            self._state_refusals.warning(
                "refused produce to %s-%d from client %r: %s",
                topic,
                partition,
                getattr(producer, "client_id", None),
                check.message,
            )
            return ProduceResult(check.error)
        log_append_time = config.message_timestamp_type == "LogAppendTime"
        if check.verdict is Verdict.DUPLICATE:
            original = check.duplicate_of
            assert original is not None
            done = ProduceResult(
                base_offset=original.first_offset,
                # The original's stamped maxTimestamp, as Kafka answers a retried batch.
                log_append_time_ms=original.timestamp_ms if log_append_time else NO_TIMESTAMP,
                log_start_offset=hosted.log.log_start_offset,
            )
            required_offset = original.last_offset + 1
        else:
            # Storage time is wall-clock (segment.ms, retention); now_ms is monotonic.
            append_time_ms = replicas.wall_clock_ms()
            stamped: bytes | None = None
            try:
                if log_append_time:
                    # Stamped before the append, so the segment's time index, the producer
                    # state and the bytes followers copy unchanged all carry the append time.
                    # The stamp changes headers and CRCs: the log checks these bytes again.
                    stamped = stamp_log_append_time(validated.data, append_time_ms)
                info = hosted.log.append_as_leader(
                    validated if stamped is None else stamped, leader.leader_epoch, append_time_ms
                )
            except KafkaError as exc:
                return ProduceResult(exc.code, error_message=exc.message)
            if stamped is not None:
                completed = table.update_leader_append(stamped, info.first_offset)
            else:
                # No batch of a client is a control batch (validation refuses them): no
                # transaction markers to look for, only the offsets the log assigned.
                completed = table.update(_rebased(headers, info.first_offset))
            hosted.producers.record_completed(completed)
            hosted.wake_waiters()  # parked follower fetches: new data
            replicas.after_leader_append(hosted, now_ms)
            replicas.metrics.produced(topic, len(records), info.last_offset - info.first_offset + 1)
            done = ProduceResult(
                base_offset=info.first_offset,
                log_append_time_ms=append_time_ms if log_append_time else NO_TIMESTAMP,
                log_start_offset=info.log_start_offset,
            )
            required_offset = info.last_offset + 1
        answer = produce_answer(acks, hosted.log.config.flush_policy)
        if answer in (ProduceAnswer.NEVER, ProduceAnswer.NOW):
            return done
        flushed = answer is ProduceAnswer.AFTER_FLUSH
        wait = ProduceWait.FLUSHED if flushed else ProduceWait.HIGH_WATERMARK
        pending = PendingProduce()
        deadline_ms = now_ms + max(0, min(timeout_ms, replicas.config.request_timeout_ms))
        waiter = DelayedProduce(key, required_offset, deadline_ms, min_isr, pending, wait)
        try:
            completion = replicas.purgatory.add_produce(waiter=waiter, progress=leader.progress())
        except PurgatoryFullError as exc:
            return ProduceResult(ErrorCode.request_timed_out, error_message=str(exc))
        if completion is not None:
            pending.error = completion.error
        else:
            replicas.deadline_wakeup()
            appended()  # in the log: what follows on the connection may append after it
            await pending.event.wait()
        if pending.error != ErrorCode.none:
            hint = None
            if pending.error == ErrorCode.not_leader_or_follower:
                hint = replicas.leader_hint(topic, partition)
            return ProduceResult(pending.error, current_leader=hint)
        return done


def _nothing() -> None:
    pass


def _rebased(headers: list[tuple[int, BatchHeader]], first_offset: int) -> list[BatchHeader]:
    """The headers with the base offsets the log gave them (consecutive from first_offset,
    as PartitionLog.append_as_leader assigns them)."""
    rebased = []
    next_offset = first_offset
    for _, header in headers:
        rebased.append(header._replace(base_offset=next_offset))
        next_offset += header.last_offset_delta + 1
    return rebased


def _opening_transactions(
    table: ProducerStateTable, headers: list[tuple[int, BatchHeader]]
) -> list[tuple[int, int]]:
    """(producer id, epoch) of each transactional batch's producer with no transaction open
    on this partition at that epoch: its batch would open one (one entry per producer).
    An open transaction at another epoch does not count: the batch is verified (and then
    refused by the producer table: only a marker ends a transaction)."""
    opening: dict[tuple[int, int], None] = {}
    for _, header in headers:
        if not header.is_transactional or header.producer_id < 0:
            continue
        entry = table.get(header.producer_id)
        if (
            entry is not None
            and entry.current_txn_first_offset >= 0
            and entry.epoch == header.producer_epoch
        ):
            continue
        opening[(header.producer_id, header.producer_epoch)] = None
    return list(opening)
