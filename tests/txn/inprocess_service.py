"""InProcessTxnService: a TxnService for protocol tests, over real TxnCoordinators.

One node that leads every `__transaction_state` partition: each partition's coordinator is
loaded at start, its appends land in memory at once (or fail with `append_error`, for tests),
and its markers are written through a KafkaBackend's `write_txn_markers` (the in-memory test
backend's, which appends real control batches and ends the transaction in the partition's
producer state). Markers for `__consumer_offsets` partitions are acknowledged without a write:
transactional offset commits live in the group coordinator, which this service does not drive.

A timer task ticks the coordinators at their deadlines (timeouts, retries, expiration). Start
with `await nursery.start(service.run)`; set `port` (and `host`) to the Kafka listener's
once it is bound, since FindCoordinator answers with them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import trio

from raftlog.clock import wall_clock_ms
from raftlog.errors import ErrorCode
from raftlog.groups.service import CoordinatorLocation
from raftlog.groups.settings import OFFSETS_TOPIC
from raftlog.net.kafka.backend import TopicPartitionKey, TxnMarkerWrite
from raftlog.txn.coordinator import TxnCoordinator
from raftlog.txn.effects import Effects, Token, WriteMarkers
from raftlog.txn.log_format import Record
from raftlog.txn.messages import (
    AddOffsetsToTxnRequest,
    AddPartitionsTxn,
    AddPartitionsTxnResult,
    DescribedTransaction,
    EndTxnRequest,
    EndTxnResult,
    InitProducerIdRequest,
    InitProducerIdResult,
    ListTransactionsResult,
)
from raftlog.txn.settings import TxnConfig

log = logging.getLogger(__name__)

MarkerWriter = Callable[
    [Sequence[TxnMarkerWrite]], Awaitable[Sequence[dict[TopicPartitionKey, ErrorCode]]]
]
FIRST_PRODUCER_ID = 5_000


class InProcessTxnService:
    def __init__(
        self,
        write_markers: MarkerWriter,
        config: TxnConfig | None = None,
        *,
        node_id: int = 1,
        host: str = "127.0.0.1",
        port: int = -1,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.config = config or TxnConfig(transaction_state_log_num_partitions=3)
        self.node_id = node_id
        self.host = host
        self.port = port
        self.clock_ms = clock_ms
        self._write_markers = write_markers
        # partition -> records in append order: the stand-in for the replicated log.
        self.logs: dict[int, list[Record]] = {}
        # Tests set this to make every `__transaction_state` append fail with it.
        self.append_error = ErrorCode.none
        # Every marker write the coordinators asked for, in order.
        self.marker_requests: list[WriteMarkers] = []
        self._next_producer_id = FIRST_PRODUCER_ID
        self.coordinators: dict[int, TxnCoordinator] = {}
        self._replies: dict[Token, object] = {}
        self._waiting: dict[Token, trio.Event] = {}
        self._next_token = 0
        self._wakeup = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._ready = False

    # ------------------------------------------------------------------ lifecycle
    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Load every partition's coordinator, then tick them; serve until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for partition in range(self.config.transaction_state_log_num_partitions):
                self._start_coordinator(partition, coordinator_epoch=0)
            self._ready = True
            task_status.started()
            await self._timer_loop()

    def _start_coordinator(self, partition: int, coordinator_epoch: int) -> None:
        coordinator = TxnCoordinator(partition, coordinator_epoch, self.config, self._allocate)
        self.coordinators[partition] = coordinator
        self._apply(coordinator, coordinator.load(self.logs.get(partition, []), self.clock_ms()))

    def fail_over(self, partition: int) -> None:
        """The partition's leadership moves (here: back to this node, one epoch later): the
        old coordinator resigns, a new one loads the log and finishes what is owed."""
        old = self.coordinators[partition]
        self._apply(old, old.resign(self.clock_ms()))
        self._start_coordinator(partition, old.coordinator_epoch + 1)

    def _allocate(self) -> int:
        self._next_producer_id += 1
        return self._next_producer_id

    async def _timer_loop(self) -> None:
        while True:
            deadlines = [
                d for c in self.coordinators.values() if (d := c.next_deadline_ms()) is not None
            ]
            wait_s = math.inf
            if deadlines:
                wait_s = max(0.0, (min(deadlines) - self.clock_ms()) / 1000)
            with trio.move_on_after(wait_s):
                await self._wakeup.wait()
            self._wakeup = trio.Event()
            now_ms = self.clock_ms()
            for coordinator in list(self.coordinators.values()):
                deadline = coordinator.next_deadline_ms()
                if deadline is not None and deadline <= now_ms:
                    self._apply(coordinator, coordinator.tick(now_ms))

    # ------------------------------------------------------------------ effects
    def _apply(self, coordinator: TxnCoordinator, fx: Effects) -> None:
        queue = [fx]
        while queue:
            effects = queue.pop(0)
            for token, reply in effects.replies:
                self._replies[token] = reply
                event = self._waiting.pop(token, None)
                if event is not None:
                    event.set()
            for append in effects.appends:
                code = self.append_error
                if code is ErrorCode.none:
                    self.logs.setdefault(append.partition, []).extend(append.records)
                queue.append(coordinator.on_append_done(append.append_id, code, self.clock_ms()))
            for markers in effects.markers:
                self.marker_requests.append(markers)
                assert self._nursery is not None
                self._nursery.start_soon(self._write, coordinator, markers)
        self._wakeup.set()

    async def _write(self, coordinator: TxnCoordinator, markers: WriteMarkers) -> None:
        results: dict[TopicPartitionKey, ErrorCode] = {
            key: ErrorCode.none for key in markers.partitions if key[0] == OFFSETS_TOPIC
        }
        data = tuple(key for key in markers.partitions if key[0] != OFFSETS_TOPIC)
        if data:
            write = TxnMarkerWrite(
                markers.producer_id,
                markers.producer_epoch,
                markers.coordinator_epoch,
                markers.commit,
                data,
            )
            try:
                (written,) = await self._write_markers([write])
                results.update(written)
            except Exception:
                log.exception("writing markers of %r failed", markers.transactional_id)
        if coordinator.resigned:
            return
        self._apply(
            coordinator, coordinator.on_markers_done(markers.marker_id, results, self.clock_ms())
        )

    async def _ask(self, partition: int, call: Callable[[Token, int], Effects]) -> Any:
        coordinator = self.coordinators[partition]
        self._next_token += 1
        token = self._next_token
        event = trio.Event()
        self._waiting[token] = event
        self._apply(coordinator, call(token, self.clock_ms()))
        await event.wait()
        return self._replies.pop(token)

    # ------------------------------------------------------------------ TxnService
    async def coordinator_for(self, transactional_id: str) -> CoordinatorLocation:
        if not self._ready or self.port < 0:
            return CoordinatorLocation(ErrorCode.coordinator_not_available)
        return CoordinatorLocation(ErrorCode.none, self.node_id, self.host, self.port)

    def _partition(self, transactional_id: str) -> int:
        return self.config.partition_for(transactional_id)

    async def init_producer_id(self, request: InitProducerIdRequest) -> InitProducerIdResult:
        partition = self._partition(request.transactional_id)
        coordinator = self.coordinators[partition]
        result: InitProducerIdResult = await self._ask(
            partition, lambda token, now_ms: coordinator.init_producer_id(token, request, now_ms)
        )
        return result

    async def add_partitions_to_txn(
        self, transactions: Sequence[AddPartitionsTxn]
    ) -> list[AddPartitionsTxnResult]:
        # A v4 batch may name transactions of several coordinators: each gets its own.
        by_partition: dict[int, list[int]] = {}
        for index, txn in enumerate(transactions):
            by_partition.setdefault(self._partition(txn.transactional_id), []).append(index)
        results: list[AddPartitionsTxnResult | None] = [None] * len(transactions)
        for partition, indexes in by_partition.items():
            coordinator = self.coordinators[partition]
            batch = [transactions[i] for i in indexes]
            answered: list[AddPartitionsTxnResult] = await self._ask(
                partition,
                lambda token, now_ms, c=coordinator, b=batch: c.add_partitions_to_txn(  # type: ignore[misc]
                    token, b, now_ms
                ),
            )
            for index, result in zip(indexes, answered, strict=True):
                results[index] = result
        return [r for r in results if r is not None]

    async def add_offsets_to_txn(self, request: AddOffsetsToTxnRequest) -> ErrorCode:
        partition = self._partition(request.transactional_id)
        coordinator = self.coordinators[partition]
        code: ErrorCode = await self._ask(
            partition, lambda token, now_ms: coordinator.add_offsets_to_txn(token, request, now_ms)
        )
        return code

    async def add_offsets_for_commit(self, request: AddOffsetsToTxnRequest) -> ErrorCode:
        return await self.add_offsets_to_txn(request)

    async def end_txn(self, request: EndTxnRequest) -> EndTxnResult:
        partition = self._partition(request.transactional_id)
        coordinator = self.coordinators[partition]
        result: EndTxnResult = await self._ask(
            partition, lambda token, now_ms: coordinator.end_txn(token, request, now_ms)
        )
        return result

    async def describe_transactions(
        self, transactional_ids: Sequence[str]
    ) -> list[DescribedTransaction]:
        out = []
        for transactional_id in transactional_ids:
            coordinator = self.coordinators[self._partition(transactional_id)]
            out.extend(coordinator.describe_transactions([transactional_id]))
        return out

    async def list_transactions(
        self,
        state_filters: Iterable[str],
        producer_id_filters: Iterable[int],
        duration_filter_ms: int,
    ) -> ListTransactionsResult:
        states = list(state_filters)
        producer_ids = list(producer_id_filters)
        now_ms = self.clock_ms()
        parts = [
            c.list_transactions(
                state_filters=states,
                producer_id_filters=producer_ids,
                duration_filter_ms=duration_filter_ms,
                now_ms=now_ms,
            )
            for c in self.coordinators.values()
        ]
        loading = any(p.error_code is ErrorCode.coordinator_load_in_progress for p in parts)
        listed = sorted(
            (t for p in parts for t in p.transactions), key=lambda t: t.transactional_id
        )
        return ListTransactionsResult(
            ErrorCode.coordinator_load_in_progress if loading else ErrorCode.none,
            tuple(listed),
            parts[0].unknown_state_filters if parts else (),
        )

    def state_of(self, transactional_id: str) -> str:
        """The transaction's state by Kafka's name ("" when the id is unknown)."""
        coordinator = self.coordinators[self._partition(transactional_id)]
        txn = coordinator.transactions.get(transactional_id)
        return "" if txn is None else txn.state.kafka_name
