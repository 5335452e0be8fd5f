"""Opening a partition log directory: leftovers, checkpoints, segment recovery (docs/formats.md).

The rules of "Recovery" in docs/formats.md live here, apart from the running log's append, read,
truncation and flush paths (log.py): segments below the recovery point are trusted, the rest is
scanned batch by batch, a torn tail is cut at the first bad batch and said so in the log, and
what was recovered is fsynced before a new recovery point claims it. Blocking throughout: the
callers run it in a worker thread.
"""

from __future__ import annotations

import logging

from raftlog.records import BatchHeader
from raftlog.storage.checkpoint import CheckpointError, fsync_dir, read_checkpoint
from raftlog.storage.epoch_cache import LeaderEpochCache
from raftlog.storage.log import EPOCH_FILE, LOG_START_FILE, RECOVERY_POINT_FILE, PartitionLog
from raftlog.storage.segment import CLEANED_SUFFIX, LOG_SUFFIX, LogSegment

log = logging.getLogger("raftlog.storage")


def recover_log(plog: PartitionLog, *, now_ms: int) -> PartitionLog:
    """Create or recover the fresh (never opened) `plog` from its directory."""
    directory = plog.directory
    config = plog.config
    directory.mkdir(parents=True, exist_ok=True)
    for stray in list(directory.glob("*.tmp")) + list(directory.glob("*" + CLEANED_SUFFIX)):
        log.info("%s: removing leftover %s", directory, stray.name)
        stray.unlink()
    recovery_point = _read_int_checkpoint(plog, RECOVERY_POINT_FILE, "recovery_point", 0)
    log_start = _read_int_checkpoint(plog, LOG_START_FILE, "log_start_offset", 0)
    try:
        plog.epoch_cache = LeaderEpochCache.from_payload(
            read_checkpoint(directory / EPOCH_FILE, "leader-epoch")
        )
    except FileNotFoundError:
        pass
    except (CheckpointError, ValueError) as exc:
        # Without the cache we cannot trust old segments' epochs: rebuild from the log.
        log.warning("%s: %s; recovering the whole log", directory, exc)
        recovery_point = 0
    bases = sorted(int(p.name[: -len(LOG_SUFFIX)]) for p in directory.glob("*" + LOG_SUFFIX))
    for suffix in (".index", ".timeindex"):
        for orphan in directory.glob("*" + suffix):
            if int(orphan.name.split(".")[0]) not in bases:
                orphan.unlink()
    if recovery_point <= (bases[0] if bases else 0):
        plog.epoch_cache.clear()  # everything is rescanned, epochs included
    _recover_segments(plog, bases, recovery_point, now_ms)
    if not plog.segments:
        plog.segments.append(LogSegment(directory, log_start, config.index_interval_bytes))
    plog._leo = plog.segments[-1].next_offset
    plog._log_start = min(max(log_start, plog.segments[0].base_offset), plog._leo)
    plog.epoch_cache.truncate_from_end(plog._leo)
    plog.epoch_cache.truncate_from_start(plog._log_start)
    # Recovered bytes may exist only in the page cache: make them durable before the
    # recovery point claims them.
    for segment in plog.segments:
        if segment.next_offset > recovery_point:
            segment.fsync()
    fsync_dir(directory)
    plog._flushed = plog._leo
    plog._write_checkpoints_now()
    return plog


def _read_int_checkpoint(plog: PartitionLog, name: str, key: str, default: int) -> int:
    try:
        return int(read_checkpoint(plog.directory / name, name.split(".")[0])[key])
    except FileNotFoundError:
        return default
    except (CheckpointError, KeyError, ValueError, TypeError) as exc:
        log.warning("%s: ignoring unreadable %s: %s", plog.directory, name, exc)
        return default


def _recover_segments(
    plog: PartitionLog, bases: list[int], recovery_point: int, now_ms: int
) -> None:
    cache = plog.epoch_cache
    directory = plog.directory
    for i, base in enumerate(bases):
        segment = LogSegment(directory, base, plog.config.index_interval_bytes)
        segment.created_ms = now_ms
        next_base = bases[i + 1] if i + 1 < len(bases) else None
        if base < recovery_point:
            segment.load_trusted()
        cut = 0
        if base >= recovery_point or segment.next_offset > recovery_point:

            def on_batch(header: BatchHeader) -> None:
                cache.assign(header.partition_leader_epoch, header.base_offset)

            cut, reason = segment.recover(on_batch, allow_gaps=plog.config.compact)
            if cut:
                log.warning(
                    "%s: truncated %d bytes of %s at offset %d: %s",
                    directory,
                    cut,
                    segment.log_path.name,
                    segment.next_offset,
                    reason,
                )
        prev = plog.segments[-1] if plog.segments else None
        if prev is not None and segment.base_offset < prev.next_offset:
            log.warning(
                "%s: %s overlaps its predecessor; deleting it and what follows",
                directory,
                segment.log_path.name,
            )
            segment.close()
            segment.delete()
            _delete_segment_files(plog, bases[i + 1 :])
            return
        plog.segments.append(segment)
        if next_base is not None and cut:
            # What follows a torn segment was written later than the lost bytes and
            # cannot be contiguous with what survived.
            log.warning(
                "%s: deleting %d segment(s) after the torn segment %s",
                directory,
                len(bases) - i - 1,
                segment.log_path.name,
            )
            _delete_segment_files(plog, bases[i + 1 :])
            return


def _delete_segment_files(plog: PartitionLog, bases: list[int]) -> None:
    for base in bases:
        segment = LogSegment(plog.directory, base, plog.config.index_interval_bytes)
        segment.close()
        segment.delete()
