"""Time- and size-based retention: delete whole old segments, never the active one."""

from __future__ import annotations

import logging

from raftlog.storage.log import PartitionLog

log = logging.getLogger("raftlog.storage")


def retention_target(partition_log: PartitionLog, now_ms: int) -> int:
    """The log start offset retention allows: the base of the first segment to keep."""
    config = partition_log.config
    if not config.delete:
        return partition_log.log_start_offset
    segments = partition_log.segments
    keep_from = 0
    # Time: a segment goes when its newest record is older than retention_ms (as in Kafka,
    # by the largest timestamp, so one late record keeps the whole segment).
    if config.retention_ms >= 0:
        while keep_from < len(segments) - 1 and (
            now_ms - segments[keep_from].max_timestamp_ms > config.retention_ms
        ):
            keep_from += 1
    # Size: drop the oldest segments while the rest still exceeds retention_bytes.
    if config.retention_bytes >= 0:
        total = sum(s.size_bytes for s in segments[keep_from:])
        while (
            keep_from < len(segments) - 1
            and total - segments[keep_from].size_bytes >= config.retention_bytes
            and total > config.retention_bytes
        ):
            total -= segments[keep_from].size_bytes
            keep_from += 1
    if keep_from == 0:
        return partition_log.log_start_offset
    return max(partition_log.log_start_offset, segments[keep_from].base_offset)


def apply_retention(partition_log: PartitionLog, now_ms: int) -> int:
    """Delete segments past retention; returns how many were deleted."""
    target = retention_target(partition_log, now_ms)
    if target <= partition_log.log_start_offset:
        return 0
    deleted = partition_log.advance_log_start(target)
    if deleted:
        log.info(
            "%s: retention deleted %d segment(s); log start is now %d",
            partition_log.directory.name,
            deleted,
            target,
        )
    return deleted
