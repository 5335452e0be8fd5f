"""The leader's read paths: replica fetches (long-poll) and consumer fetch / list offsets.

The Kafka backend and the internal RPC call these directly. Records are never
decoded or re-encoded: consumers get file regions of the segment (sent with sendfile), followers
get the same bytes read in a worker thread (they travel inside a msgpack frame).

Replica reads of partitions under a leader replication throttle (core/throttle.py: listed in
`leader.replication.throttled.replicas` for this broker, fetched by a follower outside the
ISR) share this broker's `leader.replication.throttled.rate`: a read returns at most what the
budget holds, and none while it is spent; a fetch with nothing else to return then waits
until the budget refills (or for other news) instead of answering empty at once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import trio

from raftlog.constants import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP, UNDEFINED_EPOCH
from raftlog.errors import ErrorCode, KafkaError
from raftlog.net.kafka.backend import (
    EpochEndOffset,
    FetchResult,
    IsolationLevel,
    ListOffsetsResult,
)
from raftlog.net.rpc import IdentityMismatch
from raftlog.replication.core.leader import LeaderState
from raftlog.replication.core.throttle import ThrottleState
from raftlog.replication.core.types import FetchDecision, FetchOutcome
from raftlog.replication.fetch_wire import (
    ReplicaFetchAnswer,
    ReplicaFetchPartition,
    decode_request,
    encode_response,
)
from raftlog.replication.hosted import HostedPartition, TopicPartition
from raftlog.replication.replicas import Replicas
from raftlog.storage import OffsetOutOfRangeError
from raftlog.storage.log_types import ReadResult
from raftlog.storage.scrubber import ScrubResult, verify_read

log = logging.getLogger("raftlog.replication")

# A parked replica fetch whose only news is a higher HW waits this much longer for new data,
# so under load the HW rides along with the next records instead of costing every follower an
# extra empty round trip per HW advance; when idle, followers learn the HW this late.
HIGH_WATERMARK_LINGER_MS = 5
# Replica reads up to this size run on the event loop: followers read what was just written,
# from the page cache, and a worker-thread hop per fetch costs more than the copy (and under
# CPU contention adds a scheduling delay to every acks=all produce). A page-cache pread of
# 2 MiB takes about 0.15 ms here; a steady follower's answers are 0.5-2 MiB under full load.
# Larger reads (a follower catching up from far behind) still go to a worker thread.
INLINE_REPLICA_READ_MAX_BYTES = 2 * 1024 * 1024
ReplicaRead = tuple[ReplicaFetchPartition, HostedPartition, LeaderState]
# Room left in an internal frame for the envelope and per-partition fields of a fetch answer.
REPLICA_FETCH_FRAME_OVERHEAD_BYTES = 1024 * 1024


def check_leader_epoch(leader: LeaderState, current_leader_epoch: int) -> ErrorCode:
    """KIP-320 fencing of a client's view of the leader epoch (-1: the client does not know)."""
    if current_leader_epoch == UNDEFINED_EPOCH or current_leader_epoch == leader.leader_epoch:
        return ErrorCode.none
    if current_leader_epoch < leader.leader_epoch:
        return ErrorCode.fenced_leader_epoch
    return ErrorCode.unknown_leader_epoch


# on_damage(hosted, offset, reason): a read found the batch at `offset` damaged (the scrubber
# takes it from there: Scrubber.report_damage).
OnDamage = Callable[[HostedPartition, int, str], None]


def _ignore_damage(hosted: HostedPartition, offset: int, reason: str) -> None:
    log.error("%s-%d: damaged batch at offset %d: %s", *hosted.key, offset, reason)


