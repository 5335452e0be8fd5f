from __future__ import annotations

from pathlib import Path

import pytest

from raftlog.config import NodeConfig
from raftlog.errors import ConfigError
from raftlog.storage import LogConfig, LogManager
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
