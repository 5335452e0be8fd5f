"""``python -m jepsen``: the fault-injection harness's command line.

    python -m jepsen report [DIR] [--recheck]   re-render a run (default: the latest)
    python -m jepsen check DIR                  check history.jsonl, write results.json
    python -m jepsen run [--nodes 3] [--time-limit 60] [--nemesis kill,partition]
                         [--nemesis-interval 10] [--unsafe] [--secure] [--seed N]
    python -m jepsen matrix [--runs 3] [--time-limit 120] [--secure]   table into docs/jepsen.md
    run and matrix take --workload queue (the default) or txn (transactions)
    python -m jepsen cleanup                    remove namespaces a crashed run left

Exit status: 0 valid, 1 invalid (anomalies found), 2 usage or input error, 3 not available.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from jepsen.history import HistoryError

EXIT_VALID, EXIT_INVALID, EXIT_ERROR, EXIT_UNAVAILABLE = 0, 1, 2, 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jepsen", description="raftlog's Jepsen-style fault-injection harness"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    rep = sub.add_parser("report", help="re-render plots and summary.txt of a run directory")
    rep.add_argument("dir", nargs="?", default="latest", help="run directory, name or 'latest'")
    rep.add_argument(
        "--recheck", action="store_true", help="run the checker again even if results.json exists"
    )
    rep.set_defaults(handler=cmd_report)

    chk = sub.add_parser("check", help="check history.jsonl and write results.json (no plots)")
    chk.add_argument("dir", nargs="?", default="latest", help="run directory, name or 'latest'")
    chk.set_defaults(handler=cmd_check)

    run = sub.add_parser("run", help="run the workload under a nemesis against a local cluster")
    _run_options(run)
    run.set_defaults(handler=cmd_run)

    mat = sub.add_parser(
        "matrix",
        help="each nemesis (none, kill, ..., membership, all) x N runs; table into docs/jepsen.md",
    )
    _run_options(mat, time_limit_s=120.0, matrix=True)
    mat.set_defaults(handler=cmd_matrix)

    clean = sub.add_parser("cleanup", help="remove namespaces, bridges and nodes a run left behind")
    clean.set_defaults(handler=cmd_cleanup)
    return parser


def cmd_report(args: argparse.Namespace) -> int:
    from jepsen.report import report
    from jepsen.store import SUMMARY_FILE, resolve_run_dir

    run_dir = resolve_run_dir(args.dir)
    results = report(run_dir, recheck=args.recheck)
    print((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"), end="")
    print(f"rendered into {run_dir}")
    return EXIT_VALID if results["valid"] else EXIT_INVALID


def cmd_check(args: argparse.Namespace) -> int:
    from jepsen.checker import check, write_results
    from jepsen.history import read_history
    from jepsen.report import summary_text
    from jepsen.store import HISTORY_FILE, RESULTS_FILE, resolve_run_dir

    run_dir = resolve_run_dir(args.dir)
    results = check(read_history(run_dir / HISTORY_FILE))
    write_results(run_dir / RESULTS_FILE, results)
    print(summary_text(results, run_dir.name), end="")
    return EXIT_VALID if results["valid"] else EXIT_INVALID


def _run_options(
    p: argparse.ArgumentParser, time_limit_s: float = 60.0, matrix: bool = False
) -> None:
    p.add_argument("--nodes", type=int, default=3, choices=(3, 5), help="cluster size")
    p.add_argument(
        "--time-limit", type=float, default=time_limit_s, metavar="S", help="workload seconds"
    )
    if not matrix:
        p.add_argument(
            "--nemesis",
            default="kill,partition",
            help="comma-separated: kill, pause, partition, restart, corrupt, truncate, forge, "
            "membership, or one fault kind such as partition-partition-leader; or all, none",
        )
    else:
        p.add_argument(
            "--nemesis",
            default="none,kill,pause,partition,corrupt,truncate,forge,membership,all",
            help="the matrix's nemeses, each run on its own (a name, all or none)",
        )
        p.add_argument("--runs", type=int, default=3, help="runs per nemesis")
        p.add_argument("--doc", default="docs/jepsen.md", help="where the results table goes")
    p.add_argument("--nemesis-interval", type=float, default=10.0, metavar="S")
    p.add_argument(
        "--unsafe",
        action="store_true",
        help="Kafka's documented lossy setup: acks=1, min ISR 1, unclean election, fsync interval",
    )
    p.add_argument(
        "--secure",
        action="store_true",
        help="a local CA and node certificates, SASL_SSL (SCRAM-SHA-512) clients, mutual TLS "
        "between nodes, the ACL authorizer (super user: the run's admin)",
    )
    p.add_argument("--seed", type=int, default=None, help="replay a run's choices")
    p.add_argument(
        "--workload",
        default="queue",
        choices=("queue", "txn"),
        help="queue: keyed sends and polls; txn: transactions across partitions with "
        "transactional offset commits and read_committed pollers (--senders of them)",
    )
    p.add_argument("--senders", type=int, default=4)
    p.add_argument("--pollers", type=int, default=2)
    p.add_argument("--no-progress", action="store_true", help="no live display")


def _base_options(args: argparse.Namespace, nemesis: tuple[str, ...]) -> Any:
    from jepsen.runner import RunOptions

    return RunOptions(
        nodes=args.nodes,
        time_limit_s=args.time_limit,
        nemesis=nemesis,
        nemesis_interval_s=args.nemesis_interval,
        unsafe=args.unsafe,
        secure=args.secure,
        seed=args.seed,
        senders=args.senders,
        pollers=args.pollers,
        progress=not args.no_progress and sys.stderr.isatty(),
        workload=args.workload,
    )


def cmd_run(args: argparse.Namespace) -> int:
    from jepsen.nemesis import parse_families
    from jepsen.runner import RunError, run, unavailable_reason
    from jepsen.store import SUMMARY_FILE

    families = tuple(parse_families(args.nemesis))
    reason = unavailable_reason()
    if reason:
        print(f"jepsen {args.command}: not available yet: {reason}")
        return EXIT_UNAVAILABLE
    try:
        outcome = run(_base_options(args, families))
    except RunError as exc:
        print(f"jepsen run: failed: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print((outcome.run_dir / SUMMARY_FILE).read_text(encoding="utf-8"), end="")
    print(f"run directory: {outcome.run_dir}")
    return EXIT_VALID if outcome.valid else EXIT_INVALID


def cmd_matrix(args: argparse.Namespace) -> int:
    from pathlib import Path

    from jepsen.nemesis import parse_families
    from jepsen.runner import run_matrix, unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"jepsen {args.command}: not available yet: {reason}")
        return EXIT_UNAVAILABLE
    nemeses = tuple(n.strip() for n in args.nemesis.split(",") if n.strip())
    for nemesis in nemeses:
        parse_families(nemesis)  # reject a typo before hours of runs
    rows = run_matrix(_base_options(args, ()), args.runs, Path(args.doc), nemeses)
    for r in rows:
        verdict = r.error or ("valid" if r.valid else "INVALID " + r.anomalies)
        print(f"{r.nemesis:10} run {r.run}: {verdict}  ({r.run_dir})")
    print(f"table written to {args.doc}")
    return EXIT_VALID if all(r.valid for r in rows) else EXIT_INVALID


def cmd_cleanup(args: argparse.Namespace) -> int:
    from jepsen.netns import cleanup_all, missing_prerequisites

    if missing_prerequisites():
        print("jepsen cleanup: " + "; ".join(missing_prerequisites()), file=sys.stderr)
        return EXIT_UNAVAILABLE
    removed = cleanup_all()
    print("removed: " + (", ".join(removed) if removed else "nothing"))
    return EXIT_VALID


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except (FileNotFoundError, HistoryError, ValueError) as exc:
        print(f"jepsen {args.command}: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
