"""Leader-epoch cache: (epoch, start offset) pairs, KIP-101 / KIP-279 semantics.

Each entry says: epoch E's first offset in this log is S. Followers ask "where does my last
epoch end on the leader" (end_offset_for_epoch) to find the point where their log diverged.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from raftlog.constants import UNDEFINED_EPOCH

UNDEFINED_OFFSET = -1


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


class LeaderEpochCache:
    def __init__(self, entries: list[EpochEntry] | None = None) -> None:
        self.entries: list[EpochEntry] = list(entries or [])
        for a, b in zip(self.entries, self.entries[1:], strict=False):
            if not (a.epoch < b.epoch and a.start_offset <= b.start_offset):
                raise ValueError(f"epoch cache entries out of order: {a} then {b}")

    def latest_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset`; returns True when the cache changed.

        A new epoch replaces entries that conflict with it (an equal or later epoch, or one
        starting at or after this offset) so the cache stays strictly increasing in both.
        """
        if epoch < 0:
            return False
        if self.entries:
            last = self.entries[-1]
            if last.epoch == epoch and last.start_offset <= start_offset:
                return False
            if epoch < last.epoch and start_offset >= last.start_offset:
                return False  # an older epoch's batch after a newer epoch began: keep newest
        self.entries = [
            e for e in self.entries if e.epoch < epoch and e.start_offset < start_offset
        ]
        self.entries.append(EpochEntry(epoch, start_offset))
        return True

    def end_offset_for_epoch(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest epoch <= requested, the offset where it ends), as Kafka answers
        OffsetForLeaderEpoch. Unknown epochs give (-1, -1)."""
        if requested_epoch == UNDEFINED_EPOCH or not self.entries:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if requested_epoch == self.entries[-1].epoch:
            return requested_epoch, log_end_offset
        epochs = [e.epoch for e in self.entries]
        higher = bisect.bisect_right(epochs, requested_epoch)
        if higher == len(epochs):
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET  # newer than anything we know
        if higher == 0:
            # Older than our first epoch: it ends where our history starts (Kafka does this).
            return requested_epoch, self.entries[0].start_offset
        return self.entries[higher - 1].epoch, self.entries[higher].start_offset

    def truncate_from_end(self, end_offset: int) -> bool:
        """Forget epochs starting at or after end_offset (the log was truncated there)."""
        kept = [e for e in self.entries if e.start_offset < end_offset]
        changed = len(kept) != len(self.entries)
        self.entries = kept
        return changed

    def truncate_from_start(self, start_offset: int) -> bool:
        """The log now starts at start_offset: the epoch covering it starts there."""
        below = [e for e in self.entries if e.start_offset <= start_offset]
        if not below:
            return False
        kept = [EpochEntry(below[-1].epoch, start_offset)] + [
            e for e in self.entries if e.start_offset > start_offset
        ]
        changed = kept != self.entries
        self.entries = kept
        return changed

    def clear(self) -> None:
        self.entries = []

    def to_payload(self) -> dict[str, object]:
        return {"entries": [[e.epoch, e.start_offset] for e in self.entries]}

    @classmethod
    def from_payload(cls, payload: dict[str, object]) -> LeaderEpochCache:
        raw = payload.get("entries", [])
        assert isinstance(raw, list)
        return cls([EpochEntry(int(a), int(b)) for a, b in raw])
