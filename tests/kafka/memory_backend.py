"""A single-broker KafkaBackend for protocol tests.

Partitions are append-only files of record batches (so fetches return real file regions and
the sendfile path is exercised); offsets are assigned by rewriting each batch's baseOffset,
the one header field outside the CRC, as the real storage engine does.
"""

from __future__ import annotations

import io
import re
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
import trio

from raftlog.constants import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP
from raftlog.errors import ErrorCode, KafkaError
from raftlog.metadata.controller.messages import NewTopic
from raftlog.net.kafka.backend import (
    AlterConfigOp,
    BrokerInfo,
    ConfigEntry,
    ConfigResourceType,
    ConfigSource,
    ConfigsResult,
    CreateTopicResult,
    DeleteRecordsResult,
    DeleteTopicResult,
    EpochEndOffset,
    FetchResult,
    IsolationLevel,
    LeaderHint,
    ListOffsetsResult,
    PartitionInfo,
    PartitionProducers,
    ProducerDescription,
    ProduceResult,
    ProducerIdResult,
    ProducerInfo,
    QuotaAlteration,
    QuotaAlterResult,
    QuotaEntity,
    QuotaFilter,
    TopicInfo,
    TopicPartitionKey,
    TxnMarkerWrite,
)
from raftlog.records import ControlType, TxnMarker, build_txn_marker
from raftlog.replication.core.producer_table import ProducerStateTable, Verdict
from raftlog.storage.segment import FileRegion

BATCH_HEADER_BYTES = 61
_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
TOPIC_DEFAULTS = {"cleanup.policy": "delete", "retention.ms": "604800000"}


@dataclass
class _Batch:
    base_offset: int
    last_offset: int
    position: int
    length_bytes: int
    max_timestamp_ms: int


@dataclass
class _Partition:
    file: io.FileIO
    batches: list[_Batch] = field(default_factory=list)
    end_offset: int = 0
    size_bytes: int = 0
    event: trio.Event = field(default_factory=trio.Event)
    # Producer ids, epochs, sequences and open transactions, as a real leader keeps them
    # (recorded, never checked: this backend validates nothing).
    producers: ProducerStateTable = field(default_factory=ProducerStateTable)

    def notify(self) -> None:
        self.event.set()
        self.event = trio.Event()


@dataclass
class _Topic:
    topic_id: uuid.UUID
    partitions: list[_Partition]
    configs: dict[str, str] = field(default_factory=dict)


def split_batches(records: bytes) -> list[tuple[int, int]]:
    """(start, length) of each RecordBatch v2 in a produce payload; CorruptRecord-ish
    KafkaError on a bad header or CRC."""
    out = []
    pos = 0
    while pos < len(records):
        if len(records) - pos < BATCH_HEADER_BYTES:
            raise KafkaError(ErrorCode.corrupt_message, "truncated batch header")
        (batch_length,) = struct.unpack_from(">i", records, pos + 8)
        total = 12 + batch_length
        magic = records[pos + 16]
        if magic != 2 or total < BATCH_HEADER_BYTES or pos + total > len(records):
            raise KafkaError(ErrorCode.corrupt_message, "bad batch")
        (crc,) = struct.unpack_from(">I", records, pos + 17)
        if crc32c.crc32c(records[pos + 21 : pos + total]) != crc:
            raise KafkaError(ErrorCode.corrupt_message, "crc mismatch")
        out.append((pos, total))
        pos += total
    return out


