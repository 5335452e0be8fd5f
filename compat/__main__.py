"""``python -m compat``: librdkafka's own broker-facing test suite against raftlog.

    python -m compat run [--tests 0001,0012] [--scenario all|default|noautocreate]
                         [--deadline-s 600] [--timeout-multiplier 1] [--no-doc]
                         [--group-protocol classic|consumer]
    python -m compat list                      the broker-facing tests, by scenario

`run` fetches and builds the pinned suite into .compat/ the first time (npm, gcc, make),
runs each test number alone against a fresh three-node cluster per scenario, writes the
table into docs/compat.md (a full run only) and .compat/results/<time>/, and prints one JSON
object last. Exit status: 0 when every failure is on compat/expected_failures.toml, 1 when a
test failed unexpectedly, 2 when the suite could not be set up.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from compat import report, source
from compat.runner import (
    DEFAULT_DEADLINE_S,
    GROUP_PROTOCOLS,
    KAFKA_VERSION,
    Verdict,
    run_scenario,
)
from compat.suite import SCENARIOS, broker_facing, read_tests

REPO = Path(__file__).resolve().parents[1]
WORK_DIR = REPO / ".compat"
DOC = REPO / "docs" / "compat.md"
console = Console(stderr=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m compat", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="build if needed, run the tests, write the table")
    run.add_argument("--tests", default="", help="comma-separated test numbers (default: all)")
    run.add_argument("--scenario", choices=("all", *SCENARIOS), default="all")
    run.add_argument("--deadline-s", type=float, default=DEFAULT_DEADLINE_S)
    run.add_argument(
        "--timeout-multiplier",
        type=float,
        default=1.0,
        help="librdkafka's test.timeout.multiplier (a slow machine may need 2)",
    )
    run.add_argument(
        "--group-protocol",
        choices=GROUP_PROTOCOLS,
        default="classic",
        help="the consumers' group.protocol (consumer: KIP-848); the doc's table is classic's",
    )
    run.add_argument("--no-doc", action="store_true", help="leave docs/compat.md alone")
    run.add_argument("--work-dir", type=Path, default=WORK_DIR)
    sub.add_parser("list", help="the broker-facing tests, by scenario").add_argument(
        "--work-dir", type=Path, default=WORK_DIR
    )
    return parser


def _numbers(text: str) -> set[str]:
    numbers = {part.strip() for part in text.split(",") if part.strip()}
    bad = [n for n in numbers if not (len(n) == 4 and n.isdigit())]
    if bad:
        raise SystemExit(f"--tests takes four-digit test numbers, got {', '.join(sorted(bad))}")
    return numbers


def cmd_list(args: argparse.Namespace) -> int:
    suite = source.prepare(args.work_dir)
    for case in broker_facing(read_tests(suite.tests_dir)):
        flags = " (librdkafka known issue)" if case.known_issue else ""
        print(f"{case.name}\t{','.join(case.scenarios)}{flags}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if args.deadline_s <= 0 or not 0.1 <= args.timeout_multiplier <= 100:
        raise SystemExit("--deadline-s must be > 0 and --timeout-multiplier in 0.1..100")
    wanted = _numbers(args.tests)
    expected = report.load_expected()
    console.print(f"librdkafka {source.LIBRDKAFKA_VERSION}: fetching and building if needed")
    suite = source.prepare(args.work_dir)
    cases = [
        c for c in broker_facing(read_tests(suite.tests_dir)) if not wanted or c.number in wanted
    ]
    if not cases:
        raise SystemExit(f"no broker-facing test has number {', '.join(sorted(wanted))}")
    scenarios = SCENARIOS if args.scenario == "all" else (args.scenario,)
    started = datetime.datetime.now(datetime.UTC)
    results_dir = args.work_dir / "results" / started.strftime("%Y%m%dT%H%M%S")
    verdicts: list[Verdict] = []
    total = sum(1 for c in cases for s in scenarios if s in c.scenarios)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("librdkafka tests", total=total)

        def show(found: list[Verdict]) -> None:
            for v in found:
                colour = "green" if v.state in ("passed", "skipped") else "red"
                bar.console.print(f"[{colour}]{v.state:>15}[/] {v.name} ({v.seconds:.1f} s)")
            bar.update(task, advance=len(found), description=f"librdkafka tests: {found[-1].name}")

        for scenario in scenarios:
            verdicts += run_scenario(
                suite,
                scenario,
                cases,
                results_dir,
                deadline_s=args.deadline_s,
                timeout_multiplier=args.timeout_multiplier,
                group_protocol=args.group_protocol,
                on_verdicts=show,
            )
    summary = report.summarize(
        verdicts,
        expected
        if not wanted
        else {name: e for name, e in expected.items() if name.split("_", 1)[0] in wanted},
    )
    header = (
        f"librdkafka {source.LIBRDKAFKA_VERSION} (npm {source.NPM_PACKAGE}@"
        f"{source.NPM_VERSION}), TEST_KAFKA_VERSION={KAFKA_VERSION}, "
        f"group.protocol={args.group_protocol}, three raftlog nodes per "
        f"scenario, run {started:%Y-%m-%d %H:%M} UTC: {summary['passed']} of "
        f"{summary['counted']} counted tests passed ({summary['pass_rate']:.1%})."
    )
    markdown = report.table(verdicts, expected, header)
    (results_dir / "table.md").write_text(markdown + "\n", encoding="utf-8")
    (results_dir / "results.json").write_text(
        json.dumps({"summary": summary, "verdicts": [v.__dict__ for v in verdicts]}, indent=1),
        encoding="utf-8",
    )
    full_run = not wanted and args.scenario == "all" and args.group_protocol == "classic"
    if full_run and not args.no_doc:
        report.write_doc(DOC, markdown)
        console.print(f"table written to {DOC}")
    for name in summary["unexpected_failures"]:
        console.print(f"[red]unexpected failure[/] {name}")
    for name in summary["unexpected_passes"]:
        console.print(f"[yellow]now passes, take it off the list[/] {name}")
    print(json.dumps({**summary, "results_dir": str(results_dir)}), flush=True)
    return 1 if summary["unexpected_failures"] else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command is None:
        args = build_parser().parse_args(["run", *(argv or sys.argv[1:])])
    try:
        return cmd_list(args) if args.command == "list" else cmd_run(args)
    except source.CompatSetupError as exc:
        console.print(f"[red]cannot set up librdkafka's test suite:[/] {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
