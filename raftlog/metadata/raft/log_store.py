"""The metadata replica on disk: the `__cluster_metadata-0` log, the quorum-state file and
the snapshot files, and the start-up recovery that picks what the Raft core starts from.

Entries are stored as Kafka record batches (one record per entry, partitionLeaderEpoch = the
Raft epoch) in an ordinary PartitionLog, so the metadata log is verifiable with the same
tools as any partition. The quorum-state and snapshot files are checkpoints (version,
checksum, tmp -> fsync -> rename -> fsync(dir)). A snapshot file that does not decode is
passed over at start-up for an older one or the log itself (docs/metadata.md, "Snapshots
that cannot be applied").
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar

from raftlog.codec import EPOCH_MAX, Codec, DecodeError, Map, NodeId, Range
from raftlog.constants import MIB
from raftlog.errors import LocalError
from raftlog.metadata.raft.messages import Entry
from raftlog.metadata.raft.types import QuorumState, Snapshot, SnapshotCheck
from raftlog.metadata.raft.voters import (
    decode_voters_record,
    encode_voters_record,
    is_voters_record,
)
from raftlog.records import Record, build_batch, iter_batches, iter_records
from raftlog.storage.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from raftlog.storage.config import LogConfig
from raftlog.storage.log import PartitionLog

log = logging.getLogger("raftlog.quorum")

METADATA_LOG_NAME = "__cluster_metadata-0"
QUORUM_STATE_FILE = "quorum-state"
# This replica's directory id (KIP-853's replica key: a voter is an id *and* a disk).
DIRECTORY_ID_FILE = "directory-id"
SNAPSHOT_SUFFIX = ".snapshot"
# A snapshot file that could not be used at start-up is renamed to this (etcd's ".broken"):
# out of the way of the next start and of retention, kept for the operator to look at.
UNUSABLE_SNAPSHOT_SUFFIX = ".snapshot.unusable"
# Snapshot files kept: the newest, and the one before it as the fallback should the newest
# not load at the next start. The log is kept from the fallback's end (see compact_to).
KEEP_SNAPSHOT_COUNT = 2
# Small segments so that a snapshot lets whole old segments go soon after it is written.
METADATA_SEGMENT_BYTES = 8 * MIB
# Bytes read per step while loading the metadata log at start-up.
LOAD_READ_BYTES = 4 * MIB


class MetadataRecoveryError(LocalError):
    """The local metadata replica cannot be rebuilt from this node's own disk."""


@dataclass(frozen=True, slots=True)
class QuorumStateFile:
    """The quorum-state file's payload, declared so that loading checks the same epoch bound
    (EPOCH_MAX) as every Raft message: an epoch no log can hold is refused, not stored."""

    __wire__: ClassVar[Map] = Map()
    epoch: Annotated[int, Range(0, EPOCH_MAX)]
    voted_for: NodeId | None
    leader_id: NodeId | None


_CODEC = Codec()


_SNAPSHOT_NAME = re.compile(r"^\d{20}-\d{10}" + re.escape(SNAPSHOT_SUFFIX) + "$")


def _snapshot_end_offset(path: Path) -> int:
    return int(path.name.split("-", 1)[0])


