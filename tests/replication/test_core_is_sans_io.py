"""The replication core (raftlog/replication/core/) reads its log and never writes it, and
imports no I/O library: its drivers do the I/O, which is what lets the simulator run it."""

from __future__ import annotations

import ast
from pathlib import Path

import raftlog.replication.core as core_package

CORE_DIR = Path(core_package.__file__).parent
# Modules that do I/O or schedule it; the core takes events and returns decisions instead.
IO_MODULES = {"trio", "socket", "os", "threading", "time", "asyncio", "raftlog.storage"}
# PartitionLog's writing methods, which only the drivers may call.
LOG_WRITES = {
    "append_as_leader",
    "append_as_follower",
    "truncate_to",
    "truncate_fully_and_start_at",
    "advance_log_start",
    "flush_now",
    "roll",
    "close",
    "abandon",
}


def _core_trees() -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text()) for p in sorted(CORE_DIR.glob("*.py"))}


def test_core_modules_import_no_io_library() -> None:
    for name, tree in _core_trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                assert not any(module == io or module.startswith(io + ".") for io in IO_MODULES), (
                    f"{name} imports {module}"
                )


def test_core_modules_call_no_writing_log_method() -> None:
    for name, tree in _core_trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in LOG_WRITES:
                owner = ast.unparse(node.value)
                # Only the log's own methods are forbidden (the producer table has its own
                # in-memory truncate_to, which is not the log's).
                assert "log" not in owner, f"{name}: {owner}.{node.attr}"


def test_the_core_log_view_has_no_writing_method() -> None:
    from raftlog.replication.core.types import ReplicaLogView

    members = {n for n in vars(ReplicaLogView) if not n.startswith("_")}
    assert members == {
        "log_start_offset",
        "log_end_offset",
        "flushed_offset",
        "latest_epoch",
        "end_offset_for_epoch",
    }
