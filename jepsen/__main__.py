"""``python -m jepsen``: the fault-injection harness's command line.

    python -m jepsen report [DIR] [--recheck]   re-render a run (default: the latest)
    python -m jepsen check DIR                  check history.jsonl, write results.json
    python -m jepsen run ...                    one run against a local cluster (not yet)
    python -m jepsen matrix ...                 every nemesis x workload (not yet)

Exit status: 0 valid, 1 invalid (anomalies found), 2 usage or input error, 3 not available.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

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

    # The cluster control, nemeses and workload land later; these reserve their names so the
    # Makefile and docs can already point at them.
    for name, text in (
        ("run", "run one workload under one nemesis against a local cluster"),
        ("matrix", "run every nemesis x workload combination"),
    ):
        p = sub.add_parser(name, help=f"{text} (not available yet)")
        p.set_defaults(handler=cmd_unavailable, takes_any_args=True)
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


def cmd_unavailable(args: argparse.Namespace) -> int:
    print(f"jepsen {args.command}: not available yet (needs the cluster control and nemeses)")
    return EXIT_UNAVAILABLE


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # run/matrix accept any options for now (their flags are not designed yet); every other
    # command is strict.
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "takes_any_args", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.handler(args))
    except (FileNotFoundError, HistoryError, ValueError) as exc:
        print(f"jepsen {args.command}: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
