"""Opening a partition log directory: leftovers, checkpoints, segment recovery (docs/formats.md).

The rules of "Recovery" in docs/formats.md live here, apart from the running log's append, read,
truncation and flush paths (log.py): segments below the recovery point are trusted, the rest is
scanned batch by batch, a torn tail is cut at the first bad batch and said so in the log, and
what was recovered is fsynced before a new recovery point claims it. Blocking throughout: the
callers run it in a worker thread.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from raftlog.errors import CorruptRecordError
from raftlog.records import BatchHeader, parse_txn_marker
from raftlog.storage.checkpoint import CheckpointError, fsync_dir, read_checkpoint
from raftlog.storage.config import LogConfig
from raftlog.storage.epoch_cache import LeaderEpochCache
from raftlog.storage.index import IndexMismatch
from raftlog.storage.segment import CLEANED_SUFFIX, LOG_SUFFIX, LogSegment
from raftlog.storage.txn_index import TXN_INDEX_SUFFIX, rebuild_txn_indexes

log = logging.getLogger("raftlog.storage")

RECOVERY_POINT_FILE = "recovery-point.checkpoint"
LOG_START_FILE = "log-start-offset.checkpoint"
EPOCH_FILE = "leader-epoch.checkpoint"
# In the recovery-point checkpoint: base offsets of the segments that have a .txnindex file.
TXN_INDEX_SEGMENTS_KEY = "txn_index_segments"


@dataclass(frozen=True)
class RecoveredLog:
    """What recovery found in a log directory: the open segments (at least one) and the
    offsets and epochs they hold, all durable; a PartitionLog is built from it."""

    segments: list[LogSegment]
    epoch_cache: LeaderEpochCache
    log_start_offset: int
    log_end_offset: int
    # Recovery removed data below the recovery point, which only ever claims fsynced data:
    # records this replica acknowledged are gone (a damaged or cut file), so it must not
    # lead before it has fetched back what the others committed (KIP-966). A torn tail above
    # the recovery point after a crash is not this: it was never acknowledged under
    # flush_policy=always, and calling it lost would leave a cluster that lost power with no
    # replica allowed to lead.
    lost_data: bool = False


def recover_log(directory: Path, config: LogConfig, *, now_ms: int) -> RecoveredLog:
    """Create or recover the log in `directory`; everything returned is fsynced."""
    directory.mkdir(parents=True, exist_ok=True)
    for stray in list(directory.glob("*.tmp")) + list(directory.glob("*" + CLEANED_SUFFIX)):
        log.info("%s: removing leftover %s", directory, stray.name)
        stray.unlink()
    recovery_point = _read_int_checkpoint(directory, RECOVERY_POINT_FILE, "recovery_point", 0)
    log_start = _read_int_checkpoint(directory, LOG_START_FILE, "log_start_offset", 0)
    epoch_cache = LeaderEpochCache()
    try:
        epoch_cache = LeaderEpochCache.from_payload(
            read_checkpoint(directory / EPOCH_FILE, "leader-epoch")
        )
    except FileNotFoundError:
        pass
    except (CheckpointError, ValueError) as exc:
        # Without the cache we cannot trust old segments' epochs: rebuild from the log.
        log.warning("%s: %s; recovering the whole log", directory, exc)
        recovery_point = 0
    bases = sorted(int(p.name[: -len(LOG_SUFFIX)]) for p in directory.glob("*" + LOG_SUFFIX))
    for suffix in (".index", ".timeindex", TXN_INDEX_SUFFIX):
        for orphan in directory.glob("*" + suffix):
            if int(orphan.name.split(".")[0]) not in bases:
                orphan.unlink()
    if recovery_point <= (bases[0] if bases else 0):
        epoch_cache.clear()  # everything is rescanned, epochs included
    scanned_aborts: dict[int, list[int]] = {}
    segments = _recover_segments(
        directory, config, epoch_cache, bases, recovery_point, now_ms, scanned_aborts
    )
    if not segments:
        segments.append(LogSegment(directory, log_start, config.index_interval_bytes))
    log_end = segments[-1].next_offset
    log_start = min(max(log_start, segments[0].base_offset), log_end)
    _load_txn_indexes(
        directory, segments, scanned_aborts, log_start, _txn_indexed_segments(directory)
    )
    epoch_cache.truncate_from_end(log_end)
    epoch_cache.truncate_from_start(log_start)
    # Recovered bytes may exist only in the page cache: make them durable before a
    # recovery point claims them.
    for segment in segments:
        if segment.next_offset > recovery_point:
            segment.fsync()
    fsync_dir(directory)
    lost_data = log_end < recovery_point
    if lost_data:
        log.warning(
            "%s: recovery removed data (recovery point %d, log end now %d): this replica may "
            "have lost acknowledged records and will not lead it until it has caught up",
            directory,
            recovery_point,
            log_end,
        )
    return RecoveredLog(segments, epoch_cache, log_start, log_end, lost_data)


def _read_int_checkpoint(directory: Path, name: str, key: str, default: int) -> int:
    try:
        return int(read_checkpoint(directory / name, name.split(".")[0])[key])
    except FileNotFoundError:
        return default
    except (CheckpointError, KeyError, ValueError, TypeError) as exc:
        log.warning("%s: ignoring unreadable %s: %s", directory, name, exc)
        return default


def _txn_indexed_segments(directory: Path) -> set[int] | None:
    """The segments the recovery-point checkpoint says have a .txnindex (None: unknown)."""
    try:
        payload = read_checkpoint(directory / RECOVERY_POINT_FILE, "recovery-point")
    except FileNotFoundError:
        return set()
    except (CheckpointError, ValueError) as exc:
        log.warning("%s: unreadable %s: %s", directory, RECOVERY_POINT_FILE, exc)
        return None
    bases = payload.get(TXN_INDEX_SEGMENTS_KEY, [])
    if not isinstance(bases, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in bases
    ):
        log.warning(
            "%s: malformed %s in %s", directory, TXN_INDEX_SEGMENTS_KEY, RECOVERY_POINT_FILE
        )
        return None
    return set(bases)


def _load_txn_indexes(
    directory: Path,
    segments: list[LogSegment],
    scanned_aborts: dict[int, list[int]],
    log_start: int,
    indexed: set[int] | None,
) -> None:
    """Load every segment's aborted transactions index, or rebuild them all from the log.

    A segment below the recovery point was fsynced with its index: a file the checkpoint names
    must exist, and any file must verify. A scanned segment may have lost index entries of
    markers the crash kept (the index is fsynced with the segment, so only above the recovery
    point): entries past its recovered end are dropped, and the rest must name exactly the
    ABORT markers the scan found. `indexed` None (the checkpoint is unreadable): rebuild.
    """
    reason = ""
    if indexed is None:
        reason = "the recovery point does not say which exist"
        indexed, segments_to_load = set(), []
    else:
        segments_to_load = segments
    for segment in segments_to_load:
        index = segment.txn_index
        try:
            found = scanned_aborts.get(segment.base_offset)
            if found is None:
                index.load(segment.next_offset, required=segment.base_offset in indexed)
                continue
            index.load(segment.next_offset, required=False, drop_beyond=True)
            have = [e.last_offset for e in index.entries]
            if have != found:
                raise IndexMismatch(
                    f"{index.path}: indexes aborts at {have[:5]}, the log has {found[:5]}"
                )
        except (IndexMismatch, OSError) as exc:
            reason = str(exc)
            break
    if not reason:
        return
    log.warning(
        "%s: rebuilding the aborted transactions indexes from the log: %s", directory, reason
    )
    rebuild_txn_indexes(segments, log_start)


def _abort_offset(segment: LogSegment, position: int, header: BatchHeader) -> int | None:
    """The offset of the ABORT marker at `position`, None when it is none."""
    if not (header.is_control and header.is_transactional and header.producer_id >= 0):
        return None
    try:
        marker = parse_txn_marker(segment.read_range(position, position + header.size_bytes))
    except CorruptRecordError:
        return None
    return header.base_offset if marker is not None and not marker.commit else None


def _recover_segments(
    directory: Path,
    config: LogConfig,
    cache: LeaderEpochCache,
    bases: list[int],
    recovery_point: int,
    now_ms: int,
    scanned_aborts: dict[int, list[int]],
) -> list[LogSegment]:
    segments: list[LogSegment] = []
    for i, base in enumerate(bases):
        segment = LogSegment(directory, base, config.index_interval_bytes)
        segment.created_ms = now_ms
        next_base = bases[i + 1] if i + 1 < len(bases) else None
        cut = 0
        if base < recovery_point:
            cut = segment.load_trusted()
        if base >= recovery_point or segment.next_offset > recovery_point:
            aborts = scanned_aborts[base] = []

            def on_batch(
                position: int,
                header: BatchHeader,
                segment: LogSegment = segment,
                aborts: list[int] = aborts,
            ) -> None:
                cache.assign(header.partition_leader_epoch, header.base_offset)
                offset = _abort_offset(segment, position, header)
                if offset is not None:
                    aborts.append(offset)

            scan_cut, reason = segment.recover(on_batch, allow_gaps=config.compact)
            cut += scan_cut
            if scan_cut:
                log.warning(
                    "%s: truncated %d bytes of %s at offset %d: %s",
                    directory,
                    scan_cut,
                    segment.log_path.name,
                    segment.next_offset,
                    reason,
                )
        prev = segments[-1] if segments else None
        if prev is not None and segment.base_offset < prev.next_offset:
            log.warning(
                "%s: %s overlaps its predecessor; deleting it and what follows",
                directory,
                segment.log_path.name,
            )
            segment.close()
            segment.delete()
            _delete_segment_files(directory, config, bases[i + 1 :])
            return segments
        segments.append(segment)
        if next_base is not None and cut:
            # What follows a torn segment was written later than the lost bytes and
            # cannot be contiguous with what survived.
            log.warning(
                "%s: deleting %d segment(s) after the torn segment %s",
                directory,
                len(bases) - i - 1,
                segment.log_path.name,
            )
            _delete_segment_files(directory, config, bases[i + 1 :])
            return segments
    return segments


def _delete_segment_files(directory: Path, config: LogConfig, bases: list[int]) -> None:
    for base in bases:
        segment = LogSegment(directory, base, config.index_interval_bytes)
        segment.close()
        segment.delete()
