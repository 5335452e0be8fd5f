"""The expected-failures list, the comparison with it, and the table in docs/compat.md.

compat/expected_failures.toml names each broker-facing test raftlog is known to fail, with
the reason and the issue that will fix it:

    [tests."0030_offset_commit"]
    reason = "OffsetCommit for an unknown topic answers success"
    issue = 17

A run reports every test whose verdict differs from the list: a listed test that passes
(take it off the list) and a failing test that is not listed (a regression, or a new find).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compat.runner import Verdict

EXPECTED_FAILURES_PATH = Path(__file__).with_name("expected_failures.toml")
DOC_BEGIN = "<!-- compat-table:begin -->"
DOC_END = "<!-- compat-table:end -->"
# Verdicts that count against the pass rate; skipped tests and those needing Apache Kafka's
# own scripts are left out of it.
FAILING = ("failed", "timeout", "node-exited")
MAX_DETAIL_CHARS = 160


@dataclass(frozen=True)
class Expected:
    reason: str
    issue: int | None


def load_expected(path: Path = EXPECTED_FAILURES_PATH) -> dict[str, Expected]:
    """The list, checked: each entry needs a reason."""
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    out = {}
    for name, entry in data.get("tests", {}).items():
        if not isinstance(entry, dict) or not str(entry.get("reason", "")).strip():
            raise ValueError(f"{path}: tests.{name!r} needs a reason")
        issue = entry.get("issue")
        if issue is not None and not isinstance(issue, int):
            raise ValueError(f"{path}: tests.{name!r}.issue must be an issue number")
        out[name] = Expected(str(entry["reason"]).strip(), issue)
    return out


def summarize(verdicts: Iterable[Verdict], expected: dict[str, Expected]) -> dict[str, Any]:
    """Counts, the pass rate over the tests that count, and the differences from the list."""
    verdicts = list(verdicts)
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v.state] = counts.get(v.state, 0) + 1
    counted = [v for v in verdicts if v.state == "passed" or v.state in FAILING]
    passed = sum(1 for v in counted if v.state == "passed")
    failing = {v.name for v in verdicts if v.state in FAILING}
    ran = {v.name for v in verdicts}
    return {
        "passed": passed,
        "counted": len(counted),
        "pass_rate": round(passed / len(counted), 4) if counted else 0.0,
        "states": counts,
        "unexpected_failures": sorted(failing - set(expected)),
        "unexpected_passes": sorted(
            v.name for v in verdicts if v.state == "passed" and v.name in expected
        ),
        "expected_not_run": sorted(set(expected) - ran),
    }


def _cell(text: str) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 1] + "…"


def table(verdicts: Iterable[Verdict], expected: dict[str, Expected], header: str) -> str:
    """The markdown written between the markers of docs/compat.md."""
    rows = [
        header,
        "",
        "| test | scenario | verdict | seconds | cause |",
        "| --- | --- | --- | --- | --- |",
    ]
    for v in verdicts:
        entry = expected.get(v.name)
        cause = v.detail
        if entry is not None and v.state != "passed":
            issue = f" (#{entry.issue})" if entry.issue is not None else ""
            cause = f"expected: {entry.reason}{issue}"
        elif entry is not None:
            cause = "passes: take it off the expected-failures list"
        verdict = f"**{v.state}**" if v.state in FAILING and entry is None else v.state
        rows.append(
            f"| `{v.name}` | {v.scenario} | {verdict} | {v.seconds:.1f} | "
            f"{_cell(cause if v.state != 'passed' or entry is not None else '')} |"
        )
    return "\n".join(rows)


def write_doc(doc: Path, markdown: str) -> None:
    """Replace what lies between the markers (appending them if absent)."""
    text = doc.read_text(encoding="utf-8") if doc.exists() else "# Compatibility\n"
    block = f"{DOC_BEGIN}\n{markdown}\n{DOC_END}"
    if DOC_BEGIN in text and DOC_END in text:
        before, rest = text.split(DOC_BEGIN, 1)
        after = rest.split(DOC_END, 1)[1]
        text = before + block + after
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    doc.write_text(text, encoding="utf-8")
