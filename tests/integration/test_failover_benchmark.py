"""Smoke run of `python -m benchmarks.failover` with tiny settings: three real nodes, one
kill -9 of the leader of partition 0 under a stock acks=all producer, a plot, and one JSON
object last on stdout."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
SMOKE_TIMEOUT_S = 120
EXPECTED_KEYS = {"kill_median_s", "kill_max_s", "isolate_median_s", "isolate_max_s"}


def test_failover_benchmark_prints_json_last(tmp_path):
    plot = tmp_path / "failover.png"
    command = [
        sys.executable,
        "-m",
        "benchmarks.failover",
        "--kills",
        "1",
        "--isolations",
        "0",
        "--settle",
        "0.5",
        "--rate",
        "50",
        "--recovery-timeout",
        "30",
        "--plot",
        str(plot),
        "--dir",
        str(tmp_path / "bench"),
    ]
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result) >= EXPECTED_KEYS, result
    assert len(result["kill_windows_s"]) == 1 and result["kill_recovered"] == [True], result
    assert 0 < result["kill_median_s"] == result["kill_max_s"] < 30, result
    # Isolations were not asked for: null, and the reason says so.
    assert result["isolate_median_s"] is None and result["isolate_max_s"] is None
    assert result["isolate_skipped"] == "--isolations 0"
    assert plot.stat().st_size > 0
