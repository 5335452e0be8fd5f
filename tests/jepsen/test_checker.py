"""Each anomaly: one tiny history that must be flagged and a close variant that must pass."""

from __future__ import annotations

from typing import Any

import pytest

from jepsen.checker import ANOMALY_TYPES, check
from jepsen.history import FINAL_POLL, History, HistoryBuilder


def found(history: History) -> dict[str, int]:
    results = check(history)
    counts = {k: n for k, n in results["anomaly_counts"].items() if n}
    assert results["valid"] == (not counts)
    return counts


def example(history: History, kind: str) -> dict[str, Any]:
    return check(history)["anomalies"][kind][0]


def sent(*values: tuple[str, int, int]) -> HistoryBuilder:
    """A builder whose process 9 has had each (key, value, offset) acknowledged."""
    h = HistoryBuilder()
    for key, value, offset in values:
        h.send(9, key, value, offset=offset)
    return h


# -- lost-write ----------------------------------------------------------------------------


def test_lost_write_flagged_when_a_read_passes_an_acknowledged_offset() -> None:
    h = sent(("k", 10, 0), ("k", 11, 1))
    h.poll(1, {"k": [(1, 11)]})  # a fresh consumer starts at 1: offset 0 was never read
    assert found(h.build()) == {"lost-write": 1}
    ex = example(h.build(), "lost-write")
    assert (ex["key"], ex["value"], ex["offset"], ex["max_read_offset"]) == ("k", 10, 0, 1)


def test_lost_write_not_flagged_when_every_acknowledged_value_is_read() -> None:
    h = sent(("k", 10, 0), ("k", 11, 1))
    h.poll(1, {"k": [(0, 10), (1, 11)]})
    assert found(h.build()) == {}


def test_info_send_is_never_lost() -> None:
    h = HistoryBuilder()
    h.send(9, "k", 10, type_="info")  # may or may not have happened
    h.send(9, "k", 11, offset=1)
    h.poll(1, {"k": [(1, 11)]})
    assert found(h.build()) == {}


def test_send_still_open_at_the_end_is_treated_as_info() -> None:
    h = sent(("k", 11, 1))
    h.invoke(2, "send", ["k", 10])  # never completes
    h.poll(1, {"k": [(0, 10), (1, 11)]})
    assert found(h.build()) == {}


# -- unseen ---------------------------------------------------------------------------------


def test_unseen_flagged_when_no_poll_ever_returns_an_acknowledged_value() -> None:
    h = sent(("k", 10, 0))
    h.poll(1, {})
    assert found(h.build()) == {"unseen": 1}
    assert check(h.build())["warnings"]  # and it says there were no final polls


def test_unseen_cleared_by_a_final_poll() -> None:
    h = sent(("k", 10, 0))
    h.poll(1, {})
    h.crash(1)
    h.assign(1, ["k"], seek_to_beginning=True)
    h.poll(1, {"k": [(0, 10)]}, f=FINAL_POLL)
    results = check(h.build())
    assert results["valid"] and results["warnings"] == []


# -- vanished -------------------------------------------------------------------------------


def final_polls(h: HistoryBuilder, reads: dict[str, list[tuple[int, int]]]) -> HistoryBuilder:
    h.crash(7)
    h.assign(7, ["k"], seek_to_beginning=True)
    h.poll(7, reads, f=FINAL_POLL)
    return h


def test_vanished_flagged_when_final_polls_miss_a_value_read_earlier() -> None:
    h = sent(("k", 10, 0), ("k", 11, 1))
    h.poll(1, {"k": [(0, 10), (1, 11)]})
    final_polls(h, {"k": [(0, 10)]})  # the log lost its tail after it was read
    assert found(h.build()) == {"vanished": 1}
    assert example(h.build(), "vanished")["value"] == 11


def test_vanished_not_flagged_when_final_polls_return_everything() -> None:
    h = sent(("k", 10, 0), ("k", 11, 1))
    h.poll(1, {"k": [(0, 10), (1, 11)]})
    final_polls(h, {"k": [(0, 10), (1, 11)]})
    assert found(h.build()) == {}


def test_a_read_info_send_must_survive_to_the_final_polls() -> None:
    h = HistoryBuilder()
    h.send(9, "k", 10, type_="info")
    h.poll(1, {"k": [(0, 10)]})  # it was read, so it was committed
    final_polls(h, {})
    assert found(h.build()) == {"vanished": 1}


# -- duplicate ------------------------------------------------------------------------------


def test_duplicate_flagged_for_a_value_at_two_offsets() -> None:
    h = sent(("k", 10, 0))
    h.poll(1, {"k": [(0, 10), (1, 10)]})
    assert found(h.build()) == {"duplicate": 1}
    assert example(h.build(), "duplicate")["offsets"] == [0, 1]


