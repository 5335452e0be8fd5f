"""Partition reassignment (KIP-455), as pure functions over a MetadataImage.

A reassignment is kept in the partition itself, as Kafka's KRaft controller keeps it:
- starting one sets `replicas` to the target followed by the current replicas not in it,
  `adding_replicas` to the target members that are new and `removing_replicas` to the current
  members not in the target. The ISR and the leader stay. Brokers act on the image alone: an
  adding replica is a replica, so its broker creates the log and fetches as a follower.
- The leader adds a caught-up replica to the ISR through AlterPartition as for any follower.
  Once every target replica is in the ISR, the controller completes the reassignment in one
  PartitionChange: replicas = the target, ISR = the ISR within the target, no adding or
  removing; a leader that is leaving hands over to the first eligible target replica in the
  ISR (a leader epoch bump). The removed replicas' brokers see themselves out of the replicas
  and stop and delete their logs.
- Cancelling (replicas None) returns to the original replicas (the replicas without the
  adding ones); the adding ones leave the ISR and drop their logs.
- A new target for a partition already moving replaces the old one, from the current
  replicas (Kafka's rule): an adding replica no longer wanted becomes a removing one.

Nothing is given up before it is safe: the replica set shrinks only when the target alone
holds every acknowledged record (it is all in the ISR), so acks=all writes survive the move.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator

from raftlog.errors import ErrorCode, RemoteError
from raftlog.metadata import records as r
from raftlog.metadata.controller.elections import Batch, UnsafeReplicas, eligible_fn, safe_fn
from raftlog.metadata.controller.messages import (
    AlterPartitionReassignments,
    AlterPartitionReassignmentsReply,
    PartitionReassignment,
    PartitionResult,
)
from raftlog.metadata.image import MetadataImage, PartitionState

__all__ = [
    "MAX_REASSIGNMENT_REPLICAS",
    "alter_partition_reassignments",
    "completion_change",
    "completion_changes",
    "ongoing_reassignments",
]

log = logging.getLogger("raftlog.metadata")

# Matches topics.MAX_REPLICATION_FACTOR: a target is at most this many replicas.
MAX_REASSIGNMENT_REPLICAS = 32


class PlanError(RemoteError):
    """A reassignment plan a client sent that cannot be carried out (its code goes back)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _merge(target: tuple[int, ...], current: tuple[int, ...]) -> tuple[int, ...]:
    """Kafka's replica order during a move: the target first, then the ones leaving."""
    return target + tuple(b for b in current if b not in target)


def _check_target(image: MetadataImage, target: tuple[int, ...]) -> None:
    if not target:
        raise PlanError(ErrorCode.invalid_replica_assignment, "the replica list is empty")
    if len(target) > MAX_REASSIGNMENT_REPLICAS:
        raise PlanError(
            ErrorCode.invalid_replica_assignment,
            f"{len(target)} replicas; at most {MAX_REASSIGNMENT_REPLICAS}",
        )
    if len(set(target)) != len(target):
        duplicates = sorted({b for b in target if target.count(b) > 1})
        raise PlanError(
            ErrorCode.invalid_replica_assignment, f"replicas {duplicates} are named twice"
        )
    unknown = [b for b in target if b not in image.brokers]
    if unknown:
        raise PlanError(
            ErrorCode.invalid_replica_assignment, f"brokers {unknown} are not registered"
        )
    fenced = [b for b in target if image.brokers[b].fenced]
    if fenced:
        raise PlanError(ErrorCode.invalid_replica_assignment, f"brokers {fenced} are fenced")


def completion_change(
    topic_id: uuid.UUID,
    index: int,
    state: PartitionState,
    eligible: Callable[[int], bool],
) -> r.PartitionChange | None:
    """The change that completes `state`'s reassignment, or None while it must wait (a
    target replica is not in the ISR yet, or no target replica in the ISR can lead)."""
    if not state.reassigning:
        return None
    target = state.target_replicas
    if not set(target) <= set(state.isr):
        return None
    isr = tuple(b for b in state.isr if b in target)
    leader = state.leader
    if leader not in target:
        candidates = [b for b in target if b in isr and eligible(b)]
        if not candidates:
            return None  # the leaving leader keeps leading until a target replica can
        leader = candidates[0]
    return r.PartitionChange(
        topic_id,
        index,
        leader=None if leader == state.leader else leader,
        isr=None if isr == state.isr else isr,
        replicas=target,
        adding_replicas=(),
        removing_replicas=(),
    )


def completion_changes(
    image: MetadataImage, unsafe: UnsafeReplicas, only: tuple[uuid.UUID, int] | None = None
) -> list[r.PartitionChange]:
    """Complete every reassignment that can be (only `only` when given)."""
    eligible = eligible_fn(image)
    changes = []
    for topic, index, state in _partitions(image, only):
        if not state.reassigning:
            continue
        change = completion_change(topic, index, state, safe_fn(eligible, unsafe, topic, index))
        if change is not None:
            changes.append(change)
    return changes


