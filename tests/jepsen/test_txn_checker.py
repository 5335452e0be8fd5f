"""The transactional checker: one small hand-built history per anomaly, and valid ones."""

from __future__ import annotations

from typing import Any

from jepsen.history import FINAL_POLL, INFO, History
from jepsen.txn_checker import TXN_ANOMALY_TYPES, check_txn, strongly_connected
from jepsen.txn_history import TxnHistoryBuilder

POLLER, FINAL = 10, 11
FAIL = "fail"


def found(history: History, **kwargs: Any) -> dict[str, int]:
    results = check_txn(history, **kwargs)
    counts = {k: n for k, n in results["anomaly_counts"].items() if n}
    assert results["valid"] == (not counts)
    return counts


def example(history: History, kind: str) -> dict[str, Any]:
    return dict(check_txn(history)["anomalies"][kind][0])


def final(h: TxnHistoryBuilder, reads: dict[int, list[tuple[int, int]]]) -> TxnHistoryBuilder:
    h.assign(FINAL, list(reads), seek_to_beginning=True)
    h.poll(FINAL, reads, f=FINAL_POLL)
    return h


def two_committed() -> TxnHistoryBuilder:
    """T0 writes 1 to key 0 and 2 to key 1; T1 writes 3 to key 0 and 4 to key 1."""
    h = TxnHistoryBuilder()
    h.txn(0, [(0, 1, 0), (1, 2, 0)])
    h.txn(1, [(0, 3, 2), (1, 4, 2)])
    return h


def test_a_valid_history_with_aborts_unknowns_reads_and_offsets_passes() -> None:
    h = two_committed()
    h.txn(0, [(0, 5, 4)], commit=False, type_=FAIL)  # aborted on purpose, never read
    h.txn(1, [(1, 6, None)], type_=INFO)  # unknown, and it did commit
    h.txn(2, [(0, 7, None)], type_=INFO)  # unknown, and it did not
    # A consume-transform-produce transaction of process 3 (group of its own) reads from
    # the beginning; the next one continues where it stopped.
    h.txn(3, [(1, 8, 7)], reads={0: [(0, 1)], 1: [(0, 2), (2, 4)]})
    h.txn(3, [(0, 9, 8)], reads={0: [(2, 3)], 1: [(5, 6)]})
    h.assign(POLLER, [0, 1], seek_to_beginning=True)
    h.poll(POLLER, {0: [(0, 1), (2, 3)], 1: [(0, 2)]})
    h.poll(POLLER, {1: [(2, 4), (5, 6)]})
    final(h, {0: [(0, 1), (2, 3), (8, 9)], 1: [(0, 2), (2, 4), (5, 6), (7, 8)]})
    results = check_txn(h.build())
    assert results["valid"], results["anomalies"]
    assert results["stats"]["txns"] == {"ok": 4, "fail": 1, "info": 2}
    assert results["stats"]["txns_with_reads_committed"] == 2
    assert not results["warnings"]


def test_aborted_read_of_an_aborted_transaction() -> None:
    h = two_committed()
    h.txn(2, [(0, 5, 4), (1, 6, 4)], commit=False, type_=FAIL)
    h.assign(POLLER, [1], seek_to_beginning=True)
    h.poll(POLLER, {1: [(0, 2), (2, 4), (4, 6)]})
    final(h, {0: [(0, 1), (2, 3)], 1: [(0, 2), (2, 4)]})
    # The read value also vanished from the final reads, but an aborted one is not a loss.
    assert found(h.build()) == {"aborted-read": 1}
    ex = example(h.build(), "aborted-read")
    assert (ex["key"], ex["value"], ex["offset"], ex["reader_process"]) == ("1", 6, 4, POLLER)


def test_a_final_read_of_an_aborted_value_is_an_aborted_read() -> None:
    h = two_committed()
    h.txn(2, [(0, 5, 4), (1, 6, 4)], commit=False, type_=FAIL)
    final(h, {0: [(0, 1), (2, 3), (4, 5)], 1: [(0, 2), (2, 4)]})
    assert found(h.build()) == {"aborted-read": 1}


def test_phantom_read_of_a_value_nobody_sent_there() -> None:
    h = two_committed()
    final(h, {0: [(0, 1), (2, 3), (4, 99)], 1: [(0, 2), (2, 4), (3, 1)]})
    assert found(h.build()) == {"phantom-read": 2}


