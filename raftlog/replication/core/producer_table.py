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

Transactions (KIP-98, Kafka's ProducerStateEntry.currentTxnFirstOffset):
- a transactional data batch starts the producer's transaction at its base offset, or extends
  the one already open; a COMMIT or ABORT marker ends it (`CompletedTxn`, which the driver turns
  into a .txnindex entry when it is an abort);
- the first offset of every open transaction is kept in offset order (`_ongoing`): the
  smallest is the first undecided offset; a completed transaction stays unstable until its
  marker is below the HW (`_unreplicated`, Kafka's unreplicatedTxns), because a leader change
  may still lose the marker and leave the transaction open; the LSO is the smallest first
  offset of both, never above the HW;
- the leader checks a marker before it writes it (`check_marker`): an older producer epoch is
  INVALID_PRODUCER_EPOCH, an older coordinator epoch TRANSACTION_COORDINATOR_FENCED, and a
  marker equal to the producer's last one (same epoch, coordinator epoch and type) with no
  transaction open since is a retry, answered without a second append;
- a producer with an open transaction is never expired nor evicted: forgetting it would let
  the LSO pass records that may still be aborted.

How the table is saved to and rebuilt from disk is producer_state.py's business.
"""

from __future__ import annotations

import enum
import logging
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from raftlog.codec import I32_MAX
from raftlog.errors import CorruptRecordError, ErrorCode
from raftlog.records import NO_SEQUENCE, BatchHeader, TxnMarker, iter_batches, parse_txn_marker

# One logger for the table and its snapshots (producer_state.py), as before they were split.
log = logging.getLogger("raftlog.replication.producer_state")

# Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN, matching the clients' cap of 5 in-flight
# requests per connection with idempotence enabled.
RETAINED_BATCHES_PER_PRODUCER = 5
MAX_SEQUENCE = I32_MAX  # Int.MaxValue: sequences wrap to 0 after it
# Kafka's producer.id.expiration.ms default (KIP-854): one day without a write.
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 24 * 3_600_000
# Per partition; each entry is ~1 KiB in memory, so the default caps this at ~10 MiB.
DEFAULT_MAX_PRODUCER_IDS = 10_000
# Snapshot files kept per partition: the newest, plus older ones to fall back to if the
# newest turns out corrupt.
DEFAULT_MAX_SNAPSHOTS = 3
# Completed transactions remembered until the HW passes their marker. A replay (no HW known)
# completes every transaction in the log at once; beyond this many the oldest markers, which
# are the first to be replicated, are taken as replicated.
MAX_UNREPLICATED_TXNS = 10_000


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
    # First offset of the open transaction (-1: none open).
    current_txn_first_offset: int = -1
    # Coordinator epoch of the last marker (-1: none seen); an older one is fenced.
    coordinator_epoch: int = -1
    # Offset and type of the last COMMIT/ABORT marker (-1: none), to answer its retry.
    last_marker_offset: int = -1
    last_marker_commit: bool = False

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
            self.current_txn_first_offset,
            self.coordinator_epoch,
            self.last_marker_offset,
            self.last_marker_commit,
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


@dataclass(frozen=True, slots=True)
class MarkerCheck:
    """The leader's verdict on a transaction marker it is asked to write."""

    verdict: Verdict
    error: ErrorCode = ErrorCode.none
    message: str = ""
    # For Verdict.DUPLICATE: the offset of the marker already written.
    duplicate_offset: int = -1


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction a marker ended (Kafka's CompletedTxn). For an abort, the driver writes
    (producer_id, first_offset, last_offset, last_stable_offset) to the txn index."""

    producer_id: int
    first_offset: int
    last_offset: int  # the marker's offset
    # The LSO once this transaction is complete: the first offset of the oldest transaction
    # still open, or last_offset + 1. Readers stop scanning the txn index at an entry whose
    # LSO is at or past the end of their read: every later abort starts at or after it.
    last_stable_offset: int
    aborted: bool


class ProducerStateTable:
    """Producer id -> epoch and last batches, for one partition (sans-IO)."""

    def __init__(self, config: ProducerStateConfig | None = None) -> None:
        self.config = config or ProducerStateConfig()
        # Ordered by last update, oldest first: eviction at the bound takes the least
        # recently written producer, in O(1), and replay reproduces the same order.
        self._producers: OrderedDict[int, ProducerEntry] = OrderedDict()
        # Offset after the last batch this table has seen: its state covers [.., next_offset).
        self.next_offset = 0
        # producer id -> first offset of its open transaction, in increasing offset order
        # (transactions open at the log end, so insertion order is offset order).
        self._ongoing: dict[int, int] = {}
        # (first offset, marker offset) of completed transactions whose marker the HW may not
        # cover yet, in marker order; last_stable_offset drops those it does cover.
        self._unreplicated: deque[tuple[int, int]] = deque()

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

    # ------------------------------------------------------------------ transactions
    def first_undecided_offset(self) -> int | None:
        """First offset of the oldest open transaction (None: none is open)."""
        return next(iter(self._ongoing.values()), None)

    def ongoing_transactions(self) -> dict[int, int]:
        """producer id -> first offset of each open transaction, oldest first."""
        return dict(self._ongoing)

    def last_stable_offset(self, high_watermark: int) -> int:
        """Kafka's LSO: the first offset of the oldest transaction that is open or whose
        marker the HW does not cover yet, never above the HW. The HW only grows, so a marker
        it covered is forgotten here."""
        unreplicated = self._unreplicated
        while unreplicated and unreplicated[0][1] < high_watermark:
            unreplicated.popleft()
        stable = high_watermark
        first = self.first_undecided_offset()
        if first is not None:
            stable = min(stable, first)
        for first_offset, marker_offset in unreplicated:
            if marker_offset >= high_watermark:
                stable = min(stable, first_offset)
        return stable

    def check_marker(self, marker: TxnMarker) -> MarkerCheck:
        """Decide, before the leader writes `marker`, whether it may (see the docstring)."""
        entry = self._producers.get(marker.producer_id)
        if entry is None:
            return MarkerCheck(Verdict.OK)
        if marker.producer_epoch < entry.epoch:
            return MarkerCheck(
                Verdict.ERROR,
                ErrorCode.invalid_producer_epoch,
                f"marker of producer {marker.producer_id} has epoch {marker.producer_epoch}, "
                f"older than the current epoch {entry.epoch}",
            )
        if marker.coordinator_epoch < entry.coordinator_epoch:
            return MarkerCheck(
                Verdict.ERROR,
                ErrorCode.transaction_coordinator_fenced,
                f"marker of producer {marker.producer_id} has coordinator epoch "
                f"{marker.coordinator_epoch}, older than {entry.coordinator_epoch}",
            )
        if (
            entry.current_txn_first_offset < 0
            and entry.last_marker_offset >= 0
            and marker.producer_epoch == entry.epoch
            and marker.coordinator_epoch == entry.coordinator_epoch
            and marker.commit == entry.last_marker_commit
        ):
            return MarkerCheck(Verdict.DUPLICATE, duplicate_offset=entry.last_marker_offset)
        return MarkerCheck(Verdict.OK)

    def _open_txn(self, entry: ProducerEntry, offset: int) -> None:
        if entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = offset
            self._ongoing[entry.producer_id] = offset

    def _end_txn(
        self, entry: ProducerEntry, header: BatchHeader, marker: TxnMarker
    ) -> CompletedTxn:
        pid = entry.producer_id
        offset = header.base_offset
        # Kafka: a marker with no transaction open ends an empty one starting at itself.
        first = entry.current_txn_first_offset if entry.current_txn_first_offset >= 0 else offset
        self._ongoing.pop(pid, None)
        entry.current_txn_first_offset = -1
        entry.coordinator_epoch = max(entry.coordinator_epoch, marker.coordinator_epoch)
        entry.last_marker_offset = offset
        entry.last_marker_commit = marker.commit
        self._unreplicated.append((first, offset))
        if len(self._unreplicated) > MAX_UNREPLICATED_TXNS:
            self._unreplicated.popleft()
        next_open = self.first_undecided_offset()
        return CompletedTxn(
            pid,
            first,
            offset,
            offset + 1 if next_open is None else next_open,
            aborted=not marker.commit,
        )

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
            if entry is not None and entry.current_txn_first_offset >= 0:
                # Only the transaction's marker ends it (Kafka's ProducerAppendInfo): a plain
                # batch or one of a newer epoch would fence the producer here and leave the
                # transaction open for good (its marker then refused as stale).
                if not header.is_transactional:
                    return _error(
                        ErrorCode.invalid_txn_state,
                        f"producer {pid} has a transaction open; a non-transactional batch "
                        "cannot join it",
                    )
                if header.producer_epoch != entry.epoch:
                    return _error(
                        ErrorCode.invalid_txn_state,
                        f"producer {pid} has a transaction open at epoch {entry.epoch}; a "
                        f"batch of epoch {header.producer_epoch} cannot end or join it",
                    )
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
    def update(
        self,
        headers: Iterable[BatchHeader],
        markers: Mapping[int, TxnMarker] | None = None,
    ) -> list[CompletedTxn]:
        """Record appended batches; headers must carry their final base offsets, and
        `markers` the COMMIT/ABORT marker of each control batch by its base offset (a control
        batch without one is no transaction marker). Returns the transactions the markers
        ended, in offset order."""
        completed: list[CompletedTxn] = []
        for header in headers:
            if header.base_offset < self.next_offset:
                raise ValueError(
                    f"batch at offset {header.base_offset} is below the producer state's "
                    f"next offset {self.next_offset}: truncate or rebuild first"
                )
            self.next_offset = header.next_offset
            if header.producer_id < 0:
                continue
            marker = None if markers is None else markers.get(header.base_offset)
            done = self._apply(header, marker if header.is_control else None)
            if done is not None:
                completed.append(done)
        return completed

    def update_leader_append(
        self, batches: bytes | bytearray | memoryview, first_offset: int
    ) -> list[CompletedTxn]:
        """After `append_as_leader`: the request's batches with the offsets the log assigned
        (consecutively from AppendInfo.first_offset, as the log does)."""
        headers = list(_rebased(batches, first_offset))
        return self.update(headers, markers_of(batches, [h.base_offset for h in headers]))

    def update_follower_append(self, batches: bytes | bytearray | memoryview) -> list[CompletedTxn]:
        """After `append_as_follower`: the batches already carry the leader's offsets."""
        headers = [h for _, h in iter_batches(batches, check_crc=False)]
        return self.update(headers, markers_of(batches, [h.base_offset for h in headers]))

    def _apply(self, header: BatchHeader, marker: TxnMarker | None) -> CompletedTxn | None:
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
        if header.is_control:
            return None if marker is None else self._end_txn(entry, header, marker)
        if header.is_transactional:
            self._open_txn(entry, header.base_offset)
        if header.base_sequence < 0:
            return None
        entry.batches.append(
            BatchMetadata(
                header.base_sequence,
                last_sequence(header),
                header.base_offset,
                header.last_offset,
                header.max_timestamp_ms,
            )
        )
        return None

    def _evict_over_bound(self) -> None:
        excess = len(self._producers) - self.config.max_producer_ids
        if excess <= 0:
            return
        # Least recently written first; a producer with an open transaction stays (the
        # coordinator ends every transaction within its timeout, which bounds them).
        doomed = [pid for pid, e in self._producers.items() if e.current_txn_first_offset < 0][
            :excess
        ]
        for pid in doomed:
            entry = self._producers.pop(pid)
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
            if now_ms - entry.last_timestamp_ms >= limit_ms and entry.current_txn_first_offset < 0
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
        # No marker at or after `offset` (it changed its producer's entry), so no
        # unreplicated transaction ends there.
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
            if not -1 <= entry.current_txn_first_offset < max(next_offset, 0):
                raise ValueError(
                    f"producer {entry.producer_id}: transaction first offset "
                    f"{entry.current_txn_first_offset} outside the table's [0, {next_offset})"
                )
            table._producers[entry.producer_id] = entry
        open_txns = [e for e in table._producers.values() if e.current_txn_first_offset >= 0]
        for entry in sorted(open_txns, key=lambda e: e.current_txn_first_offset):
            table._ongoing[entry.producer_id] = entry.current_txn_first_offset
        table._evict_over_bound()
        return table


def _error(code: ErrorCode, message: str) -> ProduceCheck:
    return ProduceCheck(Verdict.ERROR, code, message)


def markers_of(
    batches: bytes | bytearray | memoryview, offsets: list[int]
) -> dict[int, TxnMarker] | None:
    """The COMMIT/ABORT markers among `batches`, by the base offset each batch has in the log
    (`offsets`, one per batch). A control batch that is no well-formed marker is logged and
    left out: replicas and replay store what the leader stored, and only the leader checks."""
    markers: dict[int, TxnMarker] | None = None
    for (pos, header), offset in zip(iter_batches(batches, check_crc=False), offsets, strict=True):
        if not header.is_control:
            continue
        try:
            marker = parse_txn_marker(batches, pos)
        except CorruptRecordError as exc:
            log.warning("control batch at offset %d is no transaction marker: %s", offset, exc)
            continue
        if marker is not None:
            markers = markers or {}
            markers[offset] = marker
    return markers


def _rebased(batches: bytes | bytearray | memoryview, first_offset: int) -> Iterator[BatchHeader]:
    next_offset = first_offset
    for _, header in iter_batches(batches, check_crc=False):
        yield header._replace(base_offset=next_offset)
        next_offset += header.last_offset_delta + 1
