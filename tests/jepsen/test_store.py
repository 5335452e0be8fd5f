from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from jepsen.store import LATEST, NODES_DIR, list_runs, new_run_dir, resolve_run_dir

NOON = dt.datetime(2026, 1, 2, 12, 0, 0)


def test_new_run_dir_is_timestamped_and_latest_follows_it(tmp_path: Path) -> None:
    first = new_run_dir(tmp_path, now=NOON)
    assert first.name == "20260102T120000" and (first / NODES_DIR).is_dir()
    assert (tmp_path / LATEST).resolve() == first.resolve()
    second = new_run_dir(tmp_path, name="kill-leader", now=NOON + dt.timedelta(seconds=1))
    assert second.name == "20260102T120001-kill-leader"
    assert (tmp_path / LATEST).is_symlink()
    assert (tmp_path / LATEST).resolve() == second.resolve()
    assert list_runs(tmp_path) == [first, second]


def test_runs_started_in_the_same_second_do_not_collide(tmp_path: Path) -> None:
    runs = [new_run_dir(tmp_path, now=NOON) for _ in range(3)]
    assert [r.name for r in runs] == ["20260102T120000", "20260102T120000-1", "20260102T120000-2"]


def test_resolve_accepts_a_path_a_name_or_latest(tmp_path: Path) -> None:
    run = new_run_dir(tmp_path, now=NOON)
    assert resolve_run_dir(run, tmp_path) == run
    assert resolve_run_dir(run.name, tmp_path) == run
    assert resolve_run_dir(LATEST, tmp_path) == run.resolve()
    with pytest.raises(FileNotFoundError, match="no run directory"):
        resolve_run_dir("nope", tmp_path)
