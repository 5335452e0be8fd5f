"""LogManager: every partition log of a node under `<data_dir>/<topic>-<partition>/`.

Opens (and recovers) all logs at start, creates logs for new partitions, deletes logs of
deleted topics, and keeps the high-watermark checkpoint file for all partitions. Topic config
overrides are stored next to each log so a restart recovers with the right settings before the
metadata image is replayed.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import trio

from raftlog.config import NodeConfig
from raftlog.storage.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from raftlog.storage.config import LogConfig
from raftlog.storage.flusher import Flusher
from raftlog.storage.log import PartitionLog

log = logging.getLogger("raftlog.storage")

HIGH_WATERMARK_FILE = "high-watermark.checkpoint"
OVERRIDES_FILE = "topic-config.checkpoint"
DELETED_SUFFIX = "-delete"
TopicPartition = tuple[str, int]


def log_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_log_dir_name(name: str) -> TopicPartition | None:
    topic, sep, partition = name.rpartition("-")
    if not sep or not topic or not partition.isdigit():
        return None
    return topic, int(partition)


class LogManager:
    def __init__(self, data_dir: Path, node_config: NodeConfig) -> None:
        self.data_dir = Path(data_dir)
        self.node_config = node_config
        self.logs: dict[TopicPartition, PartitionLog] = {}
        self.flusher = Flusher()

    # ------------------------------------------------------------------ start-up
    def open_all(self, *, now_ms: int) -> None:
        """Open and recover every log found on disk (blocking; see open_all_async)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for child in sorted(self.data_dir.iterdir()):
            if not child.is_dir():
                continue
            if child.name.endswith(DELETED_SUFFIX):
                log.info("finishing the deletion of %s", child.name)
                shutil.rmtree(child, ignore_errors=True)
                continue
            tp = parse_log_dir_name(child.name)
            if tp is None:
                continue
            overrides = self._read_overrides(child)
            config = LogConfig.from_node_config(self.node_config, overrides)
            self.logs[tp] = PartitionLog.open(child, config, now_ms=now_ms)
            self.flusher.register(self.logs[tp])

    async def open_all_async(self, *, now_ms: int) -> None:
        await trio.to_thread.run_sync(lambda: self.open_all(now_ms=now_ms))

    def _read_overrides(self, directory: Path) -> dict[str, str]:
        try:
            payload = read_checkpoint(directory / OVERRIDES_FILE, "topic-config")
        except FileNotFoundError:
            return {}
        except CheckpointError as exc:
            log.warning("%s: using node defaults: %s", directory.name, exc)
            return {}
        return {str(k): str(v) for k, v in payload.get("overrides", {}).items()}

    # ------------------------------------------------------------------ logs
    def get(self, topic: str, partition: int) -> PartitionLog | None:
        return self.logs.get((topic, partition))

    def get_or_create(
        self,
        topic: str,
        partition: int,
        overrides: dict[str, str] | None = None,
        *,
        now_ms: int,
    ) -> PartitionLog:
        existing = self.logs.get((topic, partition))
        if existing is not None:
            return existing
        overrides = dict(overrides or {})
        config = LogConfig.from_node_config(self.node_config, overrides)
        directory = self.data_dir / log_dir_name(topic, partition)
        directory.mkdir(parents=True, exist_ok=True)
        write_checkpoint(directory / OVERRIDES_FILE, "topic-config", {"overrides": overrides})
        partition_log = PartitionLog.open(directory, config, now_ms=now_ms)
        self.logs[(topic, partition)] = partition_log
        self.flusher.register(partition_log)
        return partition_log

    async def get_or_create_async(
        self,
        topic: str,
        partition: int,
        overrides: dict[str, str] | None = None,
        *,
        now_ms: int,
    ) -> PartitionLog:
        """get_or_create with the blocking open (fsyncs, recovery) in a worker thread."""
        existing = self.logs.get((topic, partition))
        if existing is not None:
            return existing
        return await trio.to_thread.run_sync(
            lambda: self.get_or_create(topic, partition, overrides, now_ms=now_ms)
        )

    def update_config(self, topic: str, partition: int, overrides: dict[str, str]) -> None:
        partition_log = self.logs[(topic, partition)]
        config = LogConfig.from_node_config(self.node_config, overrides)
        write_checkpoint(
            partition_log.directory / OVERRIDES_FILE, "topic-config", {"overrides": overrides}
        )
        partition_log.update_config(config)

    def delete(self, topic: str, partition: int) -> None:
        partition_log = self.logs.pop((topic, partition), None)
        if partition_log is not None:
            self.flusher.unregister(partition_log)
            partition_log.delete()

    def all_logs(self) -> dict[TopicPartition, PartitionLog]:
        return dict(self.logs)

    def close_all(self) -> None:
        for partition_log in self.logs.values():
            partition_log.close()

    # ------------------------------------------------------------------ high watermarks
    def write_high_watermarks(self, high_watermarks: dict[TopicPartition, int]) -> None:
        """Persist HWs of all partitions (blocking; call via trio.to_thread.run_sync)."""
        entries = [[topic, partition, hw] for (topic, partition), hw in high_watermarks.items()]
        write_checkpoint(self.data_dir / HIGH_WATERMARK_FILE, "high-watermark", {"hw": entries})

    def read_high_watermarks(self) -> dict[TopicPartition, int]:
        try:
            payload = read_checkpoint(self.data_dir / HIGH_WATERMARK_FILE, "high-watermark")
        except FileNotFoundError:
            return {}
        return {(str(t), int(p)): int(hw) for t, p, hw in payload.get("hw", [])}
