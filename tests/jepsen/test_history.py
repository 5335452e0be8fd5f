from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jepsen.history import (
    SCHEMA_NAME,
    SCHEMA_VERSION,
    History,
    HistoryBuilder,
    HistoryError,
    HistoryWriter,
    Op,
    Recorder,
    header,
    parse_history,
    read_history,
    write_history,
)


def small() -> History:
    h = HistoryBuilder()
    h.fault("start", "partition", ["n2", "n1"])
    h.send(0, "k", 1, offset=0)
    h.send(0, "k", 2, type_="info")
    h.poll(1, {"k": [(0, 1)]})
    h.assign(1, ["k"], seek_to_beginning=True)
    h.crash(1)
    h.fault("stop", "partition")
    return h.build()


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    history = small()
    history.meta["workload"] = "queue"
    write_history(tmp_path / "h.jsonl", history)
    back = read_history(tmp_path / "h.jsonl")
    assert back.ops == history.ops
    assert back.meta == {"workload": "queue"}
    head = json.loads((tmp_path / "h.jsonl").read_text().splitlines()[0])
    assert head["schema"] == SCHEMA_NAME and head["version"] == SCHEMA_VERSION


def test_send_completion_repeats_key_and_value_and_carries_the_offset() -> None:
    ops = small().ops
    ok = ops[2]
    assert (ok.type, ok.f, ok.value, ok.offset) == ("ok", "send", ["k", 1], 0)
    assert ops[1].time_ns < ok.time_ns  # the builder's clock moves on every entry
    assert ok.to_json()["offset"] == 0 and "error" not in ok.to_json()


def test_unknown_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps({"schema": SCHEMA_NAME, "version": 99}) + "\n")
    with pytest.raises(HistoryError, match="schema version 99"):
        read_history(path)


def test_a_file_without_a_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps(small().ops[0].to_json()) + "\n")
    with pytest.raises(HistoryError, match="not a raftlog-jepsen-history"):
        read_history(path)


def test_a_torn_last_line_is_dropped_but_a_torn_middle_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    write_history(path, small())
    text = path.read_text()
    path.write_text(text + '{"index": 99, "proc')
    assert len(read_history(path)) == len(small())
    lines = text.splitlines()
    lines.insert(3, '{"index": 99, "proc')
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(HistoryError, match=":4: bad line"):
        read_history(path)


def test_an_entry_with_an_unknown_type_is_refused() -> None:
    with pytest.raises(HistoryError, match="unknown entry type"):
        Op.from_json({"index": 0, "process": 0, "type": "maybe", "f": "send"})


def test_writer_buffers_up_to_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    writer = HistoryWriter(path, flush_every_ops=3)
    ops = small().ops
    writer.append(ops[0])
    writer.append(ops[1])
    assert writer.buffered_ops == 2 and len(path.read_text().splitlines()) == 1
    writer.append(ops[2])
    assert writer.buffered_ops == 0 and len(path.read_text().splitlines()) == 4
    writer.close()


def test_recorder_streams_to_its_sink_and_refuses_overlapping_ops(tmp_path: Path) -> None:
    now = [0]
    with HistoryWriter(tmp_path / "h.jsonl") as writer:
        rec = Recorder(lambda: now[0], sink=writer.append)
        rec.invoke(0, "send", ["k", 1])
        now[0] = 5_000
        with pytest.raises(ValueError, match="still open"):
            rec.invoke(0, "poll")
        rec.ok(0, offset=3)
        with pytest.raises(ValueError, match="never invoked"):
            rec.ok(0)
        with pytest.raises(ValueError, match="unknown client op"):
            rec.invoke(1, "txn")
    back = read_history(tmp_path / "h.jsonl")
    assert [op.time_ns for op in back] == [0, 5_000]


def test_pairing_joins_invokes_to_completions_and_open_invokes_become_info() -> None:
    h = HistoryBuilder(tick_ns=10)
    h.invoke(0, "send", ["k", 1])
    h.invoke(1, "poll")
    h.ok(0, offset=0)
    h.invoke(0, "send", ["k", 2])  # never completes
    h.ok(1, {})
    done = h.build().completed()
    assert [(c.process, c.f, c.type, c.latency_ns) for c in done] == [
        (0, "send", "ok", 20),
        (1, "poll", "ok", 30),
        (0, "send", "info", None),
    ]


def test_fault_windows_pair_starts_with_stops() -> None:
    h = HistoryBuilder(tick_ns=100)
    h.fault("start", "kill", ["n1"])
    h.fault("start", "kill", ["n2"])
    h.fault("start", "partition", ["n3"], applied=False)  # never took effect
    h.fault("stop", "kill", ["n1"])
    h.fault("start", "pause", ["n3"])
    h.advance(1_000)
    h.send(0, "k", 1, offset=0)
    windows = h.build().fault_windows()
    assert [(w.kind, w.targets, w.start_ns, w.stop_ns, w.healed) for w in windows] == [
        ("kill", ["n1"], 100, 400, True),
        ("kill", ["n2"], 200, 1_700, False),  # still open: runs to the end of the history
        ("pause", ["n3"], 500, 1_700, False),
    ]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
ops_strategy = st.builds(
    Op,
    index=st.integers(0, 10**6),
    process=st.integers(0, 50) | st.just("nemesis"),
    type=st.sampled_from(["invoke", "ok", "fail", "info"]),
    f=st.sampled_from(["send", "poll", "final-poll", "assign", "crash", "start", "stop"]),
    value=json_values,
    time_ns=st.integers(0, 2**62),
    wall_s=st.floats(0, 2e9, allow_nan=False),
    offset=st.none() | st.integers(0, 2**62),
    error=st.none() | st.text(max_size=10),
)


@settings(max_examples=50, deadline=None)
@given(ops=st.lists(ops_strategy, max_size=20))
def test_any_history_survives_a_round_trip(ops: list[Op]) -> None:
    lines = [json.dumps(header())] + [json.dumps(op.to_json()) for op in ops]
    assert parse_history(lines).ops == ops
