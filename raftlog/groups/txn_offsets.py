"""Transactional offsets not decided yet (KIP-98, KIP-447), sans-IO.

An offset committed inside a transaction (TxnOffsetCommit) is appended to the group's offsets
partition in a transactional batch of the committing producer, then waits here, per offsets
partition and producer id, until that producer's COMMIT marker lands on the partition (the
offsets become the group's) or its ABORT marker does (they are dropped). While it waits, or
while its append is in flight, the partition's offset is unstable: OffsetFetch with
require_stable answers UNSTABLE_OFFSET_COMMIT for it, so a consumer starting up never reads a
position its predecessor's open transaction is about to move.

Each pending offset keeps its position in the partition's append order; the coordinator
compares positions when the transaction commits, so a plain commit written after a
transactional one (before the marker) still wins, exactly as a replay of the log decides.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from raftlog.errors import ErrorCode
from raftlog.groups.group import Group, GroupState
from raftlog.groups.group_members import instance_owner
from raftlog.groups.messages import NO_GENERATION, UNKNOWN_MEMBER_ID, TxnOffsetCommitRequest
from raftlog.groups.offsets_format import CommittedOffset, OffsetKey

# The offsets of one producer's open transaction on one partition: key -> (offset, position).
TxnOffsets = dict[OffsetKey, tuple[CommittedOffset, int]]


class PendingTxnOffsets:
    """Every undecided transactional offset of the partitions one coordinator serves."""

    def __init__(self) -> None:
        # partition -> producer id -> offsets appended in its open transaction.
        self._pending: dict[int, dict[int, TxnOffsets]] = {}
        # Transactional offsets whose append is in flight.
        self._inflight: Counter[OffsetKey] = Counter()
        # Markers reported while a partition loads, applied after its replay.
        self._deferred: dict[int, list[tuple[int, bool]]] = {}

    def load(self, partition: int, pending: dict[int, TxnOffsets]) -> list[tuple[int, bool]]:
        """The replay of `partition` left `pending` open; returns the markers reported during
        the load, (producer id, commit) in order, for the caller to apply now."""
        self._pending[partition] = {pid: dict(offsets) for pid, offsets in pending.items()}
        return self._deferred.pop(partition, [])

    def defer(self, partition: int, producer_id: int, commit: bool) -> None:
        self._deferred.setdefault(partition, []).append((producer_id, commit))

    def drop_partition(self, partition: int) -> None:
        """Leadership of `partition` is gone: its next coordinator replays the log."""
        self._pending.pop(partition, None)
        self._deferred.pop(partition, None)

    def begin_append(self, keys: Iterable[OffsetKey]) -> None:
        self._inflight.update(keys)

    def end_append(self, keys: Iterable[OffsetKey]) -> None:
        self._inflight.subtract(keys)
        self._inflight = +self._inflight  # drop the zeros

    def appended(
        self,
        partition: int,
        producer_id: int,
        offsets: dict[OffsetKey, CommittedOffset],
        position: int,
    ) -> None:
        """The producer's transactional batch with `offsets` is replicated at `position`."""
        txn = self._pending.setdefault(partition, {}).setdefault(producer_id, {})
        for key, value in offsets.items():
            txn[key] = (value, position)

    def take(self, partition: int, producer_id: int) -> TxnOffsets:
        """Remove and return the producer's pending offsets on `partition` (its marker
        landed)."""
        return self._pending.get(partition, {}).pop(producer_id, {})

    def has_pending(self, partition: int, producer_id: int) -> bool:
        return bool(self._pending.get(partition, {}).get(producer_id))

    def open_transactions(self, partition: int) -> int:
        return len(self._pending.get(partition, {}))

    def unstable(self, partition: int, group_id: str) -> set[tuple[str, int]]:
        """(topic, partition) of `group_id` (served on offsets partition `partition`) with a
        transactional offset not decided yet."""
        unstable = {(k.topic, k.partition) for k in self._inflight if k.group_id == group_id}
        for offsets in self._pending.get(partition, {}).values():
            unstable.update((k.topic, k.partition) for k in offsets if k.group_id == group_id)
        return unstable


def validate_txn_commit(req: TxnOffsetCommitRequest, group: Group | None) -> ErrorCode:
    """Kafka's checks of a transactional commit (KIP-447 fencing, v3+). Lighter than a
    plain commit's: v0-2 clients send no member at all and may commit for a live group, and
    a known member of the current generation may commit mid-rebalance. A group that does
    not exist yet is checked as an empty one."""
    if group is not None and group.state is GroupState.DEAD:
        return ErrorCode.coordinator_not_available
    members = {} if group is None else group.members
    owner = instance_owner(members, req.group_instance_id)
    if owner is not None and owner.member_id != req.member_id:
        return ErrorCode.fenced_instance_id
    if req.member_id != UNKNOWN_MEMBER_ID and req.member_id not in members:
        return ErrorCode.unknown_member_id
    generation_id = NO_GENERATION if group is None else group.generation_id
    if req.generation_id >= 0 and req.generation_id != generation_id:
        return ErrorCode.illegal_generation
    return ErrorCode.none
