"""Idempotent-producer state of one partition (Kafka's ProducerStateManager, KIP-98): the
sans-IO table.

The leader asks `check_batches` before it appends a produce request and reports what was
appended with `update*`; followers and recovery only `update` (they never validate: the
leader already did, and a follower must store exactly what it has).

Sequence rules (Kafka >= 2.7, ProducerAppendInfo):
- an older producer epoch than the one on record -> INVALID_PRODUCER_EPOCH;
- a newer epoch must start at sequence 0, else OUT_OF_ORDER_SEQUENCE_NUMBER;
- the same epoch must continue at last_seq + 1 (wrapping from 2**31-1 to 0), else
  OUT_OF_ORDER_SEQUENCE_NUMBER;
- a producer id with no state is accepted at any sequence: its state may have been expired
  or removed with old segments, and refusing it would strand the producer (KIP-360 dropped
  the old UNKNOWN_PRODUCER_ID answer for this case). `strict_unknown_producer` restores
  the Kafka 2.0-2.4 answer (UNKNOWN_PRODUCER_ID for a first batch with sequence != 0).
- a request that is exactly one batch equal (epoch, first and last sequence) to one of the
  producer's last 5 batches is a retry: it is answered with the original offsets and NOT
  appended. Kafka keeps 5 because clients allow at most 5 in-flight requests per partition
  when idempotence is on, so any retry the client can still send is in that window.

How the table is saved to and rebuilt from disk is producer_state.py's business.
"""

from __future__ import annotations

import enum
import logging
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from raftlog.errors import CorruptRecordError, ErrorCode
from raftlog.records import NO_SEQUENCE, BatchHeader, iter_batches

# One logger for the table and its snapshots (producer_state.py), as before they were split.
log = logging.getLogger("raftlog.replication.producer_state")

# Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN, matching the clients' cap of 5 in-flight
# requests per connection with idempotence enabled.
RETAINED_BATCHES_PER_PRODUCER = 5
MAX_SEQUENCE = 2**31 - 1  # Int.MaxValue: sequences wrap to 0 after it
# Kafka's producer.id.expiration.ms default (KIP-854): one day without a write.
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 24 * 3_600_000
# Per partition; each entry is ~1 KiB in memory, so the default caps this at ~10 MiB.
DEFAULT_MAX_PRODUCER_IDS = 10_000
# Snapshot files kept per partition: the newest, plus older ones to fall back to if the
# newest turns out corrupt.
DEFAULT_MAX_SNAPSHOTS = 3


@dataclass(frozen=True, slots=True)
class ProducerStateConfig:
    producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS
    max_producer_ids: int = DEFAULT_MAX_PRODUCER_IDS
    max_snapshots: int = DEFAULT_MAX_SNAPSHOTS
    strict_unknown_producer: bool = False

    def __post_init__(self) -> None:
        if self.producer_id_expiration_ms < 1:
            raise ValueError(f"producer_id_expiration_ms {self.producer_id_expiration_ms} < 1")
        if self.max_producer_ids < 1:
            raise ValueError(f"max_producer_ids {self.max_producer_ids} < 1")
        if self.max_snapshots < 1:
            raise ValueError(f"max_snapshots {self.max_snapshots} < 1")