class ReadPaths:
    """Consumer and replica reads of the partitions this broker leads.

    Bytes a log took on trust at start-up (below its recovery point) are verified before they
    are served, the first time they are read: a batch that was damaged while the node was down
    never reaches a consumer or a follower; the read stops before it and the damage goes to
    `on_damage`."""

    def __init__(self, replicas: Replicas, on_damage: OnDamage = _ignore_damage) -> None:
        self.replicas = replicas
        self.on_damage = on_damage
        # The leader side of replication throttles (the follower side is the fetchers').
        self.throttle = ThrottleState(replicas.node_id)

    def _verified(self, hosted: HostedPartition, result: ReadResult, outcome: ScrubResult) -> int:
        """Record what `verify_read` found for `result`; returns the bytes of the read that
        may be served (all of it, or those before a damaged batch)."""
        unverified = result.unverified
        assert unverified is not None
        unverified.segment.mark_verified(unverified.start_position, outcome.position)
        if outcome.damage is None:
            return result.size_bytes
        self.on_damage(hosted, outcome.next_offset, outcome.damage)
        return max(0, outcome.position - unverified.start_position)

    def _leader_for(
        self, topic: str, partition: int, current_leader_epoch: int
    ) -> tuple[HostedPartition | None, LeaderState | None, ErrorCode]:
        key = (topic, partition)
        # A leader's log is never cut (only a follower's, and a role change waits for the cut).
        hosted = self.replicas.partitions.get(key)
        leader = None if hosted is None else hosted.replica.leader
        if hosted is None or leader is None:
            return None, None, self.replicas.not_leader_error(topic, partition)
        return hosted, leader, check_leader_epoch(leader, current_leader_epoch)

    # ------------------------------------------------------------------ consumers
    async def fetch(
        self,
        topic: str,
        partition: int,
        fetch_offset: int,
        partition_max_bytes: int,
        current_leader_epoch: int,
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> FetchResult:
        """Whole batches from fetch_offset, never past the HW; read_committed never past the
        LSO, with the aborted transactions overlapping what it returns (from the segments'
        txn indexes). The LSO reported to read_uncommitted clients is the HW: they do not use
        it, and their path takes no transaction cost."""
        hosted, leader, error = self._leader_for(topic, partition, current_leader_epoch)
        if hosted is None or leader is None or error != ErrorCode.none:
            hint = self.replicas.leader_hint(topic, partition) if leader is None else None
            return FetchResult(error, current_leader=hint)
        partition_log = hosted.log
        high_watermark = leader.high_watermark
        committed = isolation == IsolationLevel.READ_COMMITTED
        limit = high_watermark
        if committed:
            stable = hosted.producers.last_stable_offset(high_watermark)
            # While the producer state loads nothing is known to be stable past the log start:
            # an empty answer (no error) makes the consumer ask again.
            limit = partition_log.log_start_offset if stable is None else stable
        answer = functools.partial(
            FetchResult,
            high_watermark=high_watermark,
            last_stable_offset=limit,
            log_start_offset=partition_log.log_start_offset,
        )
        if not partition_log.log_start_offset <= fetch_offset <= partition_log.log_end_offset:
            return answer(ErrorCode.offset_out_of_range)
        if fetch_offset >= limit:
            return answer()
        max_bytes = max(0, min(partition_max_bytes, self.replicas.config.fetch_max_bytes))
        read = await self._read_verified(hosted, fetch_offset, max_bytes, limit)
        if read == ErrorCode.offset_out_of_range:
            return answer(read)  # the log start moved under the read (retention)
        if isinstance(read, ErrorCode):
            return FetchResult(read)
        if read.size_bytes:
            self.replicas.metrics.fetched(topic, read.size_bytes, read.next_offset - fetch_offset)
        if not committed:
            return answer(records=list(read.regions))
        aborted: tuple[tuple[int, int], ...] = ()
        if read.regions and read.next_offset > fetch_offset:
            try:
                found = partition_log.collect_aborted_txns(fetch_offset, read.next_offset)
            except KafkaError as exc:
                return FetchResult(exc.code)
            aborted = tuple((t.producer_id, t.first_offset) for t in found)
        return answer(records=list(read.regions), aborted_transactions=aborted)

    async def _read_verified(
        self, hosted: HostedPartition, fetch_offset: int, max_bytes: int, limit: int
    ) -> ReadResult | ErrorCode:
        """The log's whole batches from fetch_offset below `limit`; bytes taken on trust at
        start-up are verified first, and a read stops before a damaged batch (an error when it
        starts there)."""
        partition_log = hosted.log
        try:
            result = partition_log.read(fetch_offset, max_bytes, max_offset=limit)
        except KafkaError as exc:  # OffsetOutOfRangeError included
            return exc.code
        if result.unverified is None:
            return result
        try:
            outcome = await trio.to_thread.run_sync(verify_read, result.unverified)
        except (OSError, ValueError) as exc:
            log.warning("%s-%d: verifying a read failed: %r", *hosted.key, exc)
            return ErrorCode.kafka_storage_error
        if self._verified(hosted, result, outcome) == result.size_bytes:
            return result
        if outcome.next_offset <= fetch_offset:
            return ErrorCode.kafka_storage_error
        # Serve the whole batches before the damaged one (verified just now).
        try:
            return partition_log.read(
                fetch_offset, max_bytes, max_offset=min(limit, outcome.next_offset)
            )
        except KafkaError as exc:
            return exc.code

    async def list_offset(
        self,
        topic: str,
        partition: int,
        timestamp_ms: int,
        current_leader_epoch: int,
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> ListOffsetsResult:
        hosted, leader, error = self._leader_for(topic, partition, current_leader_epoch)
        if hosted is None or leader is None or error != ErrorCode.none:
            return ListOffsetsResult(error)
        partition_log = hosted.log
        high_watermark = leader.high_watermark
        if high_watermark < leader.leader_epoch_start_offset and timestamp_ms != EARLIEST_TIMESTAMP:
            # KIP-207: a new leader whose HW has not yet reached the start of its epoch would
            # answer with a stale (lower) end than its predecessor did; clients retry instead.
            return ListOffsetsResult(ErrorCode.offset_not_available)
        if isolation == IsolationLevel.READ_COMMITTED:
            # Kafka: read_committed sees the log up to the LSO, LATEST included.
            stable = hosted.producers.last_stable_offset(high_watermark)
            if stable is None:
                return ListOffsetsResult(ErrorCode.offset_not_available)
            high_watermark = stable
        if timestamp_ms == LATEST_TIMESTAMP:
            return ListOffsetsResult(offset=high_watermark, leader_epoch=leader.leader_epoch)
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return ListOffsetsResult(offset=partition_log.log_start_offset)
        if timestamp_ms == MAX_TIMESTAMP:
            # The exact record (KIP-734), read off the loop; one above the HW (or the LSO) is
            # not answered, as Kafka filters it: offset -1, timestamp -1.
            at_max = await trio.to_thread.run_sync(partition_log.max_timestamp_record)
            if at_max is None or at_max[0] >= high_watermark:
                return ListOffsetsResult()
            return ListOffsetsResult(
                timestamp_ms=at_max[1], offset=at_max[0], leader_epoch=leader.leader_epoch
            )
        found = await trio.to_thread.run_sync(partition_log.offset_for_timestamp, timestamp_ms)
        if found is None or found[0] >= high_watermark:
            return ListOffsetsResult()  # Kafka: offset -1, timestamp -1 when nothing matches
        offset, found_ms = found
        return ListOffsetsResult(timestamp_ms=found_ms, offset=offset)

    async def offset_for_leader_epoch(
        self,
        topic: str,
        partition: int,
        current_leader_epoch: int,
        leader_epoch: int,
    ) -> EpochEndOffset:
        """KIP-279/320: the largest epoch <= leader_epoch and where it ends in our log."""
        hosted, leader, error = self._leader_for(topic, partition, current_leader_epoch)
        if hosted is None or leader is None or error != ErrorCode.none:
            return EpochEndOffset(error)
        epoch, end_offset = hosted.log.end_offset_for_epoch(leader_epoch)
        return EpochEndOffset(leader_epoch=epoch, end_offset=end_offset)

    # ------------------------------------------------------------------ replicas
    async def handle_replica_fetch(self, sender_id: int, body: dict) -> dict:
        """The leader side of replica.fetch: validate, maybe park, answer with records.

        sender_id is the node the connection speaks for: a fetch is an acknowledgement (it
        keeps a follower in the ISR and moves the HW), so it counts only for that node. A
        fetch naming any other replica is refused before anything is recorded; one from a
        broker that is not a replica of a partition gets NOT_LEADER_OR_FOLLOWER for it."""
        request = decode_request(body)
        if request.replica_id != sender_id:
            raise IdentityMismatch("a replica fetch names another replica")
        now_ms = self.replicas.clock_ms()
        answers: dict[TopicPartition, ReplicaFetchAnswer] = {}
        reads: list[tuple[ReplicaFetchPartition, HostedPartition, LeaderState]] = []
        for item in request.partitions:
            key = (item.topic, item.partition)
            hosted = self.replicas.partitions.get(key)
            leader = None if hosted is None else hosted.replica.leader
            if hosted is None or leader is None:
                answers[key] = _refusal(item, self.replicas.not_leader_error(*key))
                continue
            decision = leader.on_follower_fetch(
                now_ms=now_ms,
                replica_id=request.replica_id,
                fetch_offset=item.fetch_offset,
                last_fetched_epoch=item.last_fetched_epoch,
                current_leader_epoch=item.leader_epoch,
            )
            self.replicas.handle_effects(hosted, decision.effects)
            if decision.outcome is FetchOutcome.READ:
                reads.append((item, hosted, leader))
            else:
                answers[key] = _answer_without_records(item, decision)
        throttled = self._throttled(request.replica_id, reads, now_ms)
        limit = self.throttle.leader
        wait_ms = min(request.max_wait_ms, self.replicas.config.replica_fetch_wait_max_ms)
        unblocked = reads
        if throttled and limit is not None and limit.allowance_bytes(now_ms) == 0:
            # The throttled partitions' data does not count as news until the budget refills.
            unblocked = [r for r in reads if (r[0].topic, r[0].partition) not in throttled]
            wait_ms = min(wait_ms, limit.wait_ms(now_ms))
        if reads and not answers and not _has_data(unblocked) and wait_ms > 0:
            await self._park(reads, wait_ms, unblocked)
        answers.update(await self._read_for_replicas(reads, throttled))
        return encode_response([answers[(p.topic, p.partition)] for p in request.partitions])

    def _throttled(
        self, replica_id: int, reads: list[ReplicaRead], now_ms: int
    ) -> frozenset[TopicPartition]:
        """The partitions of `reads` whose replication to `replica_id` is throttled."""
        policy = self.throttle.update(self.replicas.image.configs, now_ms)
        if policy.leader_rate_bytes_per_s is None or not policy.leader_partitions:
            return frozenset()
        return frozenset(
            (item.topic, item.partition)
            for item, _, leader in reads
            if policy.leader_throttles(item.topic, item.partition, replica_id, leader.isr)
        )

    async def _park(
        self,
        reads: list[tuple[ReplicaFetchPartition, HostedPartition, LeaderState]],
        max_wait_ms: int,
        data_reads: list[ReplicaRead] | None = None,
    ) -> None:
        """Wait for new data (of `data_reads`, by default all) or a role change of any
        requested partition (no polling); a higher HW alone ends the wait
        HIGH_WATERMARK_LINGER_MS later."""
        if data_reads is None:
            data_reads = reads
        deadline = trio.current_time() + max_wait_ms / 1000
        linger_s = HIGH_WATERMARK_LINGER_MS / 1000
        while True:
            if _has_hw_news(reads):
                deadline = min(deadline, trio.current_time() + linger_s)
            wakeup = trio.Event()
            for _, hosted, _ in reads:
                hosted.waiters.add(wakeup)
            try:
                with trio.move_on_at(deadline):
                    await wakeup.wait()
            finally:
                for _, hosted, _ in reads:
                    hosted.waiters.discard(wakeup)
            if trio.current_time() >= deadline or _has_data(data_reads) or self._moved(reads):
                return

    def _moved(self, reads: list[ReplicaRead]) -> bool:
        partitions = self.replicas.partitions
        return any(
            partitions.get(h.key) is not h or h.replica.leader is not leader
            for _, h, leader in reads
        )

    async def _read_for_replicas(
        self,
        reads: list[tuple[ReplicaFetchPartition, HostedPartition, LeaderState]],
        throttled: frozenset[TopicPartition] = frozenset(),
    ) -> dict[TopicPartition, ReplicaFetchAnswer]:
        answers: dict[TopicPartition, ReplicaFetchAnswer] = {}
        regions: list[tuple[ReplicaFetchPartition, HostedPartition, LeaderState, Any]] = []
        budget_bytes = (
            self.replicas.config.internal_frame_max_bytes - REPLICA_FETCH_FRAME_OVERHEAD_BYTES
        )
        limit = self.throttle.leader if throttled else None
        now_ms = self.replicas.clock_ms()
        for item, hosted, leader in reads:
            key = (item.topic, item.partition)
            # The leadership this fetch was validated against may have ended while it was parked.
            if (
                self.replicas.partitions.get(key) is not hosted
                or hosted.replica.leader is not leader
            ):
                answers[key] = _refusal(item, ErrorCode.not_leader_or_follower)
                continue
            max_bytes = max(0, min(self.replicas.config.replica_fetch_max_bytes, budget_bytes))
            min_one_batch = not regions
            limited = limit is not None and key in throttled
            if limited:
                assert limit is not None
                allowance_bytes = limit.allowance_bytes(now_ms)
                if allowance_bytes == 0:
                    answers[key] = _answer_throttled(item, hosted, leader)
                    continue
                max_bytes = min(max_bytes, allowance_bytes)
                # A batch larger than the allowance still goes (and is paid back before the
                # next one), or a throttled replica would never get it; never past the frame.
                min_one_batch = min_one_batch or (
                    budget_bytes >= hosted.log.config.max_message_bytes
                )
            try:
                result = hosted.log.read(item.fetch_offset, max_bytes, min_one_batch=min_one_batch)
            except OffsetOutOfRangeError:
                answers[key] = ReplicaFetchAnswer(
                    item.topic,
                    item.partition,
                    ErrorCode.offset_out_of_range,
                    leader.high_watermark,
                    hosted.log.log_start_offset,
                )
                continue
            except KafkaError as exc:
                answers[key] = _refusal(item, exc.code)
                continue
            budget_bytes -= result.size_bytes
            if limited:
                assert limit is not None
                limit.record(result.size_bytes, now_ms)
            regions.append((item, hosted, leader, result))

        def read_all() -> list[tuple[bytes, ScrubResult | None]]:
            return [
                (
                    result.read_bytes(),
                    None if result.unverified is None else verify_read(result.unverified),
                )
                for _, _, _, result in regions
            ]

        total_bytes = sum(result.size_bytes for _, _, _, result in regions)
        if total_bytes <= INLINE_REPLICA_READ_MAX_BYTES and not any(
            result.unverified for _, _, _, result in regions
        ):
            payloads = read_all()
        else:
            payloads = await trio.to_thread.run_sync(read_all)
        for (item, hosted, leader, result), (records, outcome) in zip(
            regions, payloads, strict=True
        ):
            if outcome is not None:
                records = records[: self._verified(hosted, result, outcome)]
                if not records and outcome.damage is not None:
                    answers[(item.topic, item.partition)] = _refusal(
                        item, ErrorCode.kafka_storage_error
                    )
                    continue
            answers[(item.topic, item.partition)] = ReplicaFetchAnswer(
                item.topic,
                item.partition,
                ErrorCode.none,
                leader.high_watermark,
                hosted.log.log_start_offset,
                records=records,
            )
        return answers


def _has_data(reads: list[ReplicaRead]) -> bool:
    return any(item.fetch_offset < hosted.log.log_end_offset for item, hosted, _ in reads)


def _has_hw_news(reads: list[ReplicaRead]) -> bool:
    return any(0 <= item.high_watermark < leader.high_watermark for item, _, leader in reads)


def _answer_throttled(
    item: ReplicaFetchPartition, hosted: HostedPartition, leader: LeaderState
) -> ReplicaFetchAnswer:
    """A throttled partition's answer while the budget is spent: no records, its HW."""
    return ReplicaFetchAnswer(
        item.topic,
        item.partition,
        ErrorCode.none,
        leader.high_watermark,
        hosted.log.log_start_offset,
    )


def _refusal(item: ReplicaFetchPartition, error: ErrorCode) -> ReplicaFetchAnswer:
    return ReplicaFetchAnswer(item.topic, item.partition, error, -1, -1)


def _answer_without_records(
    item: ReplicaFetchPartition, decision: FetchDecision
) -> ReplicaFetchAnswer:
    return ReplicaFetchAnswer(
        item.topic,
        item.partition,
        decision.error,
        decision.high_watermark,
        decision.log_start_offset,
        decision.diverging_epoch,
    )
