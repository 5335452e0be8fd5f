"""Sparse offset and time indexes of one segment, kept in memory and appended to a file.

`.index`:     entries of (relative offset u32, position u32), big endian, 8 bytes each. An entry
              says: a batch whose base offset is base+relative starts at `position`.
`.timeindex`: entries of (timestamp i64, relative offset u32), 12 bytes each. An entry says:
              the batch at that offset has max timestamp `timestamp`, and no batch before it
              has a larger one, so a search for timestamp T may start at the last entry < T.

Indexes are an optimisation and never the truth: a file that fails its sanity checks (size not
a multiple of the entry size, entries not increasing, pointing past the log) is rebuilt from
the log by the segment.
"""

from __future__ import annotations

import bisect
import os
import struct
from array import array
from pathlib import Path

from raftlog.errors import LocalError

_OFFSET_ENTRY = struct.Struct(">II")
_TIME_ENTRY = struct.Struct(">qI")


class IndexMismatch(LocalError):
    """An index file does not match its log; the caller rebuilds it."""


class _IndexFile:
    entry: struct.Struct

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return self._fd

    def _append_bytes(self, data: bytes) -> None:
        os.write(self._open(), data)

    def _rewrite(self, data: bytes) -> None:
        self.close()
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)

    def fsync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class OffsetIndex(_IndexFile):
    entry = _OFFSET_ENTRY

    def __init__(self, path: Path, base_offset: int) -> None:
        super().__init__(path)
        self.base_offset = base_offset
        self.rel_offsets = array("q")
        self.positions = array("q")

    def __len__(self) -> int:
        return len(self.rel_offsets)

    def load(self, log_size_bytes: int) -> None:
        """Load and sanity-check the file; raises IndexMismatch if it cannot be trusted."""
        data = self.path.read_bytes() if self.path.exists() else b""
        if len(data) % self.entry.size:
            raise IndexMismatch(f"{self.path}: size {len(data)} is not a multiple of 8")
        rel, pos = array("q"), array("q")
        for r, p in self.entry.iter_unpack(data):
            if rel and (r <= rel[-1] or p <= pos[-1]):
                raise IndexMismatch(f"{self.path}: entries do not increase at offset {r}")
            if p >= log_size_bytes:
                raise IndexMismatch(f"{self.path}: entry points past the log ({p})")
            rel.append(r)
            pos.append(p)
        self.rel_offsets, self.positions = rel, pos

    def append(self, offset: int, position: int, *, write: bool = True) -> None:
        rel = offset - self.base_offset
        if self.rel_offsets and (rel <= self.rel_offsets[-1] or position <= self.positions[-1]):
            return  # not increasing: a duplicate after truncation; keep the index monotonic
        self.rel_offsets.append(rel)
        self.positions.append(position)
        if write:
            self._append_bytes(self.entry.pack(rel, position))

    def last_position(self) -> int:
        return self.positions[-1] if self.positions else 0

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last entry with offset <= `offset`, else (base, 0)."""
        i = bisect.bisect_right(self.rel_offsets, offset - self.base_offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + self.rel_offsets[i], self.positions[i]

    def entry_before(self, offset_limit: int, position_limit: int) -> tuple[int, int]:
        """The last entry with offset <= offset_limit and position <= position_limit."""
        i = bisect.bisect_right(self.rel_offsets, offset_limit - self.base_offset)
        j = bisect.bisect_right(self.positions, position_limit)
        k = min(i, j) - 1
        if k < 0:
            return self.base_offset, 0
        return self.base_offset + self.rel_offsets[k], self.positions[k]

    def truncate_to_position(self, position: int) -> None:
        """Drop entries at or past `position` (the log was cut there)."""
        k = bisect.bisect_left(self.positions, position)
        if k == len(self.positions):
            return
        del self.rel_offsets[k:]
        del self.positions[k:]
        self.write_all()

    def reset(self) -> None:
        self.rel_offsets, self.positions = array("q"), array("q")
        self.write_all()

    def write_all(self) -> None:
        self._rewrite(
            b"".join(
                self.entry.pack(r, p) for r, p in zip(self.rel_offsets, self.positions, strict=True)
            )
        )


class TimeIndex(_IndexFile):
    entry = _TIME_ENTRY

    def __init__(self, path: Path, base_offset: int) -> None:
        super().__init__(path)
        self.base_offset = base_offset
        self.timestamps = array("q")
        self.rel_offsets = array("q")

    def __len__(self) -> int:
        return len(self.timestamps)

    def load(self, next_offset: int) -> None:
        data = self.path.read_bytes() if self.path.exists() else b""
        if len(data) % self.entry.size:
            raise IndexMismatch(f"{self.path}: size {len(data)} is not a multiple of 12")
        ts, rel = array("q"), array("q")
        for t, r in self.entry.iter_unpack(data):
            if ts and (t <= ts[-1] or r < rel[-1]):
                raise IndexMismatch(f"{self.path}: entries do not increase at timestamp {t}")
            if self.base_offset + r >= next_offset:
                raise IndexMismatch(f"{self.path}: entry points past the log (offset {r})")
            ts.append(t)
            rel.append(r)
        self.timestamps, self.rel_offsets = ts, rel

    def maybe_append(self, timestamp_ms: int, offset: int, *, write: bool = True) -> None:
        if self.timestamps and timestamp_ms <= self.timestamps[-1]:
            return
        rel = offset - self.base_offset
        if self.rel_offsets and rel < self.rel_offsets[-1]:
            return
        self.timestamps.append(timestamp_ms)
        self.rel_offsets.append(rel)
        if write:
            self._append_bytes(self.entry.pack(timestamp_ms, rel))

    def max_timestamp(self) -> int:
        return self.timestamps[-1] if self.timestamps else -1

    def lookup(self, timestamp_ms: int) -> int:
        """An offset from which a scan finds the first batch with max timestamp >= target."""
        i = bisect.bisect_left(self.timestamps, timestamp_ms) - 1
        if i < 0:
            return self.base_offset
        return self.base_offset + self.rel_offsets[i]

    def truncate_to_offset(self, offset: int) -> None:
        k = bisect.bisect_left(self.rel_offsets, offset - self.base_offset)
        if k == len(self.rel_offsets):
            return
        del self.timestamps[k:]
        del self.rel_offsets[k:]
        self.write_all()

    def reset(self) -> None:
        self.timestamps, self.rel_offsets = array("q"), array("q")
        self.write_all()

    def write_all(self) -> None:
        self._rewrite(
            b"".join(
                self.entry.pack(t, r)
                for t, r in zip(self.timestamps, self.rel_offsets, strict=True)
            )
        )
