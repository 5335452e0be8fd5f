"""GroupService on a real node: the coordinator lives where `__consumer_offsets` leads.

The coordinator for a group is the leader of its offsets partition. Commits and group
metadata are appended to that partition with acks=all through the ReplicaManager, so they are
replicated like any data and survive a coordinator failover: the next leader of the partition
replays it (read_all) before serving. Leadership changes come from the metadata image.

Transactional offset commits go in as a transactional batch of the client's producer id and
epoch, with the next sequence of that producer on the partition: the coordinator is the only
writer of that producer's data there (clients may not produce to the offsets topic) and one
writer task per partition appends in order, so the partition's producer state tells the next
sequence. The produce path verifies (KIP-890) that the partition is in the producer's ongoing
transaction, as AddOffsetsToTxn put it there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import trio

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode, KafkaError
from raftlog.groups.coordinator import GroupCoordinator, TxnProducer
from raftlog.groups.coordinator_shell import GroupCoordinatorShell
from raftlog.groups.hashing import partition_for_group
from raftlog.groups.offsets_format import LogEntry, TxnEnd, TxnRecord
from raftlog.groups.offsets_format import Record as OffsetsRecord
from raftlog.groups.service import CoordinatorLocation
from raftlog.groups.settings import OFFSETS_TOPIC, GroupConfig
from raftlog.metadata.controller.broker_lifecycle import ControllerClient
from raftlog.metadata.image import MetadataDelta, MetadataImage
from raftlog.metadata.service import MetadataService
from raftlog.records import (
    BatchHeader,
    Record,
    build_batch,
    iter_records,
    parse_txn_marker,
)
from raftlog.replication.core.producer_table import MAX_SEQUENCE, ProducerEntry
from raftlog.replication.internal_topics import (
    coordinator_location,
    create_internal_topic,
    read_partition,
)
from raftlog.replication.manager import ReplicaManager

log = logging.getLogger("raftlog.groups")

# How long a commit may wait for acks=all before the member is told to retry.
OFFSETS_APPEND_TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class _TxnWriter:
    """Who a transactional offsets append is from, for the produce path's verification."""

    transactional_id: str
    client_id: str = "group-coordinator"


class NodeGroupService:
    """Implements raftlog.groups.service.GroupService for one broker."""

    def __init__(
        self,
        config: NodeConfig,
        metadata: MetadataService,
        controller: ControllerClient,
        replicas: ReplicaManager,
        clock_ms: Any,
    ) -> None:
        self.config = config
        self.metadata = metadata
        self.controller = controller
        self.replicas = replicas
        self.num_partitions = config.offsets_topic_num_partitions
        self._shell = GroupCoordinatorShell(
            GroupCoordinator(GroupConfig.from_node_config(config)),
            self._append,
            self._read_all,
            clock_ms=clock_ms,
        )
        self._owned: set[int] = set()
        self._creating = False
        self._nursery: trio.Nursery | None = None

    @property
    def shell(self) -> GroupCoordinatorShell:
        return self._shell

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self._shell.run)
            task_status.started()

    # ---------------------------------------------------------------- FindCoordinator
    async def coordinator_for(self, group_id: str) -> CoordinatorLocation:
        location = coordinator_location(
            self.metadata.image, OFFSETS_TOPIC, lambda count: partition_for_group(group_id, count)
        )
        if location is None:
            self._create_offsets_topic()
            return CoordinatorLocation(ErrorCode.coordinator_not_available)
        return location

    def _create_offsets_topic(self) -> None:
        if self._creating or self._nursery is None:
            return
        self._creating = True
        self._nursery.start_soon(self._create_offsets_topic_task)

    async def _create_offsets_topic_task(self) -> None:
        try:
            await create_internal_topic(
                self.controller.call,
                self.metadata.image,
                OFFSETS_TOPIC,
                self.num_partitions,
                self.config.offsets_topic_replication_factor,
            )
        finally:
            self._creating = False

    # ---------------------------------------------------------------- leadership
    def on_metadata(self, image: MetadataImage, delta: MetadataDelta) -> None:
        """Follow leadership of the offsets partitions (called after the ReplicaManager's)."""
        topic = image.topic(OFFSETS_TOPIC)
        led = (
            set()
            if topic is None
            else {p for p, state in topic.partitions.items() if state.leader == self.config.node_id}
        )
        for partition in sorted(self._owned - led):
            self._owned.discard(partition)
            self._shell.resign(partition)
        for partition in sorted(led - self._owned):
            self._owned.add(partition)
            if self._nursery is not None:
                self._nursery.start_soon(self._shell.become_coordinator, partition)

    # ---------------------------------------------------------------- the log seam
    async def _append(
        self, partition: int, records: list[OffsetsRecord], txn: TxnProducer | None = None
    ) -> None:
        entries = [Record(key=key, value=value) for key, value in records]
        if txn is None:
            batch = build_batch(entries)
            writer = None
        else:
            batch = build_batch(
                entries,
                producer_id=txn.producer_id,
                producer_epoch=txn.producer_epoch,
                base_sequence=self._next_sequence(partition, txn),
                is_transactional=True,
            )
            writer = _TxnWriter(txn.transactional_id)
        result = await self.replicas.writes.produce(
            OFFSETS_TOPIC, partition, batch, -1, OFFSETS_APPEND_TIMEOUT_MS, writer
        )
        if result.error != ErrorCode.none:
            raise KafkaError(result.error, result.error_message or "offsets append failed")

    def _next_sequence(self, partition: int, txn: TxnProducer) -> int:
        """The sequence the producer's next batch on the partition must carry: 0 for a new
        producer or epoch, else one past its last (wrapping as Kafka's do)."""
        hosted = self.replicas.replicas.partitions.get((OFFSETS_TOPIC, partition))
        entry = None if hosted is None else hosted.producers.table.get(txn.producer_id)
        return next_sequence(entry, txn.producer_epoch)

    async def _read_all(self, partition: int) -> list[LogEntry]:
        """Every entry of the partition, in log order: (key, value) records, TxnRecord for
        records of transactional batches, TxnEnd for COMMIT/ABORT markers."""
        hosted = self.replicas.replicas.partitions.get((OFFSETS_TOPIC, partition))
        return await read_partition(hosted, batch_entries)


def next_sequence(entry: ProducerEntry | None, producer_epoch: int) -> int:
    """The sequence a producer's next batch must carry given its state on the partition:
    0 for a producer or epoch the partition has not seen, else one past its last (wrapping
    as Kafka's sequences do)."""
    if entry is None or entry.epoch != producer_epoch:
        return 0
    return (entry.last_seq + 1) % (MAX_SEQUENCE + 1)


def batch_entries(data: bytes, pos: int, header: BatchHeader) -> list[LogEntry]:
    """The offsets-log entries of the batch at `pos`: its (key, value) records, as TxnRecord
    when the batch is transactional, or the TxnEnd of a COMMIT/ABORT marker (other control
    batches carry nothing for the coordinator). Raises CorruptRecordError on a malformed
    marker."""
    if header.is_control:
        marker = parse_txn_marker(data, pos)
        return [] if marker is None else [TxnEnd(marker.producer_id, marker.commit)]
    keyed: list[OffsetsRecord] = [
        (r.key, r.value) for r in iter_records(data, pos) if r.key is not None
    ]
    if header.is_transactional:
        return [TxnRecord(header.producer_id, key, value) for key, value in keyed]
    return list(keyed)
