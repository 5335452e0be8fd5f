"""The values and errors of the partition log's API (log.py re-exports them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from raftlog.errors import ErrorCode, KafkaError
from raftlog.storage.segment import FileRegion, LogSegment


class OffsetOutOfRangeError(KafkaError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.offset_out_of_range, message)


class RecordTooLargeError(KafkaError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.message_too_large, message)


class UnexpectedAppendOffsetError(KafkaError):
    """A follower append that does not continue the log exactly where it ends."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.unknown_server_error, message)


class LogOfflineError(KafkaError):
    """The log's directory failed (ENOSPC, EIO): the log takes no appends and serves no reads
    until the node restarts (Kafka's offline log directory). The message may reach a client,
    so it names no file and no errno: the node's log has those (PartitionLog.mark_offline)."""

    def __init__(self) -> None:
        super().__init__(ErrorCode.kafka_storage_error, "the partition's log is offline")


@dataclass(frozen=True, slots=True)
class UnverifiedRead:
    """A read's region in a segment that still holds bytes taken on trust at start-up."""

    segment: LogSegment
    start_position: int
    end_position: int
    first_batch_offset: int  # base offset of the batch at start_position
    allow_gaps: bool  # a compacted log's offsets only increase


@dataclass(frozen=True, slots=True)
class AppendInfo:
    first_offset: int
    last_offset: int
    max_timestamp_ms: int
    offset_of_max_timestamp: int
    log_start_offset: int
    batch_count: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class ReadResult:
    regions: list[FileRegion]
    log_start_offset: int
    log_end_offset: int
    size_bytes: int = 0
    next_offset: int = -1  # where the next read continues (-1: nothing was read)
    # Set when the region holds bytes this process has not verified since it opened the
    # segment: the reader checks them (storage.scrubber.verify_read) before serving them.
    unverified: UnverifiedRead | None = None

    def read_bytes(self) -> bytes:
        return b"".join(region.read_bytes() for region in self.regions)


@dataclass(slots=True)
class FlushTicket:
    """What one group-commit fsync must cover for one log (built on the event loop)."""

    target_offset: int
    fds: list[int]
    fsync_directory: bool
    generation: int
    checkpoints: dict[str, dict[str, object]] = field(default_factory=dict)