class MemoryBackend:
    """Implements raftlog.net.kafka.backend.KafkaBackend for one broker (node 1)."""

    def __init__(self, data_dir: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self._dir = data_dir
        self.host, self.port = host, port
        self._topics: dict[str, _Topic] = {}
        self._quotas: dict[QuotaEntity, dict[str, float]] = {}
        self._next_producer_id = 1000
        self.auto_create = True
        self.default_partitions = 1
        # Tests hold a topic's gate to make its DescribeConfigs finish late.
        self.gates: dict[str, trio.Event] = {}
        # Compression codec ids (attributes & 7) of every stored batch, per topic.
        self.codecs_seen: dict[str, set[int]] = {}
        # Tests can make a partition report that another broker leads it.
        self.not_leader: dict[tuple[str, int], LeaderHint] = {}
        # Every WriteTxnMarkers marker asked for, in order.
        self.markers_written: list[TxnMarkerWrite] = []

    # -- cluster
    @property
    def cluster_id(self) -> str:
        return "raftlog-test-cluster"

    @property
    def node_id(self) -> int:
        return 1

    def controller_id(self) -> int:
        return 1

    def brokers(self) -> Sequence[BrokerInfo]:
        return [BrokerInfo(1, self.host, self.port, None)]

    def topics(self, names: Sequence[str] | None) -> Sequence[TopicInfo]:
        wanted = self._topics if names is None else [n for n in names if n in self._topics]
        return [self._info(name) for name in wanted]

    def _info(self, name: str) -> TopicInfo:
        t = self._topics[name]
        return TopicInfo(
            name,
            t.topic_id,
            [PartitionInfo(i, 1, 0, [1], [1]) for i in range(len(t.partitions))],
        )

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        return next((n for n, t in self._topics.items() if t.topic_id == topic_id), None)

    def auto_create_topics(self) -> bool:
        return self.auto_create

    def _partition(self, topic: str, partition: int) -> _Partition:
        t = self._topics.get(topic)
        if t is None or not 0 <= partition < len(t.partitions):
            raise KafkaError(ErrorCode.unknown_topic_or_partition)
        if (topic, partition) in self.not_leader:
            raise KafkaError(ErrorCode.not_leader_or_follower)
        return t.partitions[partition]

    def _new_partition(self, topic: str, index: int) -> _Partition:
        path = self._dir / f"{topic}-{index}.log"
        return _Partition(io.FileIO(path, "a+"))

    def close(self) -> None:
        for t in self._topics.values():
            for p in t.partitions:
                p.file.close()

    # -- data path
    async def produce(
        self,
        topic: str,
        partition: int,
        records: bytes,
        acks: int,
        timeout_ms: int,
        producer: ProducerInfo,
    ) -> ProduceResult:
        hint = self.not_leader.get((topic, partition))
        if hint is not None:
            return ProduceResult(ErrorCode.not_leader_or_follower, current_leader=hint)
        p = self._partition(topic, partition)
        base = self._append(topic, p, records)
        return ProduceResult(ErrorCode.none, base, -1, 0)

    def _append(self, topic: str, p: _Partition, records: bytes) -> int:
        """Store the batches at the log end; returns the first offset."""
        spans = split_batches(records)
        base = p.end_offset
        data = bytearray(records)
        for start, length in spans:
            (last_delta,) = struct.unpack_from(">i", data, start + 23)
            (max_ts,) = struct.unpack_from(">q", data, start + 35)
            (attributes,) = struct.unpack_from(">h", data, start + 21)
            self.codecs_seen.setdefault(topic, set()).add(attributes & 0x7)
            struct.pack_into(">q", data, start, p.end_offset)
            struct.pack_into(">i", data, start + 12, 0)  # partitionLeaderEpoch
            position = p.size_bytes + start
            p.batches.append(
                _Batch(p.end_offset, p.end_offset + last_delta, position, length, max_ts)
            )
            p.end_offset += last_delta + 1
        p.file.write(bytes(data))
        p.size_bytes += len(data)
        p.producers.update_leader_append(data, base)
        p.notify()
        return base

    async def fetch(
        self,
        topic: str,
        partition: int,
        fetch_offset: int,
        partition_max_bytes: int,
        current_leader_epoch: int,
        isolation: IsolationLevel,
    ) -> FetchResult:
        p = self._partition(topic, partition)
        if current_leader_epoch > 0:
            return FetchResult(ErrorCode.unknown_leader_epoch)
        if not 0 <= fetch_offset <= p.end_offset:
            return FetchResult(ErrorCode.offset_out_of_range, p.end_offset, p.end_offset, 0)
        regions: list[FileRegion] = []
        total = 0
        for b in p.batches:
            if b.last_offset < fetch_offset:
                continue
            if regions and total + b.length_bytes > partition_max_bytes:
                break
            regions.append(FileRegion(p.file, b.position, b.length_bytes))
            total += b.length_bytes
        return FetchResult(ErrorCode.none, p.end_offset, p.end_offset, 0, regions)

    def data_event(self, topic: str, partition: int) -> trio.Event:
        try:
            return self._partition(topic, partition).event
        except KafkaError:
            return trio.Event()

    async def delete_records(self, topic: str, partition: int, offset: int) -> DeleteRecordsResult:
        # The in-memory log has no log start to move: the answer's shape only.
        p = self._partition(topic, partition)
        target = p.end_offset if offset == -1 else offset
        if not 0 <= target <= p.end_offset:
            return DeleteRecordsResult(ErrorCode.offset_out_of_range)
        return DeleteRecordsResult(low_watermark=target)

    async def list_offset(
        self,
        topic: str,
        partition: int,
        timestamp_ms: int,
        current_leader_epoch: int,
        isolation: IsolationLevel,
    ) -> ListOffsetsResult:
        p = self._partition(topic, partition)
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return ListOffsetsResult(ErrorCode.none, -1, 0, 0)
        if timestamp_ms == LATEST_TIMESTAMP:
            return ListOffsetsResult(ErrorCode.none, -1, p.end_offset, 0)
        if timestamp_ms == MAX_TIMESTAMP:
            # The batch's last offset stands in for the record (the real broker walks the
            # batch: storage's PartitionLog.max_timestamp_record).
            if not p.batches:
                return ListOffsetsResult(ErrorCode.none, -1, -1, -1)
            b = max(p.batches, key=lambda b: b.max_timestamp_ms)
            return ListOffsetsResult(ErrorCode.none, b.max_timestamp_ms, b.last_offset, 0)
        for b in p.batches:
            if b.max_timestamp_ms >= timestamp_ms:
                return ListOffsetsResult(ErrorCode.none, b.max_timestamp_ms, b.base_offset, 0)
        return ListOffsetsResult(ErrorCode.none, -1, -1, -1)

    async def offset_for_leader_epoch(
        self, topic: str, partition: int, current_leader_epoch: int, leader_epoch: int
    ) -> EpochEndOffset:
        p = self._partition(topic, partition)
        return EpochEndOffset(ErrorCode.none, 0, p.end_offset)

    # -- admin
    async def create_topics(
        self, topics: Sequence[NewTopic], timeout_ms: int, validate_only: bool
    ) -> Sequence[CreateTopicResult]:
        results = []
        for t in topics:
            count = self.default_partitions if t.num_partitions == -1 else t.num_partitions
            if not _TOPIC_NAME.match(t.name) or t.name in (".", ".."):
                results.append(CreateTopicResult(t.name, ErrorCode.invalid_topic_exception))
            elif t.name in self._topics:
                results.append(CreateTopicResult(t.name, ErrorCode.topic_already_exists))
            elif count < 1:
                results.append(CreateTopicResult(t.name, ErrorCode.invalid_partitions))
            else:
                topic_id = uuid.uuid4()
                if not validate_only:
                    self._topics[t.name] = _Topic(
                        topic_id,
                        [self._new_partition(t.name, i) for i in range(count)],
                        {k: v for k, v in t.configs.items() if v is not None},
                    )
                results.append(CreateTopicResult(t.name, ErrorCode.none, None, topic_id, count, 1))
        return results

    async def delete_topics(
        self, topics: Sequence[str | uuid.UUID], timeout_ms: int
    ) -> Sequence[DeleteTopicResult]:
        results = []
        for target in topics:
            name = self.topic_name(target) if isinstance(target, uuid.UUID) else target
            if name is None or name not in self._topics:
                results.append(DeleteTopicResult(name, None, ErrorCode.unknown_topic_or_partition))
                continue
            t = self._topics.pop(name)
            for p in t.partitions:
                p.file.close()
                p.notify()
            results.append(DeleteTopicResult(name, t.topic_id))
        return results

    async def create_partitions(
        self,
        topic: str,
        total_count: int,
        assignments: Sequence[Sequence[int]] | None,
        timeout_ms: int,
        validate_only: bool,
    ) -> tuple[ErrorCode, str | None]:
        t = self._topics.get(topic)
        if t is None:
            return ErrorCode.unknown_topic_or_partition, None
        if total_count <= len(t.partitions):
            return ErrorCode.invalid_partitions, f"topic has {len(t.partitions)} partitions"
        if not validate_only:
            t.partitions += [
                self._new_partition(topic, i) for i in range(len(t.partitions), total_count)
            ]
        return ErrorCode.none, None

    async def describe_configs(
        self, resource_type: ConfigResourceType, name: str, keys: Sequence[str] | None
    ) -> ConfigsResult:
        gate = self.gates.get(name)
        if gate is not None:
            await gate.wait()
        if resource_type == ConfigResourceType.BROKER:
            return ConfigsResult(
                configs=[ConfigEntry("num.partitions", str(self.default_partitions))]
            )
        t = self._topics.get(name)
        if t is None:
            return ConfigsResult(ErrorCode.unknown_topic_or_partition)
        entries = [
            ConfigEntry(
                k,
                t.configs.get(k, v),
                source=(
                    ConfigSource.DYNAMIC_TOPIC_CONFIG
                    if k in t.configs
                    else ConfigSource.DEFAULT_CONFIG
                ),
            )
            for k, v in {**TOPIC_DEFAULTS, **t.configs}.items()
            if keys is None or k in keys
        ]
        return ConfigsResult(configs=entries)

    async def alter_configs(
        self,
        resource_type: ConfigResourceType,
        name: str,
        configs: dict[str, str | None],
        validate_only: bool,
    ) -> tuple[ErrorCode, str | None]:
        t = self._topics.get(name)
        if resource_type != ConfigResourceType.TOPIC or t is None:
            return ErrorCode.unknown_topic_or_partition, None
        if not validate_only:
            t.configs = {k: v for k, v in configs.items() if v is not None}
        return ErrorCode.none, None

    async def incremental_alter_configs(
        self,
        resource_type: ConfigResourceType,
        name: str,
        ops: Sequence[tuple[str, AlterConfigOp, str | None]],
        validate_only: bool,
    ) -> tuple[ErrorCode, str | None]:
        t = self._topics.get(name)
        if resource_type != ConfigResourceType.TOPIC or t is None:
            return ErrorCode.unknown_topic_or_partition, None
        if validate_only:
            return ErrorCode.none, None
        for key, op, value in ops:
            if op == AlterConfigOp.SET and value is not None:
                t.configs[key] = value
            elif op == AlterConfigOp.DELETE:
                t.configs.pop(key, None)
            else:
                return ErrorCode.invalid_config, f"operation {op.name} unsupported"
        return ErrorCode.none, None

    async def describe_client_quotas(
        self, filters: Sequence[QuotaFilter], strict: bool
    ) -> Sequence[tuple[QuotaEntity, dict[str, float]]]:
        def matches(entity: QuotaEntity) -> bool:
            parts = dict(entity)
            for f in filters:
                if f.entity_type not in parts:
                    return False
                if f.match_type == 0 and parts[f.entity_type] != f.match:
                    return False
                if f.match_type == 1 and parts[f.entity_type] is not None:
                    return False
            return not strict or len(parts) == len(filters)

        return [(e, dict(v)) for e, v in self._quotas.items() if matches(e)]

    async def alter_client_quotas(
        self, alterations: Sequence[QuotaAlteration], validate_only: bool
    ) -> Sequence[QuotaAlterResult]:
        results = []
        for a in alterations:
            if not validate_only:
                values = self._quotas.setdefault(a.entity, {})
                for key, value, remove in a.ops:
                    if remove:
                        values.pop(key, None)
                    else:
                        values[key] = value
                if not values:
                    del self._quotas[a.entity]
            results.append(QuotaAlterResult(a.entity))
        return results

    async def init_producer_id(
        self,
        transactional_id: str | None,
        transaction_timeout_ms: int,
        producer_id: int,
        producer_epoch: int,
    ) -> ProducerIdResult:
        if transactional_id is not None:
            # The handlers send these to the transaction coordinator, never here.
            raise KafkaError(ErrorCode.coordinator_not_available)
        self._next_producer_id += 1
        return ProducerIdResult(ErrorCode.none, self._next_producer_id, 0)

    # -- transactions
    async def write_txn_markers(
        self, markers: Sequence[TxnMarkerWrite]
    ) -> Sequence[dict[TopicPartitionKey, ErrorCode]]:
        self.markers_written.extend(markers)
        return [
            {key: self._write_marker(marker, *key) for key in marker.partitions}
            for marker in markers
        ]

    def _write_marker(self, marker: TxnMarkerWrite, topic: str, partition: int) -> ErrorCode:
        try:
            p = self._partition(topic, partition)
        except KafkaError as exc:
            return exc.code
        control_type = ControlType.COMMIT if marker.commit else ControlType.ABORT
        check = p.producers.check_marker(
            TxnMarker(
                marker.producer_id, marker.producer_epoch, control_type, marker.coordinator_epoch
            )
        )
        if check.verdict is Verdict.ERROR:
            return check.error
        if check.verdict is Verdict.OK:
            self._append(
                topic,
                p,
                build_txn_marker(
                    producer_id=marker.producer_id,
                    producer_epoch=marker.producer_epoch,
                    coordinator_epoch=marker.coordinator_epoch,
                    commit=marker.commit,
                ),
            )
        return ErrorCode.none

    async def describe_producers(self, topic: str, partition: int) -> PartitionProducers:
        try:
            p = self._partition(topic, partition)
        except KafkaError as exc:
            return PartitionProducers(exc.code)
        return PartitionProducers(
            producers=[
                ProducerDescription(
                    producer_id=e.producer_id,
                    producer_epoch=e.epoch,
                    last_sequence=e.last_seq,
                    last_timestamp_ms=e.last_timestamp_ms,
                    coordinator_epoch=e.coordinator_epoch,
                    current_txn_start_offset=e.current_txn_first_offset,
                )
                for e in p.producers.entries()
            ]
        )
