"""The aborted transactions index of one segment (Kafka's `.txnindex`) and its rebuild.

One entry per ABORT marker in the segment, in marker order (Kafka's AbortedTxn): the producer
id, the first and last offset of the aborted transaction (the last is the marker's own offset)
and the LSO once it was complete. A read_committed fetch of [fetch_offset, upper) returns every
aborted transaction overlapping that range (`collect`), so the consumer can drop its records.

File `<base>.txnindex` (big endian; docs/formats.md "Aborted transactions index"):

    header  8 bytes   magic b"RLTX", version u16 (TXN_INDEX_VERSION), 2 zero bytes
    entries 38 bytes  Kafka's 34-byte entry (version i16 = 0, producer_id i64, first_offset
                      i64, last_offset i64, last_stable_offset i64), then CRC32C u32 of it

Kafka's entry has no checksum; raftlog adds one so a damaged entry is found, not served. As
Kafka's, the file exists only for a segment with at least one abort (created with its first
entry); the recovery-point checkpoint names those segments (`txn_index_segments`, written only
when there are any), so a file that should exist and does not is found. It is never the only
copy of the truth: ABORT markers are in the (CRC'd) log, so a missing or damaged file is
rebuilt by replaying the log's transactional batch headers (`rebuild_txn_indexes`). Entries are
appended on the event loop (page cache) and fsynced with their segment by the flusher (the
directory too when the file is new), before a recovery point can cover their marker.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

import crc32c

from raftlog.errors import CorruptRecordError
from raftlog.records import BatchHeader, parse_txn_marker
from raftlog.storage.checkpoint import fsync_dir
from raftlog.storage.index import IndexMismatch

TXN_INDEX_SUFFIX = ".txnindex"
TXN_INDEX_MAGIC = b"RLTX"
TXN_INDEX_VERSION = 1
_FILE_HEADER = TXN_INDEX_MAGIC + struct.pack(">HH", TXN_INDEX_VERSION, 0)
KAFKA_ENTRY_VERSION = 0
_ENTRY = struct.Struct(">hqqqq")  # Kafka's AbortedTxn layout, 34 bytes
_CRC = struct.Struct(">I")
ENTRY_SIZE_BYTES = _ENTRY.size + _CRC.size  # 38


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset
    last_stable_offset: int


def encode_entry(entry: AbortedTxn) -> bytes:
    body = _ENTRY.pack(KAFKA_ENTRY_VERSION, *entry)
    return body + _CRC.pack(crc32c.crc32c(body))


def decode_entries(data: bytes, source: str) -> list[AbortedTxn]:
    """Entries of a whole file; raises IndexMismatch on any defect."""
    if data[: len(_FILE_HEADER)] != _FILE_HEADER:
        raise IndexMismatch(f"{source}: bad header (magic or version)")
    body = memoryview(data)[len(_FILE_HEADER) :]
    if len(body) % ENTRY_SIZE_BYTES:
        raise IndexMismatch(f"{source}: size {len(data)} is not header + whole entries")
    entries: list[AbortedTxn] = []
    for pos in range(0, len(body), ENTRY_SIZE_BYTES):
        raw = body[pos : pos + _ENTRY.size]
        (stored,) = _CRC.unpack_from(body, pos + _ENTRY.size)
        if crc32c.crc32c(raw) != stored:
            raise IndexMismatch(f"{source}: entry {len(entries)} fails its CRC32C")
        version, pid, first, last, lso = _ENTRY.unpack(raw)
        if version != KAFKA_ENTRY_VERSION or pid < 0 or not 0 <= first <= last or lso < 0:
            raise IndexMismatch(f"{source}: entry {len(entries)} out of range")
        if entries and last <= entries[-1].last_offset:
            raise IndexMismatch(f"{source}: entries do not increase at offset {last}")
        entries.append(AbortedTxn(pid, first, last, lso))
    return entries


class TxnIndex:
    """The aborted transactions of one segment, in memory and in `<base>.txnindex`."""

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.entries: list[AbortedTxn] = []
        self._fd: int | None = None
        # Appended since the flusher last took this file's descriptor for an fsync.
        self.dirty = False

    def __len__(self) -> int:
        return len(self.entries)

    # ------------------------------------------------------------------ files
    def load(self, next_offset: int, *, required: bool, drop_beyond: bool = False) -> None:
        """Read and verify the file against its segment ([base, next_offset)); raises
        IndexMismatch when it is damaged, names a marker the segment lacks, or is missing
        though `required`. `drop_beyond`: entries at or past next_offset (markers a crash cut
        from a scanned segment) are dropped from the file instead."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            if required:
                raise IndexMismatch(f"{self.path}: missing") from None
            self.entries = []
            return
        entries = decode_entries(data, str(self.path))
        kept = [e for e in entries if e.last_offset < next_offset] if drop_beyond else entries
        for entry in kept:
            if not self.base_offset <= entry.last_offset < next_offset:
                raise IndexMismatch(
                    f"{self.path}: entry for offset {entry.last_offset} is outside the segment "
                    f"[{self.base_offset}, {next_offset})"
                )
        self.entries = kept
        if len(kept) != len(entries):
            self._rewrite()

    def replace(self, entries: Sequence[AbortedTxn]) -> None:
        """Rebuilt entries, written durably (tmp, fsync, rename, fsync(dir)); no file when
        there are none."""
        self.entries = list(entries)
        self._rewrite()

    def adopt(self, entries: Sequence[AbortedTxn]) -> None:
        """Take over the entries of the segment this one replaces (compaction keeps every
        marker and offset, so the file on disk already holds them)."""
        self.entries = list(entries)

    def _rewrite(self) -> None:
        """Replace the file with the entries (durably; rare: truncation and rebuild)."""
        self.close()
        if not self.entries:
            if self.path.exists():
                self.path.unlink()
                fsync_dir(self.path.parent)
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            data = _FILE_HEADER + b"".join(encode_entry(e) for e in self.entries)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)

    # ------------------------------------------------------------------ writing
    def append(self, entry: AbortedTxn) -> bool:
        """Append one entry; True when this created the file (its directory needs an fsync)."""
        if entry.last_offset < self.base_offset or (
            self.entries and entry.last_offset <= self.entries[-1].last_offset
        ):
            raise ValueError(
                f"{self.path}: entry for offset {entry.last_offset} does not follow "
                f"{self.entries[-1].last_offset if self.entries else self.base_offset}"
            )
        data = encode_entry(entry)
        created = False
        if self._fd is None:
            if self.entries:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            else:
                # The first abort of the segment: a new file (a stale one, left by a crash
                # before its entry counted, is replaced).
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                data = _FILE_HEADER + data
                created = True
        fd = self._fd
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        self.entries.append(entry)
        self.dirty = True
        return created

    def dup_dirty_fd(self) -> int | None:
        """A duplicate of the descriptor to fsync when entries were appended since the last
        call (the flusher's ticket closes it), else None."""
        if not self.dirty or self._fd is None:
            return None
        self.dirty = False
        return os.dup(self._fd)

    def truncate_to(self, offset: int) -> None:
        """Drop the entries of markers at or after `offset` (the log was cut there)."""
        kept = [e for e in self.entries if e.last_offset < offset]
        if len(kept) != len(self.entries):
            self.entries = kept
            self._rewrite()

    # ------------------------------------------------------------------ reading
    def collect(self, fetch_offset: int, upper_offset: int, out: list[AbortedTxn]) -> bool:
        """Append to `out` the aborted transactions overlapping [fetch_offset, upper_offset);
        True once no later entry (here or in a later segment) can overlap it (Kafka's
        TransactionIndex.collectAbortedTxns)."""
        for entry in self.entries:
            if entry.last_offset >= fetch_offset and entry.first_offset < upper_offset:
                out.append(entry)
            if entry.last_stable_offset >= upper_offset:
                return True
        return False

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class SegmentView(Protocol):
    """What the rebuild reads of a segment (LogSegment has it)."""

    txn_index: TxnIndex

    def headers_from(self, position: int) -> Iterator[tuple[int, BatchHeader]]: ...

    def read_range(self, start: int, end: int) -> bytes: ...


