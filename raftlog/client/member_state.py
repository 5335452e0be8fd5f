"""The pure half of a consumer-group member: its bounds, its generation, what each
heartbeat answer makes it do, and its errors. No trio, no sockets (group_member.py drives
these against the coordinator)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from raftlog.client.consumer_protocol import TopicPartition
from raftlog.client.groups import COORDINATOR_RETRIABLE
from raftlog.errors import ErrorCode, KafkaError, RemoteError

# Commit answers that mean this member's generation no longer owns the partitions.
GENERATION_LOST_CODES = frozenset(
    {
        ErrorCode.rebalance_in_progress,
        ErrorCode.illegal_generation,
        ErrorCode.unknown_member_id,
        ErrorCode.fenced_instance_id,
    }
)
# JoinGroup/SyncGroup answers after which joining again (after a back-off) can succeed.
REJOIN_CODES = frozenset(
    {
        ErrorCode.rebalance_in_progress,
        ErrorCode.illegal_generation,
        ErrorCode.member_id_required,
    }
)
LEAVE_REASON = "the consumer is closing"


@dataclass(frozen=True)
class MemberConfig:
    """Timings and bounds of one member; Kafka's consumer defaults unless said otherwise."""

    # Kafka's classic default before 3.0; the broker bounds it (6 s .. 30 min by default).
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    # How long the coordinator waits for members to rejoin. Kafka uses max.poll.interval.ms
    # (5 min); this member rejoins as soon as a heartbeat asks, so a minute is plenty.
    rebalance_timeout_ms: int = 60_000
    # JoinGroup attempts (each a find-coordinator + join + sync) before giving up.
    max_join_attempts: int = 10
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 2_000
    # Added to the rebalance timeout for the request timeout of a parked JoinGroup/SyncGroup.
    request_slack_ms: int = 5_000
    # Final commit plus LeaveGroup when the member closes.
    close_timeout_ms: int = 10_000
    # KIP-345 static membership; a static member does not send LeaveGroup when it closes.
    group_instance_id: str | None = None

    def __post_init__(self) -> None:
        for name in (
            "session_timeout_ms",
            "heartbeat_interval_ms",
            "rebalance_timeout_ms",
            "max_join_attempts",
            "close_timeout_ms",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be below "
                f"session_timeout_ms ({self.session_timeout_ms})"
            )
        if self.retry_backoff_ms < 0 or self.retry_backoff_max_ms < self.retry_backoff_ms:
            raise ValueError("need 0 <= retry_backoff_ms <= retry_backoff_max_ms")
        if self.request_slack_ms < 0:
            raise ValueError("request_slack_ms must be >= 0")


class GroupMemberError(RemoteError):
    """The member could not (re)join its group within its bounds, or was refused for good."""


class CommitFailed(KafkaError):
    """Offsets were not committed because this member's generation no longer owns them;
    the partitions' next owner reads from the last commit that did succeed."""


class RebalanceListener(Protocol):
    """What a member tells its consumer: partitions it now owns, partitions it gives up.

    on_partitions_revoked is the place to stop reading and commit (member.commit works while
    the generation still allows it and raises CommitFailed otherwise).
    """

    async def on_partitions_assigned(self, partitions: frozenset[TopicPartition]) -> None: ...

    async def on_partitions_revoked(self, partitions: frozenset[TopicPartition]) -> None: ...


@dataclass(frozen=True)
class Generation:
    generation_id: int
    member_id: str
    leader_id: str
    protocol: str
    assignment: frozenset[TopicPartition]

    @property
    def is_leader(self) -> bool:
        return self.member_id == self.leader_id


class Outcome(enum.Enum):
    """What a heartbeat answer means for the member."""

    OK = "ok"
    # The group is rebalancing; the generation is still valid, so commit, then rejoin.
    REJOIN = "rejoin"
    # The coordinator moved or is down: find it again, commit there, rejoin.
    FIND_COORDINATOR = "find_coordinator"
    # A newer generation exists: commits would be refused; rejoin with the same member id.
    STALE_GENERATION = "stale_generation"
    # The coordinator forgot this member (its session expired): rejoin as a new member.
    UNKNOWN_MEMBER = "unknown_member"
    # Nothing a rejoin fixes (fenced static member, authorization, ...).
    FATAL = "fatal"


def heartbeat_outcome(code: ErrorCode) -> Outcome:
    """The member's next step after a heartbeat answered with code. Pure."""
    if code == ErrorCode.none:
        return Outcome.OK
    if code == ErrorCode.rebalance_in_progress:
        return Outcome.REJOIN
    if code in COORDINATOR_RETRIABLE:
        return Outcome.FIND_COORDINATOR
    if code == ErrorCode.illegal_generation:
        return Outcome.STALE_GENERATION
    if code == ErrorCode.unknown_member_id:
        return Outcome.UNKNOWN_MEMBER
    return Outcome.FATAL


def commit_allowed_after(outcome: Outcome) -> bool:
    """Whether the old generation may still commit before rejoining. Pure."""
    return outcome in (Outcome.REJOIN, Outcome.FIND_COORDINATOR)


__all__ = [
    "CommitFailed",
    "Generation",
    "GroupMemberError",
    "MemberConfig",
    "Outcome",
    "RebalanceListener",
    "commit_allowed_after",
    "heartbeat_outcome",
]
