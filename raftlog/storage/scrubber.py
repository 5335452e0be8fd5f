"""The background scrubber's decisions (sans-IO) and its one blocking step.

Recovery scans only from the recovery point, so a byte that flips in a segment below it (a
committed batch, after a clean shutdown) would be served for ever. The scrubber re-reads every
segment of every hosted log, batch by batch, and checks what recovery checks: size bounds,
magic, CRC32C, offsets that continue. It runs for ever at a bounded rate, one pass after
another, so a damaged batch is found within about (bytes hosted / rate) seconds.

`ScrubSchedule` decides which byte range to verify next and when (a cursor over the logs and
a pacer); it never reads a file or a clock. `verify_range` is the blocking read the driver
runs in a worker thread. What to do about damage (truncate and fetch again, or stop serving)
is the replication driver's decision (replication/scrub.py).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import crc32c

from raftlog.errors import CorruptRecordError
from raftlog.records import (
    ATTRIBUTES_OFFSET,
    HEADER_SIZE_BYTES,
    HEADER_STRUCT,
    LOG_OVERHEAD_BYTES,
    MAGIC_V2,
    BatchHeader,
    batch_size_at,
    validate_batch,
)
from raftlog.storage.log_types import UnverifiedRead
from raftlog.storage.segment import LogSegment

# One verification step reads at most this much (or one batch, if a batch is bigger): large
# enough to amortise a thread hop, small enough that pacing stays smooth.
SCRUB_CHUNK_BYTES = 1024 * 1024
# A pass starts at least this long after the previous one started: a node with little data
# does not re-read it back to back (detection latency stays within a minute or one pass).
SCRUB_PASS_INTERVAL_S = 60.0

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class SegmentExtent:
    """What the schedule needs to know of one segment: where it starts and how long it is."""

    base_offset: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class ScrubRange:
    """Verify the whole batches of one segment from `start_position` (a batch boundary, the
    batch there holding `expected_offset`) up to `end_position` (a batch that does not end
    by then is left for the next range, unless it is the first one)."""

    key: TopicPartition
    base_offset: int
    start_position: int
    end_position: int
    expected_offset: int
    segment_size_bytes: int


@dataclass(frozen=True, slots=True)
class ScrubResult:
    """Where verification stopped; `damage` says why it stopped early at a bad batch."""

    position: int  # after the last good batch
    next_offset: int  # the offset the batch at `position` should start at
    bytes_read: int  # what the pacing charges (a batch cut by the chunk's end is read twice)
    damage: str | None = None


class ScrubSchedule:
    """Which range to verify next, paced to `bytes_per_s`.

    Pacing: each verified byte costs 1/bytes_per_s seconds of a budget that does not
    accumulate while idle, so the rate never exceeds the limit over any window longer than one
    step. The cursor walks the logs in key order, each log's segments in offset order, and
    starts over at the first log after the last.
    """

    def __init__(
        self,
        *,
        bytes_per_s: int,
        chunk_bytes: int = SCRUB_CHUNK_BYTES,
        pass_interval_s: float = SCRUB_PASS_INTERVAL_S,
    ) -> None:
        if bytes_per_s <= 0:
            raise ValueError(f"bytes_per_s must be positive, got {bytes_per_s}")
        self.bytes_per_s = bytes_per_s
        # One step never reads more than a second's worth, so a slow limit stays smooth.
        self.chunk_bytes = max(LOG_OVERHEAD_BYTES, min(chunk_bytes, bytes_per_s))
        self.pass_interval_s = pass_interval_s
        self._ready_at_s = 0.0
        self._pass_started_s = 0.0
        # Cursor: the next byte to verify.
        self._key: TopicPartition | None = None
        self._base_offset = -1
        self._position = 0
        self._expected_offset = -1
        self.passes = 0  # completed passes over every log (status, tests)
        self.bytes_verified = 0
        self._bytes_this_pass = 0

    def next_step(
        self,
        *,
        now_s: float,
        keys: Sequence[TopicPartition],
        segments_of: Callable[[TopicPartition], Sequence[SegmentExtent]],
    ) -> ScrubRange | float | None:
        """The next range to verify, or the time (s) to wait until, or None: nothing hosted
        holds a byte. `keys` must be sorted."""
        if now_s < self._ready_at_s:
            return self._ready_at_s
        if not keys:
            return None
        start = 0
        if self._key is not None:
            start = bisect.bisect_left(keys, self._key)
        # At most one full turn over the keys (+1 to come back to the cursor's own log).
        for turn in range(len(keys) + 1):
            i = start + turn
            if i >= len(keys):
                if i == len(keys):
                    # Past the last log: a new pass from the first, once the interval allows.
                    self._key = None
                    if self._bytes_this_pass:
                        self.passes += 1
                        self._bytes_this_pass = 0
                        start_s = max(now_s, self._pass_started_s + self.pass_interval_s)
                        self._pass_started_s = start_s
                        if start_s > now_s:
                            self._ready_at_s = start_s
                            return start_s
                i %= len(keys)
            key = keys[i]
            if key != self._key:
                self._key, self._base_offset, self._position, self._expected_offset = (
                    key,
                    -1,
                    0,
                    -1,
                )
            found = self._next_in_log(key, segments_of(key))
            if found is not None:
                return found
            self._base_offset = 2**63  # nothing left in this log: move to the next one
        return None

    def _next_in_log(
        self, key: TopicPartition, segments: Sequence[SegmentExtent]
    ) -> ScrubRange | None:
        for segment in segments:
            if segment.base_offset < self._base_offset:
                continue
            if segment.base_offset > self._base_offset:
                # A segment we have not started (or the one we were in was deleted).
                self._base_offset = segment.base_offset
                self._position = 0
                self._expected_offset = segment.base_offset
            if self._position < segment.size_bytes:
                return ScrubRange(
                    key,
                    segment.base_offset,
                    self._position,
                    min(segment.size_bytes, self._position + self.chunk_bytes),
                    self._expected_offset,
                    segment.size_bytes,
                )
        return None

    def _charge(self, now_s: float, bytes_read: int) -> None:
        self._ready_at_s = max(self._ready_at_s, now_s) + bytes_read / self.bytes_per_s

    def on_verified(self, *, now_s: float, step: ScrubRange, result: ScrubResult) -> None:
        """Charge the bytes read and move the cursor past the verified batches; past damage
        too (the driver repairs it; the next pass checks the repair)."""
        self._charge(now_s, result.bytes_read)
        verified = max(0, result.position - step.start_position)
        self.bytes_verified += verified
        self._bytes_this_pass += verified
        if (step.key, step.base_offset) != (self._key, self._base_offset):
            return  # the cursor moved on meanwhile
        if result.damage is not None:
            self._base_offset += 1  # the rest of this segment is past the damage: skip it
            self._position = 0
        elif result.position > self._position:
            self._position = result.position
            self._expected_offset = result.next_offset
        else:
            # No whole batch fitted and none was bad (a segment shrank under us): go on.
            self._base_offset += 1
            self._position = 0

    def on_skipped(self, *, now_s: float, step: ScrubRange) -> None:
        """The log changed under the step (truncated, removed): verify that segment again
        from its start on the next visit. The read still costs its bytes, so a log that keeps
        changing cannot make the scrubber spin."""
        self._charge(now_s, step.end_position - step.start_position)
        if (step.key, step.base_offset) == (self._key, self._base_offset):
            self._position = 0
            self._expected_offset = step.base_offset


def verify_read(read: UnverifiedRead) -> ScrubResult:
    """Check the batches of a read before they are served (blocking: a worker thread):
    the bytes were taken on trust at start-up, and a damaged batch must never reach a
    consumer or a follower. `damage` set means the read must stop at `next_offset`."""
    segment = read.segment
    step = ScrubRange(
        key=("", -1),
        base_offset=segment.base_offset,
        start_position=read.start_position,
        end_position=read.end_position,
        expected_offset=read.first_batch_offset,
        segment_size_bytes=segment.size_bytes,
    )
    return verify_range(segment, step, allow_gaps=read.allow_gaps)


def verify_range(segment: LogSegment, step: ScrubRange, *, allow_gaps: bool) -> ScrubResult:
    """Read and check the batches of `step` (blocking: a worker thread).

    Offsets must continue exactly from `step.expected_offset` (they only increase in a
    compacted log, where `allow_gaps`). A damaged batch stops the walk: `next_offset` is then
    the first offset that cannot be trusted, the one a repair truncates to.
    """
    position = step.start_position
    end = step.end_position
    fd = segment.file.fileno()
    data = os.pread(fd, end - position, position)
    if len(data) >= LOG_OVERHEAD_BYTES:
        # A first batch bigger than the chunk is checked piece by piece: its length field
        # may itself be damaged, and memory stays bounded by the chunk either way.
        first = batch_size_at(data, 0)
        if first > len(data) and position + first <= step.segment_size_bytes:
            return _verify_large_batch(
                fd, step, first, max(len(data), HEADER_SIZE_BYTES), allow_gaps=allow_gaps
            )
    expected = step.expected_offset
    rel = 0
    while rel + LOG_OVERHEAD_BYTES <= len(data):
        size = batch_size_at(data, rel)
        if size > len(data) - rel:
            if rel == 0 or position + rel + size > step.segment_size_bytes:
                return ScrubResult(
                    position + rel,
                    expected,
                    len(data),
                    f"batch at byte {position + rel} claims {size} bytes, past the segment's "
                    f"end at {step.segment_size_bytes}",
                )
            break  # ends in the next range
        try:
            header = validate_batch(data, rel)
        except CorruptRecordError as exc:
            reason = str(exc).replace(f"at byte {rel}", f"at byte {position + rel}", 1)
            return ScrubResult(position + rel, expected, len(data), reason)
        if header.base_offset != expected and not (allow_gaps and header.base_offset > expected):
            return ScrubResult(
                position + rel,
                expected,
                len(data),
                f"batch at byte {position + rel} has base offset {header.base_offset}, "
                f"expected {expected}",
            )
        expected = header.next_offset
        rel += size
    if rel == 0 and position < step.segment_size_bytes and end >= step.segment_size_bytes:
        return ScrubResult(
            position,
            expected,
            len(data),
            f"{step.segment_size_bytes - position} bytes at byte {position} are not a whole batch",
        )
    return ScrubResult(position + rel, expected, len(data))


def _verify_large_batch(
    fd: int, step: ScrubRange, size: int, chunk_bytes: int, *, allow_gaps: bool
) -> ScrubResult:
    """The checks of validate_batch for one batch larger than a chunk, CRC32C computed over
    chunk-sized reads."""
    position = step.start_position
    expected = step.expected_offset

    def damaged(why: str, bytes_read: int) -> ScrubResult:
        return ScrubResult(position, expected, bytes_read, f"batch at byte {position} {why}")

    if size < HEADER_SIZE_BYTES:
        return damaged(f"has impossible batchLength {size - LOG_OVERHEAD_BYTES}", 0)
    head = os.pread(fd, HEADER_SIZE_BYTES, position)
    if len(head) < HEADER_SIZE_BYTES:
        return damaged("has no whole header", len(head))
    header = BatchHeader._make(HEADER_STRUCT.unpack(head))
    if header.magic != MAGIC_V2:
        return damaged(f"has magic {header.magic}", len(head))
    if header.last_offset_delta < 0 or header.record_count < 0:
        return damaged("has a negative lastOffsetDelta or recordCount", len(head))
    crc = 0
    offset = position + ATTRIBUTES_OFFSET
    end = position + size
    while offset < end:
        piece = os.pread(fd, min(chunk_bytes, end - offset), offset)
        if not piece:
            return damaged(f"ends at byte {offset}, before its {size} bytes", offset - position)
        crc = crc32c.crc32c(piece, crc)
        offset += len(piece)
    if crc != header.crc:
        return damaged(
            f"(baseOffset {header.base_offset}) fails CRC32C: stored {header.crc:#010x}, "
            f"computed {crc:#010x}",
            size,
        )
    if header.base_offset != expected and not (allow_gaps and header.base_offset > expected):
        return damaged(f"has base offset {header.base_offset}, expected {expected}", size)
    return ScrubResult(position + size, header.next_offset, size)
