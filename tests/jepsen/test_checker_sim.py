"""The checker against whole simulated runs: a correct log is always valid, a log that drops
an acknowledged record never is, and a 120 s run checks in a few seconds."""

from __future__ import annotations

import random
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from jepsen.checker import check
from jepsen.history import OK, READ_FS, History, Op
from tests.jepsen.synth import synthetic_history

# A 120 s run at the rate of the real workload (~50k client ops) must check within this.
CHECK_120S_BUDGET_S = 10.0


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
    started = time.perf_counter()
    results = check(history)
    elapsed_s = time.perf_counter() - started
    print(f"seed={seed} ops={client_ops} check_s={elapsed_s:.2f}")
    assert results["valid"], f"seed={seed}"
    assert elapsed_s < CHECK_120S_BUDGET_S, f"seed={seed}: {elapsed_s:.1f}s"