def last_sequence(header: BatchHeader) -> int:
    """The batch's last sequence (Kafka's DefaultRecordBatch.lastSequence: wraps at 2**31)."""
    if header.base_sequence == NO_SEQUENCE:
        return NO_SEQUENCE
    return (header.base_sequence + header.last_offset_delta) % (MAX_SEQUENCE + 1)


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == MAX_SEQUENCE)


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """What a retry needs to be answered like the original append."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp_ms: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=RETAINED_BATCHES_PER_PRODUCER)
    )
    last_timestamp_ms: int = -1
    # Last offset of the last batch of any kind (control batches too) that changed this
    # entry: a truncation at or below it cannot be undone in memory.
    last_batch_offset: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if epoch != self.epoch:
            return None
        for meta in self.batches:
            if meta.first_seq == first_seq and meta.last_seq == last_seq:
                return meta
        return None

    def as_tuple(self) -> tuple[Any, ...]:
        """Comparable value (tests compare a rebuilt table with the live one)."""
        return (
            self.producer_id,
            self.epoch,
            self.last_timestamp_ms,
            self.last_batch_offset,
            tuple(self.batches),
        )


class Verdict(enum.Enum):
    OK = "ok"  # append it
    DUPLICATE = "duplicate"  # a retry: answer with `duplicate_of`'s offsets, do not append
    ERROR = "error"  # answer `error`, append nothing


@dataclass(frozen=True, slots=True)
class ProduceCheck:
    verdict: Verdict
    error: ErrorCode = ErrorCode.none
    message: str = ""
    duplicate_of: BatchMetadata | None = None


CHECK_OK = ProduceCheck(Verdict.OK)


class ProducerStateTable:
    """Producer id -> epoch and last batches, for one partition (sans-IO)."""

    def __init__(self, config: ProducerStateConfig | None = None) -> None:
        self.config = config or ProducerStateConfig()
        # Ordered by last update, oldest first: eviction at the bound takes the least
        # recently written producer, in O(1), and replay reproduces the same order.
        self._producers: OrderedDict[int, ProducerEntry] = OrderedDict()
        # Offset after the last batch this table has seen: its state covers [.., next_offset).
        self.next_offset = 0

    def __len__(self) -> int:
        return len(self._producers)

    def __repr__(self) -> str:
        return f"ProducerStateTable(producers={len(self._producers)}, next={self.next_offset})"

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def entries(self) -> Iterator[ProducerEntry]:
        return iter(self._producers.values())

    def as_tuple(self) -> tuple[Any, ...]:
        return (self.next_offset, tuple(e.as_tuple() for e in self._producers.values()))

    # ------------------------------------------------------------------ leader check
    def check_batches(self, batches: bytes | bytearray | memoryview) -> ProduceCheck:
        """Decide, before a leader append, whether a produce request may be appended."""
        try:
            headers = [h for _, h in iter_batches(batches, check_crc=False)]
        except CorruptRecordError as exc:
            return ProduceCheck(Verdict.ERROR, exc.code, exc.message)
        return self.check_headers(headers)

    def check_headers(self, headers: list[BatchHeader]) -> ProduceCheck:
        if len(headers) == 1:
            duplicate = self._duplicate_of(headers[0])
            if duplicate is not None:
                return ProduceCheck(Verdict.DUPLICATE, duplicate_of=duplicate)
        # (epoch, last_seq) per producer after the batches of this request checked so far:
        # several batches of one producer in a request must continue each other.
        pending: dict[int, tuple[int, int]] = {}
        for header in headers:
            pid = header.producer_id
            if pid < 0:
                continue
            if header.producer_epoch < 0:
                return _error(
                    ErrorCode.invalid_record,
                    f"batch of producer {pid} has invalid producer epoch {header.producer_epoch}",
                )
            entry = self._producers.get(pid)
            if pid in pending:
                epoch, last_seq = pending[pid]
            elif entry is not None:
                epoch, last_seq = entry.epoch, entry.last_seq
            else:
                epoch, last_seq = -1, NO_SEQUENCE
            if header.producer_epoch < epoch:
                return _error(
                    ErrorCode.invalid_producer_epoch,
                    f"producer {pid} epoch {header.producer_epoch} is older than the current "
                    f"epoch {epoch}",
                )
            if header.is_control:
                # Transaction markers carry no sequence; only the epoch matters.
                pending[pid] = (header.producer_epoch, last_seq)
                continue
            first_seq = header.base_sequence
            if first_seq < 0:
                return _error(
                    ErrorCode.invalid_record,
                    f"batch of producer {pid} has invalid base sequence {first_seq}",
                )
            error = self._sequence_error(pid, epoch, last_seq, header)
            if error is not None:
                return error
            pending[pid] = (header.producer_epoch, last_sequence(header))
        return CHECK_OK

    def _duplicate_of(self, header: BatchHeader) -> BatchMetadata | None:
        if header.producer_id < 0 or header.is_control or header.base_sequence < 0:
            return None
        entry = self._producers.get(header.producer_id)
        if entry is None:
            return None
        return entry.find_duplicate(
            header.producer_epoch, header.base_sequence, last_sequence(header)
        )

    def _sequence_error(
        self, pid: int, epoch: int, last_seq: int, header: BatchHeader
    ) -> ProduceCheck | None:
        first_seq = header.base_sequence
        if epoch == -1:  # nothing on record for this producer id
            if self.config.strict_unknown_producer and first_seq != 0:
                return _error(
                    ErrorCode.unknown_producer_id,
                    f"no state for producer {pid}; its first batch has sequence {first_seq}",
                )
            return None
        if header.producer_epoch != epoch:
            if first_seq != 0:
                return _error(
                    ErrorCode.out_of_order_sequence_number,
                    f"producer {pid} new epoch {header.producer_epoch} (was {epoch}) must "
                    f"start at sequence 0, got {first_seq}",
                )
            return None
        if not in_sequence(last_seq, first_seq):
            return _error(
                ErrorCode.out_of_order_sequence_number,
                f"producer {pid} epoch {epoch}: sequence {first_seq} does not follow the "
                f"last written sequence {last_seq}",
            )
        return None

    # ------------------------------------------------------------------ updates
    def update(self, headers: Iterable[BatchHeader]) -> None:
        """Record appended batches; headers must carry their final base offsets."""
        for header in headers:
            if header.base_offset < self.next_offset:
                raise ValueError(
                    f"batch at offset {header.base_offset} is below the producer state's "
                    f"next offset {self.next_offset}: truncate or rebuild first"
                )
            self.next_offset = header.next_offset
            if header.producer_id < 0:
                continue
            self._apply(header)

    def update_leader_append(
        self, batches: bytes | bytearray | memoryview, first_offset: int
    ) -> None:
        """After `append_as_leader`: the request's batches with the offsets the log assigned
        (consecutively from AppendInfo.first_offset, as the log does)."""
        self.update(_rebased(batches, first_offset))

    def update_follower_append(self, batches: bytes | bytearray | memoryview) -> None:
        """After `append_as_follower`: the batches already carry the leader's offsets."""
        self.update(h for _, h in iter_batches(batches, check_crc=False))

    def _apply(self, header: BatchHeader) -> None:
        pid = header.producer_id
        entry = self._producers.get(pid)
        if entry is None:
            entry = ProducerEntry(pid, header.producer_epoch)
            self._producers[pid] = entry
            self._evict_over_bound()
        else:
            self._producers.move_to_end(pid)
        if header.producer_epoch != entry.epoch:
            if header.producer_epoch < entry.epoch:
                # Only a follower or replay gets here (the leader refuses older epochs):
                # record what the leader wrote but keep the newer epoch, as Kafka does.
                log.warning(
                    "producer %d: batch at offset %d has epoch %d, older than %d",
                    pid,
                    header.base_offset,
                    header.producer_epoch,
                    entry.epoch,
                )
            else:
                entry.epoch = header.producer_epoch
                entry.batches.clear()  # sequences restart with a new epoch
        entry.last_timestamp_ms = header.max_timestamp_ms
        entry.last_batch_offset = header.last_offset
        if header.is_control or header.base_sequence < 0:
            return
        entry.batches.append(
            BatchMetadata(
                header.base_sequence,
                last_sequence(header),
                header.base_offset,
                header.last_offset,
                header.max_timestamp_ms,
            )
        )

    def _evict_over_bound(self) -> None:
        while len(self._producers) > self.config.max_producer_ids:
            pid, entry = self._producers.popitem(last=False)
            log.info(
                "evicting producer %d (last write at offset %d): more than %d producer ids",
                pid,
                entry.last_offset,
                self.config.max_producer_ids,
            )

    # ------------------------------------------------------------------ maintenance
    def expire(self, now_ms: int) -> list[int]:
        """Forget producers idle for producer_id_expiration_ms (by their batches' timestamps,
        as Kafka measures it). Returns the expired producer ids."""
        limit_ms = self.config.producer_id_expiration_ms
        expired = [
            pid
            for pid, entry in self._producers.items()
            if now_ms - entry.last_timestamp_ms >= limit_ms
        ]
        for pid in expired:
            del self._producers[pid]
        return expired

    def truncate_to(self, offset: int) -> bool:
        """Drop state derived from batches at/after `offset` if that can be done exactly in
        memory (no producer wrote there). Returns False, changing nothing, when it cannot:
        the caller must then `rebuild` from a snapshot and the log."""
        if offset >= self.next_offset:
            return True
        if any(e.last_batch_offset >= offset for e in self._producers.values()):
            return False
        self.next_offset = offset
        return True

    # ------------------------------------------------------------------ restore
    @classmethod
    def restored(
        cls,
        next_offset: int,
        entries: Iterable[ProducerEntry],
        config: ProducerStateConfig | None = None,
    ) -> ProducerStateTable:
        """A table holding `entries` (least recently written first, as `entries()` yields
        them) and covering the log up to `next_offset`; producers over the configured bound
        are evicted at once (the reader's limit may be smaller than the writer's). Raises
        ValueError on a negative or repeated producer id."""
        table = cls(config)
        table.next_offset = next_offset
        for entry in entries:
            if entry.producer_id < 0 or entry.producer_id in table._producers:
                raise ValueError(f"producer id {entry.producer_id} is negative or repeated")
            table._producers[entry.producer_id] = entry
        table._evict_over_bound()
        return table


def _error(code: ErrorCode, message: str) -> ProduceCheck:
    return ProduceCheck(Verdict.ERROR, code, message)


def _rebased(batches: bytes | bytearray | memoryview, first_offset: int) -> Iterator[BatchHeader]:
    next_offset = first_offset
    for _, header in iter_batches(batches, check_crc=False):
        yield header._replace(base_offset=next_offset)
        next_offset += header.last_offset_delta + 1
