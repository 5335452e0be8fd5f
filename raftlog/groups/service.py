"""GroupService: the seam between the Kafka protocol handlers and the node's coordinator.

The handlers (raftlog/net/kafka/handlers_groups.py) need two things from a node:
- where a group's coordinator is: the leader of `__consumer_offsets` partition
  partition_for_group(group_id, offsets_topic_num_partitions), or
  COORDINATOR_NOT_AVAILABLE while that partition has no leader or the topic does not exist
  yet (the node creates it on demand, as Kafka does on the first FindCoordinator);
- the GroupCoordinatorShell serving the offsets partitions this node leads. The shell itself
  answers NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS for groups on other partitions, so
  a client that raced a leader change looks the coordinator up again.

`InProcessGroupService` is the single-node implementation the protocol tests use: it owns
every offsets partition and keeps the "replicated" records in memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import trio

from raftlog.clock import wall_clock_ms
from raftlog.errors import ErrorCode
from raftlog.groups.coordinator import GroupCoordinator, TxnProducer
from raftlog.groups.coordinator_shell import GroupCoordinatorShell
from raftlog.groups.offsets_format import LogEntry, Record, TxnEnd, TxnRecord
from raftlog.groups.settings import GroupConfig

NO_NODE_ID = -1


class CoordinatorLocation(NamedTuple):
    """FindCoordinator's answer for one key: (error_code, node_id, host, port); node_id -1,
    host "" and port -1 on error."""

    error_code: ErrorCode
    node_id: int = NO_NODE_ID
    host: str = ""
    port: int = -1


class GroupService(Protocol):
    """What the node provides to the group protocol handlers."""

    async def coordinator_for(self, group_id: str) -> CoordinatorLocation:
        """The broker coordinating `group_id` (its advertised client endpoint), or
        COORDINATOR_NOT_AVAILABLE while the offsets partition has no leader or the offsets
        topic does not exist yet. Must not block on the topic's creation: start it and
        answer COORDINATOR_NOT_AVAILABLE, the client retries."""
        ...

    @property
    def shell(self) -> GroupCoordinatorShell:
        """The running shell of this node's coordinator (serves only the offsets partitions
        this node leads; NOT_COORDINATOR for the rest)."""
        ...


class InProcessGroupService:
    """A single node that leads every offsets partition; appends land in memory at once.

    Start with `await nursery.start(service.run)`; set `port` (and `host`) to the Kafka
    listener's once it is bound, since FindCoordinator answers with them.
    """

    def __init__(
        self,
        config: GroupConfig | None = None,
        *,
        node_id: int = 0,
        host: str = "127.0.0.1",
        port: int = -1,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.config = config or GroupConfig()
        self.node_id = node_id
        self.host = host
        self.port = port
        # partition -> entries in append order: the stand-in for the replicated log.
        self.partitions: dict[int, list[LogEntry]] = {}
        self.append_calls = 0
        self._shell = GroupCoordinatorShell(
            GroupCoordinator(self.config), self._append, self._read_all, clock_ms=clock_ms
        )
        self._ready = False

    @property
    def shell(self) -> GroupCoordinatorShell:
        return self._shell

    async def coordinator_for(self, group_id: str) -> CoordinatorLocation:
        if not self._ready or self.port < 0:
            return CoordinatorLocation(ErrorCode.coordinator_not_available)
        return CoordinatorLocation(ErrorCode.none, self.node_id, self.host, self.port)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Run the shell and load every offsets partition; serve until cancelled."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self._shell.run)
            for partition in range(self.config.offsets_topic_num_partitions):
                await self._shell.become_coordinator(partition)
            self._ready = True
            task_status.started()

    async def write_txn_marker(self, partition: int, producer_id: int, commit: bool) -> None:
        """Stand in for the transaction driver: "replicate" `producer_id`'s COMMIT/ABORT
        marker on offsets partition `partition` and tell the coordinator."""
        self.partitions.setdefault(partition, []).append(TxnEnd(producer_id, commit))
        await self._shell.complete_transaction(partition, producer_id, commit)

    async def _append(
        self, partition: int, records: list[Record], txn: TxnProducer | None = None
    ) -> None:
        self.append_calls += 1
        entries = self.partitions.setdefault(partition, [])
        if txn is None:
            entries.extend(records)
        else:
            entries.extend(TxnRecord(txn.producer_id, k, v) for k, v in records)

    async def _read_all(self, partition: int) -> list[LogEntry]:
        return list(self.partitions.get(partition, []))
