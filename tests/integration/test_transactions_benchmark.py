"""`python -m benchmarks.transactions` with tiny durations: a three-node cluster starts, every
pair is measured (two producers a side, then one), and stdout ends with the one JSON object."""

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
        "--producers",
        "2",
        "--fetch-seconds",
        "0",
    ]
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("txn_produce_ratio", "txn_produce_ratio_one_producer", "read_committed_ratio"):
        assert result[key] > 0, (key, result)
    for key in (
        "txn_produce_mib_s",
        "idempotent_produce_mib_s",
        "txn_produce_one_producer_mib_s",
        "idempotent_produce_one_producer_mib_s",
        "fetch_read_committed_mib_s",
        "fetch_read_uncommitted_mib_s",
    ):
        assert len(result[key]) == 1 and result[key][0] > 0, (key, result)
    assert result["producers"] == 2 and result["records_per_txn"] == 20
    # What each side of the main pair cost the nodes and the producers, in cores.
    for key in ("node_cores", "producer_cores"):
        for side in ("transactional", "idempotent"):
            values = result[key][side]
            assert len(values) == 1 and 0 < values[0] < 64, (key, side, result)
    assert len(result["load_average_1m"]) == 2, result
    # Two measurements of the transactional side (two producers, then one), each counting a
    # warm-up transaction per producer: every one of them is read back by both fetches.
    transactions = result["transactions_per_measurement"]
    assert len(transactions) == 2 and min(transactions) > 2, result
    assert result["fetched_records"] == 20 * sum(transactions)
