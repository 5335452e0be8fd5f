"""Render a run for a person: latency and throughput plots with the faults shaded, and a
short summary.txt. Everything is re-derivable from history.jsonl (+ results.json).

Plots use matplotlib's object API with the Agg canvas directly (never pyplot), so rendering
touches no global backend state and needs no display.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from jepsen.checker import ANOMALY_TYPES, check, read_results, write_results
from jepsen.history import FAIL, INFO, OK, FaultWindow, History, read_history
from jepsen.store import HISTORY_FILE, LATENCY_PNG, RATE_PNG, RESULTS_FILE, SUMMARY_FILE

TYPE_COLOURS = {OK: "#2b7bba", INFO: "#f39c12", FAIL: "#d62728"}
F_MARKERS = {
    "send": "o",
    "poll": "^",
    "final-poll": "v",
    "assign": "s",
    "crash": "X",
    "txn": "D",
    "init": "P",
}
F_COLOURS = {
    "send": "#2b7bba",
    "poll": "#2ca02c",
    "final-poll": "#17becf",
    "assign": "#9467bd",
    "crash": "#7f7f7f",
    "txn": "#d62728",
    "init": "#8c564b",
}
TYPE_LINESTYLES = {OK: "-", INFO: "--", FAIL: ":"}
FAULT_COLOURS = ["#e377c2", "#bcbd22", "#ff7f0e", "#8c564b", "#9edae5", "#c5b0d5"]

FIGURE_SIZE_IN = (12.0, 5.0)
FIGURE_DPI = 110
# Throughput is counted in about this many time buckets across the run, at least this wide.
RATE_BUCKETS = 120
MIN_RATE_BUCKET_S = 0.01
MIN_PLOTTED_LATENCY_MS = 0.01
# Fault labels are drawn only for this many windows; more would overlap into noise.
MAX_FAULT_LABELS = 40
# A fault starting in the last part of the x range gets its label right-aligned to its end.
LABEL_RIGHT_ALIGN_FRACTION = 0.2
# summary.txt lists at most this many fault windows and one example per anomaly type.
MAX_SUMMARY_FAULTS = 12
MAX_SUMMARY_EXAMPLE_CHARS = 160


def report(run_dir: Path, recheck: bool = False) -> dict[str, Any]:
    """Re-render a run directory from history.jsonl; check again when results.json is missing
    (or when asked). Returns the results."""
    history = read_history(run_dir / HISTORY_FILE)
    results_path = run_dir / RESULTS_FILE
    if recheck or not results_path.exists():
        results = check(history)
        write_results(results_path, results)
    else:
        results = read_results(results_path)
    render(run_dir, history, results)
    return results


def render(run_dir: Path, history: History, results: dict[str, Any]) -> list[Path]:
    """Write the plots and summary.txt into run_dir; returns the paths written."""
    windows = history.fault_windows()
    title = run_dir.name
    paths = [run_dir / LATENCY_PNG, run_dir / RATE_PNG, run_dir / SUMMARY_FILE]
    plot_latency(history, windows, paths[0], title)
    plot_rate(history, windows, paths[1], title)
    _write_text(paths[2], summary_text(results, title))
    return paths


def _new_figure() -> tuple[Figure, Any]:
    fig = Figure(figsize=FIGURE_SIZE_IN, dpi=FIGURE_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def plot_latency(history: History, windows: list[FaultWindow], path: Path, title: str) -> None:
    """Every completed op: x = when it was invoked, y = how long it took (log scale)."""
    fig, ax = _new_figure()
    points: dict[tuple[str, str], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    unfinished = 0
    for c in history.completed():
        if c.latency_ns is None:
            unfinished += 1
            continue
        xs, ys = points[(c.f, c.type)]
        xs.append(c.invoke_ns / 1e9)
        # Floored: a log axis cannot show 0, and one instant op must not stretch the axis.
        ys.append(max(c.latency_ns / 1e6, MIN_PLOTTED_LATENCY_MS))
    # ok first so the rarer info/fail points are drawn on top and stay visible.
    order = {OK: 0, FAIL: 1, INFO: 2}
    for (f, type_), (xs, ys) in sorted(points.items(), key=lambda kv: order[kv[0][1]]):
        ax.plot(
            xs,
            ys,
            linestyle="none",
            marker=F_MARKERS.get(f, "."),
            markersize=2.5 if type_ == OK else 4,
            alpha=0.5 if type_ == OK else 0.9,
            color=TYPE_COLOURS[type_],
            markeredgewidth=0,
        )
    ax.set_yscale("log")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("latency (ms, log)")
    suffix = f"; {unfinished} ops never completed (not shown)" if unfinished else ""
    ax.set_title(f"{title}: latency of every op{suffix}")
    ax.grid(True, which="major", alpha=0.3)
    _shade_faults(ax, windows)
    handles = [
        Line2D([], [], linestyle="none", marker="o", color=colour, label=type_)
        for type_, colour in TYPE_COLOURS.items()
    ] + [
        Line2D([], [], linestyle="none", marker=F_MARKERS[f], color="black", label=f)
        for f in sorted({f for f, _ in points}, key=list(F_MARKERS).index)
        if f in F_MARKERS
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    _save(fig, path)


def plot_rate(history: History, windows: list[FaultWindow], path: Path, title: str) -> None:
    """Completions per second for each op type and outcome, in fixed time buckets."""
    fig, ax = _new_figure()
    duration_s = max(history.duration_ns / 1e9, MIN_RATE_BUCKET_S)
    bucket_s = _nice_bucket_s(duration_s / RATE_BUCKETS)
    n_buckets = int(duration_s / bucket_s) + 1
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0] * n_buckets)
    for c in history.completed():
        at_ns = c.complete_ns if c.complete_ns is not None else c.invoke_ns
        counts[(c.f, c.type)][min(int(at_ns / 1e9 / bucket_s), n_buckets - 1)] += 1
    xs = [(i + 0.5) * bucket_s for i in range(n_buckets)]
    for (f, type_), row in sorted(counts.items()):
        ax.plot(
            xs,
            [n / bucket_s for n in row],
            color=F_COLOURS.get(f, "black"),
            linestyle=TYPE_LINESTYLES[type_],
            linewidth=1.4 if type_ == OK else 1.0,
            label=f"{f} {type_}",
        )
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("ops/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{title}: throughput (completions per second, {bucket_s:g} s buckets)")
    ax.grid(True, alpha=0.3)
    _shade_faults(ax, windows)
    if counts:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    _save(fig, path)


def _nice_bucket_s(raw_s: float) -> float:
    """The smallest of 1, 2, 5 x 10^n seconds that is at least raw_s, so axes read plainly."""
    scale = MIN_RATE_BUCKET_S
    while True:
        for step in (1, 2, 5):
            if step * scale >= raw_s:
                return round(step * scale, 6)
        scale *= 10


def _shade_faults(ax: Any, windows: list[FaultWindow]) -> None:
    """Shade each fault window in its kind's colour and label it along the top."""
    kinds = sorted({w.kind for w in windows})
    colour_of = {k: FAULT_COLOURS[i % len(FAULT_COLOURS)] for i, k in enumerate(kinds)}
    transform = ax.get_xaxis_transform()  # x in data units, y in axes fraction
    # The data are plotted already, so the x range is known: a label that would run off the
    # right edge is written leftwards from its window's end instead.
    x_lo, x_hi = ax.get_xlim()
    right_aligned_from = x_hi - (x_hi - x_lo) * LABEL_RIGHT_ALIGN_FRACTION
    for i, w in enumerate(windows):
        ax.axvspan(w.start_ns / 1e9, w.stop_ns / 1e9, color=colour_of[w.kind], alpha=0.18, lw=0)
        if i < MAX_FAULT_LABELS:
            label = w.kind + (" " + ",".join(w.targets) if w.targets else "")
            label += "" if w.healed else " (not healed)"
            at_right = w.start_ns / 1e9 > right_aligned_from
            ax.text(
                (w.stop_ns if at_right else w.start_ns) / 1e9,
                0.99 - 0.05 * (i % 3),  # stagger so adjacent windows' labels do not collide
                label,
                transform=transform,
                fontsize=7,
                va="top",
                ha="right" if at_right else "left",
                color="#333333",
                # A translucent box keeps the label legible over dense points.
                bbox={"facecolor": "white", "alpha": 0.7, "linewidth": 0, "pad": 1.0},
                clip_on=True,
            )


