from __future__ import annotations

from pathlib import Path

import pytest

from raftlog.storage.checkpoint import CheckpointError, read_checkpoint, write_checkpoint


def test_round_trip_and_no_tmp_left(tmp_path: Path) -> None:
    path = tmp_path / "state.checkpoint"
    write_checkpoint(path, "state", {"a": 1, "b": [1, 2], "c": b"\x00"})
    assert read_checkpoint(path, "state") == {"a": 1, "b": [1, 2], "c": b"\x00"}
    write_checkpoint(path, "state", {"a": 2})
    assert read_checkpoint(path, "state") == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["state.checkpoint"]


def test_every_corruption_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "x.checkpoint"
    write_checkpoint(path, "x", {"value": 123456})
    good = path.read_bytes()
    for i in range(len(good)):
        bad = bytearray(good)
        bad[i] ^= 0x10
        path.write_bytes(bytes(bad))
        with pytest.raises(CheckpointError):
            read_checkpoint(path, "x")
    for cut in range(len(good)):
        path.write_bytes(good[:cut])
        with pytest.raises(CheckpointError):
            read_checkpoint(path, "x")


def test_wrong_kind_and_version_are_clear_errors(tmp_path: Path) -> None:
    path = tmp_path / "x.checkpoint"
    write_checkpoint(path, "x", {"value": 1})
    with pytest.raises(CheckpointError, match="expected 'y'"):
        read_checkpoint(path, "y")
    data = bytearray(path.read_bytes())
    data[5] = 9  # version field
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="version"):
        read_checkpoint(path, "x")
