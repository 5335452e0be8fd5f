"""One partition replica hosted by this broker, as the trio driver holds it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import trio

from raftlog.replication.partition import Partition
from raftlog.storage import PartitionLog

TopicPartition = tuple[str, int]


@dataclass(eq=False)
class HostedPartition:
    topic: str
    partition: int
    topic_id: uuid.UUID
    log: PartitionLog
    replica: Partition
    # Parked replica fetches (leader side) that name this partition. Set on LEO or HW advance
    # and on role changes, so a long-poll wakes on the event instead of polling the log.
    waiters: set[trio.Event] = field(default_factory=set)

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.partition)

    def wake_waiters(self) -> None:
        for event in self.waiters:
            event.set()
        self.waiters.clear()
