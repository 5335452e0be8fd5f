from __future__ import annotations

import json
from pathlib import Path

import pytest

from jepsen.__main__ import EXIT_ERROR, EXIT_INVALID, EXIT_VALID, main
from jepsen.checker import check
from jepsen.history import HistoryBuilder, write_history
from jepsen.report import render, summary_text
from jepsen.store import HISTORY_FILE, LATENCY_PNG, RATE_PNG, RESULTS_FILE, SUMMARY_FILE
from tests.jepsen.synth import synthetic_history

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SEED = 11


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory holding only a synthetic history.jsonl with faults."""
    path = tmp_path_factory.mktemp("run")
    write_history(path / HISTORY_FILE, synthetic_history(SEED, duration_s=3.0))
    return path


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    # A blank 12x5 in figure is ~15 kB; points, lines and shading push it well past that.
    assert data.startswith(PNG_MAGIC) and len(data) > 20_000, f"seed={SEED} {path}"


def test_render_writes_readable_pngs_and_a_summary(run_dir: Path, tmp_path: Path) -> None:
    from jepsen.history import read_history

    history = read_history(run_dir / HISTORY_FILE)
    results = check(history)
    paths = render(tmp_path, history, results)
    assert [p.name for p in paths] == [LATENCY_PNG, RATE_PNG, SUMMARY_FILE]
    assert_png(tmp_path / LATENCY_PNG)
    assert_png(tmp_path / RATE_PNG)
    summary = (tmp_path / SUMMARY_FILE).read_text()
    assert "verdict: VALID" in summary, f"seed={SEED}\n{summary}"
    assert "faults: " in summary and "lost-write" in summary and "send" in summary
    assert not list(tmp_path.glob("*.tmp*"))  # written via rename, nothing left behind


def test_cli_report_rechecks_when_results_are_missing(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run_dir / RESULTS_FILE).unlink(missing_ok=True)
    assert main(["report", str(run_dir)]) == EXIT_VALID
    results = json.loads((run_dir / RESULTS_FILE).read_text())
    assert results["valid"] is True and results["faults"]["count"] > 0, f"seed={SEED}"
    assert_png(run_dir / LATENCY_PNG)
    assert "verdict: VALID" in capsys.readouterr().out


def test_cli_report_uses_existing_results_unless_told_to_recheck(run_dir: Path) -> None:
    main(["report", str(run_dir)])
    results = json.loads((run_dir / RESULTS_FILE).read_text())
    results["valid"] = False  # a doctored verdict shows the file was reused, not recomputed
    results["anomaly_types"] = ["unseen"]
    (run_dir / RESULTS_FILE).write_text(json.dumps(results))
    assert main(["report", str(run_dir)]) == EXIT_INVALID
    assert "INVALID (unseen)" in (run_dir / SUMMARY_FILE).read_text()
    assert main(["report", str(run_dir), "--recheck"]) == EXIT_VALID


def test_cli_check_reports_an_invalid_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    h = HistoryBuilder()
    h.send(0, "k", 1, offset=0)
    h.send(0, "k", 2, offset=1)
    h.poll(1, {"k": [(1, 2)]})
    write_history(tmp_path / HISTORY_FILE, h.build())
    assert main(["check", str(tmp_path)]) == EXIT_INVALID
    out = capsys.readouterr().out
    assert "INVALID (lost-write)" in out and 'e.g. lost-write: {"key":"k","value":1' in out


def test_cli_input_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # run/matrix belong to the cluster harness and are tested with it.
    assert main(["report", str(tmp_path / "missing")]) == EXIT_ERROR
    (tmp_path / HISTORY_FILE).write_text("not json\n")
    assert main(["check", str(tmp_path)]) == EXIT_ERROR
    assert "header is not JSON" in capsys.readouterr().err


def test_summary_lists_counts_faults_and_one_example_per_anomaly() -> None:
    h = HistoryBuilder()
    h.fault("start", "pause", ["n2"])
    h.send(0, "k", 1, type_="fail")
    h.poll(1, {"k": [(0, 1)]})
    text = summary_text(check(h.build()), "demo")
    lines = text.splitlines()
    assert lines[:2] == ["raftlog jepsen run demo", "verdict: INVALID (aborted-read)"]
    assert "faults: 1 (pause 1)" in text and "(not healed)" in text
    assert any(line.split() == ["aborted-read", "1"] for line in lines)
    assert "e.g. aborted-read:" in text