def _save(fig: Figure, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=FIGURE_DPI)
    os.replace(tmp, path)


def summary_text(results: dict[str, Any], title: str = "run") -> str:
    """A dozen lines: verdict, op counts, faults, anomaly counts, one example of each."""
    found = results.get("anomaly_types", [])
    verdict = "VALID" if results.get("valid") else "INVALID (" + ", ".join(found) + ")"
    stats = results.get("stats", {})
    lines = [
        f"raftlog jepsen run {title}",
        f"verdict: {verdict}",
        f"duration: {stats.get('duration_s', 0)} s, {stats.get('history_entries', 0)} history "
        f"entries, {stats.get('keys', 0)} keys, {stats.get('acknowledged_sends', 0)} "
        f"acknowledged sends",
        "",
        "ops          ok     fail     info",
    ]
    for f, by_type in results.get("ops", {}).items():
        lines.append(f"  {f:<10}" + "".join(f"{by_type.get(t, 0):>7}  " for t in (OK, FAIL, INFO)))
    faults = results.get("faults", {})
    kinds = ", ".join(f"{k} {n}" for k, n in faults.get("by_kind", {}).items())
    lines += ["", f"faults: {faults.get('count', 0)}" + (f" ({kinds})" if kinds else "")]
    for w in faults.get("windows", [])[:MAX_SUMMARY_FAULTS]:
        targets = ",".join(w["targets"]) or "-"
        healed = "" if w["healed"] else "  (not healed)"
        lines.append(
            f"  {w['start_s']:>8.1f}s - {w['stop_s']:>8.1f}s  {w['kind']} {targets}{healed}"
        )
    if faults.get("count", 0) > MAX_SUMMARY_FAULTS:
        lines.append(f"  ... {faults['count'] - MAX_SUMMARY_FAULTS} more in results.json")
    lines += ["", "anomalies:"]
    counts = results.get("anomaly_counts", {})
    for kind in counts or ANOMALY_TYPES:  # each workload's checker lists its own kinds
        lines.append(f"  {kind:<22}{counts.get(kind, 0):>7}")
    for kind in found:
        shown = results.get("anomalies", {}).get(kind) or []
        if shown:
            text = json.dumps(shown[0], separators=(",", ":"))
            if len(text) > MAX_SUMMARY_EXAMPLE_CHARS:
                text = text[: MAX_SUMMARY_EXAMPLE_CHARS - 3] + "..."
            lines.append(f"  e.g. {kind}: {text}")
    for warning in results.get("warnings", []):
        lines.append(f"warning: {warning}")
    return "\n".join(lines) + "\n"


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
