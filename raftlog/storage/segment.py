"""One log segment: `<base>.log` holding whole batches, plus its sparse indexes and its
aborted transactions index (`<base>.txnindex`, from its first abort; recovery.py loads it)."""

from __future__ import annotations

import io
import logging
import os
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from raftlog.codec import I32_MAX
from raftlog.errors import CorruptRecordError
from raftlog.records import (
    HEADER_SIZE_BYTES,
    HEADER_STRUCT,
    LOG_OVERHEAD_BYTES,
    MAGIC_V2,
    BatchHeader,
    batch_size_at,
    validate_batch,
)
from raftlog.storage.index import IndexMismatch, OffsetIndex, TimeIndex
from raftlog.storage.txn_index import TXN_INDEX_SUFFIX, TxnIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
CLEANED_SUFFIX = ".cleaned"
# Recovery reads the log in chunks this big: large enough to amortise syscalls, small enough
# that recovering many partitions at once stays within memory.
RECOVERY_CHUNK_BYTES = 8 * 1024 * 1024
# Relative offsets are u32 in the index; roll well before that.
MAX_RELATIVE_OFFSET = I32_MAX

log = logging.getLogger("raftlog.storage")


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


@dataclass(frozen=True, slots=True)
class FileRegion:
    """`length_bytes` bytes of an open file at `position`: record batches on disk, sent to the
    socket with os.sendfile without passing through Python.

    The region holds the file object, so a segment deleted by retention before the region is
    sent keeps its file readable and its descriptor number cannot be reused meanwhile.
    """

    file: io.FileIO
    position: int
    length_bytes: int

    @property
    def fd(self) -> int:
        return self.file.fileno()

    def read_bytes(self) -> bytes:
        """Blocking read of the whole region (the path without sendfile; a worker thread)."""
        data = os.pread(self.file.fileno(), self.length_bytes, self.position)
        if len(data) != self.length_bytes:
            raise OSError(
                f"file region shrank: wanted {self.length_bytes} bytes at {self.position}, "
                f"got {len(data)}"
            )
        return data


# At most this many buffers go to one writev (Linux's IOV_MAX).
WRITEV_MAX_PIECES = 1024


def write_all(fd: int, pieces: Sequence[bytes | bytearray | memoryview]) -> int:
    """Write the pieces in order, as writev calls of at most WRITEV_MAX_PIECES buffers,
    resuming after a short write; returns the bytes written."""
    views = [memoryview(piece) for piece in pieces if len(piece)]
    total = 0
    i = 0
    while i < len(views):
        batch = views[i : i + WRITEV_MAX_PIECES]
        written = os.write(fd, batch[0]) if len(batch) == 1 else os.writev(fd, batch)
        if written <= 0:
            raise OSError(f"writev wrote {written} bytes")
        total += written
        while i < len(views) and written >= views[i].nbytes:
            written -= views[i].nbytes
            i += 1
        if written:
            views[i] = views[i][written:]
    return total