def test_lost_write_of_a_committed_transaction() -> None:
    h = two_committed()
    final(h, {0: [(0, 1)], 1: [(0, 2)]})
    assert found(h.build()) == {"lost-write": 1}
    ex = example(h.build(), "lost-write")
    assert ex["missing"] == [["0", 3, 2], ["1", 4, 2]]


def test_an_unknown_transaction_may_be_wholly_absent_but_not_torn() -> None:
    h = two_committed()
    h.txn(2, [(0, 5, None), (1, 6, None)], type_=INFO)
    final(h, {0: [(0, 1), (2, 3)], 1: [(0, 2), (2, 4)]})
    assert found(h.build()) == {}
    h = two_committed()
    h.txn(2, [(0, 5, None), (1, 6, None)], type_=INFO)
    final(h, {0: [(0, 1), (2, 3), (4, 5)], 1: [(0, 2), (2, 4)]})
    assert found(h.build()) == {"torn-transaction": 1}


def test_torn_committed_transaction() -> None:
    h = two_committed()
    final(h, {0: [(0, 1), (2, 3)], 1: [(0, 2)]})
    assert found(h.build()) == {"torn-transaction": 1}
    ex = example(h.build(), "torn-transaction")
    assert ex["present"] == [["0", 3]] and ex["missing"] == [["1", 4, 2]]


def test_a_transaction_that_never_completed_is_unknown() -> None:
    h = two_committed()
    h.txn(2, [(0, 5, None)], complete=False)
    final(h, {0: [(0, 1), (2, 3), (4, 5)], 1: [(0, 2), (2, 4)]})
    assert found(h.build()) == {}


def test_vanished_value_read_earlier_but_not_at_the_end() -> None:
    h = two_committed()
    h.txn(2, [(1, 5, None)], type_=INFO)
    h.assign(POLLER, [1], seek_to_beginning=True)
    h.poll(POLLER, {1: [(0, 2), (2, 4), (4, 5)]})
    final(h, {0: [(0, 1), (2, 3)], 1: [(0, 2), (2, 4)]})
    assert found(h.build()) == {"vanished": 1}


def test_duplicate_and_inconsistent_offsets() -> None:
    h = two_committed()
    final(h, {0: [(0, 1), (2, 3), (5, 3)], 1: [(0, 2), (2, 4)]})
    assert found(h.build()) == {"duplicate": 1}
    h = two_committed()
    h.txn(2, [(0, 5, None)], type_=INFO)
    final(h, {0: [(0, 1), (2, 5)], 1: [(0, 2), (2, 4)]})  # 5 where the report said 3 is
    counts = found(h.build())
    assert counts["inconsistent-offsets"] == 1


def test_poller_skip_and_going_backwards() -> None:
    h = two_committed()
    h.assign(POLLER, [0], seek_to_beginning=True)
    h.poll(POLLER, {0: [(2, 3)]})  # skipped 1 at offset 0, the first visible value
    final(h, {0: [(0, 1), (2, 3)], 1: [(0, 2), (2, 4)]})
    assert found(h.build()) == {"poll-skip": 1}
    assert example(h.build(), "poll-skip")["skipped"] == [1]
    h = two_committed()
    h.assign(POLLER, [0], seek_to_beginning=True)
    h.poll(POLLER, {0: [(0, 1), (2, 3)]})
    h.poll(POLLER, {0: [(2, 3)]})
    final(h, {0: [(0, 1), (2, 3)], 1: [(0, 2), (2, 4)]})
    assert found(h.build()) == {"nonmonotonic-poll": 1}


def test_a_crash_or_a_new_assignment_resets_the_position() -> None:
    h = two_committed()
    h.assign(POLLER, [0], seek_to_beginning=True)
    h.poll(POLLER, {0: [(0, 1), (2, 3)]})
    h.crash(POLLER)
    h.assign(POLLER, [0], seek_to_beginning=True)
    h.poll(POLLER, {0: [(0, 1)]})
    final(h, {0: [(0, 1), (2, 3)], 1: [(0, 2), (2, 4)]})
    assert found(h.build()) == {}


def test_group_offsets_reconsumed_after_a_commit() -> None:
    h = two_committed()
    h.txn(3, [(1, 8, 4)], reads={0: [(0, 1), (2, 3)]})
    h.crash(3)  # a new consumer starts at the group's committed offsets: after 3
    h.txn(3, [(1, 9, 5)], reads={0: [(2, 3)]})
    final(h, {0: [(0, 1), (2, 3)], 1: [(0, 2), (2, 4), (4, 8), (5, 9)]})
    assert found(h.build()) == {"reconsumed": 1}
    ex = example(h.build(), "reconsumed")
    assert (ex["first_read"], ex["expected_one_of"]) == (3, [None])