def test_duplicate_not_flagged_for_the_same_value_read_twice_at_one_offset() -> None:
    h = sent(("k", 10, 0))
    h.poll(1, {"k": [(0, 10)]})
    h.poll(2, {"k": [(0, 10)]})
    assert found(h.build()) == {}


# -- inconsistent-offsets -------------------------------------------------------------------


def test_inconsistent_offsets_flagged_when_two_reads_disagree() -> None:
    h = sent(("k", 10, 0), ("k", 11, 1))
    h.send(8, "k", 12, type_="info")
    h.poll(1, {"k": [(0, 10), (1, 11)]})
    h.poll(2, {"k": [(0, 10), (1, 12)]})
    assert found(h.build()) == {"inconsistent-offsets": 1}
    assert example(h.build(), "inconsistent-offsets")["values"] == [11, 12]


def test_inconsistent_offsets_not_flagged_when_reads_agree() -> None:
    h = sent(("k", 10, 0), ("k", 11, 1))
    h.send(8, "k", 12, type_="info")
    h.poll(1, {"k": [(0, 10), (1, 11)]})
    h.poll(2, {"k": [(0, 10), (1, 11), (2, 12)]})
    assert found(h.build()) == {}


def test_same_offset_in_different_keys_is_not_inconsistent() -> None:
    h = sent(("a", 10, 0), ("b", 11, 0))
    h.poll(1, {"a": [(0, 10)], "b": [(0, 11)]})
    assert found(h.build()) == {}


# -- aborted-read and phantom-read ----------------------------------------------------------


def test_aborted_read_flagged_when_a_failed_send_is_read() -> None:
    h = HistoryBuilder()
    h.send(9, "k", 10, type_="fail")
    h.poll(1, {"k": [(0, 10)]})
    assert found(h.build()) == {"aborted-read": 1}


def test_reading_an_info_send_is_not_aborted() -> None:
    h = HistoryBuilder()
    h.send(9, "k", 10, type_="info")
    h.poll(1, {"k": [(0, 10)]})
    assert found(h.build()) == {}


def test_phantom_read_flagged_for_a_value_nobody_sent() -> None:
    h = sent(("k", 10, 0))
    h.poll(1, {"k": [(0, 10), (1, 99)]})
    assert found(h.build()) == {"phantom-read": 1}


def test_phantom_read_not_flagged_for_an_attempted_send() -> None:
    h = sent(("k", 10, 0))
    h.send(8, "k", 99, type_="info")
    h.poll(1, {"k": [(0, 10), (1, 99)]})
    assert found(h.build()) == {}


# -- poll-skip and nonmonotonic-poll across polls -------------------------------------------


def three() -> HistoryBuilder:
    h = sent(("k", 10, 0), ("k", 11, 1), ("k", 12, 2))
    h.poll(5, {"k": [(0, 10), (1, 11), (2, 12)]})  # someone reads everything: nothing lost
    return h


def test_poll_skip_flagged_across_a_consumers_polls() -> None:
    h = three()
    h.poll(1, {"k": [(0, 10)]})
    h.poll(1, {"k": [(2, 12)]})
    assert found(h.build()) == {"poll-skip": 1}
    ex = example(h.build(), "poll-skip")
    assert ex["skipped"] == [[1, 11]] and ex["delta"] == 2


def test_poll_skip_not_flagged_after_the_client_crashed() -> None:
    h = three()
    h.poll(1, {"k": [(0, 10)]})
    h.crash(1)
    h.poll(1, {"k": [(2, 12)]})
    assert found(h.build()) == {}


def test_poll_skip_not_flagged_after_an_info_poll() -> None:
    h = three()
    h.poll(1, {"k": [(0, 10)]})
    h.poll(1, {}, type_="info")  # may have consumed offset 1 and lost the response
    h.poll(1, {"k": [(2, 12)]})
    assert found(h.build()) == {}


def test_poll_skip_still_flagged_after_a_failed_poll() -> None:
    h = three()
    h.poll(1, {"k": [(0, 10)]})
    h.poll(1, {}, type_="fail")  # definitely consumed nothing
    h.poll(1, {"k": [(2, 12)]})
    assert found(h.build()) == {"poll-skip": 1}


def test_poll_over_a_hole_is_not_a_skip() -> None:
    # Offset 1 is known to nobody (an info send that was never read), so reading 0 then 2
    # skips nothing we can name.
    h = sent(("k", 10, 0), ("k", 12, 2))
    h.poll(1, {"k": [(0, 10)]})
    h.poll(1, {"k": [(2, 12)]})
    assert found(h.build()) == {}


