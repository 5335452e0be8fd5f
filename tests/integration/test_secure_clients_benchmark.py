"""`python -m benchmarks.security` with tiny durations and few ACLs: two secure three-node
clusters start, every side is measured, and stdout ends with the one JSON object."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
SMOKE_TIMEOUT_S = 300


def test_security_benchmark_measures_every_side_and_prints_json_last() -> None:
    command = [
        sys.executable,
        "-m",
        "benchmarks.security",
        "--seconds",
        "1",
        "--rounds",
        "1",
        "--acls",
        "50",
    ]
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("produce_tls_ratio", "fetch_tls_ratio", "authorizer_ratio"):
        assert result[key] > 0, (key, result)
    for key in (
        "produce_sasl_ssl_mib_s",
        "produce_plaintext_mib_s",
        "fetch_sasl_ssl_mib_s",
        "fetch_plaintext_mib_s",
        "produce_authorizer_on_mib_s",
        "produce_authorizer_off_mib_s",
    ):
        assert len(result[key]) == 1 and result[key][0] > 0, (key, result)
    assert result["acls"] == 50
