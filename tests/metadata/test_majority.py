"""Table tests of the quorum arithmetic (raftlog/metadata/raft/majority.py)."""

from __future__ import annotations

import pytest

from raftlog.metadata.raft.majority import (
    VoteResult,
    has_majority,
    majority_size,
    quorum_heard_ms,
    quorum_value,
    vote_result,
)

PENDING, WON, LOST = VoteResult.PENDING, VoteResult.WON, VoteResult.LOST


def voters(count: int) -> frozenset[int]:
    return frozenset(range(1, count + 1))


@pytest.mark.parametrize(("count", "size"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
def test_majority_size(count: int, size: int) -> None:
    assert majority_size(count) == size


def test_no_voters_is_no_quorum() -> None:
    with pytest.raises(ValueError, match="at least one voter"):
        majority_size(0)


@pytest.mark.parametrize(
    ("count", "members", "expected"),
    [
        (1, {1}, True),
        (1, set(), False),
        (2, {1}, False),  # half of an even count is no majority
        (2, {1, 2}, True),
        (3, {2, 3}, True),
        (3, {3}, False),
        (4, {1, 2}, False),
        (4, {1, 2, 4}, True),
        (5, {1, 2, 9}, False),  # 9 is no voter: it does not count
        (5, {1, 4, 5}, True),
    ],
)
def test_has_majority(count: int, members: set[int], expected: bool) -> None:
    assert has_majority(members, voters(count)) is expected


@pytest.mark.parametrize(
    ("count", "values", "expected"),
    [
        (1, {1: 7}, 7),
        (1, {}, 0),  # a missing voter has acknowledged nothing
        (2, {1: 7, 2: 3}, 3),  # both are needed: the lower one
        (3, {1: 9, 2: 5, 3: 1}, 5),
        (3, {1: 9, 2: 5}, 5),  # voter 3 missing
        (3, {1: 9}, 0),  # two voters missing: no majority holds anything
        (3, {1: 4, 2: 4, 3: 4}, 4),
        (4, {1: 8, 2: 6, 3: 4, 4: 2}, 4),  # a majority of four is three
        (4, {1: 8, 2: 6}, 0),
        (5, {1: 10, 2: 9, 3: 3, 4: 2, 5: 1}, 3),
        (5, {1: 10, 2: 9, 3: 3, 7: 99}, 3),  # a non-voter's value is ignored
        (5, {1: 10, 2: 10, 3: 10}, 10),
    ],
)
def test_quorum_value(count: int, values: dict[int, int], expected: int) -> None:
    assert quorum_value(values, voters(count), missing=0) == expected


def test_quorum_value_counts_missing_voters_as_given() -> None:
    assert quorum_value({1: 50}, voters(3), missing=20) == 20


@pytest.mark.parametrize(
    ("count", "heard", "missing", "expected"),
    [
        (1, {}, 0, None),  # the leader alone is a majority: never resigns
        (2, {2: 100}, 0, 100),
        (2, {}, 40, 40),  # not heard since the election: the grace period counts
        (3, {2: 100, 3: 300}, 0, 300),  # the leader plus the most recent one
        (3, {2: 100}, 50, 100),
        (4, {2: 100, 3: 300, 4: 200}, 0, 200),  # leader plus two others
        (5, {2: 500, 3: 100, 4: 400, 5: 300}, 0, 400),
        (5, {2: 500}, 70, 70),
    ],
)
def test_quorum_heard_ms(
    count: int, heard: dict[int, int], missing: int, expected: int | None
) -> None:
    assert quorum_heard_ms(heard, voters(count), leader_id=1, missing=missing) == expected


@pytest.mark.parametrize(
    ("count", "granted", "rejected", "expected"),
    [
        (1, {1}, set(), WON),
        (2, {1}, set(), PENDING),
        (2, {1, 2}, set(), WON),
        (2, {1}, {2}, PENDING),  # a tie: wait out the election timeout
        (3, {1}, set(), PENDING),
        (3, {1, 3}, set(), WON),
        (3, {1}, {2}, PENDING),
        (3, {1}, {2, 3}, LOST),
        (4, {1, 2}, {3, 4}, PENDING),  # a tie
        (4, {1, 2, 3}, {4}, WON),
        (4, {1}, {2, 3, 4}, LOST),
        (5, {1, 2}, {3, 4}, PENDING),  # voter 5 has not answered
        (5, {1, 2, 5}, {3, 4}, WON),
        (5, {1, 2}, {3, 4, 5}, LOST),
        (5, {1, 8, 9}, set(), PENDING),  # grants from non-voters do not count
    ],
)
def test_vote_result(
    count: int, granted: set[int], rejected: set[int], expected: VoteResult
) -> None:
    assert vote_result(granted, rejected, voters(count)) is expected
