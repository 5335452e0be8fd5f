"""Idempotent-producer state of one partition on disk: snapshot files and replay.

The table itself (the sans-IO state machine, its sequence rules and limits) is
producer_table.py; its names are re-exported here, where callers have always found them.

The state is persisted as snapshot files `<offset:020d>.producer_snapshot` in the log
directory (a raftlog checkpoint: versioned, CRC32C, atomic rename) holding the state derived
from every batch below `offset`; `rebuild` loads the newest good snapshot at or below the log
end and replays batch headers (never records) from there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from raftlog.errors import CorruptRecordError
from raftlog.records import BatchHeader, TxnMarker, parse_txn_marker
from raftlog.replication.core.producer_table import (
    CHECK_OK,
    DEFAULT_MAX_PRODUCER_IDS,
    DEFAULT_MAX_SNAPSHOTS,
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    MAX_SEQUENCE,
    RETAINED_BATCHES_PER_PRODUCER,
    BatchMetadata,
    CompletedTxn,
    MarkerCheck,
    ProduceCheck,
    ProducerEntry,
    ProducerStateConfig,
    ProducerStateTable,
    Verdict,
    in_sequence,
    last_sequence,
)
from raftlog.storage.checkpoint import (
    CheckpointError,
    fsync_dir,
    read_checkpoint,
    write_checkpoint,
)
from raftlog.storage.log import PartitionLog

log = logging.getLogger("raftlog.replication.producer_state")

__all__ = [
    "CHECK_OK",
    "DEFAULT_MAX_PRODUCER_IDS",
    "DEFAULT_MAX_SNAPSHOTS",
    "DEFAULT_PRODUCER_ID_EXPIRATION_MS",
    "MAX_SEQUENCE",
    "RETAINED_BATCHES_PER_PRODUCER",
    "SNAPSHOT_FORMAT_VERSION",
    "SNAPSHOT_KIND",
    "SNAPSHOT_SUFFIX",
    "BatchMetadata",
    "CompletedTxn",
    "MarkerCheck",
    "ProduceCheck",
    "ProducerEntry",
    "ProducerStateConfig",
    "ProducerStateTable",
    "Verdict",
    "after_log_truncation",
    "delete_snapshots_above",
    "from_payload",
    "in_sequence",
    "last_sequence",
    "list_snapshots",
    "load_latest",
    "log_batches",
    "log_headers",
    "read_snapshot",
    "rebuild",
    "replay",
    "snapshot_path",
    "snapshot_payload",
    "to_payload",
    "write_payload",
    "write_snapshot",
]

SNAPSHOT_SUFFIX = ".producer_snapshot"
SNAPSHOT_KIND = "producer-snapshot"
# Of the payload layout, on top of the checkpoint's own version. 2 added each producer's
# transaction state; a version 1 file (written before transactions) reads with none open.
SNAPSHOT_FORMAT_VERSION = 2
READABLE_SNAPSHOT_VERSIONS = (1, 2)


# ---------------------------------------------------------------------- snapshot payload


def to_payload(table: ProducerStateTable) -> dict[str, Any]:
    """The snapshot form of `table` (producers least recently written first, so a restore
    evicts in the same order)."""
    return {
        "version": SNAPSHOT_FORMAT_VERSION,
        "offset": table.next_offset,
        "producers": [
            [
                e.producer_id,
                e.epoch,
                e.last_timestamp_ms,
                e.last_batch_offset,
                [
                    [b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp_ms]
                    for b in e.batches
                ],
                [
                    e.current_txn_first_offset,
                    e.coordinator_epoch,
                    e.last_marker_offset,
                    e.last_marker_commit,
                ],
            ]
            for e in table.entries()
        ],
    }


def from_payload(
    payload: dict[str, Any], config: ProducerStateConfig | None = None
) -> ProducerStateTable:
    """Raises ValueError/TypeError/KeyError on a malformed payload."""
    if payload.get("version") not in READABLE_SNAPSHOT_VERSIONS:
        raise ValueError(
            f"producer snapshot format {payload.get('version')}, this build reads "
            f"{READABLE_SNAPSHOT_VERSIONS}"
        )
    next_offset = _as_int(payload["offset"])
    return ProducerStateTable.restored(next_offset, _entries(payload["producers"]), config)


def _entries(producers: Iterable[Any]) -> Iterator[ProducerEntry]:
    for fields in producers:
        if len(fields) == 5:  # version 1: no transaction state
            pid, epoch, last_ts, last_batch_offset, batches = fields
            txn: list[Any] = [-1, -1, -1, False]
        else:
            pid, epoch, last_ts, last_batch_offset, batches, txn = fields
        if len(txn) != 4 or not isinstance(txn[3], bool):
            raise ValueError(f"producer {pid}: transaction state {txn!r} is malformed")
        first_offset, coordinator_epoch, marker_offset = (_as_int(v) for v in txn[:3])
        if first_offset < -1 or coordinator_epoch < -1 or marker_offset < -1:
            raise ValueError(f"producer {pid}: transaction state {txn!r} out of range")
        entry = ProducerEntry(
            _as_int(pid),
            _as_int(epoch),
            last_timestamp_ms=_as_int(last_ts),
            last_batch_offset=_as_int(last_batch_offset),
            current_txn_first_offset=first_offset,
            coordinator_epoch=coordinator_epoch,
            last_marker_offset=marker_offset,
            last_marker_commit=txn[3],
        )
        for fields in batches:
            values = [_as_int(v) for v in fields]
            if len(values) != 5:
                raise ValueError(f"producer {pid}: batch entry {fields!r} needs 5 fields")
            entry.batches.append(BatchMetadata(*values))
        yield entry


def _as_int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


# ---------------------------------------------------------------------- snapshot files


def snapshot_path(snapshot_dir: Path, offset: int) -> Path:
    return Path(snapshot_dir) / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def list_snapshots(snapshot_dir: Path) -> list[tuple[int, Path]]:
    """(offset, path) of every snapshot file, oldest first."""
    found = []
    for path in Path(snapshot_dir).glob("*" + SNAPSHOT_SUFFIX):
        stem = path.name[: -len(SNAPSHOT_SUFFIX)]
        if stem.isdigit():
            found.append((int(stem), path))
    return sorted(found)


def write_snapshot(
    table: ProducerStateTable,
    snapshot_dir: Path,
    now_ms: int,
    up_to_offset: int | None = None,
) -> Path:
    """Expire idle producers, then write the table as the snapshot at `up_to_offset`
    (default: the table's next offset) and keep only the newest `max_snapshots` files.

    Blocking (fsync): on the event loop call `snapshot_payload` and run `write_payload` in
    a worker thread instead. The offset may be past the log's flushed offset: a crash that
    loses those batches leaves the snapshot beyond the recovered log end, and rebuild
    deletes it; a log recovered at or past it still holds exactly the batches below it.
    """
    offset, payload = snapshot_payload(table, now_ms, up_to_offset)
    return write_payload(snapshot_dir, offset, payload, table.config.max_snapshots)


def snapshot_payload(
    table: ProducerStateTable, now_ms: int, up_to_offset: int | None = None
) -> tuple[int, dict[str, Any]]:
    """The non-blocking half of `write_snapshot` (expires idle producers in `table`)."""
    offset = table.next_offset if up_to_offset is None else up_to_offset
    if offset < table.next_offset:
        raise ValueError(
            f"cannot snapshot at {offset}: the table already holds batches up to "
            f"{table.next_offset}"
        )
    expired = table.expire(now_ms)
    if expired:
        log.info("expired %d idle producer id(s): %s", len(expired), expired[:10])
    payload = to_payload(table)
    payload["offset"] = offset
    return offset, payload


def write_payload(
    snapshot_dir: Path, offset: int, payload: dict[str, Any], max_snapshots: int
) -> Path:
    """Write one snapshot file atomically and prune old ones (blocking)."""
    path = snapshot_path(snapshot_dir, offset)
    write_checkpoint(path, SNAPSHOT_KIND, payload)
    for _, old in list_snapshots(snapshot_dir)[:-max_snapshots]:
        old.unlink(missing_ok=True)
    return path


def delete_snapshots_above(snapshot_dir: Path, offset: int) -> list[Path]:
    """Remove snapshots describing batches at/after `offset` (after log truncation).

    Blocking when it deletes: the directory is fsynced so a removed snapshot cannot come
    back after a crash and describe the different batches appended over the truncation.
    """
    doomed = [path for snap_offset, path in list_snapshots(snapshot_dir) if snap_offset > offset]
    for path in doomed:
        path.unlink(missing_ok=True)
    if doomed:
        fsync_dir(Path(snapshot_dir))
    return doomed


def read_snapshot(path: Path, config: ProducerStateConfig | None = None) -> ProducerStateTable:
    """Read and verify one snapshot file; raises CheckpointError on any defect."""
    payload = read_checkpoint(path, SNAPSHOT_KIND)
    try:
        table = from_payload(payload, config)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: malformed producer snapshot: {exc!r}") from None
    expected = int(path.name[: -len(SNAPSHOT_SUFFIX)])
    if table.next_offset != expected:
        raise CheckpointError(
            f"{path}: holds the state at offset {table.next_offset}, its name says {expected}"
        )
    return table


def load_latest(
    snapshot_dir: Path, max_offset: int, config: ProducerStateConfig | None = None
) -> ProducerStateTable | None:
    """The newest readable snapshot at or below `max_offset` (None: there is none).

    A snapshot that fails verification is logged and deleted (as Kafka does), and the next
    older one is tried, so a bad file costs a longer replay, never wrong state.
    """
    for offset, path in reversed(list_snapshots(snapshot_dir)):
        if offset > max_offset:
            continue
        try:
            return read_snapshot(path, config)
        except FileNotFoundError:
            continue
        except (CheckpointError, OSError) as exc:
            log.warning("ignoring corrupt producer snapshot %s: %s", path, exc)
            path.unlink(missing_ok=True)
    return None


# ---------------------------------------------------------------------- replay from the log


def log_headers(plog: PartitionLog, start_offset: int, end_offset: int) -> Iterator[BatchHeader]:
    """Headers of the batches holding offsets in [start_offset, end_offset), read 61 bytes
    at a time (a batch that straddles start_offset is included)."""
    for segment in list(plog.segments):
        if segment.next_offset <= start_offset or segment.base_offset >= end_offset:
            continue
        position = segment.locate(start_offset)
        if position is None:
            continue
        for _, header in segment.headers_from(position):
            if header.base_offset >= end_offset:
                return
            if header.last_offset >= start_offset:
                yield header


def log_batches(
    plog: PartitionLog, start_offset: int, end_offset: int
) -> Iterator[tuple[BatchHeader, TxnMarker | None]]:
    """`log_headers` with the COMMIT/ABORT marker of each control batch (a control batch is
    read whole: it is a few dozen bytes; data batches are still read 61 bytes at a time)."""
    for segment in list(plog.segments):
        if segment.next_offset <= start_offset or segment.base_offset >= end_offset:
            continue
        position = segment.locate(start_offset)
        if position is None:
            continue
        for pos, header in segment.headers_from(position):
            if header.base_offset >= end_offset:
                return
            if header.last_offset < start_offset:
                continue
            marker = None
            if header.is_control:
                try:
                    marker = parse_txn_marker(segment.read_range(pos, pos + header.size_bytes))
                except CorruptRecordError as exc:
                    log.warning(
                        "%s: control batch at offset %d is no transaction marker: %s",
                        plog.directory.name,
                        header.base_offset,
                        exc,
                    )
            yield header, marker


def replay(
    table: ProducerStateTable, batches: Iterable[tuple[BatchHeader, TxnMarker | None]]
) -> None:
    """Apply stored batches (with their markers) to `table`, in order."""
    for header, marker in batches:
        table.update([header], None if marker is None else {header.base_offset: marker})


def rebuild(
    plog: PartitionLog,
    snapshot_dir: Path,
    config: ProducerStateConfig | None = None,
    *,
    now_ms: int | None = None,
) -> ProducerStateTable:
    """Producer state of `plog` up to its end: the newest good snapshot at or below the log
    end, then the batch headers after it (blocking: run in a worker thread).

    Snapshots above the log end describe batches the log no longer has (a truncation or a
    crash before fsync) and are deleted first. With `now_ms`, idle producers are expired.
    """
    end = plog.log_end_offset
    for path in delete_snapshots_above(snapshot_dir, end):
        log.info("deleted producer snapshot %s: beyond the log end %d", path.name, end)
    table = load_latest(snapshot_dir, end, config)
    if table is None:
        table = ProducerStateTable(config)
    # Data below the log start is gone (retention): replay what is left. A snapshot's offset
    # is a batch boundary, so batches starting below it are already in the table.
    covered = table.next_offset
    stored = log_batches(plog, max(covered, plog.log_start_offset), end)
    replay(table, ((h, m) for h, m in stored if h.base_offset >= covered))
    table.next_offset = end
    if now_ms is not None:
        table.expire(now_ms)
    return table


def after_log_truncation(
    table: ProducerStateTable,
    plog: PartitionLog,
    snapshot_dir: Path,
) -> ProducerStateTable:
    """Bring `table` in line with `plog` after `plog.truncate_to(...)` (blocking when it has
    to rebuild). Returns the table to use from now on (the same one if nothing changed)."""
    end = plog.log_end_offset
    delete_snapshots_above(snapshot_dir, end)
    if table.truncate_to(end):
        return table
    return rebuild(plog, snapshot_dir, table.config)
