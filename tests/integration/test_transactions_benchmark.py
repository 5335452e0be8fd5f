"""`python -m benchmarks.transactions` with tiny durations: a three-node cluster starts, both
pairs are measured, and stdout ends with the one JSON object."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
SMOKE_TIMEOUT_S = 300


def test_transactions_benchmark_measures_every_side_and_prints_json_last() -> None:
    command = [
        sys.executable,
        "-m",
        "benchmarks.transactions",
        "--seconds",
        "1",
        "--rounds",
        "1",
        "--records-per-txn",
        "20",
    ]
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("txn_produce_ratio", "read_committed_ratio"):
        assert result[key] > 0, (key, result)
    for key in (
        "txn_produce_mib_s",
        "idempotent_produce_mib_s",
        "fetch_read_committed_mib_s",
        "fetch_read_uncommitted_mib_s",
        "transactions_per_round",
    ):
        assert len(result[key]) == 1 and result[key][0] > 0, (key, result)
    assert result["records_per_txn"] == 20
    assert result["fetched_records"] == 20 * result["transactions_per_round"][0]
