"""Read the partitions a consumer group assigns to this member, committing as it goes.

    async with open_group_consumer(cluster, "billing", ["orders"]) as consumer:
        while True:
            item = await consumer.receive()   # ConsumedRecord(topic, partition, record)

A GroupMember (group_member.py) keeps the membership; this module is its listener. When
partitions are assigned it looks up their committed offsets (or resets to the earliest or
latest offset where nothing is committed) and starts one fetch task per partition; records
reach `receive()` through a bounded channel, so a slow reader slows the fetchers instead of
growing memory. A record counts as consumed once `receive()` has returned it; the position
committed for a partition is the offset after the last record returned.

Commits happen every `auto_commit_interval_ms`, when partitions are revoked (before the
member rejoins, while the generation still allows it) and when the consumer closes. Commits
are serialized, so an older position never overwrites a newer one. Records fetched for a
revoked assignment and still buffered are dropped (each carries the assignment's epoch): the
partition's next owner reads them from the committed offset. Delivery is at-least-once —
what was returned after the last successful commit is read again by the next owner.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from raftlog.client.admin import Admin
from raftlog.client.cluster import Cluster
from raftlog.client.connection import ConnectionClosed, RequestTimeout
from raftlog.client.consumer import DEFAULT_FETCH_MAX_BYTES, Consumer
from raftlog.client.consumer_protocol import TopicPartition
from raftlog.client.group_member import CommitFailed, GroupMember, MemberConfig
from raftlog.client.groups import GroupAdmin
from raftlog.client.protocol import IsolationLevel
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import Record

log = logging.getLogger(__name__)

RESET_POLICIES = ("earliest", "latest")
# Consecutive OFFSET_OUT_OF_RANGE resets of one partition before the fetch gives up: a log
# truncated again and again under the reader is worth an error, not a spin.
MAX_OFFSET_RESETS = 5


@dataclass(frozen=True)
class GroupConsumerConfig:
    member: MemberConfig = field(default_factory=MemberConfig)
    # Where a partition without a committed offset starts (Kafka's auto.offset.reset).
    reset: str = "latest"
    # Kafka's auto.commit.interval.ms.
    auto_commit_interval_ms: int = 5_000
    buffer_max_records: int = 1_000
    fetch_max_wait_ms: int = 500
    fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    # Kafka's isolation.level: read_committed reads up to the LSO, without aborted records.
    isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED

    def __post_init__(self) -> None:
        if self.reset not in RESET_POLICIES:
            raise ValueError(f"reset must be one of {RESET_POLICIES}, not {self.reset!r}")
        for name in ("auto_commit_interval_ms", "buffer_max_records", "fetch_max_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.fetch_max_wait_ms < 0:
            raise ValueError("fetch_max_wait_ms must be >= 0")


@dataclass(frozen=True)
class ConsumedRecord:
    topic: str
    partition: int
    record: Record


class GroupConsumer:
    """The listener and reader side of a group member; create it with open_group_consumer."""

    def __init__(
        self,
        cluster: Cluster,
        group_id: str,
        topics: Sequence[str],
        config: GroupConsumerConfig | None = None,
    ) -> None:
        self.cluster = cluster
        self.group_id = group_id
        self.config = config or GroupConsumerConfig()
        self.member = GroupMember(cluster, group_id, topics, self, self.config.member)
        # Next offset to return, per assigned partition; what was last committed.
        self.positions: dict[TopicPartition, int] = {}
        self.committed: dict[TopicPartition, int] = {}
        self._fetcher = Consumer(
            cluster,
            max_bytes=self.config.fetch_max_bytes,
            max_wait_ms=self.config.fetch_max_wait_ms,
            isolation_level=self.config.isolation_level,
        )
        self._admin = Admin(cluster)
        self._groups = GroupAdmin(cluster)
        self._send, self._receive = trio.open_memory_channel[tuple[int, TopicPartition, Record]](
            self.config.buffer_max_records
        )
        # Bumped on every assignment change; buffered records of an older epoch are dropped.
        self._epoch = 0
        self._fetch_scope: trio.CancelScope | None = None
        self._commit_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None

    @property
    def assignment(self) -> frozenset[TopicPartition]:
        return self.member.assignment

    async def receive(self) -> ConsumedRecord:
        """The next record of an assigned partition (waits while there is none)."""
        while True:
            epoch, tp, record = await self._receive.receive()
            position = self.positions.get(tp)
            if epoch != self._epoch or position is None or record.offset < position:
                continue  # fetched for an assignment since revoked
            self.positions[tp] = record.offset + 1
            return ConsumedRecord(tp[0], tp[1], record)

    async def commit(self) -> None:
        """Commit the position of every assigned partition that moved since its last commit.

        CommitFailed when a rebalance took the partitions first.
        """
        async with self._commit_lock:
            moved = {tp: o for tp, o in self.positions.items() if self.committed.get(tp) != o}
            if not moved:
                return
            await self.member.commit(moved)
            self.committed.update(moved)

    # ------------------------------------------------------------------ listener
    async def on_partitions_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        self._epoch += 1
        epoch = self._epoch
        if not partitions:
            return
        ordered = sorted(partitions)
        committed = await self._groups.committed_positions(self.group_id, ordered)
        starts = {tp: committed[tp] if tp in committed else await self._reset(tp) for tp in ordered}
        self.positions = dict(starts)
        self.committed = dict(committed)
        scope = trio.CancelScope()
        self._fetch_scope = scope
        assert self._nursery is not None, "on_partitions_assigned before the consumer started"
        self._nursery.start_soon(self._fetch_assignment, scope, epoch, starts)

    async def on_partitions_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        if self._fetch_scope is not None:
            self._fetch_scope.cancel()
            self._fetch_scope = None
        self._epoch += 1
        try:
            await self.commit()
        except CommitFailed as exc:
            log.warning(
                "group %s: offsets of %s not committed (%s); their next owner reads again "
                "from the last commit",
                self.group_id,
                _names(partitions),
                exc,
            )
        except (KafkaError, ConnectionClosed, RequestTimeout, OSError) as exc:
            log.warning("group %s: commit on revoke failed: %s", self.group_id, exc)
        finally:
            self.positions.clear()
            self.committed.clear()

    # ------------------------------------------------------------------ tasks
    async def _fetch_assignment(
        self, scope: trio.CancelScope, epoch: int, starts: dict[TopicPartition, int]
    ) -> None:
        with scope:
            async with trio.open_nursery() as nursery:
                for tp, start in starts.items():
                    nursery.start_soon(self._fetch_partition, epoch, tp, start)

    async def _fetch_partition(self, epoch: int, tp: TopicPartition, start: int) -> None:
        topic, partition = tp
        offset = start
        resets = 0
        while True:
            try:
                result = await self._fetcher.fetch(topic, partition, offset)
            except KafkaError as exc:
                if exc.code != ErrorCode.offset_out_of_range or resets >= MAX_OFFSET_RESETS:
                    raise
                resets += 1
                reset_to = await self._reset(tp)
                log.warning(
                    "group %s: %s-%d offset %d is out of range; reading from the %s offset %d",
                    self.group_id,
                    topic,
                    partition,
                    offset,
                    self.config.reset,
                    reset_to,
                )
                offset = reset_to
                continue
            resets = 0
            for record in result.records:
                await self._send.send((epoch, tp, record))
            # Past control batches and aborted records too: a partition ending in a marker
            # would otherwise be fetched again at once, for ever.
            offset = max(offset, result.next_offset)

    async def _commit_periodically(self) -> None:
        interval_s = self.config.auto_commit_interval_ms / 1000
        while True:
            # The commit period, not a wait for state.
            await trio.sleep(interval_s)
            if not self.member.stable:
                continue  # a rebalance is under way; the revoke commits
            try:
                await self.commit()
            except CommitFailed as exc:
                log.info("group %s: periodic commit skipped: %s", self.group_id, exc)
            except (KafkaError, ConnectionClosed, RequestTimeout, OSError) as exc:
                log.warning("group %s: periodic commit failed: %s", self.group_id, exc)

    async def _reset(self, tp: TopicPartition) -> int:
        spec, level = self.config.reset, self.config.isolation_level
        return (await self._admin.list_offsets(tp[0], tp[1], spec, level)).offset


@asynccontextmanager
async def open_group_consumer(
    cluster: Cluster,
    group_id: str,
    topics: Sequence[str],
    config: GroupConsumerConfig | None = None,
) -> AsyncIterator[GroupConsumer]:
    """Join group_id (returns once the first assignment is in); commit and leave on exit."""
    consumer = GroupConsumer(cluster, group_id, topics, config)
    async with trio.open_nursery() as nursery:
        consumer._nursery = nursery
        try:
            async with consumer.member.joined():
                nursery.start_soon(consumer._commit_periodically)
                yield consumer
        finally:
            nursery.cancel_scope.cancel()


def _names(partitions: frozenset[TopicPartition]) -> str:
    return ",".join(f"{t}-{p}" for t, p in sorted(partitions)) or "nothing"


__all__ = [
    "RESET_POLICIES",
    "ConsumedRecord",
    "GroupConsumer",
    "GroupConsumerConfig",
    "open_group_consumer",
]
