"""LogManager: every partition log of a node under `<data_dir>/<topic>-<partition>/`.

Opens (and recovers) all logs at start, creates logs for new partitions, removes logs of
deleted topics and stray logs (log_dirs.py: rename, then delete), and keeps the high-watermark
checkpoint file for all partitions. Topic config overrides and the topic id are stored next to
each log so a restart recovers with the right settings, and recognises a log whose topic was
re-created meanwhile, before the metadata image is replayed.

The blocking halves (create_log, write_overrides, log_dirs' rename and delete) touch only the
directory they are given, so they run in worker threads; the bookkeeping (adopt, detach,
set_config) runs on the event loop. get_or_create, update_config and delete do both at once
for tools and tests that own the whole manager.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import trio

from raftlog.config import NodeConfig
from raftlog.storage.checkpoint import (
    CheckpointError,
    fsync_dir,
    read_checkpoint,
    write_checkpoint,
)
from raftlog.storage.config import LogConfig
from raftlog.storage.flusher import Flusher
from raftlog.storage.log import PartitionLog
from raftlog.storage.log_dirs import (
    DELETE_SUFFIX,
    TopicPartition,
    is_removal_dir,
    log_dir_name,
    parse_log_dir_name,
    read_topic_id,
    remove_directory,
    rename_for_removal,
    write_topic_id,
)

log = logging.getLogger("raftlog.storage")

HIGH_WATERMARK_FILE = "high-watermark.checkpoint"
OVERRIDES_FILE = "topic-config.checkpoint"

__all__ = ["LogManager", "TopicPartition", "log_dir_name", "parse_log_dir_name"]


class LogManager:
    def __init__(self, data_dir: Path, node_config: NodeConfig) -> None:
        self.data_dir = Path(data_dir)
        self.node_config = node_config
        self.logs: dict[TopicPartition, PartitionLog] = {}
        # The topic id each log was created for; None for logs older than the id file.
        self.topic_ids: dict[TopicPartition, uuid.UUID | None] = {}
        self.flusher = Flusher()

    # ------------------------------------------------------------------ start-up
    def open_all(self, *, now_ms: int) -> None:
        """Open and recover every log found on disk (blocking; see open_all_async)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for child in sorted(self.data_dir.iterdir()):
            if not child.is_dir():
                continue
            if is_removal_dir(child.name):
                # Renamed before a crash or stop: the rename was the decision, finish it.
                log.info("finishing the removal of %s", child.name)
                remove_directory(child)
                continue
            tp = parse_log_dir_name(child.name)
            if tp is None:
                continue
            overrides = self._read_overrides(child)
            config = LogConfig.from_node_config(self.node_config, overrides)
            self.logs[tp] = PartitionLog.open(child, config, now_ms=now_ms)
            self.topic_ids[tp] = read_topic_id(child)
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

    def topic_id(self, topic: str, partition: int) -> uuid.UUID | None:
        return self.topic_ids.get((topic, partition))

    def create_log(
        self,
        topic: str,
        partition: int,
        overrides: dict[str, str],
        *,
        topic_id: uuid.UUID | None,
        now_ms: int,
    ) -> PartitionLog:
        """Blocking (worker thread): make the log's directory durable and open the log.

        Touches only that directory and its parent's entry, never `self.logs`: the caller
        hands the result to adopt() on the event loop. Every file (config, topic id, the
        empty segment) and the directory entry itself are fsynced before it returns, so
        nothing is served from a log whose directory a crash could still take away.
        """
        config = LogConfig.from_node_config(self.node_config, overrides)
        directory = self.data_dir / log_dir_name(topic, partition)
        directory.mkdir(parents=True, exist_ok=True)
        fsync_dir(self.data_dir)
        self.write_overrides(directory, overrides)
        if topic_id is not None:
            write_topic_id(directory, topic_id)
        return PartitionLog.open(directory, config, now_ms=now_ms)

    def adopt(
        self, topic: str, partition: int, plog: PartitionLog, topic_id: uuid.UUID | None
    ) -> None:
        """Event loop: take a log made by create_log into the manager and the flusher."""
        key = (topic, partition)
        if key in self.logs:
            raise RuntimeError(f"{log_dir_name(topic, partition)} already has an open log")
        self.logs[key] = plog
        self.topic_ids[key] = topic_id
        self.flusher.register(plog)

    def detach(self, topic: str, partition: int) -> PartitionLog | None:
        """Event loop: forget the log (no flush, no new flush rounds) before its removal."""
        key = (topic, partition)
        self.topic_ids.pop(key, None)
        plog = self.logs.pop(key, None)
        if plog is not None:
            self.flusher.unregister(plog)
            plog.abandon()  # closes its files; an in-flight flush skips its checkpoints
        return plog

    def set_config(self, topic: str, partition: int, overrides: dict[str, str]) -> LogConfig:
        """Event loop: apply new overrides in memory; write_overrides persists them."""
        config = LogConfig.from_node_config(self.node_config, overrides)
        self.logs[(topic, partition)].update_config(config)
        return config

    def write_overrides(self, directory: Path, overrides: dict[str, str]) -> None:
        """Blocking: the overrides file a restart recovers the log's settings from."""
        write_checkpoint(directory / OVERRIDES_FILE, "topic-config", {"overrides": overrides})

    # -------------------------------------------------- blocking, all at once (tools, tests)
    def get_or_create(
        self,
        topic: str,
        partition: int,
        overrides: dict[str, str] | None = None,
        *,
        topic_id: uuid.UUID | None = None,
        now_ms: int,
    ) -> PartitionLog:
        existing = self.logs.get((topic, partition))
        if existing is not None:
            return existing
        plog = self.create_log(
            topic, partition, dict(overrides or {}), topic_id=topic_id, now_ms=now_ms
        )
        self.adopt(topic, partition, plog, topic_id)
        return plog

    def update_config(self, topic: str, partition: int, overrides: dict[str, str]) -> None:
        self.set_config(topic, partition, overrides)
        self.write_overrides(self.logs[(topic, partition)].directory, overrides)

    def delete(self, topic: str, partition: int) -> None:
        plog = self.detach(topic, partition)
        if plog is not None:
            remove_directory(rename_for_removal(plog, DELETE_SUFFIX))

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