class LogSegment:
    def __init__(self, directory: Path, base_offset: int, index_interval_bytes: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        name = segment_name(base_offset)
        self.log_path = directory / (name + LOG_SUFFIX)
        self.index = OffsetIndex(directory / (name + INDEX_SUFFIX), base_offset)
        self.time_index = TimeIndex(directory / (name + TIME_INDEX_SUFFIX), base_offset)
        self.txn_index = TxnIndex(directory / (name + TXN_INDEX_SUFFIX), base_offset)
        exists = self.log_path.exists()
        # One unbuffered handle: writes go to the end, every read uses explicit positions
        # (pread/sendfile), so sharing it is safe. Readers hold a reference via FileRegion, so
        # a segment deleted by retention stays readable until its last region is dropped.
        self.file: io.FileIO = io.FileIO(self.log_path, "r+" if exists else "w+")
        self.size_bytes = os.fstat(self.file.fileno()).st_size
        self.file.seek(self.size_bytes)
        self.next_offset = base_offset
        self.max_timestamp_ms = -1
        self.offset_of_max_timestamp = base_offset
        self.first_batch_timestamp_ms: int | None = None
        self.created_ms: int | None = None
        self._bytes_since_index_entry = 0
        # [from, to): bytes this process took on trust when it opened the segment (below the
        # recovery point, so recovery did not scan them) and has not verified since. A byte
        # may have flipped there while the node was down: reads check these batches' CRCs
        # before serving them (`needs_verify`), and the scrubber and those reads shrink the
        # range from below as they verify it. Bytes appended or scanned here are verified.
        self.unverified_from = 0
        self.unverified_to = 0

    # ------------------------------------------------------------------ verification
    def needs_verify(self, start: int, end: int) -> bool:
        """Whether any byte of [start, end) is one this process has not verified."""
        return start < self.unverified_to and end > self.unverified_from

    def mark_verified(self, start: int, end: int) -> None:
        """[start, end) was read and every batch in it checked. Verification moves forward
        (the scrubber's passes and consumers' reads both do), so the unverified range shrinks
        from its lower end; a range verified above it is simply verified again later."""
        if start <= self.unverified_from < end:
            self.unverified_from = min(end, self.unverified_to)
        if self.unverified_from >= self.unverified_to:
            self.unverified_from = self.unverified_to = 0

    # ------------------------------------------------------------------ reading
    def header_at(self, position: int) -> BatchHeader:
        data = os.pread(self.file.fileno(), HEADER_SIZE_BYTES, position)
        if len(data) < HEADER_SIZE_BYTES:
            raise CorruptRecordError(f"{self.log_path}: short header read at byte {position}")
        return BatchHeader._make(HEADER_STRUCT.unpack(data))

    def headers_from(self, position: int) -> Iterator[tuple[int, BatchHeader]]:
        while position < self.size_bytes:
            header = self.header_at(position)
            yield position, header
            position += header.size_bytes

    def locate(self, offset: int) -> int | None:
        """Position of the first batch whose last offset is >= `offset` (None: none here)."""
        _, position = self.index.lookup(offset)
        for pos, header in self.headers_from(position):
            if header.last_offset >= offset:
                return pos
        return None

    def end_position(
        self, start_position: int, offset_limit: int, position_limit: int
    ) -> tuple[int, int]:
        """End of the run of whole batches from start_position that stay below both limits,
        and the offset a reader continues from there."""
        entry_offset, indexed = self.index.entry_before(offset_limit, position_limit)
        position = start_position
        next_offset = -1
        if indexed > start_position:
            # Batches before an index entry end below its offset and position: skip them.
            position, next_offset = indexed, entry_offset
        for pos, header in self.headers_from(position):
            if header.last_offset >= offset_limit or pos + header.size_bytes > position_limit:
                return pos, header.base_offset
            position, next_offset = pos + header.size_bytes, header.next_offset
        return position, next_offset

    def read_range(self, start: int, end: int) -> bytes:
        return os.pread(self.file.fileno(), end - start, start)

    def region(self, start: int, end: int) -> FileRegion:
        return FileRegion(self.file, start, end - start)

    # ------------------------------------------------------------------ writing
    def append(
        self,
        data: bytes | bytearray | memoryview,
        batches: list[tuple[int, BatchHeader]],
        now_ms: int,
    ) -> None:
        """Write whole batches; `batches` are (position in data, header) of each."""
        self.append_pieces([data], len(data), batches, now_ms)

    def append_pieces(
        self,
        pieces: Sequence[bytes | bytearray | memoryview],
        size_bytes: int,
        batches: list[tuple[int, BatchHeader]],
        now_ms: int,
    ) -> None:
        """Write whole batches given as consecutive pieces of `size_bytes` in all (one
        writev, so no piece is copied into a joined buffer); `batches` are (position in the
        joined bytes, header) of each."""
        start = self.size_bytes
        written = write_all(self.file.fileno(), pieces)
        if written != size_bytes:
            raise OSError(f"wrote {written} bytes of an append of {size_bytes}")
        if self.created_ms is None:
            self.created_ms = now_ms
        for rel_pos, header in batches:
            self._index_batch(start + rel_pos, header)
        self.size_bytes = start + size_bytes

    def _index_batch(self, position: int, header: BatchHeader, write_index: bool = True) -> None:
        if self.first_batch_timestamp_ms is None:
            self.first_batch_timestamp_ms = header.max_timestamp_ms
        if header.max_timestamp_ms > self.max_timestamp_ms:
            self.max_timestamp_ms = header.max_timestamp_ms
            self.offset_of_max_timestamp = header.base_offset
        if self._bytes_since_index_entry >= self.index_interval_bytes and position > 0:
            self.index.append(header.base_offset, position, write=write_index)
            self.time_index.maybe_append(
                self.max_timestamp_ms, self.offset_of_max_timestamp, write=write_index
            )
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += header.size_bytes
        self.next_offset = header.next_offset

    def seal(self) -> None:
        """The segment stops being active: record its final max timestamp (as Kafka does)."""
        if self.max_timestamp_ms >= 0:
            self.time_index.maybe_append(self.max_timestamp_ms, self.offset_of_max_timestamp)

    def fits_relative(self, last_offset: int) -> bool:
        return last_offset - self.base_offset <= MAX_RELATIVE_OFFSET

    # ------------------------------------------------------------------ recovery
    def load_trusted(self) -> int:
        """Open a segment below the recovery point: trust its batches, sanity-check indexes.

        Only headers after the last index entry are read (to find the next offset); an index
        that fails its checks is rebuilt by a full recovery scan of this segment. Returns the
        bytes that scan cut (0 when the segment was whole).
        """
        try:
            if self.size_bytes and not self.index.path.exists():
                raise IndexMismatch(f"{self.index.path}: missing")
            self.index.load(self.size_bytes)
            last_position = self.index.last_position()
            if self.index.positions:
                header = self.header_at(last_position)
                if header.base_offset != self.base_offset + self.index.rel_offsets[-1]:
                    raise IndexMismatch(f"{self.index.path}: last entry points at another batch")
            self.next_offset = self.base_offset
            for pos, header in self.headers_from(last_position):
                if header.magic != MAGIC_V2 or pos + header.size_bytes > self.size_bytes:
                    raise IndexMismatch(f"{self.log_path}: batch at byte {pos} is not whole")
                self.next_offset = header.next_offset
                if header.max_timestamp_ms > self.max_timestamp_ms:
                    self.max_timestamp_ms = header.max_timestamp_ms
                    self.offset_of_max_timestamp = header.base_offset
            self.time_index.load(self.next_offset)
            if self.time_index.rel_offsets and (
                self.time_index.max_timestamp() >= self.max_timestamp_ms
            ):
                self.max_timestamp_ms = self.time_index.max_timestamp()
                self.offset_of_max_timestamp = self.base_offset + self.time_index.rel_offsets[-1]
            self._bytes_since_index_entry = self.size_bytes - last_position
            self.unverified_from, self.unverified_to = 0, self.size_bytes
        except (IndexMismatch, CorruptRecordError) as exc:
            log.warning("rebuilding the indexes of %s: %s", self.log_path, exc)
            truncated, reason = self.recover(on_batch=None)
            if truncated:
                log.warning("%s: cut %d bytes: %s", self.log_path, truncated, reason)
            return truncated
        return 0

    def recover(
        self,
        on_batch: Callable[[int, BatchHeader], None] | None,
        *,
        allow_gaps: bool = True,
    ) -> tuple[int, str]:
        """Validate every batch (CRC included), rebuild both indexes, and cut the file at the
        first bad batch; `on_batch(position, header)` sees each valid batch. Returns (bytes
        cut, why). The txn index is recovery.py's to check against the batches."""
        self.unverified_from = self.unverified_to = 0
        self.index.rel_offsets, self.index.positions = array("q"), array("q")
        self.time_index.reset()
        self.next_offset = self.base_offset
        self.max_timestamp_ms = -1
        self.offset_of_max_timestamp = self.base_offset
        self.first_batch_timestamp_ms = None
        self._bytes_since_index_entry = 0
        fd = self.file.fileno()
        end = self.size_bytes
        position = 0
        buf = b""
        buf_start = 0
        reason = ""
        while position < end:
            rel = position - buf_start
            if len(buf) - rel < HEADER_SIZE_BYTES:
                buf, buf_start, rel = (
                    os.pread(fd, min(RECOVERY_CHUNK_BYTES, end - position), position),
                    position,
                    0,
                )
            if len(buf) - rel >= LOG_OVERHEAD_BYTES:
                size = batch_size_at(buf, rel)
                if len(buf) - rel < size <= end - position:
                    buf, buf_start, rel = os.pread(fd, size, position), position, 0
            try:
                header = validate_batch(buf, rel)
            except CorruptRecordError as exc:
                reason = str(exc).replace(f"at byte {rel}", f"at byte {position}", 1)
                break
            # baseOffset is outside the CRC: continuity is the only check a flipped bit there
            # meets. Compacted logs have legitimate gaps, so they only require increase.
            gap = header.base_offset != self.next_offset and self.next_offset != self.base_offset
            if (
                header.base_offset < self.next_offset
                or (gap and not allow_gaps)
                or not self.fits_relative(header.last_offset)
            ):
                reason = (
                    f"batch at byte {position} has base offset {header.base_offset}, "
                    f"expected >= {self.next_offset}"
                )
                break
            self._index_batch(position, header, write_index=False)
            if on_batch is not None:
                on_batch(position, header)
            position += header.size_bytes
        truncated = self.size_bytes - position
        if truncated:
            self.file.truncate(position)
            self.size_bytes = position
            self.file.seek(position)
        self.index.write_all()
        self.time_index.write_all()
        return truncated, reason

    def truncate_to(self, offset: int) -> int:
        """Drop every batch whose last offset is >= offset; returns bytes removed."""
        position = self.locate(offset)
        if position is None:
            return 0
        removed = self.size_bytes - position
        self.file.truncate(position)
        self.size_bytes = position
        self.unverified_to = min(self.unverified_to, position)
        self.mark_verified(position, position)
        self.file.seek(position)
        self.index.truncate_to_position(position)
        self.time_index.truncate_to_offset(offset)
        self.txn_index.truncate_to(offset)
        # Recompute the in-memory summary from what remains (truncation is rare).
        last_pos = self.index.last_position()
        self.next_offset = self.base_offset
        self.max_timestamp_ms = self.time_index.max_timestamp()
        if self.time_index.rel_offsets:
            self.offset_of_max_timestamp = self.base_offset + self.time_index.rel_offsets[-1]
        else:
            self.offset_of_max_timestamp = self.base_offset
        for _pos, header in self.headers_from(last_pos):
            self.next_offset = header.next_offset
            if header.max_timestamp_ms > self.max_timestamp_ms:
                self.max_timestamp_ms = header.max_timestamp_ms
                self.offset_of_max_timestamp = header.base_offset
        self._bytes_since_index_entry = self.size_bytes - last_pos
        if self.size_bytes == 0:
            self.created_ms = None
        return removed

    # ------------------------------------------------------------------ lifecycle
    def fsync(self) -> None:
        os.fdatasync(self.file.fileno())

    def close(self) -> None:
        self.index.close()
        self.time_index.close()
        self.txn_index.close()
        self.file.close()

    def delete(self) -> None:
        """Unlink the files; the open handle lives on for readers still holding regions."""
        self.index.delete()
        self.time_index.delete()
        self.txn_index.delete()
        self.log_path.unlink(missing_ok=True)
