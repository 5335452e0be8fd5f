"""Disk damage for the ``corrupt`` and ``truncate`` nemeses: what a failing disk does to one
replica's segment files while its node is down.

- ``flip_byte``: one byte inside the records of a batch in the older part of the log (what
  the replica has long since acknowledged) flips, CRC untouched: bit rot found on read.
- ``cut_mid_batch``: the last segment ends in the middle of one of its last batches: a torn
  write, or a disk that lost its cache, below what the replica had flushed.

Both work on the files of a killed node only (the nemesis kills it first and starts it
again after); neither knows anything about the node beyond the RecordBatch v2 layout on disk.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from raftlog.records import HEADER_SIZE_BYTES, LOG_OVERHEAD_BYTES, batch_size_at
from raftlog.storage.manager import log_dir_name

SEGMENT_SUFFIX = ".log"
# A flip lands in the oldest part of the log (up to this fraction of its batches), far
# below anything in flight when the node was killed.
FLIP_OLDEST_FRACTION = 0.8
# A cut lands inside one of this many batches at the end of the last segment.
CUT_LAST_BATCHES = 5


@dataclass(frozen=True)
class Damage:
    """What was done, for the history and the run's log."""

    kind: str  # "flip" or "cut"
    segment: Path
    position: int  # byte flipped, or the new length of the segment file
    batch_position: int  # where the batch it hit starts

    def describe(self) -> str:
        what = "flipped byte" if self.kind == "flip" else "cut to"
        return f"{self.segment.parent.name}/{self.segment.name}: {what} {self.position}"


def partition_dir(data_dir: Path, topic: str, partition: int) -> Path:
    return data_dir / log_dir_name(topic, partition)


def batch_positions(data: bytes) -> list[tuple[int, int]]:
    """(start, size) of each whole batch in a segment file's bytes."""
    batches: list[tuple[int, int]] = []
    position = 0
    while position + LOG_OVERHEAD_BYTES <= len(data):
        size = batch_size_at(data, position)
        if size < HEADER_SIZE_BYTES or position + size > len(data):
            break
        batches.append((position, size))
        position += size
    return batches


def _segments(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob(f"*{SEGMENT_SUFFIX}") if p.stat().st_size > 0)


def flip_byte(directory: Path, rng: random.Random) -> Damage | None:
    """Flip one byte of the records (past the header the CRC covers from) of a batch in the
    oldest part of the partition's log; None if it holds no batch yet."""
    candidates = [
        (segment, start, size)
        for segment in _segments(directory)
        for start, size in batch_positions(segment.read_bytes())
    ]
    if not candidates:
        return None
    oldest = candidates[: max(1, int(len(candidates) * FLIP_OLDEST_FRACTION))]
    segment, start, size = rng.choice(oldest)
    # Past the 61-byte header: the bytes of the records themselves, inside the CRC's range.
    position = start + HEADER_SIZE_BYTES + rng.randrange(max(1, size - HEADER_SIZE_BYTES))
    position = min(position, start + size - 1)
    with open(segment, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ (1 << rng.randrange(8))]))
    return Damage("flip", segment, position, start)


def cut_mid_batch(directory: Path, rng: random.Random) -> Damage | None:
    """Cut the last segment inside one of its last batches; None if it holds none."""
    segments = _segments(directory)
    if not segments:
        return None
    segment = segments[-1]
    batches = batch_positions(segment.read_bytes())
    if not batches:
        return None
    start, size = rng.choice(batches[-CUT_LAST_BATCHES:])
    length = start + 1 + rng.randrange(size - 1)  # at least one byte kept, one lost
    with open(segment, "r+b") as f:
        f.truncate(length)
    return Damage("cut", segment, length, start)
