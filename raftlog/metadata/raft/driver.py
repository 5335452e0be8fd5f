"""The trio driver of the metadata quorum: RaftCore + the `__cluster_metadata-0` log + RPC.

The core decides; this module only executes its Ready in the order the contract demands
(docs/raft.md): quorum state fsynced before any message that reflects it, then truncate,
append, install snapshot, send, apply. Entries are stored as Kafka record batches (one record
per entry, partitionLeaderEpoch = the Raft epoch) in an ordinary PartitionLog, so the metadata
log is verifiable with the same tools as any partition. A dedicated task fsyncs appended
entries through the shared group-commit flusher and then tells the core `flushed(...)`; a
follower's next Fetch, which acknowledges, waits for that.

Snapshots are decoded into a MetadataImage before they are trusted: a snapshot downloaded from
the leader is vetted by the core (through `snapshot_check`) before anything of it is made
durable, and at start-up a snapshot file that does not decode is passed over for an older
one or the log itself (docs/metadata.md, "Snapshots that cannot be applied"). The image that
vetting built is handed to the MetadataService, so a snapshot is decoded once.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from raftlog.clock import wall_clock_ms
from raftlog.config import MIB, NodeConfig
from raftlog.errors import RaftlogError
from raftlog.metadata.image import MetadataImage
from raftlog.metadata.raft.core import (
    NotLeader,
    QuorumState,
    RaftConfig,
    RaftCore,
    Snapshot,
    SnapshotCheck,
    SnapshotRejected,
)
from raftlog.metadata.raft.messages import Entry, MessageDecodeError, message_from_wire
from raftlog.metadata.raft.roles import ProtocolViolation, RoleChange
from raftlog.metadata.snapshot import SnapshotCorruptError, decode_snapshot
from raftlog.net.rpc import PeerSet
from raftlog.records import Record, build_batch, iter_batches, iter_records
from raftlog.storage.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from raftlog.storage.config import LogConfig
from raftlog.storage.flusher import Flusher
from raftlog.storage.log import PartitionLog

log = logging.getLogger("raftlog.quorum")

METADATA_LOG_NAME = "__cluster_metadata-0"
QUORUM_STATE_FILE = "quorum-state"
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
# Non-voters (broker-only nodes) whose reply address this node keeps. A frame names its own
# sender id, so the table (and the connections and per-replica leader state behind it) is
# bounded; a cluster has far fewer brokers than this.
MAX_OBSERVER_COUNT = 1024


class MetadataRecoveryError(RaftlogError):
    """The local metadata replica cannot be rebuilt from this node's own disk."""


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

    # ---------------------------------------------------------------- quorum state
    def load_quorum_state(self) -> QuorumState:
        path = self.directory / QUORUM_STATE_FILE
        if not path.exists():
            return QuorumState()
        payload = read_checkpoint(path, "quorum-state")
        return QuorumState(payload["epoch"], payload["voted_for"], payload["leader_id"])

    def save_quorum_state(self, state: QuorumState) -> None:
        """Blocking (fsync): call from a worker thread."""
        write_checkpoint(
            self.directory / QUORUM_STATE_FILE,
            "quorum-state",
            {"epoch": state.epoch, "voted_for": state.voted_for, "leader_id": state.leader_id},
        )

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
                snapshot = Snapshot(payload["end_offset"], payload["epoch"], payload["data"])
            except (CheckpointError, KeyError, TypeError) as exc:
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
        write_checkpoint(
            self.directory / name,
            "metadata-snapshot",
            {"end_offset": snapshot.end_offset, "epoch": snapshot.epoch, "data": snapshot.data},
        )
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
        """
        passed_over: list[Path] = []
        snapshot = self.load_snapshot(check, passed_over=passed_over)
        if snapshot is None and self.log.log_start_offset > 0:
            where = (
                f"node {node_id}: no usable metadata snapshot in {self.directory} "
                f"(passed over: {', '.join(p.name for p in passed_over) or 'none'}) and the "
                f"metadata log starts at {self.log.log_start_offset}, not 0"
            )
            if is_voter:
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


@dataclass
class _CommitWaiter:
    epoch: int
    done: trio.Event
    committed: bool = False


class QuorumDriver:
    """Runs one node's RaftCore against the store, the flusher and the internal RPC."""

    def __init__(
        self,
        config: NodeConfig,
        store: MetadataLogStore,
        flusher: Flusher,
        peers: PeerSet,
        *,
        on_commit: Callable[[list[Entry], int], None],
        on_snapshot: Callable[[Snapshot], None],
        on_role_change: Callable[[RoleChange], None],
        rng: random.Random | None = None,
        snapshot_decoder: Callable[[bytes], MetadataImage] = decode_snapshot,
    ) -> None:
        self.config = config
        self.store = store
        self.flusher = flusher
        self.peers = peers
        self.voters = config.voters
        self._on_commit = on_commit
        self._on_snapshot = on_snapshot
        self._on_role_change = on_role_change
        self._observers: dict[int, tuple[str, int]] = {}
        self._internal_address = config.advertised_internal_address
        raft_config = RaftConfig(
            election_timeout_ms=config.election_timeout_ms,
            fetch_timeout_ms=config.fetch_timeout_ms,
            election_backoff_max_ms=config.election_backoff_max_ms,
            fetch_max_wait_ms=min(config.raft_fetch_max_wait_ms, config.fetch_timeout_ms // 2),
            request_timeout_ms=config.fetch_timeout_ms,
        )
        self._snapshot_decoder = snapshot_decoder
        # The image that vetting a snapshot built, until the MetadataService takes it.
        self._decoded: tuple[Snapshot, MetadataImage] | None = None
        snapshot, entries = store.recover(
            self._check_snapshot, node_id=config.node_id, is_voter=config.node_id in self.voters
        )
        self.core = RaftCore(
            config.node_id,
            frozenset(self.voters),
            raft_config,
            store.load_quorum_state(),
            entries,
            snapshot,
            rng=rng or random.Random(),
            now_ms=self.now_ms(),
            snapshot_check=self._check_snapshot,
        )
        self.high_watermark = self.core.high_watermark
        self._wake = trio.Event()
        self._flush_wanted = trio.Event()
        self._commit_waiters: dict[int, _CommitWaiter] = {}
        self._reads: dict[object, tuple[trio.Event, list[int | None]]] = {}
        peers.add_unreachable_listener(self._peer_unreachable)
        log.info(
            "metadata log loaded: start %d, end %d, snapshot %s, quorum state %s",
            store.log.log_start_offset,
            store.log.log_end_offset,
            snapshot.end_offset if snapshot else None,
            self.core.role,
        )

    @staticmethod
    def now_ms() -> int:
        return int(trio.current_time() * 1000)

    # ---------------------------------------------------------------- snapshot vetting
    def _check_snapshot(self, snapshot: Snapshot) -> str | None:
        """SnapshotCheck: decode the image now, before the snapshot is made durable or the
        log is touched; None if it can be applied, else why not."""
        try:
            image = self._snapshot_decoder(snapshot.data)
        except SnapshotCorruptError as exc:
            return exc.message
        if image.last_applied_offset >= snapshot.end_offset:
            return (
                f"its image is at offset {image.last_applied_offset}, beyond the snapshot's "
                f"end offset {snapshot.end_offset}"
            )
        self._decoded = (snapshot, image)
        return None

    def decoded_snapshot(self, snapshot: Snapshot) -> MetadataImage:
        """The image of a snapshot the core accepted, decoded once when it was vetted."""
        decoded, self._decoded = self._decoded, None
        if decoded is not None and (decoded[0] is snapshot or decoded[0] == snapshot):
            return decoded[1]
        return self._snapshot_decoder(snapshot.data)

    # ---------------------------------------------------------------- inputs
    def receive(self, sender_id: int, body: list) -> None:
        """RPC cast "raft": [message wire, reply host, reply port]."""
        try:
            wire, host, port = body
            message = message_from_wire(wire)
            reply_address = (str(host), int(port))
        except (MessageDecodeError, TypeError, ValueError) as exc:
            log.warning("dropping malformed raft message from node %s: %s", sender_id, exc)
            return
        if sender_id not in self.voters:
            if sender_id not in self._observers and len(self._observers) >= MAX_OBSERVER_COUNT:
                log.warning(
                    "dropping raft message from node %s: already %d observers",
                    sender_id,
                    len(self._observers),
                )
                return
            self._observers[sender_id] = reply_address
        try:
            self.core.receive(self.now_ms(), sender_id, message)
        except ProtocolViolation as exc:
            # A peer sending what no correct node sends must not take this node down.
            log.error(
                "ignoring raft message from node %s that breaks the protocol: %s", sender_id, exc
            )
            return
        self._wake.set()

    def _peer_unreachable(self, peer_id: int) -> None:
        """A connect to peer_id was refused; if it is our leader, elect without waiting out
        the fetch timeout (a kill -9'd leader otherwise costs the whole fetch_timeout_ms)."""
        if peer_id != self.config.node_id and peer_id == self.core.leader_id:
            self.core.leader_unreachable(self.now_ms(), peer_id)
            self._wake.set()

    def propose(self, payload: bytes) -> tuple[int, int]:
        """Append one entry as leader; returns (offset, epoch). Raises NotLeader."""
        (offset,) = self.core.propose(self.now_ms(), [payload])
        self._wake.set()
        return offset, self.core.epoch

    async def wait_committed(self, offset: int, epoch: int) -> bool:
        """True once (offset, epoch) is committed; False if that entry was truncated away."""
        if self.high_watermark > offset:
            return True  # already delivered through on_commit (epoch checked by the caller)
        waiter = self._commit_waiters.setdefault(offset, _CommitWaiter(epoch, trio.Event()))
        if waiter.epoch != epoch:
            return False
        await waiter.done.wait()
        return waiter.committed

    async def read_index(self) -> int:
        """A linearizable read point: the leader's commit offset after confirming leadership."""
        token = object()
        done = trio.Event()
        slot: list[int | None] = [None]
        self._reads[token] = (done, slot)
        try:
            self.core.read_index(self.now_ms(), token)
            self._wake.set()
            await done.wait()
        finally:
            self._reads.pop(token, None)
        if slot[0] is None:
            raise NotLeader(self.core.leader_id, self.core.epoch)
        return slot[0]

    def snapshot_written(self, end_offset: int, epoch: int, data: bytes) -> None:
        self.core.snapshot_written(end_offset, epoch, data)

    def resign(self) -> bool:
        """Hand leadership over (EndQuorumEpoch); True if this node was the leader."""
        leading = self.core.role.name == "leader"
        self.core.resign(self.now_ms())
        self._wake.set()
        return leading

    # ---------------------------------------------------------------- loop
    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # Connect to every other voter at once rather than on the first message: a cast to a
        # peer that is not connected yet is dropped, and the first pre-vote after a failover
        # (from a node that only ever talked to the old leader) must not be lost that way.
        for voter_id, address in self.voters.items():
            if voter_id != self.config.node_id:
                self.peers.peer(voter_id, *address)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._flush_loop)
            task_status.started()
            while True:
                await self._process_ready()
                deadline_s = self.core.next_deadline_ms() / 1000
                with trio.move_on_at(deadline_s):
                    await self._wake.wait()
                self._wake = trio.Event()
                self.core.tick(self.now_ms())

    async def _flush_loop(self) -> None:
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted = trio.Event()
            await self.flusher.flush(self.store.log, self.store.log.log_end_offset)
            # Report what storage says is durable: a truncation during the fsync lowers it.
            self.core.flushed(self.store.log.flushed_offset)
            self._wake.set()

    async def _process_ready(self) -> None:
        ready = self.core.take_ready()
        if ready.quorum_state is not None:
            await trio.to_thread.run_sync(self.store.save_quorum_state, ready.quorum_state)
        if ready.truncate_to is not None:
            self.store.truncate_to(ready.truncate_to)
            self._fail_waiters_from(ready.truncate_to)
        if ready.entries:
            # Storage time is wall-clock ms (segment.ms, record timestamps), as in Kafka.
            self.store.append(ready.entries, wall_clock_ms())
            self._flush_wanted.set()
        if ready.snapshot_rejected is not None:
            self._log_refused_snapshot(ready.snapshot_rejected)
        if ready.snapshot is not None:
            # Only the snapshot file goes to a worker thread. The log itself is changed here,
            # on the event loop, like every other change to it: a flusher round or the
            # compaction after a local snapshot must never run against a log that a thread
            # is emptying at the same time.
            await trio.to_thread.run_sync(self.store.save_snapshot, ready.snapshot)
            self.store.start_after_snapshot(ready.snapshot)
            self._fail_waiters_from(0, below=ready.snapshot.end_offset)
            self._on_snapshot(ready.snapshot)
        for to_id, message in ready.messages:
            self._send(to_id, message.to_wire())
        if ready.committed:
            self._on_commit(ready.committed, ready.high_watermark)
            for entry in ready.committed:
                waiter = self._commit_waiters.pop(entry.offset, None)
                if waiter is not None:
                    waiter.committed = waiter.epoch == entry.epoch
                    waiter.done.set()
        self.high_watermark = ready.high_watermark
        for token, offset in ready.reads:
            pending = self._reads.get(token)
            if pending is not None:
                pending[1][0] = offset
                pending[0].set()
        if ready.role_change is not None:
            log.info(
                "metadata quorum: %s in epoch %d, leader %s",
                ready.role_change.role,
                ready.role_change.epoch,
                ready.role_change.leader_id,
            )
            self._on_role_change(ready.role_change)

    def _log_refused_snapshot(self, refused: SnapshotRejected) -> None:
        log.error(
            "node %d: refused metadata snapshot (end offset %d, epoch %d) from leader %s: %s; "
            "kept the metadata log (start %d, end %d) and the applied state, next snapshot "
            "download in %d ms at the earliest",
            self.config.node_id,
            refused.end_offset,
            refused.epoch,
            refused.leader_id,
            refused.reason,
            self.store.log.log_start_offset,
            self.store.log.log_end_offset,
            refused.retry_in_ms,
        )

    def _fail_waiters_from(self, offset: int, *, below: int | None = None) -> None:
        for waiter_offset in list(self._commit_waiters):
            if waiter_offset >= offset and (below is None or waiter_offset < below):
                waiter = self._commit_waiters.pop(waiter_offset)
                waiter.done.set()

    def _send(self, to_id: int, wire: list) -> None:
        address = self.voters.get(to_id) or self._observers.get(to_id)
        if address is None:
            return
        host, port = self._internal_address
        self.peers.peer(to_id, *address).cast("raft", [wire, host, port])

    def close(self) -> None:
        for waiter in self._commit_waiters.values():
            waiter.done.set()
        self._commit_waiters.clear()
        self.store.close()
