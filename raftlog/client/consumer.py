"""Read committed records: fetch_range() for a bounded read, poll() for a simple loop.

Fetches go to the partition leader with its current leader epoch; leadership errors refresh
metadata and retry. A broker only returns records below the high watermark, so nothing read
here can later disappear. A fetch response may end in a partial batch (the broker cuts at
max_bytes); that tail is ignored and fetched again from its start next time.

Isolation (KIP-98): read_uncommitted (the default) returns every data record below the high
watermark; read_committed reads only below the last stable offset (LSO) and leaves out the
records of aborted transactions, found as Kafka's consumer finds them, from the response's
aborted_transactions list (see VisibleBatches). Control batches (transaction markers) are
never returned as records under either level, but a read moves past them.
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass

from raftlog.client.admin import ListedOffset, list_offset
from raftlog.client.cluster import Cluster, raise_for
from raftlog.client.protocol import IsolationLevel, throttle_time_ms
from raftlog.constants import MIB
from raftlog.errors import ErrorCode
from raftlog.records import (
    LOG_OVERHEAD_BYTES,
    NO_PRODUCER_ID,
    BatchHeader,
    ControlType,
    Record,
    batch_size_at,
    control_type_of,
    iter_batches,
    iter_records,
)

DEFAULT_FETCH_MAX_BYTES = 1024 * 1024
DEFAULT_FETCH_MAX_WAIT_MS = 500
# What decoding one read (a fetch here, a chunk of fetches in the Spark source) may build
# before it stops at a batch boundary; the rest is fetched again from there. Each batch is
# bounded when it is produced (max.message.bytes, compression.DECOMPRESSED_BATCH_MAX_BYTES),
# but a response of many small, highly compressed batches would otherwise expand to thousands
# of times its size in memory.
DECODED_READ_MAX_BYTES = 256 * MIB
# What one decoded record, and one of its headers, cost beyond the bytes they hold (their
# Python objects), so a batch of many empty records or headers (4 bytes a header on the wire)
# weighs what it takes in memory: about 110 bytes a record and 100 a header here, and 190 more
# a header as the Spark source's {"key", "value"} row.
DECODED_RECORD_OVERHEAD_BYTES = 128
DECODED_HEADER_OVERHEAD_BYTES = 320


@dataclass(frozen=True, order=True)
class AbortedTxn:
    """One entry of a read_committed fetch's aborted_transactions: the producer's aborted
    transaction began at first_offset (and ends at that producer's next ABORT marker)."""

    first_offset: int
    producer_id: int


@dataclass(frozen=True)
class RawFetch:
    error: ErrorCode  # none, or offset_out_of_range (every other error is raised)
    data: bytes  # record batches as the broker sent them; may end in a cut batch
    high_watermark: int
    log_start_offset: int
    throttle_time_ms: int = 0
    # The broker's LSO (read_committed never gets data at or past it); -1 when not sent.
    last_stable_offset: int = -1
    aborted_transactions: tuple[AbortedTxn, ...] = ()


@dataclass(frozen=True)
class FetchResult:
    records: list[Record]
    high_watermark: int
    throttle_time_ms: int
    last_stable_offset: int = -1
    # The offset after the last batch decoded (control batches and aborted transactions'
    # batches included, so a read moves past them): the end of the response's whole batches,
    # or where the decode budget stopped; -1 when it held none.
    next_offset: int = -1


def whole_batches(data: bytes) -> bytes:
    """The prefix of data made of complete batches."""
    pos = 0
    while pos + LOG_OVERHEAD_BYTES <= len(data):
        size = batch_size_at(data, pos)
        if pos + size > len(data):
            break
        pos += size
    return data[:pos]


class VisibleBatches:
    """Which batches of one fetch response a consumer returns (sans-IO; Kafka's
    CompletedFetch rule).

    read_uncommitted: every data batch. read_committed: a transactional batch is left out
    when its producer has an aborted transaction open at it: the response's aborted list,
    sorted by first offset, adds a producer once a batch reaches that transaction's first
    offset, and the producer's ABORT marker removes it again. Control batches are never
    visible. Batches must be fed in offset order, each once.
    """

    def __init__(
        self,
        isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
        aborted: Iterable[AbortedTxn] = (),
    ) -> None:
        self.isolation_level = isolation_level
        self._pending = sorted(aborted)  # a sorted list is a heap
        self._aborted_producers: set[int] = set()

    def visible(self, data: bytes | memoryview, pos: int, header: BatchHeader) -> bool:
        """Whether the (validated) batch at pos of data holds records to return."""
        if (
            self.isolation_level is IsolationLevel.READ_COMMITTED
            and header.producer_id != NO_PRODUCER_ID
        ):
            while self._pending and self._pending[0].first_offset <= header.last_offset:
                self._aborted_producers.add(heapq.heappop(self._pending).producer_id)
            if header.is_control:
                if _is_abort_marker(data, pos, header):
                    self._aborted_producers.discard(header.producer_id)
            elif header.is_transactional and header.producer_id in self._aborted_producers:
                return False
        return not header.is_control


def _is_abort_marker(data: bytes | memoryview, pos: int, header: BatchHeader) -> bool:
    """Whether a control batch is an ABORT marker (its first record's key says so; Kafka
    reads only the first). Raises CorruptRecordError on a malformed control key."""
    if header.record_count < 1:
        return False
    first = next(iter_records(data, pos), None)
    return first is not None and control_type_of(first.key) == ControlType.ABORT


def iter_visible_batches(
    data: bytes,
    isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    aborted: Iterable[AbortedTxn] = (),
) -> Iterator[tuple[int, BatchHeader, bool]]:
    """(position, header, visible) of every whole batch of data, in order (see
    VisibleBatches for `visible`); a cut batch at the end is left out."""
    data = whole_batches(data)
    rule = VisibleBatches(isolation_level, aborted)
    for pos, header in iter_batches(data):
        yield pos, header, rule.visible(data, pos, header)


def decoded_size_bytes(records: Sequence[Record]) -> int:
    """What `records` take in memory once decoded, as DECODED_READ_MAX_BYTES counts it (a
    plain loop: a few percent of what decoding the records cost)."""
    total = DECODED_RECORD_OVERHEAD_BYTES * len(records)
    for r in records:
        total += len(r.key or b"") + len(r.value or b"")
        if r.headers:
            total += sum(
                DECODED_HEADER_OVERHEAD_BYTES + len(k) + len(v or b"") for k, v in r.headers
            )
    return total


@dataclass(frozen=True)
class DecodedFetch:
    records: list[Record]
    # The offset after the last batch decoded (control and aborted batches included, so a
    # read moves past them); -1 when data held no whole batch.
    next_offset: int


def decode_records(
    data: bytes | None,
    isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    aborted: Iterable[AbortedTxn] = (),
    budget_bytes: int = DECODED_READ_MAX_BYTES,
) -> DecodedFetch:
    """Records of the complete visible batches of data, in order (control batches are skipped,
    and under read_committed aborted transactions' batches too). Decoding stops after the
    batch that brings the decoded size to `budget_bytes` (at least one batch is decoded, so a
    read always moves on); next_offset says where the next read starts."""
    out: list[Record] = []
    next_offset = -1
    if not data:
        return DecodedFetch(out, next_offset)
    data = bytes(data)
    spent_bytes = 0
    for pos, header, visible in iter_visible_batches(data, isolation_level, aborted):
        next_offset = max(next_offset, header.next_offset)
        if visible:
            records = list(iter_records(data, pos))
            out.extend(records)
            spent_bytes += decoded_size_bytes(records)
            if spent_bytes >= budget_bytes:
                break
    return DecodedFetch(out, next_offset)


def _aborted_of(answer: object) -> tuple[AbortedTxn, ...]:
    entries = getattr(answer, "aborted_transactions", None) or ()
    out = []
    for entry in entries:
        producer_id, first_offset = int(entry.producer_id), int(entry.first_offset)
        # From outside the process: an entry that cannot be a transaction is ignored, not
        # trusted (it could only hide records).
        if producer_id >= 0 and first_offset >= 0:
            out.append(AbortedTxn(first_offset, producer_id))
    return tuple(out)


class Consumer:
    """Fetches of one isolation level (read_uncommitted unless asked); every method also
    takes isolation_level to override it for one call."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
        max_wait_ms: int = DEFAULT_FETCH_MAX_WAIT_MS,
        isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
        decode_budget_bytes: int = DECODED_READ_MAX_BYTES,
    ) -> None:
        self.cluster = cluster
        self.max_bytes = max_bytes
        self.max_wait_ms = max_wait_ms
        self.isolation_level = IsolationLevel(isolation_level)
        # What one fetch may decode (decode_records); the bound is per fetch: fetch_range
        # collects every record of its range, so it is for ranges a caller means to hold.
        self.decode_budget_bytes = decode_budget_bytes

    def _level(self, isolation_level: IsolationLevel | None) -> IsolationLevel:
        return self.isolation_level if isolation_level is None else IsolationLevel(isolation_level)

    async def fetch_raw(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int | None = None,
        isolation_level: IsolationLevel | None = None,
    ) -> RawFetch:
        """One fetch at offset from the leader, the record bytes undecoded (leadership errors
        retried). OFFSET_OUT_OF_RANGE is answered, not raised: whether it means data loss
        (below the log start) is the caller's decision. Under read_committed the answer
        carries the aborted transactions to leave out (decode with VisibleBatches)."""
        max_bytes = self.max_bytes if max_bytes is None else max_bytes
        level = self._level(isolation_level)

        async def attempt() -> RawFetch:
            connection, info = await self.cluster.leader(topic, partition)
            values = {
                "replica_id": -1,
                "max_wait": self.max_wait_ms,
                "min_bytes": 1,
                "max_bytes": max_bytes,
                "isolation_level": int(level),
                "session_id": 0,
                "session_epoch": -1,
                "topics": [
                    {
                        "topic": topic,
                        "partitions": [
                            {
                                "partition": partition,
                                "current_leader_epoch": info.leader_epoch,
                                "fetch_offset": offset,
                                "last_fetched_epoch": -1,
                                "log_start_offset": -1,
                                "partition_max_bytes": max_bytes,
                            }
                        ],
                    }
                ],
                "forgotten_topics_data": [],
                "rack_id": "",
            }
            response = await connection.call("fetch", values)
            raise_for(getattr(response, "error_code", 0), f"fetch {topic}-{partition}")
            answer = response.responses[0].partitions[0]
            error = ErrorCode(int(answer.error_code))
            if error != ErrorCode.offset_out_of_range:
                raise_for(error, f"fetch {topic}-{partition} at {offset}")
            return RawFetch(
                error,
                bytes(answer.records or b""),
                int(answer.high_watermark),
                int(getattr(answer, "log_start_offset", -1)),
                throttle_time_ms(response),
                int(getattr(answer, "last_stable_offset", -1)),
                _aborted_of(answer) if level is IsolationLevel.READ_COMMITTED else (),
            )

        return await self.cluster.retrying(attempt, refresh_topics=[topic])

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        isolation_level: IsolationLevel | None = None,
    ) -> FetchResult:
        """One fetch at offset from the leader (retrying leadership errors), decoded: the
        visible records at or after offset."""
        level = self._level(isolation_level)
        raw = await self.fetch_raw(topic, partition, offset, isolation_level=level)
        raise_for(raw.error, f"fetch {topic}-{partition} at {offset}")
        decoded = decode_records(
            raw.data, level, raw.aborted_transactions, self.decode_budget_bytes
        )
        records = [r for r in decoded.records if r.offset >= offset]
        return FetchResult(
            records,
            raw.high_watermark,
            raw.throttle_time_ms,
            raw.last_stable_offset,
            decoded.next_offset,
        )

    def _readable_end(self, result: FetchResult, level: IsolationLevel) -> int:
        """Where a read of this level stops: the LSO under read_committed, else the HW."""
        if level is IsolationLevel.READ_COMMITTED and result.last_stable_offset >= 0:
            return min(result.last_stable_offset, result.high_watermark)
        return result.high_watermark

    async def fetch_range(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int | None = None,
        *,
        isolation_level: IsolationLevel | None = None,
    ) -> list[Record]:
        """Visible records with start <= offset < end; end is clamped to the high watermark
        (read_committed: to the last stable offset).

        end=None reads up to the high watermark (LSO) seen by the first fetch.
        """
        level = self._level(isolation_level)
        out: list[Record] = []
        offset = start
        while end is None or offset < end:
            result = await self.fetch(topic, partition, offset, isolation_level=level)
            readable = self._readable_end(result, level)
            limit = readable if end is None else min(end, readable)
            end = limit if end is None else end
            out.extend(r for r in result.records if r.offset < limit)
            if result.next_offset <= offset:
                break  # nothing more below the limit yet
            offset = result.next_offset
            if offset >= limit:
                break
        return out

    async def poll(
        self,
        topic: str,
        partition: int,
        start: int = 0,
        *,
        isolation_level: IsolationLevel | None = None,
    ) -> AsyncIterator[list[Record]]:
        """Yield each non-empty fetch's visible records forever, from start (long-polls the
        leader); control batches and aborted transactions move the position silently."""
        level = self._level(isolation_level)
        offset = start
        while True:
            result = await self.fetch(topic, partition, offset, isolation_level=level)
            if result.next_offset > offset:
                offset = result.next_offset
            if result.records:
                yield result.records

    async def list_offset(
        self,
        topic: str,
        partition: int,
        spec: str | int = "latest",
        *,
        isolation_level: IsolationLevel | None = None,
    ) -> ListedOffset:
        """ListOffsets at this consumer's isolation level (see list_offset)."""
        return await list_offset(self.cluster, topic, partition, spec, self._level(isolation_level))
