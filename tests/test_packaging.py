"""pyproject.toml lists its packages by hand: every package under raftlog/ must be there, or
a non-editable `pip install .` leaves it out and a node fails to start."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_raftlog_package_is_installed() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "raftlog").rglob("__init__.py")
    }
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"
