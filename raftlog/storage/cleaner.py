"""Log compaction (cleanup.policy=compact): keep the newest record of every key.

Rules, as in Kafka: offsets are never changed (kept records keep their offsets and each batch
keeps its base offset and lastOffsetDelta); nothing at or above `clean_below_offset` (the high
watermark, and never the active segment) is touched; a tombstone (null value) survives until
its batch is older than delete.retention.ms, so consumers that were behind still see deletes;
records without a key and control batches are kept.

Transactions (KIP-98): the caller passes the last stable offset as `clean_below_offset`, so
no undecided transaction is compacted. Records of aborted transactions (the segments' txn
indexes name them) never count as a key's newest record and are removed, as Kafka's cleaner
does, so an aborted write can never hide the committed value before it. Transaction markers
are control batches and are always kept, with their txn index entries, so a marker outlives
every record of its transaction (Kafka drops markers after delete.retention.ms once their
data is gone; raftlog keeps them: one small batch per transaction).

The heavy part (reading segments, building cleaned files, fsync) runs in a worker thread; only
the swap of each cleaned file into place runs on the event loop, so appends are never blocked
for long. Each segment is rewritten to `<base>.cleaned` and renamed over `<base>.log`, so a crash
leaves either the old or the new file, both valid.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import trio

from raftlog.errors import CorruptRecordError
from raftlog.records import BatchHeader, iter_batches, iter_records, rebuild_batch
from raftlog.storage.checkpoint import fsync_dir
from raftlog.storage.log import PartitionLog
from raftlog.storage.segment import CLEANED_SUFFIX, LogSegment

log = logging.getLogger("raftlog.storage")


@dataclass
class CleanStats:
    segments_cleaned: int = 0
    records_removed: int = 0
    bytes_before: int = 0
    bytes_after: int = 0


def _read_whole(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


# producer id -> (first offset, last offset) of each of its aborted transactions.
AbortedRanges = dict[int, list[tuple[int, int]]]


def aborted_ranges(partition_log: PartitionLog) -> AbortedRanges:
    """The aborted transactions the log's txn indexes hold, by producer (event loop)."""
    ranges: AbortedRanges = {}
    for segment in partition_log.segments:
        for entry in segment.txn_index.entries:
            ranges.setdefault(entry.producer_id, []).append((entry.first_offset, entry.last_offset))
    return ranges


def is_aborted(header: BatchHeader, aborted: AbortedRanges | None) -> bool:
    """A data batch of an aborted transaction."""
    if aborted is None or header.is_control or not header.is_transactional:
        return False
    return any(
        first <= header.base_offset <= last for first, last in aborted.get(header.producer_id, ())
    )


def build_key_map(
    paths: list[Path], clean_below_offset: int, aborted: AbortedRanges | None = None
) -> dict[bytes, int]:
    """key -> offset of its newest record below clean_below_offset, records of aborted
    transactions left out (worker thread)."""
    latest: dict[bytes, int] = {}
    for path in paths:
        data = _read_whole(path)
        for pos, header in iter_batches(data):
            if header.is_control or is_aborted(header, aborted):
                continue
            for record in iter_records(data, pos):
                if record.key is not None and record.offset < clean_below_offset:
                    latest[record.key] = record.offset
    return latest


def clean_segment_file(
    path: Path,
    key_map: dict[bytes, int],
    clean_below_offset: int,
    tombstone_horizon_ms: int,
    aborted: AbortedRanges | None = None,
) -> tuple[Path, int, int] | None:
    """Write the cleaned copy of one segment; returns (path, records removed, new size) or
    None when nothing would change (worker thread)."""
    data = _read_whole(path)
    out = bytearray()
    removed = 0
    for pos, header in iter_batches(data):
        end = pos + header.size_bytes
        if header.is_control or header.last_offset >= clean_below_offset:
            out += data[pos:end]
            continue
        if is_aborted(header, aborted):
            removed += header.record_count
            continue
        kept = []
        records = list(iter_records(data, pos))
        for record in records:
            if record.key is None:
                kept.append(record)
                continue
            if key_map.get(record.key, -1) != record.offset:
                continue  # a newer record of this key exists
            if record.value is None and header.max_timestamp_ms < tombstone_horizon_ms:
                continue  # tombstone past delete.retention.ms
            kept.append(record)
        removed += len(records) - len(kept)
        if len(kept) == len(records):
            out += data[pos:end]
        elif kept:
            out += rebuild_batch(header, kept)
    if removed == 0:
        return None
    cleaned = path.with_name(path.name[: -len(".log")] + CLEANED_SUFFIX)
    with open(cleaned, "wb") as handle:
        handle.write(out)
        handle.flush()
        os.fsync(handle.fileno())
    return cleaned, removed, len(out)


