"""Follower fetchers: one trio task per leader broker, batching every partition it leads for us.

A round is: ask each partition's FollowerState for its next fetch, send them as ONE
replica.fetch call, apply the answers (append as follower, learn the leader's HW; hand a
truncation on a diverging epoch, or a restart at the leader's log start when out of range, to
the `truncate` callback, which cuts the log off the event loop and reports back to the
follower), then fsync what was appended before the next round. The next round's fetch
offsets are the acknowledgement the leader counts towards its HW, so the fsync must come first
(persist before you promise); the flushes of one round share a group commit in the Flusher.

Failures (the leader unreachable, a timeout, an error answer) back off for
replica_fetch_backoff_ms and try again; metadata moves partitions between fetchers.

Follower replication throttles (core/throttle.py: a partition listed in
`follower.replication.throttled.replicas` for this broker, while this replica is outside the
ISR) share this broker's `follower.replication.throttled.rate`, Kafka's way: while the budget
is spent such a partition is left out of the rounds; what its answers bring is paid from it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from raftlog.errors import ErrorCode, KafkaError
from raftlog.replication.core.follower import (
    FetchRequest,
    FetchResponse,
    FollowerAction,
    FollowerState,
    FollowerStep,
)
from raftlog.replication.core.throttle import ConfigsView, ThrottleState
from raftlog.replication.fetch_wire import (
    ReplicaFetchAnswer,
    ReplicaFetchPartition,
    ReplicaFetchRequest,
    decode_response,
    encode_request,
)
from raftlog.replication.hosted import HostedPartition, TopicPartition, flush_partitions
from raftlog.storage import Flusher

log = logging.getLogger("raftlog.replication")

SendFetch = Callable[[int, dict], Awaitable[dict]]
# Cut the follower's log as a TRUNCATE/RESET step asks, then call its on_truncated.
Truncate = Callable[[HostedPartition, FollowerState, FollowerStep], None]


@dataclass(frozen=True)
class FetcherSettings:
    replica_id: int
    # How long the leader may park a fetch that has nothing new.
    max_wait_ms: int
    # Wait this long after a failed round before the next one.
    backoff_ms: int
    # An answer later than max_wait_ms + this is treated as lost (the connection hung).
    rpc_timeout_slack_ms: int


class ReplicaFetcher:
    """Fetches every partition this broker follows from one leader broker."""

    def __init__(self, pool: FetcherPool, leader_id: int) -> None:
        self.pool = pool
        self.leader_id = leader_id
        self.keys: set[TopicPartition] = set()
        self.cancel_scope = trio.CancelScope()
        self._wakeup = trio.Event()
        self.rounds = 0  # completed fetch rounds (tests and status)

    def wake(self) -> None:
        self._wakeup.set()

    async def run(self) -> None:
        with self.cancel_scope:
            while True:
                await self._round()

    async def _wait_for_work(self, timeout_ms: float) -> None:
        with trio.move_on_after(timeout_ms / 1000):
            await self._wakeup.wait()
        self._wakeup = trio.Event()

    def _due_requests(self) -> _Due:
        now_ms = self.pool.clock_ms()
        due = _Due()
        throttle = self.pool.throttle
        policy = throttle.update(self.pool.configs(), now_ms)
        limit = throttle.follower
        check = limit is not None and bool(policy.follower_partitions)
        spent = check and limit is not None and limit.allowance_bytes(now_ms) == 0
        for key in sorted(self.keys):
            hosted = self.pool.hosted(key)
            if hosted is None:
                continue
            follower = hosted.replica.follower
            if follower is None or follower.leader_id != self.leader_id:
                continue
            if hosted.log.offline:
                continue  # its disk failed: it stays out of replication until a restart
            if not hosted.producers.loaded:
                # The producer state is being rebuilt from this log in a worker thread: the
                # log must hold still; the next round (after the backoff) asks again.
                continue
            # The partition's state, not the follower's: an ISR change keeps the follower.
            state = hosted.replica.state
            throttled = (
                check
                and state is not None
                and policy.follower_throttles(
                    hosted.topic, hosted.partition, follower.replica_id, state.isr
                )
            )
            if throttled and spent:
                assert limit is not None
                due.held_ms = limit.wait_ms(now_ms)
                continue
            request = follower.fetch_request(now_ms=now_ms)
            if request is not None:
                due.append((hosted, follower, request))
                if throttled:
                    due.throttled.add(key)
        return due

    async def _round(self) -> None:
        settings = self.pool.settings
        # A follower with unflushed data sends no fetch: flush first, or it would stall.
        if not await self._flush(self._unflushed()):
            await trio.sleep(settings.backoff_ms / 1000)
            return
        due = self._due_requests()
        if not due:
            # Nothing to ask (backing off, held by a throttle, or no partitions yet): wait for
            # new work.
            await self._wait_for_work(min(settings.backoff_ms, due.held_ms or settings.backoff_ms))
            return
        request = ReplicaFetchRequest(
            replica_id=settings.replica_id,
            max_wait_ms=settings.max_wait_ms,
            min_bytes=1,
            partitions=tuple(
                ReplicaFetchPartition(
                    h.topic,
                    h.partition,
                    r.fetch_offset,
                    r.last_fetched_epoch,
                    r.current_leader_epoch,
                    f.high_watermark,
                )
                for h, f, r in due
            ),
        )
        timeout_s = (settings.max_wait_ms + settings.rpc_timeout_slack_ms) / 1000
        try:
            with trio.fail_after(timeout_s):
                reply = await self.pool.send_fetch(self.leader_id, encode_request(request))
            answers = {(a.topic, a.partition): a for a in decode_response(reply)}
        except Exception as exc:  # any transport failure means "retry later"
            log.info("replica fetch from broker %d failed: %r", self.leader_id, exc)
            now_ms = self.pool.clock_ms()
            for _, follower, fetch in due:
                follower.on_fetch_response(
                    now_ms=now_ms,
                    response=FetchResponse(fetch.request_id, ErrorCode.network_exception, -1, -1),
                )
            await trio.sleep(settings.backoff_ms / 1000)
            return
        self._pay_throttle(due.throttled, answers)
        appended, failed, answered = self._apply_answers(due, answers)
        if not await self._flush(appended):
            failed = True
        now_ms = self.pool.clock_ms()
        for hosted in appended:
            current = hosted.replica.follower
            if current is not None:
                current.on_flushed(now_ms=now_ms)
        self._note_caught_up(answered)
        for hosted, _, _ in due:
            self.pool.on_progress(hosted)
        self.rounds += 1
        if failed:
            await trio.sleep(settings.backoff_ms / 1000)

    def _pay_throttle(
        self, throttled: set[TopicPartition], answers: dict[TopicPartition, ReplicaFetchAnswer]
    ) -> None:
        limit = self.pool.throttle.follower
        if limit is None or not throttled:
            return
        size_bytes = sum(len(answers[k].records) for k in throttled if k in answers)
        limit.record(size_bytes, self.pool.clock_ms())

    @staticmethod
    def _note_caught_up(answered: list[tuple[HostedPartition, FollowerState, int]]) -> None:
        """A replica that lost acknowledged records is whole again once it holds, fsynced,
        everything below a HW its leader sent after checking our log (KIP-966's rule)."""
        for hosted, follower, leader_hw in answered:
            plog = hosted.log
            if (
                plog.lost_data
                and hosted.replica.follower is follower
                and plog.damaged_range is None
                and min(plog.flushed_offset, plog.log_end_offset) >= leader_hw
            ):
                plog.lost_data = False
                log.warning(
                    "%s-%d: fetched back everything committed (high watermark %d) from broker "
                    "%d: eligible to lead again",
                    hosted.topic,
                    hosted.partition,
                    leader_hw,
                    follower.leader_id,
                )

    def _apply_answers(
        self,
        due: list[tuple[HostedPartition, FollowerState, FetchRequest]],
        answers: dict[TopicPartition, ReplicaFetchAnswer],
    ) -> tuple[list[HostedPartition], bool, list[tuple[HostedPartition, FollowerState, int]]]:
        now_ms = self.pool.clock_ms()
        appended: list[HostedPartition] = []
        # Valid answers (our log matched the leader's at the fetch offset) and their HW.
        answered: list[tuple[HostedPartition, FollowerState, int]] = []
        failed = False
        for hosted, follower, fetch in due:
            # Metadata may have replaced the follower (new epoch) or dropped the partition while
            # the fetch was out: that answer belongs to a state that no longer exists.
            if (
                self.pool.hosted(hosted.key) is not hosted
                or hosted.replica.follower is not follower
            ):
                continue
            answer = answers.get(hosted.key)
            if answer is None:
                response = FetchResponse(fetch.request_id, ErrorCode.network_exception, -1, -1)
                records = b""
            else:
                response = FetchResponse(
                    fetch.request_id,
                    answer.error,
                    answer.high_watermark,
                    answer.log_start_offset,
                    answer.diverging_epoch,
                    bool(answer.records),
                )
                records = answer.records
            step = follower.on_fetch_response(now_ms=now_ms, response=response)
            partition_log = hosted.log
            if step.action is FollowerAction.NOTHING:
                answered.append((hosted, follower, response.high_watermark))
                # Nothing new, but the leader's log start may have moved (retention,
                # DeleteRecords): an idle partition follows it too (not while a worker thread
                # cuts its log).
                if not follower.awaiting_truncation:
                    self._follow_log_start(hosted, follower, response.log_start_offset)
            try:
                if step.action is FollowerAction.APPEND:
                    # Storage time is wall-clock (segment.ms); now_ms here is monotonic.
                    partition_log.append_as_follower(
                        records, max_leader_epoch=follower.leader_epoch
                    )
                    appended.append(hosted)
                    answered.append((hosted, follower, response.high_watermark))
                    self._update_producers(hosted, records)
                    self._follow_log_start(hosted, follower, response.log_start_offset)
                elif step.action is FollowerAction.RESET:
                    assert step.reset_to_offset is not None
                    log.warning(
                        "%s-%d: offset %d is out of the leader's range; restarting at %d",
                        hosted.topic,
                        hosted.partition,
                        fetch.fetch_offset,
                        step.reset_to_offset,
                    )
                    self.pool.truncate(hosted, follower, step)
                elif step.action is FollowerAction.TRUNCATE:
                    log.info(
                        "%s-%d: diverged from leader %d; truncating to %s",
                        hosted.topic,
                        hosted.partition,
                        self.leader_id,
                        step.truncate_to_offset,
                    )
                    self.pool.truncate(hosted, follower, step)
                elif step.action is FollowerAction.BACKOFF:
                    failed = True
            except KafkaError as exc:
                failed = True
                if partition_log.offline:
                    continue  # the disk failed: logged once by the log, not fetched again
                # A batch the log refuses (bad CRC, an impossible epoch, an offset gap):
                # nothing of the answer was stored; fetch it again after a pause rather than
                # stop replicating the partition.
                log.warning(
                    "%s-%d: refused the batches fetched from broker %d at offset %d, "
                    "fetching them again: %s",
                    hosted.topic,
                    hosted.partition,
                    self.leader_id,
                    fetch.fetch_offset,
                    exc,
                )
        return appended, failed, answered

    def _update_producers(self, hosted: HostedPartition, records: bytes) -> None:
        # The same table serves when this replica leads: a new leader answers retries of
        # batches it only ever replicated.
        try:
            completed = hosted.producers.table.update_follower_append(records)
            hosted.producers.record_completed(completed)
        except ValueError as exc:
            # The table and the log disagree (it cannot happen unless a bug did): rebuild the
            # table from the log rather than stop replicating.
            log.error("%s-%d: producer state: %s", hosted.topic, hosted.partition, exc)
            self.pool.rebuild_producers(hosted)

    @staticmethod
    def _follow_log_start(
        hosted: HostedPartition, follower: FollowerState, leader_log_start_offset: int
    ) -> None:
        # The leader's retention moved its log start: follow it, never past our own HW.
        target = min(leader_log_start_offset, follower.high_watermark)
        if target > hosted.log.log_start_offset:
            hosted.log.advance_log_start(target)

    async def _flush(self, appended: list[HostedPartition]) -> bool:
        return await flush_partitions(self.pool.flusher, appended) if appended else True

    def _unflushed(self) -> list[HostedPartition]:
        """Followed partitions whose log holds unflushed data (a flush failed earlier), but
        none whose log a truncation is cutting in a worker thread."""
        out = []
        for key in sorted(self.keys):
            hosted = self.pool.hosted(key)
            follower = None if hosted is None else hosted.replica.follower
            if (
                hosted is not None
                and follower is not None
                and not hosted.log.offline
                and follower.awaiting_flush
                and not follower.awaiting_truncation
            ):
                out.append(hosted)
        return out


class _Due(list[tuple[HostedPartition, FollowerState, FetchRequest]]):
    """A round's fetches; `throttled` names those a follower throttle pays for, `held_ms`
    (when not 0) how long a spent throttle holds back the partitions it left out."""

    def __init__(self) -> None:
        super().__init__()
        self.throttled: set[TopicPartition] = set()
        self.held_ms = 0


def _no_configs() -> ConfigsView:
    return {}


class FetcherPool:
    """The set of fetchers, one per leader broker; moves partitions when leaders change."""

    def __init__(
        self,
        settings: FetcherSettings,
        *,
        hosted: Callable[[TopicPartition], HostedPartition | None],
        send_fetch: SendFetch,
        flusher: Flusher,
        clock_ms: Callable[[], int],
        on_progress: Callable[[HostedPartition], None],
        truncate: Truncate,
        rebuild_producers: Callable[[HostedPartition], None],
        configs: Callable[[], ConfigsView] = _no_configs,
    ) -> None:
        self.settings = settings
        # The image's configs (replication throttles are read from them).
        self.configs = configs
        self.throttle = ThrottleState(settings.replica_id)
        self.hosted = hosted
        self.send_fetch = send_fetch
        self.flusher = flusher
        self.clock_ms = clock_ms
        self.on_progress = on_progress
        self.truncate = truncate
        # The producer state disagrees with the log: rebuild it from the whole log.
        self.rebuild_producers = rebuild_producers
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self._leader_of: dict[TopicPartition, int] = {}
        self._nursery: trio.Nursery | None = None

    def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        for fetcher in self.fetchers.values():
            nursery.start_soon(fetcher.run)

    def leader_of(self, key: TopicPartition) -> int | None:
        return self._leader_of.get(key)

    def wake(self, key: TopicPartition) -> None:
        """Start the next round of `key`'s fetcher now (new work for it)."""
        leader_id = self._leader_of.get(key)
        if leader_id is not None:
            self.fetchers[leader_id].wake()

    def assign(self, key: TopicPartition, leader_id: int | None) -> None:
        """Fetch `key` from `leader_id` from now on (None: stop fetching it)."""
        old = self._leader_of.get(key)
        if old == leader_id:
            if leader_id is not None:
                self.fetchers[leader_id].wake()
            return
        if old is not None:
            previous = self.fetchers[old]
            previous.keys.discard(key)
            del self._leader_of[key]
            if not previous.keys:
                previous.cancel_scope.cancel()
                del self.fetchers[old]
        if leader_id is None:
            return
        fetcher = self.fetchers.get(leader_id)
        if fetcher is None:
            fetcher = self.fetchers[leader_id] = ReplicaFetcher(self, leader_id)
            if self._nursery is not None:
                self._nursery.start_soon(fetcher.run)
        fetcher.keys.add(key)
        self._leader_of[key] = leader_id
        fetcher.wake()

    def stop(self) -> None:
        """Cancel every fetcher (controlled shutdown); assignments are forgotten."""
        for fetcher in self.fetchers.values():
            fetcher.cancel_scope.cancel()
        self.fetchers.clear()
        self._leader_of.clear()
        self._nursery = None
