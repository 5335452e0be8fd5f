"""Partition log directories: their names, the topic id they hold, and their removal.

A log leaves the data directory in two steps, as in Kafka: an atomic rename (cheap, one
directory entry) to `<topic>-<partition>.<uuid>-delete` (its topic was deleted) or
`<topic>-<partition>.<uuid>-stray` (the metadata does not assign it to this broker), then a
recursive delete in the background. The old name is free as soon as the rename is durable, so a
topic re-created under the same name never meets the old files. A crash between the two steps
leaves a renamed directory, which LogManager.open_all removes at the next start: a renamed
directory is never opened as a log.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from pathlib import Path

from raftlog.storage.checkpoint import CheckpointError, fsync_dir, read_checkpoint, write_checkpoint
from raftlog.storage.log import PartitionLog

log = logging.getLogger("raftlog.storage")

DELETE_SUFFIX = "-delete"
STRAY_SUFFIX = "-stray"
REMOVAL_SUFFIXES = (DELETE_SUFFIX, STRAY_SUFFIX)
# The id of the topic the log belongs to (Kafka's partition.metadata): a topic deleted and
# re-created under the same name while this broker was down gets a new id, so the old log is
# recognised and removed instead of being served as the new topic's data.
PARTITION_METADATA_FILE = "partition-metadata.checkpoint"
PARTITION_METADATA_KIND = "partition-metadata"
TopicPartition = tuple[str, int]


def log_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_log_dir_name(name: str) -> TopicPartition | None:
    topic, sep, partition = name.rpartition("-")
    if not sep or not topic or not partition.isdigit():
        return None
    return topic, int(partition)


def is_removal_dir(name: str) -> bool:
    """A directory renamed for removal (a live log's name ends in its partition number)."""
    return name.endswith(REMOVAL_SUFFIXES)


def write_topic_id(directory: Path, topic_id: uuid.UUID) -> None:
    """Blocking: tmp, fsync, rename, fsync(dir), as every checkpoint."""
    write_checkpoint(
        directory / PARTITION_METADATA_FILE, PARTITION_METADATA_KIND, {"topic_id": topic_id.hex}
    )


def read_topic_id(directory: Path) -> uuid.UUID | None:
    """The stored topic id; None when absent (a log from before the file existed) or unreadable
    (said in the log): the caller then matches the log by name alone."""
    try:
        payload = read_checkpoint(directory / PARTITION_METADATA_FILE, PARTITION_METADATA_KIND)
        return uuid.UUID(hex=str(payload["topic_id"]))
    except FileNotFoundError:
        return None
    except (CheckpointError, KeyError, ValueError) as exc:
        log.warning("%s: ignoring unreadable %s: %s", directory.name, PARTITION_METADATA_FILE, exc)
        return None


def rename_for_removal(plog: PartitionLog, suffix: str) -> Path:
    """Step one (blocking): abandon the log and rename its directory durably; returns the new
    path for remove_directory. Safe while a flush of the log runs (see move_directory)."""
    if suffix not in REMOVAL_SUFFIXES:
        raise ValueError(f"unknown removal suffix {suffix!r}")
    plog.abandon()
    source = plog.directory
    target = source.with_name(f"{source.name}.{uuid.uuid4().hex}{suffix}")
    plog.move_directory(target)
    fsync_dir(target.parent)
    return target


def remove_directory(path: Path) -> bool:
    """Step two (blocking): delete a renamed directory; False (and an error line) on failure,
    in which case the next start tries again."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return True
    except OSError as exc:
        log.error("cannot delete %s (the next start tries again): %r", path, exc)
        return False
    return True