async def clean_log(
    partition_log: PartitionLog, *, clean_below_offset: int, now_ms: int
) -> CleanStats:
    """Compact every inactive segment wholly below clean_below_offset.

    A batch the cleaner cannot read (a CRC that fails, records that do not decode or that
    decompress past DECOMPRESSED_BATCH_MAX_BYTES) stops compaction of this log, as Kafka marks
    a partition uncleanable: the log keeps every segment as it is, the node and the other
    logs carry on, and an ERROR line says which log and why. So does any other failure but
    a disk error (OSError, the caller's to report): like Kafka's cleaner, a log it cannot
    compact must not take the node down with it, on every replica at once."""
    if not partition_log.config.compact or partition_log.uncleanable_reason is not None:
        return CleanStats()
    name = partition_log.directory.name
    try:
        return await _clean_log(partition_log, clean_below_offset, now_ms)
    except CorruptRecordError as exc:
        partition_log.uncleanable_reason = exc.message
        log.error("%s: compaction stopped until a restart, a batch cannot be read: %s", name, exc)
    except OSError:
        raise
    except Exception as exc:
        partition_log.uncleanable_reason = repr(exc)
        log.exception("%s: compaction stopped until a restart, it failed unexpectedly", name)
    return CleanStats()


async def _clean_log(
    partition_log: PartitionLog, clean_below_offset: int, now_ms: int
) -> CleanStats:
    stats = CleanStats()
    limit = min(clean_below_offset, partition_log.active_segment.base_offset)
    segments = [s for s in partition_log.segments[:-1] if s.next_offset <= limit]
    if not segments:
        return stats
    paths = [s.log_path for s in segments]
    aborted = aborted_ranges(partition_log)
    key_map = await trio.to_thread.run_sync(build_key_map, paths, limit, aborted)
    horizon_ms = now_ms - partition_log.config.delete_retention_ms
    for segment in segments:
        size_before = segment.size_bytes
        result = await trio.to_thread.run_sync(
            clean_segment_file, segment.log_path, key_map, limit, horizon_ms, aborted
        )
        if result is None:
            continue
        cleaned, removed, size_after = result
        # The log may have changed while we worked (retention, truncation, close).
        if (
            partition_log.closed
            or segment not in partition_log.segments
            or segment.size_bytes != size_before
        ):
            cleaned.unlink(missing_ok=True)
            continue
        # Index files go first: a crash after the rename then finds no index and rebuilds
        # it, never an index that describes the old file.
        segment.index.delete()
        segment.time_index.delete()
        fresh = await trio.to_thread.run_sync(
            _rename_and_load, partition_log.directory, segment, cleaned
        )
        if partition_log.closed or segment not in partition_log.segments:
            fresh.close()
            continue
        fresh.created_ms = segment.created_ms
        partition_log.segments[partition_log.segments.index(segment)] = fresh
        # No segment.close(): readers may hold regions of the old file; it closes with them.
        stats.segments_cleaned += 1
        stats.records_removed += removed
        stats.bytes_before += size_before
        stats.bytes_after += size_after
    if stats.segments_cleaned:
        log.info(
            "%s: compacted %d segment(s), removed %d record(s), %d -> %d bytes",
            partition_log.directory.name,
            stats.segments_cleaned,
            stats.records_removed,
            stats.bytes_before,
            stats.bytes_after,
        )
    return stats


def _rename_and_load(directory: Path, old: LogSegment, cleaned: Path) -> LogSegment:
    """Rename the cleaned file over the segment and rebuild its indexes (worker thread)."""
    os.replace(cleaned, old.log_path)
    fsync_dir(directory)
    fresh = LogSegment(directory, old.base_offset, old.index_interval_bytes)
    fresh.recover(on_batch=None)
    # Compaction keeps every marker at its offset: the txn index file still holds.
    old.txn_index.close()
    fresh.txn_index.adopt(old.txn_index.entries)
    return fresh
