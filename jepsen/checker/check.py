"""Turn a history into results.json: the verdict, anomaly counts and examples, op counts and
the faults that were injected."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from jepsen.checker.anomalies import ANOMALY_TYPES, DEFAULT_MAX_EXAMPLES, run_all
from jepsen.checker.index import Index, build_index
from jepsen.history import CLIENT_FS, COMPLETION_TYPES, OK, SEND, History

RESULTS_SCHEMA = "raftlog-jepsen-results"
RESULTS_VERSION = 1
# results.json lists at most this many fault windows (the per-kind counts are always full).
MAX_FAULT_WINDOWS_LISTED = 500


def check(history: History, max_examples: int = DEFAULT_MAX_EXAMPLES) -> dict[str, Any]:
    """Check a Kafka-queue history. ``valid`` is true only when no anomaly of any type was
    found; ``warnings`` say when a true verdict is weak (nothing acknowledged, no final
    polls)."""
    if history.meta.get("workload") == "txn":
        from jepsen.txn_checker import check_txn  # it builds on this module

        return check_txn(history, max_examples)
    started = time.perf_counter()
    idx = build_index(history)
    anomalies = run_all(history, idx, max_examples)
    counts = {kind: anomalies.counts.get(kind, 0) for kind in ANOMALY_TYPES}
    found = [kind for kind, n in counts.items() if n]
    results: dict[str, Any] = {
        "schema": RESULTS_SCHEMA,
        "version": RESULTS_VERSION,
        "valid": not found,
        "anomaly_types": found,
        "anomaly_counts": counts,
        "anomalies": {kind: anomalies.examples[kind] for kind in found},
        "ops": op_counts(history),
        "faults": fault_summary(history),
        "stats": _stats(history, idx),
        "warnings": _warnings(history, idx),
    }
    results["stats"]["check_ms"] = round((time.perf_counter() - started) * 1000, 1)
    return results


def op_counts(history: History) -> dict[str, dict[str, int]]:
    """{f: {ok, fail, info}} for client ops, plus "total". Unfinished invokes count as info."""
    by_f: dict[str, Counter[str]] = {f: Counter() for f in CLIENT_FS}
    for c in history.completed():
        by_f.setdefault(c.f, Counter())[c.type] += 1
    out = {f: {t: by_f[f].get(t, 0) for t in COMPLETION_TYPES} for f in by_f if by_f[f]}
    out["total"] = {t: sum(c[t] for c in by_f.values()) for t in COMPLETION_TYPES}
    return out


def fault_summary(history: History) -> dict[str, Any]:
    windows = history.fault_windows()
    by_kind = Counter(w.kind for w in windows)
    return {
        "count": len(windows),
        "by_kind": dict(sorted(by_kind.items())),
        "windows": [
            {
                "kind": w.kind,
                "targets": w.targets,
                "start_s": round(w.start_ns / 1e9, 3),
                "stop_s": round(w.stop_ns / 1e9, 3),
                "healed": w.healed,
            }
            for w in windows[:MAX_FAULT_WINDOWS_LISTED]
        ],
    }


def _stats(history: History, idx: Index) -> dict[str, Any]:
    acked = sum(1 for ws in idx.writes.values() for w in ws.values() if w.type == OK)
    return {
        "history_entries": len(history),
        "duration_s": round(history.duration_ns / 1e9, 3),
        "keys": len(set(idx.keys) | set(idx.writes)),
        "acknowledged_sends": acked,
        "distinct_values_read": sum(len(log.first_reader) for log in idx.keys.values()),
    }


def _warnings(history: History, idx: Index) -> list[str]:
    out = []
    if not any(w.type == OK for ws in idx.writes.values() for w in ws.values()):
        out.append("no acknowledged sends: nothing to lose, so 'valid' proves little")
    if not idx.has_final_polls and any(op.f == SEND for op in history.ops):
        out.append("no final-poll ops: 'unseen' values may simply never have been polled")
    return out


def write_results(path: Path, results: dict[str, Any]) -> None:
    """tmp -> rename, so a reader never sees half a results.json."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=2, sort_keys=False)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_results(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        results = json.load(fh)
    if results.get("schema") != RESULTS_SCHEMA or results.get("version") != RESULTS_VERSION:
        raise ValueError(
            f"{path}: not a {RESULTS_SCHEMA} v{RESULTS_VERSION} file "
            f"(schema {results.get('schema')!r}, version {results.get('version')!r})"
        )
    return results
