"""An in-memory partition log: one record per batch, (offset, epoch, payload), with a flushed mark.

Used by the replication unit tests and the partition simulator. `crash()` keeps only the
flushed prefix, as a power loss would. A running prefix digest lets the simulator compare
two logs up to an offset in O(1).
"""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.constants import UNDEFINED_EPOCH
from raftlog.replication.core.types import UNKNOWN_OFFSET


@dataclass(frozen=True)
class Entry:
    offset: int
    epoch: int
    payload: str


class MemoryLog:
    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._digests: list[int] = []
        self._log_start_offset = 0
        self._flushed_offset = 0
        # Bumped on every truncation so a flush started before it cannot mark new data.
        self.generation = 0

    # ------------------------------------------------------------------ ReplicaLogView
    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._log_start_offset + len(self.entries)

    @property
    def flushed_offset(self) -> int:
        return self._flushed_offset

    def latest_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else UNDEFINED_EPOCH

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        # Walk back to the last entry of an epoch <= `epoch`; its successor starts the next.
        for index in range(len(self.entries) - 1, -1, -1):
            entry = self.entries[index]
            if entry.epoch <= epoch:
                if entry.epoch == self.latest_epoch():
                    return entry.epoch, self.log_end_offset
                return entry.epoch, entry.offset + 1
        return UNDEFINED_EPOCH, UNKNOWN_OFFSET

    def truncate_to(self, offset: int) -> None:
        keep = max(0, offset - self._log_start_offset)
        if keep < len(self.entries):
            del self.entries[keep:]
            del self._digests[keep:]
            self.generation += 1
        self._flushed_offset = min(self._flushed_offset, self.log_end_offset)

    # ------------------------------------------------------------------ driver side
    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.entries.clear()
        self._digests.clear()
        self._log_start_offset = offset
        self._flushed_offset = offset
        self.generation += 1

    def append(self, epoch: int, payloads: list[str]) -> tuple[int, int]:
        """Leader append: assign offsets, stamp the leader epoch. Returns (first, last)."""
        first = self.log_end_offset
        for payload in payloads:
            self._push(Entry(self.log_end_offset, epoch, payload))
        return first, self.log_end_offset - 1

    def append_entries(self, entries: list[Entry]) -> None:
        """Follower append of the leader's entries; they must continue our log exactly."""
        for entry in entries:
            if entry.offset != self.log_end_offset:
                raise ValueError(f"append at {entry.offset}, LEO is {self.log_end_offset}")
            if entry.epoch < self.latest_epoch():
                raise ValueError(f"epoch {entry.epoch} after epoch {self.latest_epoch()}")
            self._push(entry)

    def _push(self, entry: Entry) -> None:
        previous = self._digests[-1] if self._digests else 0
        self.entries.append(entry)
        self._digests.append(hash((previous, entry.offset, entry.epoch, entry.payload)))

    def flush_to(self, offset: int) -> None:
        self._flushed_offset = max(self._flushed_offset, min(offset, self.log_end_offset))

    def crash(self) -> None:
        """Lose everything that was not fsynced."""
        self.truncate_to(self._flushed_offset)

    def read(self, start_offset: int, max_entries: int) -> list[Entry]:
        index = start_offset - self._log_start_offset
        return self.entries[max(0, index) : max(0, index) + max_entries]

    def entry_at(self, offset: int) -> Entry | None:
        index = offset - self._log_start_offset
        return self.entries[index] if 0 <= index < len(self.entries) else None

    def digest_below(self, offset: int) -> int:
        """Digest of every entry below `offset` (0 for an empty prefix)."""
        count = offset - self._log_start_offset
        if count <= 0:
            return 0
        return self._digests[count - 1]


class ReadOnlyView:
    """A MemoryLog seen through ReplicaLogView only, as the replication core must see a log.

    Any other attribute (truncate_to, append, flush_to, ...) fails the test: a core that
    writes to its log, instead of asking its driver to, is caught here.
    """

    def __init__(self, log: MemoryLog) -> None:
        self._log = log

    @property
    def log_start_offset(self) -> int:
        return self._log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._log.log_end_offset

    @property
    def flushed_offset(self) -> int:
        return self._log.flushed_offset

    def latest_epoch(self) -> int:
        return self._log.latest_epoch()

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self._log.end_offset_for_epoch(epoch)

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the replication core reached for log.{name}: not a read")
