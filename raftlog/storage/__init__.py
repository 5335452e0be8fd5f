"""Segments, offset/time indexes, partition logs, checkpoints, flusher, retention, cleaner.

Rules of this package (docs/formats.md):
- Every file can be verified: batches carry CRC32C, checkpoints a version and a checksum.
  Checkpoints are written tmp -> fsync -> rename -> fsync(dir).
- Recovery truncates a torn tail at the first bad batch and says so in the log.
- Blocking disk work (fsync, deletes, large reads) runs in worker threads or the one
  group-commit flusher, never on the event loop.
- Log configs are parsed with raftlog.config_keys, the table the controller validates with.
"""

from raftlog.storage.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from raftlog.storage.config import LogConfig
from raftlog.storage.flusher import Flusher
from raftlog.storage.log import (
    AppendInfo,
    LogOfflineError,
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
    "LogOfflineError",
    "OffsetOutOfRangeError",
    "PartitionLog",
    "ReadResult",
    "RecordTooLargeError",
    "UnexpectedAppendOffsetError",
    "read_checkpoint",
    "write_checkpoint",
]
