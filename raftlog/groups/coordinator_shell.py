"""Trio driver of the GroupCoordinator: parks callers, performs appends, fires timers.

The coordinator is pure; this shell owns everything with time or I/O in it:
- each request gets a token; the caller waits until an effect delivers that token's reply
  (immediately, or when its rebalance completes);
- appends go to one writer task per offsets partition, which drains its queue in order
  (ordering is what makes a replay equal the in-memory state) and batches everything queued
  into one append call (group commit: many commits per acks=all round trip);
- one timer task sleeps until the coordinator's next deadline, or until woken by a change.

The node gives it `append(partition, [(key, value)], txn)` (acks=all; raises KafkaError on
failure; with a TxnProducer the records are one transactional batch of that producer) and
`await read_all(partition) -> list of LogEntry` (the partition's log: (key, value) records,
TxnRecord and TxnEnd for transactional batches and markers, read by the node in bounded steps
on the event loop, where the log is never changed underneath it). The transaction driver
calls `complete_transaction` once a marker is replicated on an offsets partition.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Any

import trio

from raftlog.clock import wall_clock_ms
from raftlog.errors import CorruptRecordError, ErrorCode, KafkaError
from raftlog.groups.coordinator import Append, Effects, GroupCoordinator, TxnProducer
from raftlog.groups.group import Token
from raftlog.groups.messages import (
    ConsumerHeartbeatRequest,
    ConsumerHeartbeatResponse,
    DeleteGroupResult,
    DescribedConsumerGroup,
    DescribedGroup,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
    TxnOffsetCommitRequest,
)
from raftlog.groups.offsets_format import LogEntry, Record, replay

log = logging.getLogger(__name__)

# Reads of an offsets partition tried before its groups are given up (NOT_COORDINATOR).
LOAD_ATTEMPTS = 3

AppendFn = Callable[[int, list[Record], TxnProducer | None], Awaitable[Any]]
ReadAllFn = Callable[[int], Awaitable[list[LogEntry]]]


class _Slot:
    __slots__ = ("done", "value")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.value: Any = None


class GroupCoordinatorShell:
    def __init__(
        self,
        coordinator: GroupCoordinator,
        append: AppendFn,
        read_all: ReadAllFn,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.coordinator = coordinator
        self._append_fn = append
        self._read_all = read_all
        self._clock_ms = clock_ms
        self._slots: dict[Token, _Slot] = {}
        self._next_token = 0
        self._queues: dict[int, deque[Append]] = {}
        self._writing: set[int] = set()
        self._nursery: trio.Nursery | None = None
        self._wakeup = trio.Event()

    # ------------------------------------------------------------------ lifecycle
    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; start with `await nursery.start(shell.run)`."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._timer_loop)
            task_status.started()

    async def become_coordinator(self, partition: int) -> None:
        """This broker now leads offsets partition `partition`: load it, then serve it."""
        self._apply(self.coordinator.begin_load(partition, self._clock_ms()))
        epoch = self.coordinator.epoch_of(partition)
        for attempt in range(1, LOAD_ATTEMPTS + 1):
            try:
                records = await self._read_all(partition)
                break
            except (KafkaError, OSError) as exc:
                # The log moved under the read (truncated on a leader change, or its start
                # advanced): a stale load is dropped below, a current one starts over.
                if self.coordinator.epoch_of(partition) != epoch:
                    return
                log.warning(
                    "reading offsets partition %d failed (attempt %d/%d): %s",
                    partition,
                    attempt,
                    LOAD_ATTEMPTS,
                    exc,
                )
        else:
            log.error("cannot read offsets partition %d, not serving it", partition)
            self.resign(partition)
            return
        if self.coordinator.epoch_of(partition) != epoch:
            return  # resigned (or reloaded) while reading: this load is stale
        try:
            # Decoding is pure and takes seconds for a large partition: in a worker thread,
            # the event loop (Raft, fetches, every client) runs meanwhile.
            replayed = await trio.to_thread.run_sync(replay, records)
        except CorruptRecordError as exc:
            if self.coordinator.epoch_of(partition) == epoch:
                log.error("cannot load offsets partition %d, not serving it: %s", partition, exc)
                self.resign(partition)
            return
        if self.coordinator.epoch_of(partition) != epoch:
            return  # resigned (or reloaded) while replaying: this load is stale
        self.coordinator.install_load(partition, replayed, self._clock_ms())
        self._wakeup.set()

    def resign(self, partition: int) -> None:
        """Leadership of `partition` moved away: its callers get NOT_COORDINATOR."""
        self._apply(self.coordinator.resign(partition, self._clock_ms()))
        # Appends not yet started must never be written after a later re-election loaded
        # the partition, so they fail here; one already in flight fails or is ignored.
        queue = self._queues.pop(partition, deque())
        now_ms = self._clock_ms()
        for append in queue:
            self._apply(
                self.coordinator.on_append_done(
                    append.append_id, ErrorCode.not_leader_or_follower, now_ms
                )
            )

    # ------------------------------------------------------------------ requests
    async def join_group(self, req: JoinGroupRequest) -> JoinGroupResponse:
        return await self._call(lambda token, now: self.coordinator.join_group(token, req, now))

    async def sync_group(self, req: SyncGroupRequest) -> SyncGroupResponse:
        return await self._call(lambda token, now: self.coordinator.sync_group(token, req, now))

    async def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResponse:
        return self.coordinator.heartbeat(req, self._clock_ms())

    def consumer_subscriptions(self, group_id: str) -> set[str]:
        """The topics group `group_id`'s consumer-protocol members subscribe to."""
        return self.coordinator.consumer_subscriptions(group_id)

    def consumer_uses_regex(self, group_id: str) -> bool:
        """Whether a member of group `group_id` subscribes by regex (its heartbeats then
        need the cluster's topic names)."""
        return self.coordinator.consumer_uses_regex(group_id)

    async def consumer_group_heartbeat(
        self,
        req: ConsumerHeartbeatRequest,
        partition_counts: dict[str, int],
        topic_names: Collection[str] | None = None,
        may_describe: Callable[[str], bool] | None = None,
    ) -> ConsumerHeartbeatResponse:
        # Answered once the group's record is replicated, if the heartbeat changed it; the
        # timer is woken in _apply (session deadlines moved).
        return await self._call(
            lambda token, now: self.coordinator.consumer_group_heartbeat(
                token, req, partition_counts, now, topic_names, may_describe
            )
        )

    async def consumer_group_describe(
        self, group_ids: Iterable[str]
    ) -> list[DescribedConsumerGroup]:
        return self.coordinator.consumer_group_describe(group_ids)

    async def leave_group(self, req: LeaveGroupRequest) -> LeaveGroupResponse:
        response, fx = self.coordinator.leave_group(req, self._clock_ms())
        self._apply(fx)
        return response

    async def offset_commit(self, req: OffsetCommitRequest) -> OffsetCommitResponse:
        return await self._call(lambda token, now: self.coordinator.offset_commit(token, req, now))

    async def offset_fetch(self, req: OffsetFetchRequest) -> OffsetFetchResponse:
        return self.coordinator.offset_fetch(req)

    async def txn_offset_commit(self, req: TxnOffsetCommitRequest) -> OffsetCommitResponse:
        """Answered once the transactional batch is replicated; the offsets count only after
        complete_transaction(committed=True)."""
        return await self._call(
            lambda token, now: self.coordinator.txn_offset_commit(token, req, now)
        )

    async def complete_transaction(self, partition: int, producer_id: int, committed: bool) -> None:
        """`producer_id`'s COMMIT/ABORT marker is replicated on offsets partition `partition`
        (called by the transaction driver)."""
        self.coordinator.complete_transaction(partition, producer_id, committed, self._clock_ms())

    async def describe_groups(self, group_ids: Iterable[str]) -> list[DescribedGroup]:
        return self.coordinator.describe_groups(group_ids)

    async def list_groups(self, states_filter: Iterable[str] = ()) -> ListGroupsResponse:
        return self.coordinator.list_groups(states_filter)

    async def offset_delete(self, req: OffsetDeleteRequest) -> OffsetDeleteResponse:
        """Answered once the offsets' tombstones are replicated (KIP-496)."""
        return await self._call(lambda token, now: self.coordinator.offset_delete(token, req, now))

    async def delete_groups(self, group_ids: Iterable[str]) -> list[DeleteGroupResult]:
        ids = list(group_ids)
        return await self._call(lambda token, now: self.coordinator.delete_groups(token, ids, now))

    # ------------------------------------------------------------------ plumbing
    async def _call(self, request: Callable[[Token, int], Effects]) -> Any:
        if self._nursery is None:
            raise RuntimeError("GroupCoordinatorShell.run() is not running")
        self._next_token += 1
        token = self._next_token
        slot = self._slots[token] = _Slot()
        try:
            self._apply(request(token, self._clock_ms()))
            await slot.done.wait()
        finally:
            # A cancelled caller (closed connection) leaves nothing behind; a reply that
            # arrives later for its token is dropped.
            self._slots.pop(token, None)
        return slot.value

    def _apply(self, fx: Effects) -> None:
        for token, response in fx.replies:
            slot = self._slots.pop(token, None)
            if slot is not None:
                slot.value = response
                slot.done.set()
        for append in fx.appends:
            self._queues.setdefault(append.partition, deque()).append(append)
            if append.partition not in self._writing:
                if self._nursery is None:
                    raise RuntimeError("GroupCoordinatorShell.run() is not running")
                self._writing.add(append.partition)
                self._nursery.start_soon(self._writer, append.partition)
        self._wakeup.set()

    async def _writer(self, partition: int) -> None:
        try:
            while queue := self._queues.get(partition):
                batch: list[Append] = []
                records: list[Record] = []
                limit = self.coordinator.config.append_max_records
                # One batch is one producer's: transactional appends of the same producer
                # and epoch go together, never with plain records or another's.
                txn = queue[0].txn
                while (
                    queue
                    and queue[0].txn == txn
                    and (not batch or len(records) + len(queue[0].records) <= limit)
                ):
                    append = queue.popleft()
                    batch.append(append)
                    records.extend(append.records)
                code = ErrorCode.none
                try:
                    await self._append_fn(partition, records, txn)
                except KafkaError as exc:
                    code = exc.code
                except Exception:
                    # A failed write must still answer its callers, never kill the node.
                    log.exception("append to offsets partition %d failed", partition)
                    code = ErrorCode.unknown_server_error
                now_ms = self._clock_ms()
                for append in batch:
                    self._apply(self.coordinator.on_append_done(append.append_id, code, now_ms))
        finally:
            self._writing.discard(partition)

    async def _timer_loop(self) -> None:
        while True:
            self._wakeup = trio.Event()
            deadline_ms = self.coordinator.next_deadline_ms()
            if deadline_ms is None:
                await self._wakeup.wait()
            else:
                delay_ms = deadline_ms - self._clock_ms()
                if delay_ms > 0:
                    with trio.move_on_after(delay_ms / 1000):
                        await self._wakeup.wait()
            fx = self.coordinator.tick(self._clock_ms())
            self._apply(fx)
