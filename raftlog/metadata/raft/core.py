"""Sans-IO core of the metadata-quorum Raft (pull-based, after KIP-595 / KIP-996 / etcd raft).

The core never touches a socket, a disk or a clock: the driver feeds it ``tick``,
``receive``, ``propose``, ``flushed``, ``snapshot_written``, ``resign`` and ``read_index``
(keyword arguments only), then drains ``take_ready()``, which ``executor.execute_ready``
carries out in order (persist quorum state -> truncate -> append -> install snapshot ->
send -> apply -> reads).
docs/raft.md describes the roles, messages and persistence rules. This module holds the driver
API and the in-memory log; ``RaftCore`` mixes in ``replication.Replication`` (fetch, HW,
snapshots, reads) on top of ``elections.Elections`` (epochs, votes, leadership).

Offsets are 0-based; every "offset" that bounds a range (high watermark, flushed, log end,
snapshot end) is exclusive.
"""

from __future__ import annotations

import bisect
import dataclasses
import random
import uuid
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from raftlog.codec import DecodeError
from raftlog.metadata.raft.elections import Elections
from raftlog.metadata.raft.membership import Membership, voters_of
from raftlog.metadata.raft.messages import (
    BeginQuorumEpoch,
    BeginQuorumEpochResponse,
    EndQuorumEpoch,
    EndQuorumEpochResponse,
    Entry,
    Fetch,
    FetchResponse,
    FetchSnapshot,
    FetchSnapshotResponse,
    Message,
    SnapshotId,
    Vote,
    VoteResponse,
)
from raftlog.metadata.raft.replication import Replication
from raftlog.metadata.raft.roles import Follower, Leader, Resigned, Role, Unattached
from raftlog.metadata.raft.types import (
    LeaderContact,
    NotLeader,
    Overloaded,
    ProtocolViolation,
    QuorumState,
    RaftConfig,
    Ready,
    RoleChange,
    Snapshot,
    SnapshotCheck,
)
from raftlog.metadata.raft.voters import VoterSet

__all__ = ["RaftCore"]


def _epoch_of(entry: Entry) -> int:
    return entry.epoch


def _has_negative(message: Fetch | FetchSnapshot) -> bool:
    """Offsets and positions index the log and the snapshot: a negative one is malformed."""
    if isinstance(message, Fetch):
        return min(message.fetch_offset, message.last_fetched_epoch, message.epoch) < 0
    snap = message.snapshot_id
    return min(message.position, message.max_bytes, snap.end_offset, snap.epoch) < 0


