"""The transactional workload end to end (a real cluster, kills), and its wiring into the
harness: the CLI option, the checker chosen from the history, its own matrix table."""

from __future__ import annotations

from pathlib import Path

import pytest

from jepsen.history import FINAL_POLL, read_history, write_history
from jepsen.runner import RunOptions, run, unavailable_reason
from jepsen.txn_history import TxnHistoryBuilder

REASON = unavailable_reason()
needs_cluster = pytest.mark.skipif(REASON is not None, reason=REASON or "")

TXN_SMOKE_SEED = 5


@pytest.mark.cluster
@needs_cluster
def test_txn_smoke_run_with_kills_is_valid(tmp_path: Path) -> None:
    outcome = run(
        RunOptions(
            nodes=3,
            # One kill window (8-16 s) and the recovery after it. A transaction caught in
            # librdkafka's send_offsets_to_transaction stall is abandoned after 30 s, so
            # with start-up and the final reads the test stays near a minute.
            time_limit_s=20,
            nemesis=("kill",),
            nemesis_interval_s=8,
            seed=TXN_SMOKE_SEED,
            progress=False,
            store_root=tmp_path,
            workload="txn",
        )
    )
    res = outcome.results
    where = f"seed={TXN_SMOKE_SEED} {outcome.run_dir}"
    assert res["workload"] == "txn", where
    assert res["valid"], f"{where}: {res['anomaly_counts']} {res['anomalies']}"
    txns = res["stats"]["txns"]
    assert txns["ok"] > 20 and txns["fail"] > 0, f"{where} {txns}"
    assert res["stats"]["txns_with_reads_committed"] > 0, f"{where} {res['stats']}"
    assert res["ops"]["final-poll"]["ok"] > 0, f"{where} {res['ops']}"
    assert res["faults"]["count"] >= 1, f"{where} {res['faults']}"
    assert all(w["healed"] for w in res["faults"]["windows"]), where
    assert not outcome.warnings, f"{where} {outcome.warnings}"


def test_the_cli_selects_the_txn_workload() -> None:
    from jepsen.__main__ import _base_options, build_parser

    args = build_parser().parse_args(["run", "--workload", "txn", "--nemesis", "kill"])
    assert _base_options(args, ("kill",)).workload == "txn"
    default = build_parser().parse_args(["run"])
    assert _base_options(default, ()).workload == "queue"
    matrix = build_parser().parse_args(["matrix", "--workload", "txn"])
    assert _base_options(matrix, ()).workload == "txn"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--workload", "bank"])


def test_a_txn_history_is_checked_and_summarised_by_the_txn_checker(tmp_path: Path) -> None:
    from jepsen.checker import check
    from jepsen.report import summary_text

    h = TxnHistoryBuilder()
    h.txn(0, [(0, 1, 0), (1, 2, 0)])
    h.assign(9, [0, 1], seek_to_beginning=True)
    h.poll(9, {0: [(0, 1)]}, f=FINAL_POLL)  # 2 is missing: torn
    history = h.build()
    history.meta["workload"] = "txn"
    write_history(tmp_path / "history.jsonl", history)
    results = check(read_history(tmp_path / "history.jsonl"))
    assert results["workload"] == "txn" and results["anomaly_types"] == ["torn-transaction"]
    text = summary_text(results)
    assert "torn-transaction" in text and "lost-write" in text and "int-poll-skip" not in text


def test_a_txn_matrix_keeps_a_table_of_its_own(tmp_path: Path) -> None:
    from jepsen.runner import MATRIX_BEGIN, MatrixRow, matrix_table, write_matrix_table

    doc = tmp_path / "jepsen.md"
    rows = [MatrixRow("kill", 1, "20260101T000000-kill-1", True, "-", 321, 5)]
    write_matrix_table(doc, matrix_table(rows, RunOptions()))
    txn = RunOptions(workload="txn")
    write_matrix_table(doc, matrix_table(rows, txn), workload="txn")
    write_matrix_table(doc, matrix_table(rows, txn), workload="txn")
    text = doc.read_text()
    assert text.count(MATRIX_BEGIN) == 1
    assert text.count("<!-- jepsen-matrix-txn:begin -->") == 1
    assert "`python -m jepsen matrix --workload txn`" in text
    assert "| committed transactions |" in text
