"""Read committed records: fetch_range() for a bounded read, poll() for a simple loop.

Fetches go to the partition leader with its current leader epoch; leadership errors refresh
metadata and retry. A broker only returns records below the high watermark, so nothing read
here can later disappear. A fetch response may end in a partial batch (the broker cuts at
max_bytes); that tail is ignored and fetched again from its start next time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from raftlog.client.cluster import Cluster, raise_for
from raftlog.client.protocol import throttle_time_ms
from raftlog.errors import ErrorCode
from raftlog.records import LOG_OVERHEAD_BYTES, Record, batch_size_at, iter_batches, iter_records

DEFAULT_FETCH_MAX_BYTES = 1024 * 1024
DEFAULT_FETCH_MAX_WAIT_MS = 500


@dataclass(frozen=True)
class RawFetch:
    error: ErrorCode  # none, or offset_out_of_range (every other error is raised)
    data: bytes  # record batches as the broker sent them; may end in a cut batch
    high_watermark: int
    log_start_offset: int
    throttle_time_ms: int = 0


@dataclass(frozen=True)
class FetchResult:
    records: list[Record]
    high_watermark: int
    throttle_time_ms: int


def whole_batches(data: bytes) -> bytes:
    """The prefix of data made of complete batches."""
    pos = 0
    while pos + LOG_OVERHEAD_BYTES <= len(data):
        size = batch_size_at(data, pos)
        if pos + size > len(data):
            break
        pos += size
    return data[:pos]


def decode_records(data: bytes | None) -> list[Record]:
    """Records of every complete data batch (control batches are skipped)."""
    if not data:
        return []
    data = whole_batches(bytes(data))
    out: list[Record] = []
    for pos, header in iter_batches(data):
        if not header.is_control:
            out.extend(iter_records(data, pos))
    return out


class Consumer:
    def __init__(
        self,
        cluster: Cluster,
        *,
        max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
        max_wait_ms: int = DEFAULT_FETCH_MAX_WAIT_MS,
    ) -> None:
        self.cluster = cluster
        self.max_bytes = max_bytes
        self.max_wait_ms = max_wait_ms

    async def fetch_raw(
        self, topic: str, partition: int, offset: int, *, max_bytes: int | None = None
    ) -> RawFetch:
        """One fetch at offset from the leader, the record bytes undecoded (leadership errors
        retried). OFFSET_OUT_OF_RANGE is answered, not raised: whether it means data loss
        (below the log start) is the caller's decision."""
        max_bytes = self.max_bytes if max_bytes is None else max_bytes

        async def attempt() -> RawFetch:
            connection, info = await self.cluster.leader(topic, partition)
            values = {
                "replica_id": -1,
                "max_wait": self.max_wait_ms,
                "min_bytes": 1,
                "max_bytes": max_bytes,
                "isolation_level": 0,
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
            )

        return await self.cluster.retrying(attempt, refresh_topics=[topic])

    async def fetch(self, topic: str, partition: int, offset: int) -> FetchResult:
        """One fetch at offset from the leader (retrying leadership errors), decoded."""
        raw = await self.fetch_raw(topic, partition, offset)
        raise_for(raw.error, f"fetch {topic}-{partition} at {offset}")
        records = [r for r in decode_records(raw.data) if r.offset >= offset]
        return FetchResult(records, raw.high_watermark, raw.throttle_time_ms)

    async def fetch_range(
        self, topic: str, partition: int, start: int, end: int | None = None
    ) -> list[Record]:
        """Records with start <= offset < end; end is clamped to the high watermark.

        end=None reads up to the high watermark seen by the first fetch.
        """
        out: list[Record] = []
        offset = start
        while end is None or offset < end:
            result = await self.fetch(topic, partition, offset)
            limit = result.high_watermark if end is None else min(end, result.high_watermark)
            end = limit if end is None else end
            out.extend(r for r in result.records if r.offset < limit)
            if result.records:
                offset = max(offset, result.records[-1].offset + 1)
            if offset >= limit or not result.records:
                break
        return out

    async def poll(self, topic: str, partition: int, start: int = 0) -> AsyncIterator[list[Record]]:
        """Yield each non-empty fetch's records forever, from start (long-polls the leader)."""
        offset = start
        while True:
            result = await self.fetch(topic, partition, offset)
            if result.records:
                offset = result.records[-1].offset + 1
                yield result.records