def replay_aborted_txns(
    segments: Sequence[SegmentView], log_start_offset: int
) -> list[list[AbortedTxn]]:
    """Replay the transactional batches of the segments, oldest first, and return each
    segment's aborted transactions (blocking: reads every batch header).

    The producer table's rules (a transactional data batch opens or extends its producer's
    transaction, a COMMIT or ABORT marker ends it; an entry's LSO is the first offset of the
    oldest transaction still open, else the marker's offset + 1). Batches below the log start
    are gone for readers and skipped, so a transaction that began before it starts, here, at
    its first batch at or after it.
    """
    ongoing: dict[int, int] = {}
    result: list[list[AbortedTxn]] = []
    for segment in segments:
        entries: list[AbortedTxn] = []
        for pos, header in segment.headers_from(0):
            pid = header.producer_id
            if header.last_offset < log_start_offset or pid < 0 or not header.is_transactional:
                continue
            if not header.is_control:
                ongoing.setdefault(pid, header.base_offset)
                continue
            try:
                marker = parse_txn_marker(segment.read_range(pos, pos + header.size_bytes))
            except CorruptRecordError:
                marker = None  # the log's own validation decides about the batch
            if marker is None:
                continue
            first = ongoing.pop(pid, header.base_offset)
            if not marker.commit:
                next_open = next(iter(ongoing.values()), header.base_offset + 1)
                entries.append(AbortedTxn(pid, first, header.base_offset, next_open))
        result.append(entries)
    return result


def rebuild_txn_indexes(segments: Sequence[SegmentView], log_start_offset: int) -> None:
    """Rewrite every segment's index from the log (blocking)."""
    for segment, entries in zip(
        segments, replay_aborted_txns(segments, log_start_offset), strict=True
    ):
        segment.txn_index.replace(entries)
