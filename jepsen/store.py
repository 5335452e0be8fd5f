"""Where a run's files go: ``jepsen/store/<timestamp>/``, with ``jepsen/store/latest`` pointing
at the newest run. The store is git-ignored.

One run directory holds:

    history.jsonl   every operation and nemesis event (jepsen.history)
    results.json    the checker's verdict (jepsen.checker)
    summary.txt     the verdict for a person, a dozen lines
    latency-raw.png latency of every op over time, faults shaded
    rate.png        throughput per op type over time, faults shaded
    nodes/          each node's log and data directory (the cluster control writes these)
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

STORE_ROOT = Path(__file__).resolve().parent / "store"
LATEST = "latest"

HISTORY_FILE = "history.jsonl"
RESULTS_FILE = "results.json"
SUMMARY_FILE = "summary.txt"
LATENCY_PNG = "latency-raw.png"
RATE_PNG = "rate.png"
NODES_DIR = "nodes"

# Two runs started in the same second get -1, -2, ... suffixes; past this, something is looping.
MAX_SAME_SECOND_RUNS = 100


def new_run_dir(
    root: Path = STORE_ROOT, name: str | None = None, now: dt.datetime | None = None
) -> Path:
    """Create and return a fresh run directory, and point ``latest`` at it.

    ``name`` (e.g. "partition-leader") is appended to the timestamp so a matrix run's
    directories say what they are.
    """
    stamp = (now or dt.datetime.now()).strftime("%Y%m%dT%H%M%S")
    base = f"{stamp}-{name}" if name else stamp
    root.mkdir(parents=True, exist_ok=True)
    for attempt in range(MAX_SAME_SECOND_RUNS):
        run = root / (base if attempt == 0 else f"{base}-{attempt}")
        try:
            run.mkdir()
        except FileExistsError:
            continue
        (run / NODES_DIR).mkdir()
        _point_latest(root, run)
        return run
    raise RuntimeError(f"{MAX_SAME_SECOND_RUNS} runs named {base!r} already exist under {root}")


def _point_latest(root: Path, run: Path) -> None:
    # Build the new link beside the old one and rename over it: a reader following
    # `latest` never finds it missing.
    tmp = root / f".{LATEST}.{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(run.name)
    os.replace(tmp, root / LATEST)


def resolve_run_dir(arg: str | Path, root: Path = STORE_ROOT) -> Path:
    """A run directory from a CLI argument: a path, a run name under the store, or "latest"."""
    path = Path(arg)
    if path.is_dir():
        return path
    under_root = root / path
    if under_root.is_dir():
        return under_root.resolve() if str(arg) == LATEST else under_root
    looked = {str(path), str(under_root)}
    raise FileNotFoundError(f"no run directory {arg!r} (looked at {' and '.join(sorted(looked))})")


def list_runs(root: Path = STORE_ROOT) -> list[Path]:
    """Run directories, oldest first (names start with a sortable timestamp)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
