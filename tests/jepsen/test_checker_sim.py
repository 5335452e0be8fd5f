"""The checker against whole simulated runs: a correct log is always valid, a log that drops
an acknowledged record never is, and a 120 s run checks in a few seconds."""

from __future__ import annotations

import json
import random
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from jepsen.checker import check
from jepsen.history import OK, READ_FS, History, Op
from tests.jepsen.synth import synthetic_history

# Checking a 120 s run (~50k client ops) may cost at most this many times one JSON round
# trip of the same history (about 1x when measured; JSON is C, the checker is Python)...
CHECK_VS_JSON_MAX_RATIO = 3.0
# ...and never more than this, however loaded the machine (a few seconds when idle).
CHECK_120S_CEILING_S = 30.0


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_a_correct_log_is_valid(seed: int) -> None:
    history = synthetic_history(seed, duration_s=1.0, processes=4, keys=3)
    results = check(history)
    assert results["valid"], f"seed={seed}: {results['anomalies']}"
    assert results["stats"]["acknowledged_sends"] > 0, f"seed={seed}"


def drop_from_reads(history: History, key: str, value: int) -> History:
    """The same history, except no poll ever returned ``value`` in ``key``."""
    ops = []
    for op in history.ops:
        if op.f in READ_FS and op.type == OK and isinstance(op.value, dict) and key in op.value:
            pairs = [p for p in op.value[key] if p[1] != value]
            op = Op(**{**op.to_json(), "value": {**op.value, key: pairs}})
        ops.append(op)
    return History(ops, history.meta)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_dropping_an_acknowledged_record_is_always_caught(seed: int) -> None:
    history = synthetic_history(seed, duration_s=1.0, processes=4, keys=3)
    acked = [op for op in history.ops if op.f == "send" and op.type == OK]
    victim = random.Random(seed).choice(acked)
    key, value = victim.value
    results = check(drop_from_reads(history, key, value))
    assert not results["valid"], f"seed={seed} victim={victim}"
    # Lost when a read got past its offset; unseen when it was the last record of its key.
    kind = "lost-write" if results["anomaly_counts"]["lost-write"] else "unseen"
    flagged = [(e["key"], e["value"]) for e in results["anomalies"][kind]]
    assert flagged == [(key, value)], f"seed={seed}: {results['anomalies']}"
    # Consumers that read across the hole also skipped a record known to exist.
    assert set(results["anomaly_types"]) <= {kind, "poll-skip", "int-poll-skip"}, f"seed={seed}"
    last_offset = max(op.offset for op in acked if op.value[0] == key)
    assert (kind == "unseen") == (victim.offset == last_offset), f"seed={seed}"


def test_a_120s_history_checks_within_budget() -> None:
    seed = 120
    history = synthetic_history(seed, duration_s=120.0, processes=10, keys=8, think_ms=18.0)
    client_ops = sum(1 for op in history.ops if op.type != "invoke" and not op.is_nemesis)
    assert client_ops > 40_000, f"seed={seed}: only {client_ops} ops"
    # Baseline from the same run, same data: one JSON round trip of every entry (what
    # reading history.jsonl costs anyway), timed on every 4th entry and scaled up to keep
    # the test short. Absolute times drift on a shared machine; the ratio does not.
    sample_every = 4
    started = time.perf_counter()
    for op in history.ops[::sample_every]:
        json.loads(json.dumps(op.to_json()))
    baseline_s = (time.perf_counter() - started) * sample_every
    started = time.perf_counter()
    results = check(history)
    check_s = time.perf_counter() - started
    ratio = check_s / baseline_s
    print(f"seed={seed} ops={client_ops} check_s={check_s:.2f} json_s={baseline_s:.2f}")
    assert results["valid"], f"seed={seed}"
    assert ratio < CHECK_VS_JSON_MAX_RATIO, f"seed={seed}: check/json ratio {ratio:.2f}"
    assert check_s < CHECK_120S_CEILING_S, f"seed={seed}: {check_s:.1f}s"
