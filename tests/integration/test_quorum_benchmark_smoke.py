"""Smoke run of `python -m benchmarks.quorum` with tiny durations: it starts three real nodes
and three pysyncobj processes, does one failover, and ends stdout with one JSON object."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

# About 30 s (three nodes and three pysyncobj processes): `make test-all`.
pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SMOKE_TIMEOUT_S = 300
EXPECTED_KEYS = {
    "commits_per_s",
    "pysyncobj_commits_per_s",
    "ratio",
    "failover_s_median",
    "failover_s_max",
}


def test_quorum_benchmark_prints_json_last(tmp_path):
    command = [
        sys.executable,
        "-m",
        "benchmarks.quorum",
        "--seconds",
        "1",
        "--failovers",
        "1",
        "--writers",
        "4",
        "--dir",
        str(tmp_path / "bench"),
    ]
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    last_line = done.stdout.strip().splitlines()[-1]
    result = json.loads(last_line)
    assert set(result) >= EXPECTED_KEYS, result
    assert result["commits_per_s"] > 0, result
    assert result["pysyncobj_commits_per_s"] > 0, result
    assert result["ratio"] == pytest.approx(
        result["commits_per_s"] / result["pysyncobj_commits_per_s"], rel=0.02
    )
    assert result["failovers"] == 1
    assert 0 < result["failover_s_median"] <= result["failover_s_max"]
