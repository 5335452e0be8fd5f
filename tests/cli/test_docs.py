"""docs/operations.md carries the generated config table; it must match the code."""

from __future__ import annotations

from pathlib import Path

from raftlog.config import config_docs

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_operations_doc_lists_every_config_key_with_its_default() -> None:
    text = DOC.read_text()
    for key, default, _ in config_docs():
        assert f"| `{key}` | `{default}` |" in text, f"{key} missing or stale in {DOC}"
