from __future__ import annotations

from raftlog.storage.epoch_cache import EpochEntry, LeaderEpochCache


def cache(*pairs: tuple[int, int]) -> LeaderEpochCache:
    return LeaderEpochCache([EpochEntry(e, s) for e, s in pairs])


def test_end_offset_for_epoch_follows_kip_101_and_279() -> None:
    c = cache((1, 0), (3, 10), (6, 25))
    leo = 40
    assert c.end_offset_for_epoch(6, leo) == (6, 40)  # latest epoch ends at LEO
    assert c.end_offset_for_epoch(3, leo) == (3, 25)
    assert c.end_offset_for_epoch(4, leo) == (3, 25)  # unknown: largest epoch below it
    assert c.end_offset_for_epoch(5, leo) == (3, 25)
    assert c.end_offset_for_epoch(1, leo) == (1, 10)
    assert c.end_offset_for_epoch(0, leo) == (0, 0)  # older than all: where history starts
    assert c.end_offset_for_epoch(7, leo) == (-1, -1)  # newer than all
    assert c.end_offset_for_epoch(-1, leo) == (-1, -1)
    assert LeaderEpochCache().end_offset_for_epoch(1, leo) == (-1, -1)


def test_assign_keeps_entries_increasing() -> None:
    c = LeaderEpochCache()
    assert c.assign(1, 0)
    assert not c.assign(1, 5)  # same epoch later: no change
    assert c.assign(2, 5)
    assert not c.assign(1, 7)  # stale epoch after a newer one: ignored
    assert c.assign(4, 3)  # new epoch starting earlier replaces the conflicting entry
    assert c.entries == [EpochEntry(1, 0), EpochEntry(4, 3)]


def test_truncation_from_both_ends() -> None:
    c = cache((1, 0), (3, 10), (6, 25))
    c.truncate_from_end(25)
    assert c.entries == [EpochEntry(1, 0), EpochEntry(3, 10)]
    c.truncate_from_start(12)
    assert c.entries == [EpochEntry(3, 12)]
    payload = c.to_payload()
    assert LeaderEpochCache.from_payload(payload).entries == c.entries
