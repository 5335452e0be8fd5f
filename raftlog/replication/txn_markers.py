"""The leader's transaction-marker path (Kafka's WriteTxnMarkers, KIP-98): the transaction
coordinator ends a transaction on each of its partitions with a COMMIT or ABORT marker.

Markers never go through the client produce path: clients may not write control batches
(batch_validation refuses them), and a marker carries no sequence. Per partition, on the event
loop with no await between the check and the table update (as produce.py does):
  wait for the producer state -> min.insync.replicas -> ProducerStateTable.check_marker ->
  append_as_leader -> update_leader_append (ends the transaction) -> index an abort
and then the answer waits as acks=all does: every ISR member holds the marker durably and the
HW covers it, so a commit the coordinator counts as written cannot be lost with a leader.

A retried marker (the coordinator did not get the answer) is recognised by the table
(Verdict.DUPLICATE: same producer epoch, coordinator epoch and type, and no transaction opened
since): it is not appended again, and it is answered once the first copy is covered.

Errors, as Kafka answers them per partition: NOT_LEADER_OR_FOLLOWER / UNKNOWN_TOPIC_OR_PARTITION,
NOT_ENOUGH_REPLICAS, INVALID_PRODUCER_EPOCH (an older producer epoch than the partition has
seen), TRANSACTION_COORDINATOR_FENCED (an older coordinator epoch), REQUEST_TIMED_OUT.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from raftlog.concurrency import run_all
from raftlog.constants import ACKS_ALL
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import (
    MAX_COORDINATOR_EPOCH,
    MAX_PRODUCER_EPOCH,
    ControlType,
    TxnMarker,
    build_txn_marker,
)
from raftlog.replication.core.purgatory import DelayedProduce, ProduceWait, PurgatoryFullError
from raftlog.replication.hosted import TopicPartition
from raftlog.replication.producer_state import Verdict
from raftlog.replication.replicas import PendingProduce, Replicas

log = logging.getLogger("raftlog.replication.txn_markers")

# A marker that finds its replica's producer state loading waits at most this long.
MAX_PRODUCER_STATE_WAIT_MS = 30_000
# Kafka's WriteTxnMarkers has no timeout field: the broker waits at most request.timeout.ms.
# One request names at most this many partitions per marker (a transaction's partitions).
MAX_PARTITIONS_PER_MARKER = 100_000


@dataclass(frozen=True)
class TxnMarkerRequest:
    """One marker to write on several partitions (Kafka's WritableTxnMarker)."""

    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    commit: bool
    partitions: tuple[TopicPartition, ...]

    def check(self) -> str | None:
        """Why the fields are out of range (None: they are not)."""
        if self.producer_id < 0:
            return f"producer id {self.producer_id} < 0"
        if not 0 <= self.producer_epoch <= MAX_PRODUCER_EPOCH:
            return f"producer epoch {self.producer_epoch} out of range"
        if not 0 <= self.coordinator_epoch <= MAX_COORDINATOR_EPOCH:
            return f"coordinator epoch {self.coordinator_epoch} out of range"
        if len(self.partitions) > MAX_PARTITIONS_PER_MARKER:
            return f"{len(self.partitions)} partitions in one marker"
        return None

    @property
    def parsed(self) -> TxnMarker:
        control_type = ControlType.COMMIT if self.commit else ControlType.ABORT
        return TxnMarker(
            self.producer_id, self.producer_epoch, control_type, self.coordinator_epoch
        )


MarkerResults = dict[TopicPartition, ErrorCode]


class TxnMarkerPath:
    """Writes transaction markers to the partitions this broker leads."""

    def __init__(self, replicas: Replicas) -> None:
        self.replicas = replicas

    async def write_markers(
        self, markers: Sequence[TxnMarkerRequest], timeout_ms: int | None = None
    ) -> list[MarkerResults]:
        """Every marker on every one of its partitions, concurrently; one error code per
        partition, in the order of `markers`."""
        if timeout_ms is None:
            timeout_ms = self.replicas.config.request_timeout_ms
        results: list[MarkerResults] = [{} for _ in markers]

        async def one(index: int, marker: TxnMarkerRequest, key: TopicPartition) -> None:
            results[index][key] = await self.write_marker(marker, key, timeout_ms)

        calls = []
        for index, marker in enumerate(markers):
            problem = marker.check()
            for key in marker.partitions:
                if problem is not None:
                    log.warning("refused marker for %s-%d: %s", *key, problem)
                    results[index][key] = ErrorCode.invalid_request
                else:
                    calls.append((index, marker, key))
        await run_all(one, calls)
        return results

    async def write_marker(
        self, marker: TxnMarkerRequest, key: TopicPartition, timeout_ms: int
    ) -> ErrorCode:
        replicas = self.replicas
        topic, partition = key
        hosted = replicas.partitions.get(key)
        if hosted is not None and hosted.replica.leader is not None and not hosted.producers.loaded:
            with trio.move_on_after(max(0, min(timeout_ms, MAX_PRODUCER_STATE_WAIT_MS)) / 1000):
                await hosted.producers.ready.wait()
            hosted = replicas.partitions.get(key)
        leader = None if hosted is None else hosted.replica.leader
        if hosted is None or leader is None:
            return replicas.not_leader_error(topic, partition)
        if not hosted.producers.loaded:
            return ErrorCode.request_timed_out
        min_isr = replicas.min_insync_replicas(topic)
        error = leader.check_produce(acks=ACKS_ALL, min_insync_replicas=min_isr)
        if error != ErrorCode.none:
            return error
        now_ms = replicas.clock_ms()
        table = hosted.producers.table
        check = table.check_marker(marker.parsed)
        if check.verdict is Verdict.ERROR:
            log.info("%s-%d: marker refused: %s", topic, partition, check.message)
            return check.error
        # The transaction ends here: a verification still in flight was about it (KIP-890;
        # the epoch tells a TV2 add whether its own transaction is the one ending).
        hosted.producers.verifications.end_transaction(marker.producer_id, marker.producer_epoch)
        if check.verdict is Verdict.DUPLICATE:
            required_offset = check.duplicate_offset + 1
        else:
            append_time_ms = replicas.wall_clock_ms()
            batch = build_txn_marker(
                producer_id=marker.producer_id,
                producer_epoch=marker.producer_epoch,
                coordinator_epoch=marker.coordinator_epoch,
                commit=marker.commit,
                timestamp_ms=append_time_ms,
            )
            try:
                info = hosted.log.append_as_leader(batch, leader.leader_epoch, append_time_ms)
                hosted.producers.record_completed(
                    table.update_leader_append(batch, info.first_offset)
                )
            except KafkaError as exc:
                return exc.code
            hosted.wake_waiters()
            replicas.after_leader_append(hosted, now_ms)
            required_offset = info.last_offset + 1
        return await self._await_covered(key, required_offset, min_isr, now_ms, timeout_ms)

    async def _await_covered(
        self, key: TopicPartition, required_offset: int, min_isr: int, now_ms: int, timeout_ms: int
    ) -> ErrorCode:
        """Wait as an acks=all produce does (produce.py)."""
        replicas = self.replicas
        hosted = replicas.partitions.get(key)
        leader = None if hosted is None else hosted.replica.leader
        if hosted is None or leader is None:
            return ErrorCode.not_leader_or_follower
        pending = PendingProduce()
        wait = ProduceWait.HIGH_WATERMARK
        deadline_ms = now_ms + max(0, min(timeout_ms, replicas.config.request_timeout_ms))
        waiter = DelayedProduce(key, required_offset, deadline_ms, min_isr, pending, wait)
        try:
            completion = replicas.purgatory.add_produce(waiter=waiter, progress=leader.progress())
        except PurgatoryFullError:
            return ErrorCode.request_timed_out
        if completion is not None:
            return completion.error
        replicas.deadline_wakeup()
        await pending.event.wait()
        return pending.error
