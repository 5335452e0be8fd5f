"""Quorum arithmetic of the metadata Raft, in one place (after etcd's quorum package).

Every question the core asks of "a majority of the voters" is answered here: how many make
one, which offset a majority holds (the high watermark), whether an election is won or lost,
when a leader stops having heard from a majority (check-quorum), and whether a read was
confirmed by one. Voters that a mapping does not mention count as the lowest value (never
acknowledged, never heard from).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import Enum

__all__ = [
    "VoteResult",
    "has_majority",
    "majority_size",
    "quorum_heard_ms",
    "quorum_value",
    "vote_result",
]

# Stands for "heard from at every moment" (the leader itself) in quorum_heard_ms.
_ALWAYS_MS = 1 << 62


class VoteResult(Enum):
    PENDING = "pending"
    WON = "won"
    LOST = "lost"


def majority_size(voter_count: int) -> int:
    """The fewest voters that make a majority of voter_count."""
    if voter_count <= 0:
        raise ValueError(f"a quorum needs at least one voter, not {voter_count}")
    return voter_count // 2 + 1


def has_majority(members: Collection[int], voters: Collection[int]) -> bool:
    """True if the voters among members make a majority (non-voters do not count)."""
    return sum(1 for v in voters if v in members) >= majority_size(len(voters))


def quorum_value(values: Mapping[int, int], voters: Collection[int], *, missing: int) -> int:
    """The largest x that a majority of voters have reached (value >= x); a voter absent
    from values counts as `missing`.

    With match offsets this is the offset a majority holds (etcd's CommittedIndex); with
    the times voters were last heard from, the time by which a majority had been heard.
    """
    ranked = sorted((values.get(v, missing) for v in voters), reverse=True)
    return ranked[majority_size(len(voters)) - 1]


def quorum_heard_ms(
    last_heard_ms: Mapping[int, int], voters: Collection[int], *, leader_id: int, missing: int
) -> int | None:
    """Check-quorum: the latest time by which a majority of voters had been heard from, the
    leader counting as always heard from; None when the leader alone is a majority. A voter
    absent from last_heard_ms counts as heard from at `missing`."""
    heard_ms = quorum_value({**last_heard_ms, leader_id: _ALWAYS_MS}, voters, missing=missing)
    return None if heard_ms == _ALWAYS_MS else heard_ms


def vote_result(
    granted: Collection[int], rejected: Collection[int], voters: Collection[int]
) -> VoteResult:
    """WON once the granted votes make a majority, LOST once the rejections do; else
    PENDING. An even split is PENDING: the candidate waits out its election timeout
    instead of backing off early."""
    if has_majority(granted, voters):
        return VoteResult.WON
    if has_majority(rejected, voters):
        return VoteResult.LOST
    return VoteResult.PENDING
