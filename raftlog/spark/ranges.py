"""Offset ranges and how they are cut into Spark splits (pure; no I/O).

A range is [start, end) of one partition. Cutting follows Spark's Kafka source
(KafkaOffsetRangeCalculator): maxRecordsPerPartition caps every split, and minPartitions,
when larger than the number of ranges, divides the ranges in proportion to their size.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Records start <= offset < end of topic-partition."""

    topic: str
    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"bad offset range {self}: need 0 <= start <= end")

    @property
    def size(self) -> int:
        return self.end - self.start


def cut(rng: OffsetRange, parts: int) -> list[OffsetRange]:
    """rng in `parts` contiguous pieces whose sizes differ by at most one."""
    parts = max(1, min(parts, rng.size))
    bounds = [rng.start + rng.size * i // parts for i in range(parts + 1)]
    return [
        OffsetRange(rng.topic, rng.partition, lo, hi)
        for lo, hi in itertools.pairwise(bounds)
        if hi > lo
    ]


def split_ranges(
    ranges: Iterable[OffsetRange],
    *,
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> list[OffsetRange]:
    """The splits to read: empty ranges dropped, sorted by topic, partition and start."""
    splits = sorted(r for r in ranges if r.size > 0)
    if max_records_per_partition is not None:
        if max_records_per_partition < 1:
            raise ValueError("max_records_per_partition must be >= 1")
        splits = [
            piece
            for r in splits
            for piece in cut(r, -(-r.size // max_records_per_partition))  # ceil
        ]
    if min_partitions is not None and min_partitions > len(splits) and splits:
        total = sum(r.size for r in splits)
        # Spark's rule: a range gets round-half-up(size / total * minPartitions) pieces, at
        # least one; the rounding may give a few splits more or fewer than asked, never empty.
        splits = [
            piece
            for r in splits
            for piece in cut(r, max(1, int(r.size / total * min_partitions + 0.5)))
        ]
    return sorted(splits)
