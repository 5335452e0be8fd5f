"""Trio driver of the transaction coordinators of one broker: one TxnCoordinator per
`__transaction_state` partition this broker leads.

The coordinators are pure; this shell owns everything with time or I/O in it:
- each request gets a token; the caller waits until an effect delivers that token's reply;
- appends go to one writer task per partition, which drains its queue in order (the order of
  the records is what makes a replay equal the in-memory state) and batches what is queued
  into one append call;
- each marker write runs in its own task and its answer goes back to the coordinator that
  asked, whose retry rules (on_markers_done, tick) decide what is tried again and when;
- one timer task sleeps until the earliest deadline of any coordinator, or until woken;
- producer ids come from blocks the node allocates (AllocateProducerIds): the core asks for
  one synchronously, so a block is fetched ahead in the background and the core is told
  "none at hand" (it answers a retriable error) only while the first block is on its way.

A coordinator belongs to one leadership of its partition: `become_coordinator(partition,
leader_epoch)` creates it (the leader epoch is its coordinator epoch, which every marker
carries) and loads the partition in the background; `resign(partition)` ends it. Completions
of a resigned coordinator's appends and markers go to it, never to its successor.

The node gives it (all async):
- `append(partition, records)`: acks=all; raises KafkaError on failure;
- `read_all(partition)`: the partition's (key, value) records in log order;
- `write_markers(WriteMarkers)`: {partition: error code} (a partition left out counts as
  failed); raising KafkaError fails every partition with its code;
- `allocate_block()`: a fresh range of producer ids.
Times given to the coordinators are wall-clock ms (they are stored in the records).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import trio

from raftlog.clock import wall_clock_ms
from raftlog.concurrency import run_all
from raftlog.errors import CorruptRecordError, ErrorCode, KafkaError
from raftlog.net.limits import RateLimitedLog
from raftlog.txn import describe
from raftlog.txn.coordinator import TxnCoordinator
from raftlog.txn.effects import Append, Effects, Token, WriteMarkers
from raftlog.txn.log_format import TV_2, Record, TopicPartition
from raftlog.txn.messages import (
    AddOffsetsToTxnRequest,
    AddPartitionsTxn,
    AddPartitionsTxnResult,
    DescribedTransaction,
    EndTxnRequest,
    EndTxnResult,
    InitProducerIdRequest,
    InitProducerIdResult,
    ListedTransaction,
    ListTransactionsResult,
    TxnApi,
    for_version,
)
from raftlog.txn.settings import TxnConfig

log = logging.getLogger(__name__)
_cut_short = RateLimitedLog(log)

# Reads of a `__transaction_state` partition tried before it is given up (NOT_COORDINATOR).
LOAD_ATTEMPTS = 3
# One append call carries at most this many records and bytes (one record batch): under the
# topic's max.message.bytes however many transactions are queued.
APPEND_MAX_RECORDS = 500
APPEND_MAX_BYTES = 512 * 1024
# After a failed AllocateProducerIds, wait this long before asking again (InitProducerId is
# answered COORDINATOR_LOAD_IN_PROGRESS meanwhile, which clients retry).
PRODUCER_ID_RETRY_BACKOFF_MS = 1_000
# AddPartitionsToTxn / AddOffsetsToTxn answered CONCURRENT_TRANSACTIONS (the producer's last
# transaction is still writing its markers) wait up to this long for it to complete before
# the answer goes out: a client would otherwise back off (librdkafka: 20 ms) and ask again,
# which is most of a short transaction's time when its producer starts the next at once.
CONCURRENT_TRANSACTIONS_WAIT_MS = 1_000
# A load replays this many records per event-loop step (some 10 ms of decoding), a listing
# filters this many transactions per step: a partition may hold millions, and Raft, fetches
# and every client wait while one step runs.
LOAD_STEP_RECORDS = 1_000
LIST_STEP_TRANSACTIONS = 1_000
# ListTransactions needs no permission to be asked (the DESCRIBE filter runs on its answer)
# and Kafka does not bound it: here the answer is cut short (and logged) past this many
# transactions or this many characters of transactional ids.
MAX_LISTED_TRANSACTIONS = 100_000
MAX_LISTED_ID_CHARS = 32 * 1024 * 1024

AppendFn = Callable[[int, list[Record]], Awaitable[Any]]
ReadAllFn = Callable[[int], Awaitable[list[Record]]]
WriteMarkersFn = Callable[[WriteMarkers], Awaitable[Mapping[TopicPartition, ErrorCode]]]
AllocateBlockFn = Callable[[], Awaitable[range]]
T = TypeVar("T")


def _concurrent(codes: Iterable[ErrorCode]) -> bool:
    return any(code == ErrorCode.concurrent_transactions for code in codes)


class _Reply:
    __slots__ = ("done", "value")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.value: Any = None


class _Slot:
    """One leadership of one partition: its coordinator and its append queue."""

    def __init__(self, coordinator: TxnCoordinator) -> None:
        self.coordinator = coordinator
        self.queue: deque[Append] = deque()
        self.writing = False
        self.resigned = False
        self.loaded = trio.Event()  # set when the load finished, served or given up
        # Set (and replaced) whenever an append or a marker write of this partition's
        # transactions completes: what a request answered CONCURRENT_TRANSACTIONS waits for.
        self.progressed = trio.Event()

    def progress(self) -> None:
        self.progressed.set()
        self.progressed = trio.Event()


class TxnCoordinatorShell:
    def __init__(
        self,
        config: TxnConfig,
        append: AppendFn,
        read_all: ReadAllFn,
        write_markers: WriteMarkersFn,
        allocate_block: AllocateBlockFn,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.config = config
        self._append_fn = append
        self._read_all = read_all
        self._write_markers = write_markers
        self._allocate_block = allocate_block
        self._clock_ms = clock_ms
        self._slots: dict[int, _Slot] = {}
        self._replies: dict[Token, _Reply] = {}
        self._next_token = 0
        self._nursery: trio.Nursery | None = None
        self._wakeup = trio.Event()
        # The earliest coordinator deadline the timer loop sleeps until.
        self._timer_sleep_until_ms: float = math.inf
        # Producer ids at hand: the block in use first, at most one fetched ahead.
        self._id_blocks: deque[range] = deque()
        self._refilling = False
        self._refill_not_before_ms = 0

    # ------------------------------------------------------------------ lifecycle
    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; start with `await nursery.start(shell.run)`."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._timer_loop)
            task_status.started()

    @property
    def partitions(self) -> dict[int, int]:
        """partition -> coordinator epoch, for every partition this shell coordinates."""
        return {p: s.coordinator.coordinator_epoch for p, s in self._slots.items()}

    def coordinator(self, partition: int) -> TxnCoordinator | None:
        slot = self._slots.get(partition)
        return None if slot is None else slot.coordinator

    def become_coordinator(self, partition: int, coordinator_epoch: int) -> None:
        """This broker now leads `partition` at leader epoch `coordinator_epoch`: a new
        coordinator answers COORDINATOR_LOAD_IN_PROGRESS at once and serves once the
        partition is replayed (in the background). Synchronous, so that a resign that
        follows in the same metadata change always finds what it resigns."""
        slot = self._slots.get(partition)
        if slot is not None:
            if slot.coordinator.coordinator_epoch == coordinator_epoch:
                return
            self.resign(partition)  # a new leader epoch: a new coordinator
        nursery = self._require_nursery()
        slot = _Slot(TxnCoordinator(partition, coordinator_epoch, self.config, self._producer_id))
        self._slots[partition] = slot
        self._maybe_refill()
        nursery.start_soon(self._load, partition, slot)

    async def wait_loaded(self, partition: int) -> None:
        slot = self._slots.get(partition)
        if slot is not None:
            await slot.loaded.wait()

    def resign(self, partition: int) -> None:
        """Leadership of `partition` moved away: its parked callers get NOT_COORDINATOR."""
        slot = self._slots.pop(partition, None)
        if slot is None:
            return
        slot.resigned = True
        # Appends not yet started must never be written after a later leadership loaded the
        # partition; the coordinator forgot them (resign), so they are just dropped.
        slot.queue.clear()
        slot.loaded.set()
        self._apply(slot, slot.coordinator.resign(self._clock_ms()))

    async def _load(self, partition: int, slot: _Slot) -> None:
        try:
            for attempt in range(1, LOAD_ATTEMPTS + 1):
                try:
                    records = await self._read_all(partition)
                    break
                except Exception as exc:  # a damaged partition must not stop the node
                    if slot.resigned:
                        return
                    log.warning(
                        "reading __transaction_state-%d failed (attempt %d/%d): %s",
                        partition,
                        attempt,
                        LOAD_ATTEMPTS,
                        exc,
                    )
            else:
                log.error("cannot read __transaction_state-%d, not coordinating it", partition)
                self._give_up(slot)
                return
            if slot.resigned:
                return  # resigned while reading: this load is stale
            try:
                for start in range(0, len(records), LOAD_STEP_RECORDS):
                    step = records[start : start + LOAD_STEP_RECORDS]
                    slot.coordinator.replay_chunk(step, self._clock_ms())
                    await trio.lowlevel.checkpoint()
                    if slot.resigned:
                        return  # resigned while replaying: this load is stale
                fx = slot.coordinator.finish_load(self._clock_ms())
            except CorruptRecordError as exc:
                log.error(
                    "cannot load __transaction_state-%d, not coordinating it: %s", partition, exc
                )
                self._give_up(slot)
                return
            self._apply(slot, fx)
        finally:
            slot.loaded.set()

    def _give_up(self, slot: _Slot) -> None:
        """Stop serving a partition that cannot be loaded: its callers get NOT_COORDINATOR
        (they look the coordinator up again) until the next leadership tries anew."""
        partition = slot.coordinator.partition
        if self._slots.get(partition) is slot:
            self.resign(partition)

    # ------------------------------------------------------------------ requests
    async def init_producer_id(self, req: InitProducerIdRequest) -> InitProducerIdResult:
        slot = self._slot_for(req.transactional_id)
        if slot is None:
            code = for_version(ErrorCode.not_coordinator, TxnApi.INIT_PRODUCER_ID, req.api_version)
            return InitProducerIdResult(code)
        coordinator = slot.coordinator
        result: InitProducerIdResult = await self._call(
            slot, lambda token, now: coordinator.init_producer_id(token, req, now)
        )
        return result

    async def add_partitions_to_txn(
        self, transactions: Sequence[AddPartitionsTxn]
    ) -> list[AddPartitionsTxnResult]:
        """A batch (v4+) may name transactional ids of several partitions: each partition's
        coordinator answers its own, in request order; ids of partitions this broker does
        not coordinate get NOT_COORDINATOR."""
        results: list[AddPartitionsTxnResult | None] = [None] * len(transactions)
        by_slot: dict[int, tuple[_Slot, list[int]]] = {}
        for index, txn in enumerate(transactions):
            partition = self.config.partition_for(txn.transactional_id)
            slot = self._slots.get(partition)
            if slot is None:
                code = for_version(
                    ErrorCode.not_coordinator, TxnApi.ADD_PARTITIONS_TO_TXN, txn.api_version
                )
                results[index] = AddPartitionsTxnResult(
                    txn.transactional_id, {p: code for p in txn.partitions}
                )
            else:
                by_slot.setdefault(partition, (slot, []))[1].append(index)

        async def ask(slot: _Slot, indexes: list[int]) -> None:
            batch = [transactions[i] for i in indexes]
            coordinator = slot.coordinator

            async def once() -> list[AddPartitionsTxnResult]:
                answered: list[AddPartitionsTxnResult] = await self._call(
                    slot, lambda token, now: coordinator.add_partitions_to_txn(token, batch, now)
                )
                return answered

            answered = await self._after_concurrent(
                slot, once, lambda rs: any(_concurrent(r.errors.values()) for r in rs)
            )
            for index, result in zip(indexes, answered, strict=True):
                results[index] = result

        await run_all(ask, by_slot.values())
        done = [r for r in results if r is not None]
        assert len(done) == len(transactions), results
        return done

    async def add_offsets_to_txn(self, req: AddOffsetsToTxnRequest) -> ErrorCode:
        slot = self._slot_for(req.transactional_id)
        if slot is None:
            return for_version(
                ErrorCode.not_coordinator, TxnApi.ADD_OFFSETS_TO_TXN, req.api_version
            )
        coordinator = slot.coordinator

        async def once() -> ErrorCode:
            code: ErrorCode = await self._call(
                slot, lambda token, now: coordinator.add_offsets_to_txn(token, req, now)
            )
            return code

        return await self._after_concurrent(slot, once, lambda code: _concurrent((code,)))

    async def end_txn(self, req: EndTxnRequest) -> EndTxnResult:
        slot = self._slot_for(req.transactional_id)
        if slot is None:
            code = for_version(ErrorCode.not_coordinator, TxnApi.END_TXN, req.api_version)
            return EndTxnResult(code)
        coordinator = slot.coordinator
        result: EndTxnResult = await self._call(
            slot, lambda token, now: coordinator.end_txn(token, req, now)
        )
        return result

    async def add_partition_for_produce(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
    ) -> ErrorCode:
        """KIP-890 part 2: a Produce v12+ batch would open a transaction on
        `topic`-`partition`; add the partition to the producer's transaction (a TV2 client
        sends no AddPartitionsToTxn for it). NONE once the Ongoing record is replicated."""
        request = AddPartitionsTxn(
            transactional_id,
            producer_id,
            producer_epoch,
            ((topic, partition),),
            client_transaction_version=TV_2,
        )
        [result] = await self.add_partitions_to_txn([request])
        return result.errors[(topic, partition)]

    def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
    ) -> ErrorCode:
        """KIP-890 part 1 (TxnCoordinator.verify); NOT_COORDINATOR for an id of a partition
        this broker does not coordinate."""
        slot = self._slot_for(transactional_id)
        if slot is None:
            return ErrorCode.not_coordinator
        return slot.coordinator.verify(
            transactional_id, producer_id, producer_epoch, topic, partition
        )

    async def describe_transactions(
        self, transactional_ids: Sequence[str]
    ) -> list[DescribedTransaction]:
        described = []
        for txn_id in transactional_ids:
            slot = self._slot_for(txn_id)
            if slot is None:
                described.append(DescribedTransaction(txn_id, ErrorCode.not_coordinator))
            else:
                described.extend(slot.coordinator.describe_transactions([txn_id]))
        return described

    async def list_transactions(
        self,
        state_filters: Iterable[str] = (),
        producer_id_filters: Iterable[int] = (),
        duration_filter_ms: int = -1,
    ) -> ListTransactionsResult:
        """Every partition's part, merged: one list sorted by transactional id;
        COORDINATOR_LOAD_IN_PROGRESS (with what is known) while any partition loads.
        Filtered a step at a time, and at most MAX_LISTED_TRANSACTIONS long."""
        states, producer_ids = list(state_filters), list(producer_id_filters)
        now_ms = self._clock_ms()
        merged = describe.list_transactions(
            (),
            state_filters=states,
            producer_id_filters=producer_ids,
            duration_filter_ms=duration_filter_ms,
            now_ms=now_ms,
        )
        listed: list[ListedTransaction] = []
        id_chars = 0
        cut = False
        code = ErrorCode.none
        for slot in list(self._slots.values()):
            coordinator = slot.coordinator
            if coordinator.loading:
                code = ErrorCode.coordinator_load_in_progress
            # The transactions as they are now: those that change during the steps below
            # are listed as they were, as if the request had been answered at once.
            transactions = list(coordinator.transactions.values())
            for start in range(0, len(transactions), LIST_STEP_TRANSACTIONS):
                await trio.lowlevel.checkpoint()
                part = describe.list_transactions(
                    transactions[start : start + LIST_STEP_TRANSACTIONS],
                    state_filters=states,
                    producer_id_filters=producer_ids,
                    duration_filter_ms=duration_filter_ms,
                    now_ms=now_ms,
                )
                for listed_txn in part.transactions:
                    id_chars += len(listed_txn.transactional_id)
                    if len(listed) >= MAX_LISTED_TRANSACTIONS or id_chars > MAX_LISTED_ID_CHARS:
                        cut = True
                        break
                    listed.append(listed_txn)
                if cut:
                    break
            if cut:
                break
        if cut:
            _cut_short.warning(
                "ListTransactions answered with its first %d transactions only (at most %d, "
                "or %d characters of transactional ids)",
                len(listed),
                MAX_LISTED_TRANSACTIONS,
                MAX_LISTED_ID_CHARS,
            )
        listed.sort(key=lambda t: t.transactional_id)
        return replace(merged, error_code=code, transactions=tuple(listed))

    # ------------------------------------------------------------------ plumbing
    def _slot_for(self, transactional_id: str) -> _Slot | None:
        return self._slots.get(self.config.partition_for(transactional_id))

    def _require_nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise RuntimeError("TxnCoordinatorShell.run() is not running")
        return self._nursery

    async def _after_concurrent(
        self, slot: _Slot, once: Callable[[], Awaitable[T]], concurrent: Callable[[T], bool]
    ) -> T:
        """once(), asked again each time the partition's transactions progress while its
        answer says CONCURRENT_TRANSACTIONS, for up to CONCURRENT_TRANSACTIONS_WAIT_MS; then
        whatever the last answer was (the client retries that as usual)."""
        deadline = trio.current_time() + CONCURRENT_TRANSACTIONS_WAIT_MS / 1000
        while True:
            progressed = slot.progressed
            answer = await once()
            if not concurrent(answer) or slot.resigned:
                return answer
            with trio.move_on_at(deadline) as waited:
                await progressed.wait()
            if waited.cancelled_caught:
                return answer

    async def _call(self, slot: _Slot, request: Callable[[Token, int], Effects]) -> Any:
        self._require_nursery()
        self._next_token += 1
        token = self._next_token
        reply = self._replies[token] = _Reply()
        try:
            self._apply(slot, request(token, self._clock_ms()))
            await reply.done.wait()
        finally:
            # A cancelled caller (closed connection) leaves nothing behind; a reply that
            # arrives later for its token is dropped.
            self._replies.pop(token, None)
        return reply.value

    def _apply(self, slot: _Slot, fx: Effects) -> None:
        for token, response in fx.replies:
            reply = self._replies.pop(token, None)
            if reply is not None:
                reply.value = response
                reply.done.set()
        if slot.resigned:
            # A resigned coordinator asks for nothing more (resign() returns replies only);
            # anything else would be written under a leadership that has ended.
            assert not fx.appends and not fx.markers, fx
            return
        if fx.appends or fx.markers:
            nursery = self._require_nursery()
            slot.queue.extend(fx.appends)
            if slot.queue and not slot.writing:
                slot.writing = True
                nursery.start_soon(self._writer, slot)
            for markers in fx.markers:
                nursery.start_soon(self._send_markers, slot, markers)
        # Wake the timer loop only for a deadline sooner than the one it sleeps until: most
        # steps of a transaction move none, and each wake reads every coordinator's.
        deadline_ms = slot.coordinator.next_deadline_ms()
        if deadline_ms is not None and deadline_ms < self._timer_sleep_until_ms:
            self._wakeup.set()

    async def _writer(self, slot: _Slot) -> None:
        partition = slot.coordinator.partition
        try:
            while slot.queue and not slot.resigned:
                batch: list[Append] = []
                records: list[Record] = []
                size = 0
                while slot.queue:
                    append = slot.queue[0]
                    more = sum(len(k) + len(v or b"") for k, v in append.records)
                    if batch and (
                        len(records) + len(append.records) > APPEND_MAX_RECORDS
                        or size + more > APPEND_MAX_BYTES
                    ):
                        break
                    slot.queue.popleft()
                    batch.append(append)
                    records.extend(append.records)
                    size += more
                code = ErrorCode.none
                try:
                    await self._append_fn(partition, records)
                except KafkaError as exc:
                    code = exc.code
                except Exception:
                    # A failed write must still answer its callers, never kill the node.
                    log.exception("append to __transaction_state-%d failed", partition)
                    code = ErrorCode.unknown_server_error
                now_ms = self._clock_ms()
                for append in batch:
                    self._apply(
                        slot, slot.coordinator.on_append_done(append.append_id, code, now_ms)
                    )
                slot.progress()
        finally:
            slot.writing = False

    async def _send_markers(self, slot: _Slot, markers: WriteMarkers) -> None:
        try:
            results = dict(await self._write_markers(markers))
        except KafkaError as exc:
            results = {p: exc.code for p in markers.partitions}
        except Exception:
            # Retriable: the coordinator tries again after its backoff.
            log.exception("writing the markers of %r failed", markers.transactional_id)
            results = {p: ErrorCode.request_timed_out for p in markers.partitions}
        self._apply(
            slot, slot.coordinator.on_markers_done(markers.marker_id, results, self._clock_ms())
        )
        slot.progress()

    async def _timer_loop(self) -> None:
        while True:
            self._wakeup = trio.Event()
            deadlines = [
                d
                for s in self._slots.values()
                if (d := s.coordinator.next_deadline_ms()) is not None
            ]
            self._timer_sleep_until_ms = min(deadlines, default=math.inf)
            if not deadlines:
                await self._wakeup.wait()
            else:
                delay_ms = min(deadlines) - self._clock_ms()
                if delay_ms > 0:
                    with trio.move_on_after(delay_ms / 1000):
                        await self._wakeup.wait()
            now_ms = self._clock_ms()
            for slot in list(self._slots.values()):
                deadline_ms = slot.coordinator.next_deadline_ms()
                if deadline_ms is not None and deadline_ms <= now_ms:
                    self._apply(slot, slot.coordinator.tick(now_ms))

    # ------------------------------------------------------------------ producer ids
    def _producer_id(self) -> int | None:
        """The core's allocator: an id at hand, or None while the next block is fetched."""
        while self._id_blocks and not self._id_blocks[0]:
            self._id_blocks.popleft()
        producer_id = None
        if self._id_blocks:
            block = self._id_blocks[0]
            producer_id = block[0]
            self._id_blocks[0] = block[1:]
        self._maybe_refill()
        return producer_id

    def _maybe_refill(self) -> None:
        """Fetch the next block once the one in use is 90% spent (Kafka's prefetch rule),
        so InitProducerId rarely waits for the controller."""
        at_hand = sum(len(b) for b in self._id_blocks)
        low_water = max(1, len(self._id_blocks[-1]) // 10) if self._id_blocks else 1
        if len(self._id_blocks) > 1 or at_hand > low_water or self._refilling:
            return
        if self._nursery is None or self._clock_ms() < self._refill_not_before_ms:
            return
        self._refilling = True
        self._nursery.start_soon(self._refill)

    async def _refill(self) -> None:
        try:
            block = await self._allocate_block()
            if len(block) < 1 or block.step != 1 or block.start < 0:
                raise KafkaError(ErrorCode.unknown_server_error, f"bad producer id block {block}")
            self._id_blocks.append(block)
        except Exception as exc:  # any failure waits, then is tried again
            log.warning("producer id block not allocated: %s", exc)
            self._refill_not_before_ms = self._clock_ms() + PRODUCER_ID_RETRY_BACKOFF_MS
        finally:
            self._refilling = False
