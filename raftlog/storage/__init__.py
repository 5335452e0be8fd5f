"""Segments, offset/time indexes, partition logs, checkpoints, flusher, retention, cleaner."""

from raftlog.storage.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from raftlog.storage.config import LogConfig
from raftlog.storage.flusher import Flusher
from raftlog.storage.log import (
    AppendInfo,
    OffsetOutOfRangeError,
    PartitionLog,
    ReadResult,
    RecordTooLargeError,
    UnexpectedAppendOffsetError,
)
from raftlog.storage.manager import LogManager
from raftlog.storage.segment import FileRegion

__all__ = [
    "AppendInfo",
    "CheckpointError",
    "FileRegion",
    "Flusher",
    "LogConfig",
    "LogManager",
    "OffsetOutOfRangeError",
    "PartitionLog",
    "ReadResult",
    "RecordTooLargeError",
    "UnexpectedAppendOffsetError",
    "read_checkpoint",
    "write_checkpoint",
]