class RaftCore(Membership):
    """One node's Raft state machine. Voter iff node_id is in its voter set (the latest
    VotersRecord in its log, else its snapshot's, else the bootstrap `voters`); otherwise an
    observer."""

    def __init__(
        self,
        *,
        node_id: int,
        voters: frozenset[int] | VoterSet,
        config: RaftConfig,
        persisted: QuorumState,
        entries: Sequence[Entry] = (),
        snapshot: Snapshot | None = None,
        rng: random.Random,
        now_ms: int = 0,
        snapshot_check: SnapshotCheck | None = None,
        directory_id: uuid.UUID | None = None,
    ) -> None:
        """`voters` is the bootstrap voter set (the static config), used until the log or the
        snapshot holds a VotersRecord. `snapshot_check` vets every snapshot downloaded from the
        leader before anything of it is installed; None accepts every snapshot (the
        simulator's byte-level digests). `directory_id` names this node's metadata log
        directory in its fetches (KIP-853's replica key)."""
        if not voters:
            raise ValueError("voters must not be empty")
        bootstrap = voters if isinstance(voters, VoterSet) else VoterSet.of_ids(voters)
        if not bootstrap.voters:
            raise ValueError("voters must not be empty")
        self.node_id = node_id
        self.directory_id = directory_id
        self.config = config
        self._rng = rng
        self._snapshot = snapshot
        self._log_start = snapshot.end_offset if snapshot else 0
        self._log: list[Entry] = []
        self._now_ms = now_ms
        self._role = Unattached(0, now_ms)  # replaced below, once the log is loaded
        self._init_voters(bootstrap, snapshot.voters if snapshot else None)
        for e in entries:
            if e.offset < self._log_start:
                continue  # the driver may hand over a prefix the snapshot already covers
            if e.offset != self._log_start + len(self._log):
                raise ValueError(f"node {node_id}: log from disk has a gap at {e!r}")
            self._log.append(e)
            try:
                voter_record = voters_of(e)
            except DecodeError as exc:
                raise ValueError(f"node {node_id}: bad VotersRecord on disk at {e!r}") from exc
            if voter_record is not None:
                self._voter_records.append((e.offset, voter_record))
        self._refresh_voters()
        self._flushed = self.log_end  # whatever the driver loaded from disk is durable
        self.high_watermark = self._log_start  # a snapshot only ever holds committed entries
        self._applied = self._log_start
        self._ready = Ready()
        self._persisted = persisted
        # follower side
        self._fetch_inflight_deadline_ms: int | None = None
        self.leader_contact: LeaderContact | None = None
        self._fetch_target: int | None = None
        self._snapshot_fetch: tuple[SnapshotId, bytearray] | None = None
        self._snapshot_check = snapshot_check
        self._snapshot_refusals = 0  # consecutive downloaded snapshots the check refused
        self._snapshot_retry_ms = 0  # no snapshot download starts before this time
        # leader side (reset by _become)
        self._acked: dict[int, int] = {}
        self._last_fetch_ms: dict[int, int] = {}
        self._parked: dict[int, tuple[Fetch, int]] = {}
        self._sent_hw: dict[int, int] = {}
        self._reads: list[tuple[object, int, set[int]]] = []  # token, sequence, confirmed by
        self._read_sequence = 0  # leader: read_index() calls this epoch; follower: last seen
        self._begin_resend_ms = 0
        self._leader_since_ms = now_ms
        self._served_blob: tuple[Snapshot, bytes] | None = None
        # the latest time any input carried (flushed() carries none)
        self._role = self._initial_role(persisted, now_ms)
        self._reported: RoleChange | None = None
        self._report_role()
        if isinstance(self._role, Follower):
            self._fetch_target = self._role.leader_id
            self._maybe_fetch(now_ms)
        elif isinstance(self._role, Resigned):
            self._send_end_quorum_epoch(())

    # ----------------------------------------------------------------- properties

    @property
    def role(self) -> Role:
        return self._role

    @property
    def log_start(self) -> int:
        return self._log_start

    @property
    def log_end(self) -> int:
        return self._log_start + len(self._log)

    @property
    def last_epoch(self) -> int:
        if self._log:
            return self._log[-1].epoch
        return self._snapshot.epoch if self._snapshot else 0

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def entries(self) -> list[Entry]:
        """A copy of the in-memory log (entries after the snapshot)."""
        return list(self._log)

    def epoch_before(self, offset: int) -> int | None:
        """The epoch of the entry just below `offset` (the snapshot's epoch at its end; 0 for
        an empty prefix; None if the entry is gone into the snapshot or not in the log)."""
        if offset == self._log_start:
            return self._snapshot.epoch if self._snapshot else 0
        if not self._log_start < offset <= self.log_end:
            return None
        return self._log[offset - 1 - self._log_start].epoch

    # ----------------------------------------------------------------- driver API

    def take_ready(self) -> Ready:
        """Hand over everything to do; see the Ready docstring for the mandatory order."""
        ready = self._ready
        self._ready = Ready()
        end = min(self.high_watermark, self.log_end)
        if end > self._applied:
            ready.committed = self._log[self._applied - self._log_start : end - self._log_start]
            self._applied = end
        ready.high_watermark = self.high_watermark
        return ready

    def next_deadline_ms(self) -> int:
        """The simulated/real time at which the driver must call tick() next."""
        role = self._role
        if isinstance(role, Follower):
            deadline = role.fetch_deadline_ms
            if self._fetch_inflight_deadline_ms is not None:
                deadline = min(deadline, self._fetch_inflight_deadline_ms)
            return deadline
        if isinstance(role, Leader):
            deadline = self._check_quorum_deadline_ms()
            for _, parked_deadline in self._parked.values():
                deadline = min(deadline, parked_deadline)
            if len(self._last_fetch_ms) < len(self.voters - {self.node_id}):
                deadline = min(deadline, self._begin_resend_ms)
            return deadline
        return role.election_deadline_ms

    def tick(self, *, now_ms: int) -> None:
        self._now_ms = max(self._now_ms, now_ms)
        role = self._role
        if isinstance(role, Leader):
            self._tick_leader(now_ms)
        elif isinstance(role, Follower):
            if now_ms >= role.fetch_deadline_ms:
                if self.is_voter:
                    self._start_prospective(now_ms, role.voted_for, role.leader_id)
                else:
                    # An observer never votes: it asks a random voter who leads now.
                    self._role = dataclasses.replace(
                        role, fetch_deadline_ms=now_ms + self.config.fetch_timeout_ms
                    )
                    self._fetch_target = self._rng.choice(sorted(self.voters))
                    self._fetch_inflight_deadline_ms = None
                    self._maybe_fetch(now_ms)
            elif (
                self._fetch_inflight_deadline_ms is not None
                and now_ms >= self._fetch_inflight_deadline_ms
            ):
                self._fetch_inflight_deadline_ms = None  # lost request or response: resend
                self._maybe_fetch(now_ms)
        elif now_ms >= role.election_deadline_ms:
            if not self.is_voter:
                self._role = dataclasses.replace(
                    role, election_deadline_ms=now_ms + self.config.request_timeout_ms
                )
                self._probe_for_leader(now_ms)
            else:
                self._election_timeout(now_ms)

    def receive(self, *, now_ms: int, from_id: int, message: Message) -> None:
        """Handle one message. Raises ProtocolViolation (and changes nothing) for a message no
        correct peer sends; the driver logs it and closes that connection."""
        handler = self._HANDLERS.get(type(message))
        if handler is None:
            raise ProtocolViolation(f"node {self.node_id}: not a Raft message: {message!r:.200}")
        if from_id == self.node_id or (
            isinstance(message, Fetch | FetchSnapshot)
            and (message.replica_id != from_id or _has_negative(message))
        ):
            raise ProtocolViolation(f"node {self.node_id}: bad message {message!r:.200}")
        self._now_ms = max(self._now_ms, now_ms)
        handler(self, now_ms, from_id, message)

    def propose(self, *, now_ms: int, payloads: list[bytes]) -> list[int]:
        """Append payloads in the current epoch; the offsets commit once the HW passes them."""
        self._now_ms = max(self._now_ms, now_ms)
        role = self._role
        if not isinstance(role, Leader):
            raise NotLeader(self.leader_id, self.epoch)
        backlog = self.log_end - self.high_watermark
        if backlog + len(payloads) > self.config.max_uncommitted_entries:
            raise Overloaded(f"node {self.node_id}: {backlog} entries wait for commit")
        start = self.log_end
        self._append([Entry(start + i, role.epoch, bytes(p)) for i, p in enumerate(payloads)])
        self._wake_parked(now_ms)
        return list(range(start, start + len(payloads)))

    def flushed(self, *, offset: int) -> None:
        """The driver made the log durable below offset (exclusive)."""
        offset = min(offset, self.log_end)
        if offset <= self._flushed:
            return
        self._flushed = offset
        if isinstance(self._role, Leader):
            self._advance_high_watermark(None)
        else:
            self._maybe_fetch(None)

    def snapshot_written(self, *, end_offset: int, epoch: int, data: bytes) -> None:
        """The state machine wrote a snapshot of everything below end_offset: drop the prefix."""
        if end_offset <= self._log_start:
            return
        if end_offset > self._applied:
            raise ValueError(
                f"node {self.node_id}: snapshot end {end_offset} beyond applied {self._applied}"
            )
        actual = self._log[end_offset - 1 - self._log_start].epoch
        if actual != epoch:
            raise ValueError(f"node {self.node_id}: snapshot epoch {epoch} != entry's {actual}")
        voters = self.voters_at(end_offset)
        del self._log[: end_offset - self._log_start]
        self._snapshot = Snapshot(end_offset, epoch, bytes(data), voters)
        self._log_start = end_offset
        self._track_snapshot(end_offset, voters)

    def resign(self, *, now_ms: int) -> None:
        """Graceful shutdown: hand leadership over (EndQuorumEpoch) before stopping."""
        self._now_ms = max(self._now_ms, now_ms)
        role = self._role
        if not isinstance(role, Leader):
            return
        others = [v for v in self.voters if v != self.node_id]
        successors = tuple(sorted(others, key=lambda v: (-self._acked.get(v, 0), v)))
        self._send_end_quorum_epoch(successors)
        self._become(Resigned(role.epoch, self._election_deadline(now_ms), successors))

    def read_index(self, *, now_ms: int, token: object) -> None:
        """Linearizable read: answered in Ready.reads with an offset once a majority of voters
        fetched after this call (so this node was still the leader) and the epoch's no-op
        entry is committed. Answered with None if leadership is lost first."""
        self._now_ms = max(self._now_ms, now_ms)
        if not isinstance(self._role, Leader):
            raise NotLeader(self.leader_id, self.epoch)
        self._read_sequence += 1
        self._reads.append((token, self._read_sequence, set()))
        # Parked fetches arrived before the read: answer them so the followers fetch again
        # at once and their next fetch confirms leadership without waiting a long poll out.
        for replica in list(self._parked):
            self._answer_parked(replica)
        self._answer_reads()

    def replica_progress(self) -> dict[int, tuple[int, int | None]] | None:
        """On the leader: voter id -> (acknowledged log end, last fetch ms or None), for
        DescribeQuorum; the leader's own entry is its flushed end. None on other roles."""
        if not isinstance(self._role, Leader):
            return None
        progress: dict[int, tuple[int, int | None]] = {
            v: (self._acked.get(v, 0), self._last_fetch_ms.get(v)) for v in self._acked
        }
        progress[self.node_id] = (self._flushed, None)
        return progress

    # ----------------------------------------------------------------- role hooks

    def _role_changed(self, old: Role, new: Role) -> None:
        """Reset the per-role bookkeeping that does not survive a role change."""
        if new.epoch != old.epoch or isinstance(new, Leader):
            self._read_sequence = 0  # read sequences are only meaningful within one epoch
        if isinstance(old, Leader):
            for token, _, _ in self._reads:
                self._ready.reads.append((token, None))
            self._reads = []
            self._parked = {}
            self._acked = {}
            self._last_fetch_ms = {}
            self._sent_hw = {}
            self._observer_fetch = {}
            self._observer_directory = {}
        # Any real transition (a new epoch or leader) voids the fetch in flight: its answer
        # would come from the old leader, so fetch from the new one at once.
        self._fetch_inflight_deadline_ms = None
        self._snapshot_fetch = None
        if isinstance(new, Follower):
            self._fetch_target = new.leader_id

    def _start_leading(self, now_ms: int) -> None:
        epoch = self._role.epoch
        others = [v for v in self.voters if v != self.node_id]
        self._acked = {v: 0 for v in others}
        # Grace period for check-quorum: count everyone as heard from at election time.
        self._leader_since_ms = now_ms
        self._last_fetch_ms = {}
        self._observer_fetch = {}
        self._observer_directory = {}
        self._begin_resend_ms = now_ms + self.config.fetch_max_wait_ms
        for v in others:
            self._send(v, BeginQuorumEpoch(epoch, self.node_id))
        # The no-op entry of the epoch: the HW may only move onto an offset of this epoch,
        # so committing it commits every earlier entry (Raft's "commit only current term").
        self._append([Entry(self.log_end, epoch, self.config.leader_change_payload)])

    # ----------------------------------------------------------------- log helpers

    def _append(self, entries: list[Entry]) -> None:
        self._log.extend(entries)
        self._ready.entries.extend(entries)
        self._track_appended(entries)

    def _truncate(self, offset: int) -> None:
        assert offset >= self.high_watermark, (self.node_id, offset, self.high_watermark)
        if offset >= self.log_end:
            return
        del self._log[offset - self._log_start :]
        self._flushed = min(self._flushed, offset)
        ready = self._ready
        ready.truncate_to = offset if ready.truncate_to is None else min(ready.truncate_to, offset)
        ready.entries = [e for e in ready.entries if e.offset < offset]
        self._track_truncated(offset)

    def _end_offset_for_epoch(self, epoch: int) -> tuple[int, int] | None:
        """(largest epoch <= epoch in this log, its end offset); None if inside the snapshot."""
        i = bisect.bisect_right(self._log, epoch, key=_epoch_of)
        if i > 0:
            return self._log[i - 1].epoch, self._log_start + i
        if self._snapshot is None:
            return 0, 0
        if self._snapshot.epoch <= epoch:
            return self._snapshot.epoch, self._log_start
        return None

    def _send(self, to_id: int, message: Message) -> None:
        self._ready.messages.append((to_id, message))

    _HANDLERS: ClassVar[dict[type, Callable[[RaftCore, int, int, Any], None]]] = {
        Fetch: Replication._on_fetch,
        FetchResponse: Replication._on_fetch_response,
        FetchSnapshot: Replication._on_fetch_snapshot,
        FetchSnapshotResponse: Replication._on_fetch_snapshot_response,
        Vote: Elections._on_vote,
        VoteResponse: Elections._on_vote_response,
        BeginQuorumEpoch: Elections._on_begin_quorum_epoch,
        BeginQuorumEpochResponse: Elections._on_response,
        EndQuorumEpoch: Elections._on_end_quorum_epoch,
        EndQuorumEpochResponse: Elections._on_response,
    }