def test_nonmonotonic_poll_flagged_when_a_consumer_rereads() -> None:
    h = three()
    h.poll(1, {"k": [(0, 10), (1, 11)]})
    h.poll(1, {"k": [(1, 11), (2, 12)]})
    assert found(h.build()) == {"nonmonotonic-poll": 1}
    assert example(h.build(), "nonmonotonic-poll")["delta"] == 0


def test_nonmonotonic_poll_not_flagged_after_seek_to_beginning() -> None:
    h = three()
    h.poll(1, {"k": [(0, 10), (1, 11)]})
    h.assign(1, ["k"], seek_to_beginning=True)
    h.poll(1, {"k": [(0, 10), (1, 11), (2, 12)]})
    assert found(h.build()) == {}


def test_assign_without_seek_keeps_the_position_of_still_assigned_keys() -> None:
    h = three()
    h.poll(1, {"k": [(0, 10), (1, 11)]})
    h.assign(1, ["k", "other"])
    h.poll(1, {"k": [(0, 10)]})
    assert found(h.build()) == {"nonmonotonic-poll": 1}


def test_assign_without_seek_forgets_unassigned_keys() -> None:
    h = three()
    h.poll(1, {"k": [(0, 10), (1, 11)]})
    h.assign(1, ["other"])
    h.assign(1, ["k"])
    h.poll(1, {"k": [(0, 10)]})
    assert found(h.build()) == {}


# -- within one poll ------------------------------------------------------------------------


def test_int_poll_skip_flagged_within_one_poll() -> None:
    h = three()
    h.poll(1, {"k": [(0, 10), (2, 12)]})
    assert found(h.build()) == {"int-poll-skip": 1}


def test_int_poll_skip_not_flagged_for_contiguous_records() -> None:
    h = three()
    h.poll(1, {"k": [(0, 10), (1, 11), (2, 12)]})
    assert found(h.build()) == {}


def test_int_nonmonotonic_poll_flagged_within_one_poll() -> None:
    h = three()
    h.poll(1, {"k": [(1, 11), (0, 10)]})
    assert found(h.build()) == {"int-nonmonotonic-poll": 1}


def test_int_nonmonotonic_poll_not_flagged_across_keys() -> None:
    h = three()
    h.send(9, "j", 20, offset=0)
    h.poll(1, {"k": [(1, 11)], "j": [(0, 20)]})
    assert found(h.build()) == {}


# -- nonmonotonic-send ----------------------------------------------------------------------


def test_nonmonotonic_send_flagged_when_a_producers_offsets_go_back() -> None:
    h = sent(("k", 10, 1), ("k", 11, 0))
    h.poll(1, {"k": [(0, 11), (1, 10)]})
    assert found(h.build()) == {"nonmonotonic-send": 1}
    assert example(h.build(), "nonmonotonic-send")["offsets"] == [1, 0]


def test_nonmonotonic_send_not_flagged_across_producers() -> None:
    h = HistoryBuilder()
    h.send(1, "k", 10, offset=1)
    h.send(2, "k", 11, offset=0)
    h.poll(3, {"k": [(0, 11), (1, 10)]})
    assert found(h.build()) == {}


# -- results shape --------------------------------------------------------------------------


def test_every_anomaly_type_is_counted_even_when_zero() -> None:
    results = check(three().build())
    assert set(results["anomaly_counts"]) == set(ANOMALY_TYPES)
    assert results["valid"] is True and results["anomalies"] == {}


def test_examples_are_bounded_but_counts_are_not() -> None:
    h = HistoryBuilder()
    for i in range(50):
        h.send(9, "k", i, offset=i)
    results = check(h.build(), max_examples=3)
    assert results["anomaly_counts"]["unseen"] == 50
    assert len(results["anomalies"]["unseen"]) == 3


def test_op_counts_and_faults() -> None:
    h = HistoryBuilder()
    h.fault("start", "partition", ["n1"])
    h.send(1, "k", 1, offset=0)
    h.send(1, "k", 2, type_="fail")
    h.send(1, "k", 3, type_="info")
    h.fault("stop", "partition")
    h.invoke(2, "poll")  # never completes: counted as info
    results = check(h.build())
    assert results["ops"]["send"] == {"ok": 1, "fail": 1, "info": 1}
    assert results["ops"]["poll"] == {"ok": 0, "fail": 0, "info": 1}
    assert results["ops"]["total"] == {"ok": 1, "fail": 1, "info": 2}
    assert results["faults"]["by_kind"] == {"partition": 1}
    assert results["faults"]["windows"][0]["healed"] is True


@pytest.mark.parametrize("key", [3, "3"])
def test_int_and_string_keys_are_the_same_key(key: Any) -> None:
    h = HistoryBuilder()
    h.send(1, key, 5, offset=0)
    h.poll(2, {"3": [(0, 5)]})
    assert found(h.build()) == {}
