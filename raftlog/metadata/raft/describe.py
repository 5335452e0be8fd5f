"""DescribeQuorum from the leader's core (KIP-595, v2 of KIP-853): pure, no I/O.

The leader knows every voter's and observer's acknowledged log end and when it last fetched;
``describe`` turns that, with the voter set's endpoints, into a ``QuorumDescription``. The
description is also the body of the internal "quorum.describe" answer a non-leader forwards
to, so it is declared for the codec and range-checked when it arrives; its first fields are
the answer's format from before KIP-853, the rest were added after them (codec.Added).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated, ClassVar

from raftlog.codec import Added, Array, Epoch, MaxLen, Millis, NodeId, Offset
from raftlog.metadata.raft.core import RaftCore
from raftlog.metadata.raft.voters import MAX_VOTERS, Voter

__all__ = ["MAX_OBSERVERS_DESCRIBED", "QuorumDescription", "ReplicaProgress", "describe"]

# Observers listed in one description (the driver keeps at most 1024 observers' addresses).
MAX_OBSERVERS_DESCRIBED = 1024


@dataclass(frozen=True, slots=True)
class ReplicaProgress:
    """One replica of the metadata log as the leader sees it (DescribeQuorum ReplicaState);
    times are wall-clock ms, -1 when unknown."""

    __wire__: ClassVar[Array] = Array()
    replica_id: NodeId
    log_end_offset: Offset
    last_fetch_timestamp_ms: Millis
    last_caught_up_timestamp_ms: Millis
    directory_id: Annotated[uuid.UUID | None, Added()] = None


@dataclass(frozen=True, slots=True)
class QuorumDescription:
    """The leader's view of the quorum: progress of voters and observers, and the voters'
    endpoints (DescribeQuorum v2's Nodes)."""

    __wire__: ClassVar[Array] = Array()
    leader_id: NodeId
    leader_epoch: Epoch
    high_watermark: Offset
    voters: Annotated[tuple[ReplicaProgress, ...], MaxLen(MAX_VOTERS)]
    # Added with KIP-853 (a node answering without them described voters only).
    observers: Annotated[tuple[ReplicaProgress, ...], MaxLen(MAX_OBSERVERS_DESCRIBED), Added()] = ()
    nodes: Annotated[tuple[Voter, ...], MaxLen(MAX_VOTERS), Added()] = ()


def _progress(
    replica_id: int,
    directory_id: uuid.UUID | None,
    end_offset: int,
    last_fetch_ms: int | None,
    *,
    leader_id: int,
    high_watermark: int,
    now_ms: int,
    wall_now_ms: int,
) -> ReplicaProgress:
    if replica_id == leader_id:
        last = wall_now_ms
    elif last_fetch_ms is None:
        last = -1
    else:
        last = max(wall_now_ms - (now_ms - last_fetch_ms), 0)
    caught_up = last if end_offset >= high_watermark else -1
    return ReplicaProgress(replica_id, end_offset, last, caught_up, directory_id)


def describe(core: RaftCore, now_ms: int, wall_now_ms: int) -> QuorumDescription | None:
    """The description on the leader (None on any other node). `now_ms` is the core's clock,
    `wall_now_ms` the wall clock the timestamps are given in."""
    progress = core.replica_progress()
    if progress is None:
        return None
    observers = core.observer_progress() or {}
    hw = core.high_watermark
    common = {
        "leader_id": core.node_id,
        "high_watermark": hw,
        "now_ms": now_ms,
        "wall_now_ms": wall_now_ms,
    }
    voter_set = core.voter_set
    voters = []
    for voter in voter_set.voters:
        end_offset, last_fetch_ms = progress.get(voter.voter_id, (0, None))
        voters.append(
            _progress(voter.voter_id, voter.directory_id, end_offset, last_fetch_ms, **common)
        )
    observer_list = [
        _progress(replica_id, core.observer_directory(replica_id), end_offset, last_ms, **common)
        for replica_id, (end_offset, last_ms) in sorted(observers.items())
    ][:MAX_OBSERVERS_DESCRIBED]
    if not core.is_voter:
        # A leader removing itself still leads: it is described as an observer meanwhile.
        end_offset, _ = progress.get(core.node_id, (0, None))
        observer_list.insert(0, _progress(core.node_id, None, end_offset, None, **common))
    return QuorumDescription(
        core.node_id,
        core.epoch,
        hw,
        tuple(voters),
        tuple(observer_list[:MAX_OBSERVERS_DESCRIBED]),
        voter_set.voters,
    )
