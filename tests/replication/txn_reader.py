"""A read_committed consumer's filtering, as Kafka's Java consumer does it (Fetcher /
CompletedFetch): the aborted transactions of a fetch answer, ordered by first offset, mark a
producer aborted once a batch reaches the first offset; its transactional batches are skipped
until its ABORT marker; control batches are never delivered."""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from raftlog.records import Record, iter_batches, iter_records, parse_txn_marker


class CommittedReader:
    def __init__(self) -> None:
        self.records: list[Record] = []
        self.next_offset = 0

    def consume(self, data: bytes, aborted: Iterable[tuple[int, int]]) -> None:
        """One fetch answer: whole batches from `self.next_offset` and its aborted list."""
        queue = [(first, pid) for pid, first in aborted]
        heapq.heapify(queue)
        aborted_pids: set[int] = set()
        for pos, header in iter_batches(data):
            if header.last_offset < self.next_offset:
                continue
            if header.producer_id >= 0:
                while queue and queue[0][0] <= header.last_offset:
                    aborted_pids.add(heapq.heappop(queue)[1])
                marker = parse_txn_marker(data, pos) if header.is_control else None
                if marker is not None and not marker.commit:
                    aborted_pids.discard(header.producer_id)
                elif header.is_transactional and header.producer_id in aborted_pids:
                    self.next_offset = header.next_offset
                    continue
            if not header.is_control:
                self.records.extend(
                    r for r in iter_records(data, pos) if r.offset >= self.next_offset
                )
            self.next_offset = header.next_offset