def test_group_offsets_input_skip_after_an_abort() -> None:
    h = two_committed()
    h.txn(3, [(1, 8, 4)], reads={0: [(0, 1)]}, commit=False, type_=FAIL)
    h.crash(3)
    h.txn(3, [(1, 9, 5)], reads={0: [(2, 3)]})  # 1 was consumed only by the abort
    final(h, {0: [(0, 1), (2, 3)], 1: [(0, 2), (2, 4), (5, 9)]})
    assert found(h.build()) == {"input-skip": 1}


def test_group_offsets_of_an_unknown_transaction_may_go_either_way() -> None:
    for next_first in ((0, 1), (2, 3)):
        h = two_committed()
        h.txn(3, [(1, 8, None)], reads={0: [(0, 1)]}, type_=INFO)
        h.crash(3)
        h.txn(3, [(1, 9, 5)], reads={0: [next_first]})
        committed = [(4, 8), (5, 9)] if next_first == (2, 3) else [(5, 9)]
        final(h, {0: [(0, 1), (2, 3)], 1: [(0, 2), (2, 4), *committed]})
        assert found(h.build()) == {}, next_first


def test_g1c_each_transaction_read_past_the_other() -> None:
    h = TxnHistoryBuilder()
    h.txn(0, [(0, 1, 0)])
    h.txn(1, [(1, 2, 0)])
    # T2 read key 1 past T3's record, T3 read key 0 past T2's: each committed first.
    h.txn(2, [(0, 3, 2)], reads={1: [(0, 2), (3, 6)]})
    h.txn(3, [(1, 6, 3)], reads={0: [(0, 1), (2, 3)]})
    final(h, {0: [(0, 1), (2, 3)], 1: [(0, 2), (3, 6)]})
    counts = found(h.build())
    assert counts.get("G1c") == 1
    assert example(h.build(), "G1c")["txns"] == [4, 6]


def test_write_cycles_kafka_allows_are_not_g1c_and_g0_only_with_ww_deps() -> None:
    # T0 and T1 interleave on keys 0 and 1 (opposite orders): a G0 by offsets, which
    # Kafka's transactions allow. T2 then reads both; T1 read key 0 before T0 appended.
    h = TxnHistoryBuilder()
    h.txn(1, [(0, 2, 0), (1, 3, 1)], reads={})
    h.txn(0, [(0, 1, 1), (1, 4, 0)])
    h.txn(2, [(0, 5, 3)], reads={0: [(0, 2), (1, 1)], 1: [(0, 4), (1, 3)]})
    final(h, {0: [(0, 2), (1, 1), (3, 5)], 1: [(0, 4), (1, 3)]})
    results = check_txn(h.build())
    assert results["valid"], results["anomalies"]
    assert "G0" not in results["anomaly_counts"]
    assert results["stats"]["ww_cycle_components"] == 1
    assert any("write-write cycle" in w for w in results["warnings"])
    assert found(h.build(), ww_deps=True) == {"G0": 1}


def test_reading_past_its_own_later_write_is_a_cycle() -> None:
    h = TxnHistoryBuilder()
    h.txn(0, [(0, 1, 0)])
    h.txn(1, [(0, 2, 1)], reads={0: [(0, 1), (2, 3)]})  # its own record sits at 1, under 3
    h.txn(2, [(0, 3, 2)])
    final(h, {0: [(0, 1), (1, 2), (2, 3)]})
    assert found(h.build()).get("G1c") == 1


def test_without_final_polls_losses_are_not_claimed_but_warned() -> None:
    h = two_committed()
    results = check_txn(h.build())
    assert results["valid"]
    assert any("no final-poll" in w for w in results["warnings"])


def test_strongly_connected_components() -> None:
    comps = strongly_connected({1: {2}, 2: {3}, 3: {1, 4}, 4: {5}, 5: {4}, 6: set()})
    assert sorted(sorted(c) for c in comps) == [[1, 2, 3], [4, 5], [6]]
    # Deep chains do not recurse.
    chain = {i: {i + 1} for i in range(50_000)}
    chain[50_000] = {0}
    assert len(strongly_connected(chain)) == 1


def test_every_anomaly_type_has_a_description() -> None:
    assert all(TXN_ANOMALY_TYPES.values())