class MetadataLogStore:
    """Durable state of one node's metadata replica: log, quorum-state file, snapshots."""

    def __init__(self, data_dir: Path, *, now_ms: int) -> None:
        self.directory = data_dir / METADATA_LOG_NAME
        self.directory.mkdir(parents=True, exist_ok=True)
        config = LogConfig(
            segment_bytes=METADATA_SEGMENT_BYTES,
            retention_ms=-1,
            retention_bytes=-1,
            flush_policy="always",
        )
        self.log = PartitionLog.open(self.directory, config, now_ms=now_ms)

    def load_or_create_directory_id(self) -> uuid.UUID:
        """The id this metadata log directory was given when the Raft driver first ran on
        it; a new, random one the first time (Kafka's directory.id). Blocking (fsync) then."""
        path = self.directory / DIRECTORY_ID_FILE
        if not path.exists():
            created = uuid.uuid4()
            write_checkpoint(path, "directory-id", {"directory_id": created.hex})
            return created
        payload = read_checkpoint(path, "directory-id")
        try:
            loaded = uuid.UUID(hex=payload["directory_id"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise MetadataRecoveryError(f"{path}: not a directory id") from None
        if loaded.int == 0:
            raise MetadataRecoveryError(f"{path}: the zero directory id is reserved")
        return loaded

    # ---------------------------------------------------------------- quorum state
    def load_quorum_state(self) -> QuorumState:
        path = self.directory / QUORUM_STATE_FILE
        if not path.exists():
            return QuorumState()
        payload = read_checkpoint(path, "quorum-state")
        try:
            stored: QuorumStateFile = _CODEC.from_wire(QuorumStateFile, payload)
        except DecodeError as exc:
            raise MetadataRecoveryError(
                f"{path}: quorum state out of range ({exc}); see docs/operations.md, "
                f"'A quorum-state file that does not load'"
            ) from None
        return QuorumState(stored.epoch, stored.voted_for, stored.leader_id)

    def save_quorum_state(self, state: QuorumState) -> None:
        """Blocking (fsync): call from a worker thread."""
        if not 0 <= state.epoch <= EPOCH_MAX:
            # The core never goes past EPOCH_MAX; a file this node could not load again must
            # never be written.
            raise LocalError(f"refusing to persist quorum state {state}: epoch out of range")
        stored = QuorumStateFile(state.epoch, state.voted_for, state.leader_id)
        write_checkpoint(self.directory / QUORUM_STATE_FILE, "quorum-state", _CODEC.to_wire(stored))

    # ---------------------------------------------------------------- snapshots
    def _snapshot_paths(self) -> list[Path]:
        """Snapshot files, oldest first (their names sort by end offset, then epoch)."""
        return sorted(
            p for p in self.directory.glob(f"*{SNAPSHOT_SUFFIX}") if _SNAPSHOT_NAME.match(p.name)
        )

    def load_snapshot(
        self, check: SnapshotCheck | None = None, *, passed_over: list[Path] | None = None
    ) -> Snapshot | None:
        """The newest usable snapshot, or None: readable (checksum), accepted by `check` (it
        decodes), and joined to the log (the log does not start beyond its end).

        An unusable newer one falls back to an older one; the files passed over are added to
        `passed_over`, newest first, with a log line saying why each one is.
        """
        log_start = self.log.log_start_offset
        for path in reversed(self._snapshot_paths()):
            reason: str | None
            try:
                payload = read_checkpoint(path, "metadata-snapshot")
                # KIP-853: the voter set at the snapshot's end (absent: the bootstrap set).
                voters_bytes = payload.get("voters")
                voters = None if voters_bytes is None else decode_voters_record(voters_bytes)
                snapshot = Snapshot(
                    payload["end_offset"], payload["epoch"], payload["data"], voters
                )
            except (CheckpointError, DecodeError, KeyError, TypeError) as exc:
                reason = f"unreadable: {exc}"
            else:
                if snapshot.end_offset < log_start:
                    reason = f"the log starts at {log_start}, after its end {snapshot.end_offset}"
                else:
                    reason = check(snapshot) if check is not None else None
                    if reason is None:
                        return snapshot
            log.error("passing over metadata snapshot %s: %s", path.name, reason)
            if passed_over is not None:
                passed_over.append(path)
        return None

    def save_snapshot(self, snapshot: Snapshot) -> None:
        """Blocking (fsync): write the snapshot, then drop all but the newest two.

        By name, not by which one was just written: a local snapshot's write can finish after
        a newer snapshot from the leader was installed (and the log emptied up to its end),
        and deleting that newer one would leave a gap between the surviving snapshot and the
        log at the next start. The one before the newest is the fallback should the newest
        not load at the next start.
        """
        name = f"{snapshot.end_offset:020d}-{snapshot.epoch:010d}{SNAPSHOT_SUFFIX}"
        payload: dict[str, object] = {
            "end_offset": snapshot.end_offset,
            "epoch": snapshot.epoch,
            "data": snapshot.data,
        }
        if snapshot.voters is not None:
            payload["voters"] = encode_voters_record(snapshot.voters)
        write_checkpoint(self.directory / name, "metadata-snapshot", payload)
        # Zero-padded end offset, then epoch: names sort by age.
        for old in self._snapshot_paths()[:-KEEP_SNAPSHOT_COUNT]:
            old.unlink(missing_ok=True)

    def set_aside_snapshots(self, paths: Sequence[Path]) -> None:
        """Rename snapshot files that could not be used, so that no later start or retention
        counts on them; kept on disk for the operator."""
        for path in paths:
            path.replace(
                path.with_name(path.name.removesuffix(SNAPSHOT_SUFFIX) + UNUSABLE_SNAPSHOT_SUFFIX)
            )
            log.warning(
                "renamed unusable metadata snapshot %s to *%s", path.name, UNUSABLE_SNAPSHOT_SUFFIX
            )

    def recover(
        self, check: SnapshotCheck | None, *, node_id: int, is_voter: bool
    ) -> tuple[Snapshot | None, list[Entry]]:
        """Start-up: the snapshot and the log entries the Raft core starts from.

        The newest snapshot that loads and decodes, else an older one, else the log from
        offset 0. When none of these is there (the log was compacted or replaced by a
        leader's snapshot, and every snapshot that covers its start is unusable) an observer
        starts over from an empty log and fetches a snapshot from the leader; a voter refuses
        to start, since forgetting entries it acknowledged could lose committed metadata.
        `is_voter` is the bootstrap set's word; a node that any voter set on this disk names
        (a passed-over snapshot's, a VotersRecord in the log: KIP-853) counts as a voter too.
        """
        passed_over: list[Path] = []
        snapshot = self.load_snapshot(check, passed_over=passed_over)
        if snapshot is None and self.log.log_start_offset > 0:
            where = (
                f"node {node_id}: no usable metadata snapshot in {self.directory} "
                f"(passed over: {', '.join(p.name for p in passed_over) or 'none'}) and the "
                f"metadata log starts at {self.log.log_start_offset}, not 0"
            )
            if is_voter or self._named_voter(node_id, passed_over):
                log.critical("%s: refusing to start this voter", where)
                raise MetadataRecoveryError(
                    f"{where}: this voter cannot rebuild its metadata from its own disk, and "
                    "emptying its log could lose committed metadata it acknowledged. Make "
                    "sure a majority of the other voters is healthy, then remove that "
                    "directory so this node rejoins as an empty replica (or restore the "
                    "snapshot, e.g. by running the version that wrote it)."
                )
            log.error("%s: this observer starts over from an empty log", where)
            self.log.truncate_fully_and_start_at(0)
        if passed_over:
            if snapshot is not None:
                log.warning(
                    "node %d: metadata starts from the older snapshot at offset %d",
                    node_id,
                    snapshot.end_offset,
                )
            else:
                log.warning("node %d: metadata starts from the log at offset 0", node_id)
            self.set_aside_snapshots(passed_over)
        if snapshot is not None and snapshot.end_offset > self.log.log_end_offset:
            # The snapshot outran the log (crash between snapshot install and truncation).
            self.log.truncate_fully_and_start_at(snapshot.end_offset)
            return snapshot, []
        return snapshot, self.load_entries()

    def _named_voter(self, node_id: int, snapshot_paths: Sequence[Path]) -> bool:
        """Whether a voter set on this disk names node_id: the `voters` of a snapshot file
        (readable even when its image is not) or a VotersRecord in the log. Only asked when
        recovery would otherwise empty the log, so reading it all is affordable."""
        for path in snapshot_paths:
            try:
                voters_bytes = read_checkpoint(path, "metadata-snapshot").get("voters")
                if voters_bytes is not None and node_id in decode_voters_record(voters_bytes).ids:
                    return True
            except (CheckpointError, DecodeError, TypeError, AttributeError):
                continue
        for entry in self.load_entries():
            if is_voters_record(entry.data):
                try:
                    if node_id in decode_voters_record(entry.data).ids:
                        return True
                except DecodeError:
                    continue
        return False

    # ---------------------------------------------------------------- entries
    def load_entries(self) -> list[Entry]:
        entries: list[Entry] = []
        offset = self.log.log_start_offset
        while offset < self.log.log_end_offset:
            result = self.log.read(offset, LOAD_READ_BYTES)
            data = result.read_bytes()
            if not data:
                break
            for pos, header in iter_batches(data):
                for record in iter_records(data, pos):
                    if record.offset >= offset:
                        entries.append(
                            Entry(record.offset, header.partition_leader_epoch, record.value or b"")
                        )
                offset = header.next_offset
        return entries

    def append(self, entries: Sequence[Entry], now_ms: int) -> None:
        """Write entries (offsets and epochs set by the core), one record batch each.

        One batch per entry because storage truncates whole batches: Raft may cut the log
        at any entry (a follower's divergent tail starts wherever the new leader's log
        ends), and a batch spanning that cut would take the entries below it along, some
        of them committed, leaving the log shorter than the core believes.
        """
        if not entries:
            return
        batches = b"".join(
            build_batch(
                [Record(timestamp_ms=now_ms, value=e.data)],
                base_offset=e.offset,
                partition_leader_epoch=e.epoch,
                now_ms=now_ms,
            )
            for e in entries
        )
        self.log.append_as_follower(batches, now_ms)

    def truncate_to(self, offset: int) -> None:
        self.log.truncate_to(offset)

    def install_snapshot(self, snapshot: Snapshot) -> None:
        """Blocking: a follower got a snapshot from the leader; it replaces the whole log."""
        self.save_snapshot(snapshot)
        self.start_after_snapshot(snapshot)

    def start_after_snapshot(self, snapshot: Snapshot) -> None:
        """Empty the log up to an installed (already durable) snapshot's end. Call it on the
        event loop: the flusher and compaction touch the same PartitionLog there."""
        self.log.truncate_fully_and_start_at(snapshot.end_offset)

    def compact_to(self, end_offset: int) -> None:
        """After a local snapshot at end_offset: let whole segments go below the snapshot
        kept before it, so that one stays a usable fallback (with the log from its end) should
        the newest not load at the next start. With no older snapshot nothing goes."""
        older = [
            end for end in map(_snapshot_end_offset, self._snapshot_paths()) if end < end_offset
        ]
        if older:
            self.log.advance_log_start(min(older[-1], self.log.log_end_offset))

    def close(self) -> None:
        self.log.close()
