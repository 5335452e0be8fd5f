from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import trio

from raftlog.config import NodeConfig
from raftlog.errors import ConfigError
from raftlog.storage import LogConfig, LogManager, read_checkpoint
from raftlog.storage.log_dirs import (
    DELETE_SUFFIX,
    PARTITION_METADATA_FILE,
    STRAY_SUFFIX,
    read_topic_id,
    remove_directory,
    rename_for_removal,
)
from raftlog.storage.recovery import RECOVERY_POINT_FILE
from tests.storage.helpers import batch


def test_layout_reopen_delete_and_high_watermarks(tmp_path: Path) -> None:
    node = NodeConfig(data_dir=str(tmp_path))
    manager = LogManager(tmp_path, node)
    manager.open_all(now_ms=0)
    a = manager.get_or_create("orders-eu", 0, {"retention.ms": "5000"}, now_ms=0)
    b = manager.get_or_create("orders-eu", 1, now_ms=0)
    a.append_as_leader(batch(3), leader_epoch=1, now_ms=0)
    b.append_as_leader(batch(1), leader_epoch=1, now_ms=0)
    assert (tmp_path / "orders-eu-0").is_dir()
    manager.write_high_watermarks({("orders-eu", 0): 3, ("orders-eu", 1): 1})
    manager.close_all()

    again = LogManager(tmp_path, node)
    again.open_all(now_ms=0)
    assert set(again.all_logs()) == {("orders-eu", 0), ("orders-eu", 1)}
    reopened = again.get("orders-eu", 0)
    assert reopened is not None and reopened.log_end_offset == 3
    assert reopened.config.retention_ms == 5000
    assert again.read_high_watermarks() == {("orders-eu", 0): 3, ("orders-eu", 1): 1}
    again.delete("orders-eu", 1)
    assert not (tmp_path / "orders-eu-1").exists()
    assert again.get("orders-eu", 1) is None


def test_topic_overrides_use_kafka_names() -> None:
    node = NodeConfig()
    config = LogConfig.from_node_config(
        node, {"cleanup.policy": "compact", "segment.bytes": "1048576", "flush.ms": "10"}
    )
    assert config.compact and config.segment_bytes == 1048576 and config.flush_interval_ms == 10
    with pytest.raises(ConfigError, match="unknown topic config"):
        LogConfig.from_node_config(node, {"retention.hours": "1"})
    with pytest.raises(ConfigError, match="integer"):
        LogConfig.from_node_config(node, {"retention.ms": "soon"})
    with pytest.raises(ConfigError, match=r"cleanup\.policy"):
        LogConfig.from_node_config(node, {"cleanup.policy": "shred"})


def test_renamed_directories_are_finished_at_start_and_never_opened(tmp_path: Path) -> None:
    node = NodeConfig(data_dir=str(tmp_path))
    manager = LogManager(tmp_path, node)
    manager.open_all(now_ms=0)
    for index in range(3):
        manager.get_or_create("orders", index, now_ms=0).append_as_leader(
            batch(2), leader_epoch=0, now_ms=0
        )
    # A crash after step one (rename) and before step two (delete) of two removals.
    deleted = rename_for_removal(manager.detach("orders", 0), DELETE_SUFFIX)  # type: ignore[arg-type]
    stray = rename_for_removal(manager.detach("orders", 1), STRAY_SUFFIX)  # type: ignore[arg-type]
    assert deleted.name.startswith("orders-0.") and deleted.name.endswith("-delete")
    assert stray.name.startswith("orders-1.") and stray.name.endswith("-stray")
    assert deleted.is_dir() and stray.is_dir()
    assert not (tmp_path / "orders-0").exists() and not (tmp_path / "orders-1").exists()
    manager.close_all()

    again = LogManager(tmp_path, node)
    again.open_all(now_ms=0)
    assert set(again.all_logs()) == {("orders", 2)}
    assert not deleted.exists() and not stray.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["orders-2"]
    again.close_all()


def test_topic_id_is_kept_next_to_the_log(tmp_path: Path) -> None:
    node = NodeConfig(data_dir=str(tmp_path))
    manager = LogManager(tmp_path, node)
    manager.open_all(now_ms=0)
    topic_id = uuid.uuid4()
    created = manager.create_log("orders", 0, {}, topic_id=topic_id, now_ms=0)
    assert manager.get("orders", 0) is None  # create_log leaves the bookkeeping to adopt()
    manager.adopt("orders", 0, created, topic_id)
    manager.get_or_create("legacy", 0, now_ms=0)  # no id: a log from before the id file
    with pytest.raises(RuntimeError, match="already has an open log"):
        manager.adopt("orders", 0, created, topic_id)
    manager.close_all()

    again = LogManager(tmp_path, node)
    again.open_all(now_ms=0)
    assert again.topic_id("orders", 0) == topic_id
    assert again.topic_id("legacy", 0) is None
    (tmp_path / "legacy-0" / PARTITION_METADATA_FILE).write_bytes(b"garbage")
    assert read_topic_id(tmp_path / "legacy-0") is None  # unreadable: matched by name alone
    again.close_all()


async def test_a_flush_racing_a_removal_writes_no_checkpoint_under_the_old_name(
    tmp_path: Path,
) -> None:
    """A flush whose worker thread runs after the log was abandoned skips its checkpoint
    writes, so a log re-created under the name never gets the old one's recovery point."""
    node = NodeConfig(data_dir=str(tmp_path))
    manager = LogManager(tmp_path, node)
    manager.open_all(now_ms=0)
    old = manager.get_or_create("orders", 0, now_ms=0)
    old.append_as_leader(batch(5), leader_epoch=0, now_ms=0)
    old.roll()  # a checkpoint is now due: the next flush writes a recovery point of 5
    ticket = old.prepare_flush()
    assert ticket.checkpoints
    target = await trio.to_thread.run_sync(
        rename_for_removal,
        manager.detach("orders", 0),  # type: ignore[arg-type]
        DELETE_SUFFIX,
    )
    fresh = manager.get_or_create("orders", 0, now_ms=0)
    old.run_flush(ticket)  # the flusher's worker thread, late
    old.complete_flush(ticket)
    point = read_checkpoint(tmp_path / "orders-0" / RECOVERY_POINT_FILE, "recovery-point")
    assert point["recovery_point"] == 0  # the fresh log's own, not the old log's 5
    fresh.close()
    assert remove_directory(target) and not target.exists()
