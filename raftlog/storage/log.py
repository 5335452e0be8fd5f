"""PartitionLog: one partition's segments, offsets, epoch cache and checkpoints.

Appends are synchronous page-cache writes on the event loop (like Kafka's); durability is the
flusher's job (storage/flusher.py), which fsyncs off the loop and advances `flushed_offset`.
Reads return file regions for os.sendfile and never decode records.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from raftlog.batch_validation import ValidatedBatches
from raftlog.constants import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from raftlog.errors import CorruptRecordError, ErrorCode, KafkaError
from raftlog.records import (
    OFFSET_LENGTH_EPOCH_BYTES,
    BatchHeader,
    iter_records,
    offset_and_epoch_prefix,
    validate_batch,
)
from raftlog.storage.checkpoint import fsync_dir, write_checkpoint
from raftlog.storage.config import LogConfig
from raftlog.storage.log_types import (
    AppendInfo,
    FlushTicket,
    LogOfflineError,
    OffsetOutOfRangeError,
    ReadResult,
    RecordTooLargeError,
    UnexpectedAppendOffsetError,
    UnverifiedRead,
)
from raftlog.storage.recovery import (
    EPOCH_FILE,
    LOG_START_FILE,
    RECOVERY_POINT_FILE,
    TXN_INDEX_SEGMENTS_KEY,
    RecoveredLog,
    recover_log,
)
from raftlog.storage.segment import LogSegment
from raftlog.storage.txn_index import AbortedTxn, TxnIndex

log = logging.getLogger("raftlog.storage")


class PartitionLog:
    def __init__(self, directory: Path, config: LogConfig, recovered: RecoveredLog) -> None:
        """A log over what recovery found; open() is how a log is made."""
        self.directory = directory
        self.config = config
        self.segments: list[LogSegment] = list(recovered.segments)
        self.epoch_cache = recovered.epoch_cache
        self._log_start = recovered.log_start_offset
        self._leo = recovered.log_end_offset
        # Recovery fsynced everything it returned.
        self._flushed = recovered.log_end_offset
        self._recovery_point = 0
        # Bumped by truncation: a flush or checkpoint prepared before it must not count.
        self._generation = 0
        # Serialises checkpoint writes between the flusher's worker thread and truncation.
        self._checkpoint_lock = threading.Lock()
        self._dirty_segments: list[LogSegment] = []
        # Txn indexes appended to since the last flush ticket (fsynced with the segments).
        self._dirty_txn_indexes: list[TxnIndex] = []
        self._directory_dirty = False
        self._checkpoint_due = False
        self.closed = False
        # [from, to): offsets the scrubber found damaged in this log and that reads refuse
        # with KAFKA_STORAGE_ERROR until a truncation removes them (a leader's damage).
        self.damaged_range: tuple[int, int] | None = None
        # Why the log went offline after a disk error (None: online). Set once, never cleared:
        # after a failed write or fsync the page cache and the disk may disagree, so only a
        # restart (recovery from what is on disk) brings the log back.
        self.offline_reason: str | None = None
        # This replica lost records it may have acknowledged (recovery cut below the recovery
        # point, or a damaged batch was cut out): it must not lead, nor count as in sync,
        # until it has fetched back everything the leader committed (the fetcher clears it).
        self.lost_data = recovered.lost_data
        # Why compaction stopped for this log (None: it runs): a batch the cleaner could not
        # read. Cleared by a restart, which rereads the log from disk.
        self.uncleanable_reason: str | None = None

    # ------------------------------------------------------------------ properties
    @property
    def log_start_offset(self) -> int:
        return self._log_start

    @property
    def log_end_offset(self) -> int:
        return self._leo

    @property
    def flushed_offset(self) -> int:
        return self._flushed

    @property
    def generation(self) -> int:
        """Bumped by every truncation: work prepared against the old log must not count."""
        return self._generation

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments)

    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self.directory.name}, start={self._log_start}, leo={self._leo}, "
            f"flushed={self._flushed}, segments={len(self.segments)})"
        )

    # ------------------------------------------------------------------ open / recover
    @classmethod
    def open(cls, directory: Path, config: LogConfig, *, now_ms: int) -> PartitionLog:
        """Create or recover the log in `directory` (blocking: run in a worker thread)."""
        directory = Path(directory)
        plog = cls(directory, config, recover_log(directory, config, now_ms=now_ms))
        plog._write_checkpoints_now()  # the recovery point at the recovered, durable end
        return plog

    # ------------------------------------------------------------------ append
    def _validate(
        self, buf: bytes | bytearray | memoryview, *, as_leader: bool
    ) -> list[tuple[int, BatchHeader]]:
        if not buf:
            raise CorruptRecordError("append of zero bytes: no record batch")
        headers = []
        pos = 0
        while pos < len(buf):
            header = validate_batch(buf, pos)
            if as_leader:
                self._check_leader_batch(pos, header)
            headers.append((pos, header))
            pos += header.size_bytes
        return headers

    def _check_leader_batch(self, pos: int, header: BatchHeader) -> None:
        if header.size_bytes > self.config.max_message_bytes:
            raise RecordTooLargeError(
                f"batch at byte {pos} is {header.size_bytes} bytes, above "
                f"max.message.bytes {self.config.max_message_bytes}"
            )
        if header.record_count < 1 or header.last_offset_delta != header.record_count - 1:
            raise CorruptRecordError(
                f"batch at byte {pos} has recordCount {header.record_count} and "
                f"lastOffsetDelta {header.last_offset_delta}; a produced batch must "
                f"have consecutive offsets"
            )

    def append_as_leader(
        self,
        batches: bytes | bytearray | memoryview | ValidatedBatches,
        leader_epoch: int,
        now_ms: int,
    ) -> AppendInfo:
        """Validate, assign offsets and the leader epoch, write. All or nothing.

        ValidatedBatches (a produce request's data) had their CRCs and records checked by
        the produce path: only the header checks that depend on this log's config run again
        (it may have changed since). Each batch is written as a new 16-byte prefix (offset,
        length, epoch) and the batch's own bytes after it, in one writev: the request's
        bytes are never copied to set the offset in place.
        """
        self._check_open()
        if isinstance(batches, ValidatedBatches):
            data: bytes | bytearray | memoryview = batches.data
            headers = batches.headers
            if not headers:
                raise CorruptRecordError("append of zero bytes: no record batch")
            expected_pos = 0
            for pos, header in headers:
                # The headers must tile the data back to back: a gap or an overlap would
                # write bytes no check covered (a caller's bug, refused before any write).
                if pos != expected_pos:
                    raise CorruptRecordError(f"validated batch at {pos}, expected {expected_pos}")
                expected_pos = pos + header.size_bytes
                self._check_leader_batch(pos, header)
            if expected_pos != len(data):
                raise CorruptRecordError(
                    f"validated batches cover {expected_pos} of {len(data)} bytes"
                )
        else:
            data = batches
            headers = self._validate(data, as_leader=True)
        view = memoryview(data)
        next_offset = self._leo
        assigned = []
        pieces: list[bytes | memoryview] = []
        for pos, header in headers:
            pieces.append(offset_and_epoch_prefix(header, next_offset, leader_epoch))
            pieces.append(view[pos + OFFSET_LENGTH_EPOCH_BYTES : pos + header.size_bytes])
            assigned.append(
                (pos, header._replace(base_offset=next_offset, partition_leader_epoch=leader_epoch))
            )
            next_offset += header.last_offset_delta + 1
        info = self._write(pieces, len(data), assigned, now_ms)
        if self.epoch_cache.assign(leader_epoch, info.first_offset):
            self._checkpoint_due = True
        return info

    def append_as_follower(
        self,
        batches: bytes | bytearray | memoryview,
        now_ms: int | None = None,
        *,
        max_leader_epoch: int | None = None,
    ) -> AppendInfo:
        """Append batches whose offsets and epochs the leader set; must continue at LEO.

        Every batch's CRC is checked before anything is written (a byte damaged on the
        leader's disk or on the way is never stored). baseOffset and partitionLeaderEpoch are
        outside the CRC, so they get sanity checks instead: offsets continue the log, and with
        `max_leader_epoch` (the epoch of the leader we fetch from) epochs never go back and
        never pass that leader's own epoch. The bytes are written as they came (no copy): the
        caller must not change them during the call.
        """
        self._check_open()
        headers = self._validate(batches, as_leader=False)
        expected = self._leo
        previous_epoch = self.epoch_cache.latest_epoch()
        for pos, header in headers:
            if max_leader_epoch is not None and not (
                max(previous_epoch, 0) <= header.partition_leader_epoch <= max_leader_epoch
            ):
                raise CorruptRecordError(
                    f"follower append: batch at byte {pos} has leader epoch "
                    f"{header.partition_leader_epoch}, outside [{max(previous_epoch, 0)}, "
                    f"{max_leader_epoch}]"
                )
            previous_epoch = header.partition_leader_epoch
            # Gaps are legitimate only in compacted logs (the leader's cleaner removed
            # whole batches); anywhere else they mean a lost or misplaced write.
            ok = header.base_offset == expected or (
                self.config.compact and header.base_offset > expected
            )
            if not ok:
                raise UnexpectedAppendOffsetError(
                    f"follower append: batch at byte {pos} has base offset "
                    f"{header.base_offset}, the log expects {expected} (LEO {self._leo})"
                )
            expected = header.next_offset
        info = self._write(
            [batches],
            len(batches),
            headers,
            int(time.time() * 1000) if now_ms is None else now_ms,
        )
        for _, header in headers:
            if self.epoch_cache.assign(header.partition_leader_epoch, header.base_offset):
                self._checkpoint_due = True
        return info

    def _write(
        self,
        pieces: Sequence[bytes | bytearray | memoryview],
        size_bytes: int,
        headers: list[tuple[int, BatchHeader]],
        now_ms: int,
    ) -> AppendInfo:
        first = headers[0][1]
        last = headers[-1][1]
        try:
            segment = self._maybe_roll(size_bytes, first.base_offset, last.last_offset, now_ms)
            segment.append_pieces(pieces, size_bytes, headers, now_ms)
        except OSError as exc:
            # Part of the batches may be in the file beyond the LEO: nothing may be written
            # after them. Recovery at the next start cuts them.
            self.mark_offline(f"append failed: {exc}")
            raise LogOfflineError() from exc
        if not self._dirty_segments or self._dirty_segments[-1] is not segment:
            self._dirty_segments.append(segment)
        self._leo = last.next_offset
        max_ts, max_ts_offset = -1, first.base_offset
        for _, header in headers:
            if header.max_timestamp_ms > max_ts:
                max_ts, max_ts_offset = header.max_timestamp_ms, header.base_offset
        return AppendInfo(
            first_offset=first.base_offset,
            last_offset=last.last_offset,
            max_timestamp_ms=max_ts,
            offset_of_max_timestamp=max_ts_offset,
            log_start_offset=self._log_start,
            batch_count=len(headers),
            size_bytes=size_bytes,
        )

    def _maybe_roll(
        self, size_bytes: int, first_offset: int, last_offset: int, now_ms: int
    ) -> LogSegment:
        active = self.segments[-1]
        if active.size_bytes == 0:
            if active.base_offset != first_offset and first_offset > active.base_offset:
                return self._roll(first_offset)  # compacted follower gap: keep base = offset
            return active
        too_big = active.size_bytes + size_bytes > self.config.segment_bytes
        too_old = (
            active.created_ms is not None and now_ms - active.created_ms >= self.config.segment_ms
        )
        if too_big or too_old or not active.fits_relative(last_offset):
            return self._roll(first_offset)
        return active

    def _roll(self, base_offset: int) -> LogSegment:
        old = self.segments[-1]
        old.seal()
        if old.size_bytes == 0:
            old.close()
            old.delete()
            self.segments.pop()
            self._dirty_segments = [s for s in self._dirty_segments if s is not old]
        segment = LogSegment(self.directory, base_offset, self.config.index_interval_bytes)
        self.segments.append(segment)
        self._directory_dirty = True
        self._checkpoint_due = True  # the recovery point may now pass a whole segment
        return segment

    def roll(self) -> None:
        """Start a new active segment at LEO (no-op if the active one is empty)."""
        if self.segments[-1].size_bytes:
            self._roll(self._leo)

    # ------------------------------------------------------------------ read
    def _segment_index(self, offset: int) -> int:
        bases = [s.base_offset for s in self.segments]
        return max(0, bisect.bisect_right(bases, offset) - 1)

    def read(
        self,
        start_offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> ReadResult:
        """Regions of whole batches from the one holding start_offset, below max_offset."""
        self._check_open()
        if start_offset < self._log_start or start_offset > self._leo:
            raise OffsetOutOfRangeError(
                f"offset {start_offset} is outside [{self._log_start}, {self._leo}] "
                f"of {self.directory.name}"
            )
        limit = self._leo if max_offset is None else min(max_offset, self._leo)
        if self.damaged_range is not None:
            damaged_from, damaged_to = self.damaged_range
            if damaged_from <= start_offset < damaged_to:
                raise KafkaError(
                    ErrorCode.kafka_storage_error,
                    f"offset {start_offset} of {self.directory.name} is in a damaged range",
                )
            if start_offset < damaged_from:
                limit = min(limit, damaged_from)
        empty = ReadResult([], self._log_start, self._leo)
        i = self._segment_index(start_offset)
        while i < len(self.segments) and start_offset < limit:
            segment = self.segments[i]
            if segment.base_offset >= limit:
                break
            position = segment.locate(start_offset)
            if position is None:
                i += 1
                continue
            end, next_offset = segment.end_position(position, limit, position + max(0, max_bytes))
            if end == position:
                header = segment.header_at(position)
                if not min_one_batch or header.last_offset >= limit:
                    return empty
                end = position + header.size_bytes  # KIP-74: one batch even if too big
                next_offset = header.next_offset
            unverified = None
            if segment.needs_verify(position, end):
                unverified = UnverifiedRead(
                    segment,
                    position,
                    end,
                    segment.header_at(position).base_offset,
                    allow_gaps=self.config.compact,
                )
            return ReadResult(
                [segment.region(position, end)],
                self._log_start,
                self._leo,
                end - position,
                next_offset,
                unverified,
            )
        return empty

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """First (offset, timestamp) whose timestamp >= timestamp_ms (ListOffsets)."""
        self._check_open()
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return self._log_start, -1
        if timestamp_ms == LATEST_TIMESTAMP:
            return self._leo, -1
        for segment in self.segments:
            if segment.max_timestamp_ms < timestamp_ms:
                continue
            start = max(segment.time_index.lookup(timestamp_ms), self._log_start)
            position = segment.locate(start)
            if position is None:
                continue
            for pos, header in segment.headers_from(position):
                if header.max_timestamp_ms < timestamp_ms:
                    continue
                data = segment.read_range(pos, pos + header.size_bytes)
                for record in iter_records(data):
                    ts = record.timestamp_ms if record.timestamp_ms is not None else -1
                    if ts >= timestamp_ms and record.offset >= self._log_start:
                        return record.offset, ts
        return None

    def max_timestamp_record(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record holding the log's largest timestamp
        (ListOffsets MAX_TIMESTAMP, KIP-734); None for a log without timestamps.

        Segments remember only the batch that holds their max timestamp; as Kafka does, the
        answer is the exact record inside that batch, which costs one batch read. A batch
        whose header claims a max no record holds answers its first offset."""
        self._check_open()
        segments = [s for s in self.segments if s.size_bytes and s.max_timestamp_ms >= 0]
        if not segments:
            return None
        # max() keeps the first of equals: the earliest segment holding the max.
        segment = max(segments, key=lambda s: s.max_timestamp_ms)
        max_ts = segment.max_timestamp_ms
        batch_offset = segment.offset_of_max_timestamp
        position = segment.locate(batch_offset)
        if position is None:
            return batch_offset, max_ts
        for pos, header in segment.headers_from(position):
            if header.max_timestamp_ms != max_ts:
                continue
            data = segment.read_range(pos, pos + header.size_bytes)
            for record in iter_records(data):
                if record.timestamp_ms == max_ts:
                    return record.offset, max_ts
            return header.base_offset, max_ts
        return batch_offset, max_ts

    # ------------------------------------------------------------------ transactions
    def append_aborted_txns(self, entries: list[AbortedTxn]) -> None:
        """Index aborted transactions whose ABORT markers were just appended (the driver calls
        it right after the append, on the event loop, from the producer table's answer); the
        next flush fsyncs them with the segment."""
        if not entries:
            return
        self._check_open()
        for entry in entries:
            if not self._log_start <= entry.last_offset < self._leo:
                raise ValueError(
                    f"{self.directory.name}: aborted transaction marker at {entry.last_offset} "
                    f"is outside the log [{self._log_start}, {self._leo})"
                )
            segment = self.segments[self._segment_index(entry.last_offset)]
            try:
                if segment.txn_index.append(entry):
                    self._directory_dirty = True  # a new file: its name must be durable too
            except OSError as exc:
                self.mark_offline(f"txn index append failed: {exc}")
                raise LogOfflineError() from exc
            if segment.txn_index not in self._dirty_txn_indexes:
                self._dirty_txn_indexes.append(segment.txn_index)

    def collect_aborted_txns(self, fetch_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping [fetch_offset, upper_offset), oldest marker
        first (a read_committed fetch answers them with its records)."""
        self._check_open()
        found: list[AbortedTxn] = []
        if upper_offset <= fetch_offset:
            return found
        for segment in self.segments[self._segment_index(fetch_offset) :]:
            if segment.txn_index.collect(fetch_offset, upper_offset, found):
                break
        return found

    # ------------------------------------------------------------------ damage
    def mark_damaged(self, offset: int) -> None:
        """The batch holding `offset` failed verification: refuse reads from it to the
        current end (nothing past a damaged batch can be located reliably) until a
        truncation at or below `offset` removes it."""
        if self.damaged_range is not None:
            offset = min(offset, self.damaged_range[0])
        self.damaged_range = (offset, max(self._leo, offset + 1))

    def _clear_damage_from(self, offset: int) -> None:
        if self.damaged_range is not None and offset <= self.damaged_range[0]:
            self.damaged_range = None

    # ------------------------------------------------------------------ truncation
    def truncate_to(self, offset: int) -> None:
        """Drop offsets >= offset (whole batches: a batch holding `offset` goes entirely)."""
        self._check_open()
        if offset >= self._leo:
            return
        if offset <= self._log_start:
            self.truncate_fully_and_start_at(offset)
            return
        while len(self.segments) > 1 and self.segments[-1].base_offset >= offset:
            # delete() without close(): a reader's FileRegion keeps the old file readable
            self.segments.pop().delete()
        segment = self.segments[-1]
        segment.truncate_to(offset)
        self._dirty_segments = [s for s in self._dirty_segments if s in self.segments]
        old_leo = self._leo
        self._leo = segment.next_offset
        self._clear_damage_from(self._leo)
        self.epoch_cache.truncate_from_end(self._leo)
        self._after_truncation()
        log.info("%s: truncated from %d to %d", self.directory.name, old_leo, self._leo)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Empty the log; the next offset appended is `offset`."""
        self._check_open()
        for segment in self.segments:
            segment.delete()
        self.segments = [LogSegment(self.directory, offset, self.config.index_interval_bytes)]
        self._dirty_segments = []
        self._log_start = self._leo = offset
        self.damaged_range = None
        self.epoch_cache.clear()
        self._after_truncation()
        fsync_dir(self.directory)

    def _after_truncation(self) -> None:
        # Truncation is rare and must be durable before anything is appended on top of it:
        # a stale recovery point would make recovery trust bytes written after this cut.
        with self._checkpoint_lock:
            self._generation += 1
            self._flushed = min(self._flushed, self._leo)
            self._recovery_point = min(self._recovery_point, self._leo)
            try:
                self._write_checkpoints_locked(self._checkpoint_payloads(self._recovery_point))
            except OSError as exc:
                # The files on disk still describe the uncut log: anything appended on top
                # could be trusted by recovery below a stale recovery point. Stop here.
                self.mark_offline(f"checkpoint after truncation failed: {exc}")
                raise LogOfflineError() from exc

    def advance_log_start(self, offset: int) -> int:
        """Move the log start up to `offset`, deleting whole segments below it.

        Returns the number of segments deleted. The active segment is never deleted while it
        holds data at or after `offset`.
        """
        self._check_open()
        if offset <= self._log_start:
            return 0
        if offset > self._leo:
            raise OffsetOutOfRangeError(
                f"cannot start the log at {offset}, beyond its end {self._leo}"
            )
        if offset == self._leo and self.segments[-1].size_bytes:
            self._roll(self._leo)
        deleted = 0
        while len(self.segments) > 1 and self.segments[1].base_offset <= offset:
            segment = self.segments.pop(0)
            segment.delete()  # the handle closes when the last reader drops its region
            deleted += 1
        self._dirty_segments = [s for s in self._dirty_segments if s in self.segments]
        self._log_start = offset
        self.epoch_cache.truncate_from_start(offset)
        self._checkpoint_due = True
        return deleted

    # ------------------------------------------------------------------ epochs
    def latest_epoch(self) -> int:
        return self.epoch_cache.latest_epoch()

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.epoch_cache.end_offset_for_epoch(epoch, self._leo)

    # ------------------------------------------------------------------ durability
    @property
    def checkpoint_due(self) -> bool:
        return self._checkpoint_due

    def checkpoint_recovery_point_soon(self) -> bool:
        """Have the next flush round persist the recovery point at what it fsyncs, when data
        was fsynced past the recorded one. Recovery can tell data it lost (below the recovery
        point: acknowledged) from a torn tail only up to the recorded point, so it should not
        lag far behind (Kafka's log.flush.offset.checkpoint.interval.ms)."""
        if self.closed or self.offline_reason is not None or self._flushed <= self._recovery_point:
            return False
        self._checkpoint_due = True
        return True

    def needs_flush(self) -> bool:
        return self._flushed < self._leo or self._checkpoint_due or self._directory_dirty

    def prepare_flush(self) -> FlushTicket:
        """Snapshot what one fsync must cover (called on the event loop by the flusher).

        File descriptors are duplicated so a segment closed meanwhile (retention, truncation)
        cannot have its descriptor number reused under the worker thread's fsync.
        """
        fds = [os.dup(s.file.fileno()) for s in self._dirty_segments]
        self._dirty_segments = []
        for txn_index in self._dirty_txn_indexes:
            fd = txn_index.dup_dirty_fd()
            if fd is not None:
                fds.append(fd)
        self._dirty_txn_indexes = []
        ticket = FlushTicket(self._leo, fds, self._directory_dirty, self._generation)
        self._directory_dirty = False
        if self._checkpoint_due:
            ticket.checkpoints = self._checkpoint_payloads(self._leo)
            self._checkpoint_due = False
        return ticket

    def run_flush(self, ticket: FlushTicket) -> None:
        """The blocking half of a flush (worker thread): fsync, then checkpoints."""
        try:
            for fd in ticket.fds:
                os.fdatasync(fd)
            if ticket.fsync_directory:
                fsync_dir(self.directory)
            if ticket.checkpoints:
                with self._checkpoint_lock:
                    if ticket.generation == self._generation:
                        self._write_checkpoints_locked(ticket.checkpoints)
        except OSError as exc:
            # A failed fsync may have dropped dirty pages (Linux marks them clean): what the
            # page cache shows can no longer be trusted to be on disk.
            self.mark_offline(f"flush failed: {exc}")
            raise
        finally:
            for fd in ticket.fds:
                os.close(fd)

    def complete_flush(self, ticket: FlushTicket) -> None:
        """Back on the event loop: advance flushed_offset unless a truncation intervened."""
        if ticket.generation != self._generation:
            self._checkpoint_due = self._checkpoint_due or bool(ticket.checkpoints)
            return
        if ticket.target_offset > self._flushed:
            self._flushed = min(ticket.target_offset, self._leo)
        if ticket.checkpoints:
            self._recovery_point = max(self._recovery_point, ticket.target_offset)

    def flush_now(self) -> None:
        """Synchronous flush of everything (close, tests, tools)."""
        ticket = self.prepare_flush()
        ticket.checkpoints = self._checkpoint_payloads(ticket.target_offset)
        self.run_flush(ticket)
        self.complete_flush(ticket)

    def _checkpoint_payloads(self, recovery_point: int) -> dict[str, dict[str, object]]:
        recovery: dict[str, object] = {"recovery_point": recovery_point}
        # The segments whose .txnindex must exist (recovery rebuilds when one is missing);
        # written only when there are any, so a log without transactions keeps its bytes.
        indexed = [s.base_offset for s in self.segments if s.txn_index.entries]
        if indexed:
            recovery[TXN_INDEX_SEGMENTS_KEY] = indexed
        return {
            EPOCH_FILE: self.epoch_cache.to_payload(),
            LOG_START_FILE: {"log_start_offset": self._log_start},
            RECOVERY_POINT_FILE: recovery,
        }

    def _write_checkpoints_locked(self, payloads: dict[str, dict[str, object]]) -> None:
        # Epochs and log start first: the recovery point must never cover data whose epoch
        # entries are not on disk yet.
        for name in (EPOCH_FILE, LOG_START_FILE, RECOVERY_POINT_FILE):
            if name in payloads:
                write_checkpoint(self.directory / name, name.split(".")[0], payloads[name])

    def _write_checkpoints_now(self) -> None:
        with self._checkpoint_lock:
            self._recovery_point = self._flushed
            self._write_checkpoints_locked(self._checkpoint_payloads(self._flushed))

    # ------------------------------------------------------------------ lifecycle
    def update_config(self, config: LogConfig) -> None:
        self.config = config

    def _check_open(self) -> None:
        if self.closed:
            raise KafkaError(ErrorCode.kafka_storage_error, f"{self.directory.name} is closed")
        if self.offline_reason is not None:
            raise LogOfflineError()

    @property
    def offline(self) -> bool:
        return self.offline_reason is not None

    @property
    def unsafe_to_lead(self) -> bool:
        """This copy may lack or damage acknowledged records (KIP-966's unclean replica)."""
        return self.lost_data or self.damaged_range is not None or self.offline

    def mark_offline(self, reason: str) -> None:
        """Stop using the log after a disk error; logged once (also from a worker thread)."""
        if self.offline_reason is None:
            self.offline_reason = reason
            log.error(
                "%s: log directory failed (%s); the partition is offline on this node until "
                "it restarts with the disk repaired",
                self.directory.name,
                reason,
            )

    def close(self) -> None:
        """Flush everything, write a recovery point at LEO, close files (blocking).

        An offline log is only closed: no fsync, no checkpoint may claim what the failed disk
        holds; recovery at the next start reads it."""
        if self.closed:
            return
        if self.offline_reason is not None:
            self.abandon()
            return
        self.segments[-1].seal()
        for segment in self.segments:
            segment.fsync()
        self._flushed = self._leo
        self._write_checkpoints_now()
        for segment in self.segments:
            segment.close()
        self.closed = True

    def abandon(self) -> None:
        """Stop using the log without flushing it: its directory is about to be removed
        (deleted topic, stray log). Cheap enough for the event loop (no fsync). A flush already
        running in a worker thread skips its checkpoint writes (the generation moved on)."""
        if self.closed:
            return
        self._generation += 1
        for segment in self.segments:
            segment.close()
        self._dirty_segments = []
        self.closed = True

    def move_directory(self, target: Path) -> None:
        """Rename the abandoned log's directory to `target` (blocking; the caller fsyncs the
        parent). Under the checkpoint lock: a flush writing checkpoints into the old path
        finishes first, so none lands in a directory re-created under the old name later."""
        if not self.closed:
            raise RuntimeError(f"{self.directory.name}: abandon() the log before moving it")
        with self._checkpoint_lock:
            os.replace(self.directory, target)