def _partitions(
    image: MetadataImage, only: tuple[uuid.UUID, int] | None
) -> Iterator[tuple[uuid.UUID, int, PartitionState]]:
    if only is not None:
        state = image.partition(*only)
        if state is not None:
            yield only[0], only[1], state
        return
    for topic, index, state in image.iter_partitions():
        yield topic.topic_id, index, state


def _cancel(topic_id: uuid.UUID, index: int, state: PartitionState) -> r.PartitionChange:
    original = state.original_replicas
    isr = tuple(b for b in state.isr if b in original)
    if not isr:
        # Only joining replicas are in sync: returning would leave no replica known to hold
        # the data. The operator can finish the move instead, or move to other replicas.
        raise PlanError(
            ErrorCode.invalid_replica_assignment,
            "no original replica is in the ISR; cancelling would lose the partition's data",
        )
    leader = state.leader
    if leader not in original:
        leader = isr[0]
    return r.PartitionChange(
        topic_id,
        index,
        leader=None if leader == state.leader else leader,
        isr=None if isr == state.isr else isr,
        replicas=original,
        adding_replicas=(),
        removing_replicas=(),
    )


def _start(
    topic_id: uuid.UUID, index: int, state: PartitionState, target: tuple[int, ...]
) -> r.PartitionChange | None:
    current = state.replicas
    if target == state.target_replicas and state.reassigning:
        return None  # the same plan again: nothing changes
    if target == current and not state.reassigning:
        return None
    adding = tuple(b for b in target if b not in current)
    removing = tuple(b for b in current if b not in target)
    return r.PartitionChange(
        topic_id,
        index,
        replicas=_merge(target, current),
        adding_replicas=adding,
        removing_replicas=removing,
    )


def _reassign_one(
    batch: Batch, item: PartitionReassignment, allow_rf_change: bool, unsafe: UnsafeReplicas
) -> None:
    image = batch.image
    if item.partition < 0:
        raise PlanError(
            ErrorCode.unknown_topic_or_partition, f"partition {item.partition} is negative"
        )
    topic = image.topic(item.topic)
    state = None if topic is None else topic.partitions.get(item.partition)
    if topic is None or state is None:
        raise PlanError(
            ErrorCode.unknown_topic_or_partition, f"no partition {item.topic}-{item.partition}"
        )
    if item.replicas is None:
        if not state.reassigning:
            raise PlanError(
                ErrorCode.no_reassignment_in_progress,
                f"{item.topic}-{item.partition} has no reassignment in progress",
            )
        batch.add(_cancel(topic.topic_id, item.partition, state))
        log.info("%s-%d: reassignment cancelled", item.topic, item.partition)
        return
    target = tuple(item.replicas)
    _check_target(image, target)
    if not allow_rf_change and len(target) != len(state.original_replicas):
        raise PlanError(
            ErrorCode.invalid_replication_factor,
            f"the target has {len(target)} replicas, the partition "
            f"{len(state.original_replicas)}, and the request does not allow changing that",
        )
    change = _start(topic.topic_id, item.partition, state, target)
    if change is None:
        return
    batch.add(change)
    log.info(
        "%s-%d: reassignment to %s started (replicas %s)",
        item.topic,
        item.partition,
        list(target),
        list(state.replicas),
    )
    # A move that adds nothing (or whose new replicas are somehow in sync) is done at once.
    batch.add(*completion_changes(batch.image, unsafe, (topic.topic_id, item.partition)))


def alter_partition_reassignments(
    batch: Batch, req: AlterPartitionReassignments, unsafe: UnsafeReplicas
) -> AlterPartitionReassignmentsReply:
    """Start, replace or cancel reassignments; one result per partition named."""
    seen: set[tuple[str, int]] = set()
    results = []
    for item in req.partitions:
        key = (item.topic, item.partition)
        try:
            if key in seen:
                raise PlanError(
                    ErrorCode.invalid_request,
                    f"{item.topic}-{item.partition} is named twice in one request",
                )
            seen.add(key)
            _reassign_one(batch, item, req.allow_replication_factor_change, unsafe)
        except PlanError as exc:
            results.append(PartitionResult(item.topic, item.partition, exc.code, exc.message))
            continue
        results.append(PartitionResult(item.topic, item.partition))
    return AlterPartitionReassignmentsReply(tuple(results))


def ongoing_reassignments(
    image: MetadataImage, wanted: dict[str, tuple[int, ...] | None] | None = None
) -> list[tuple[str, int, PartitionState]]:
    """(topic, partition, state) of every partition being reassigned, sorted; `wanted`
    narrows it to the named topics (a None or empty tuple of indexes: all of them)."""
    out = []
    for topic, index, state in image.iter_partitions():
        if not state.reassigning:
            continue
        if wanted is not None:
            if topic.name not in wanted:
                continue
            indexes = wanted[topic.name]
            if indexes and index not in indexes:
                continue
        out.append((topic.name, index, state))
    return sorted(out, key=lambda item: (item[0], item[1]))
