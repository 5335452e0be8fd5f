"""The replication half of the Raft core: fetch, high watermark, snapshots, reads.

Leader side: serve Fetch (long-polling idle followers), detect divergence, advance the high
watermark, answer linearizable reads, serve snapshot chunks, check-quorum. Follower side: fetch
only once everything appended is flushed (the fetch offset is a durable acknowledgement),
truncate on divergence, download, vet and install snapshots. Mixed into RaftCore, which owns the
log and the state declared below.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from raftlog.codec import DecodeError
from raftlog.metadata.raft.elections import Elections
from raftlog.metadata.raft.majority import has_majority, quorum_heard_ms, quorum_value
from raftlog.metadata.raft.messages import (
    ERROR_FENCED_EPOCH,
    ERROR_NONE,
    ERROR_NOT_LEADER,
    ERROR_SNAPSHOT_NOT_FOUND,
    BeginQuorumEpoch,
    DivergingEpoch,
    Entry,
    Fetch,
    FetchResponse,
    FetchSnapshot,
    FetchSnapshotResponse,
    Message,
    SnapshotId,
)
from raftlog.metadata.raft.roles import Follower, Leader, Resigned
from raftlog.metadata.raft.types import (
    LeaderContact,
    ProtocolViolation,
    Snapshot,
    SnapshotCheck,
    SnapshotRejected,
)
from raftlog.metadata.raft.voters import VoterSet, unwrap_snapshot, wrap_snapshot

__all__ = ["Replication"]


class Replication(Elections):
    """Fetch/HW/snapshot handling of RaftCore (mixed into RaftCore, on top of Elections).

    The attributes and hooks below are provided by RaftCore.
    """

    _log: list[Entry]
    _log_start: int
    _snapshot: Snapshot | None
    _flushed: int
    high_watermark: int
    _applied: int
    _now_ms: int
    # follower side
    _fetch_inflight_deadline_ms: int | None
    # (leader id, when) of the last answer this node had from a leader it followed. Unlike
    # the follower role it outlives role changes: a voter that took over because that leader
    # fell silent tells its controller how long the silence has lasted (controller/liveness).
    leader_contact: LeaderContact | None
    _fetch_target: int | None
    _snapshot_fetch: tuple[SnapshotId, bytearray] | None
    _snapshot_check: SnapshotCheck | None
    _snapshot_refusals: int
    _snapshot_retry_ms: int
    # leader side
    _acked: dict[int, int]
    _last_fetch_ms: dict[int, int]
    _parked: dict[int, tuple[Fetch, int]]
    _sent_hw: dict[int, int]
    _reads: list[tuple[object, int, set[int]]]
    _read_sequence: int
    _begin_resend_ms: int
    _leader_since_ms: int
    _served_blob: tuple[Snapshot, bytes] | None
    _bootstrap_voters: VoterSet
    _observer_fetch: dict[int, tuple[int, int]]
    _observer_directory: dict[int, uuid.UUID | None]
    directory_id: uuid.UUID | None

    # --- provided by RaftCore
    def _append(self, entries: list[Entry]) -> None:
        raise NotImplementedError

    def _truncate(self, offset: int) -> None:
        raise NotImplementedError

    def _end_offset_for_epoch(self, epoch: int) -> tuple[int, int] | None:
        raise NotImplementedError

    def _after_commit(self, now_ms: int | None) -> None:
        raise NotImplementedError

    def _check_entries_from_leader(self, entries: tuple[Entry, ...]) -> str | None:
        raise NotImplementedError

    def _track_snapshot(self, end_offset: int, snapshot_voters: VoterSet | None) -> None:
        raise NotImplementedError

    def _snapshot_blob(self) -> bytes:
        """The snapshot as it is served: its voter set and the state machine's bytes."""
        snapshot = self._snapshot
        assert snapshot is not None
        cached = self._served_blob
        if cached is None or cached[0] is not snapshot:
            # A snapshot of the bootstrap set travels as the state machine's bytes alone, as
            # before dynamic membership: every node starts from that same set.
            voters = None if snapshot.voters == self._bootstrap_voters else snapshot.voters
            cached = self._served_blob = (snapshot, wrap_snapshot(voters, snapshot.data))
        return cached[1]

    # ----------------------------------------------------------------- leader side

    def _check_quorum_deadline_ms(self) -> int:
        """When this leader stops having heard from a majority within the fetch timeout."""
        # Every voter counts as heard from when this leader was elected (a grace period).
        heard_ms = quorum_heard_ms(
            self._last_fetch_ms, self.voters, leader_id=self.node_id, missing=self._leader_since_ms
        )
        if heard_ms is None:
            return 1 << 62  # a single voter: no one else to hear from
        return heard_ms + self.config.fetch_timeout_ms

    def _tick_leader(self, now_ms: int) -> None:
        if now_ms >= self._check_quorum_deadline_ms():
            # Check-quorum: a partitioned leader steps aside so it stops serving stale reads
            # and its clients go looking for the real leader.
            self._send_end_quorum_epoch(())
            self._become(Resigned(self.epoch, self._election_deadline(now_ms)))
            return
        for replica, (_, deadline) in list(self._parked.items()):
            if now_ms >= deadline:
                self._answer_parked(replica)
        if now_ms >= self._begin_resend_ms:
            self._begin_resend_ms = now_ms + self.config.fetch_max_wait_ms
            for v in self._acked:
                if v not in self._last_fetch_ms:
                    self._send(v, BeginQuorumEpoch(self.epoch, self.node_id))

    def _advance_high_watermark(self, now_ms: int | None) -> None:
        role = self._role
        assert isinstance(role, Leader)
        # The leader's own log counts only as far as it is flushed.
        candidate = quorum_value(
            {**self._acked, self.node_id: self._flushed}, self.voters, missing=0
        )
        if candidate <= self.high_watermark:
            return
        if self._log[candidate - 1 - self._log_start].epoch != role.epoch:
            return  # only an offset of the current epoch may commit (Raft figure 8)
        self.high_watermark = candidate
        self._wake_parked(now_ms)
        self._answer_reads()
        self._after_commit(now_ms)

    def _wake_parked(self, now_ms: int | None) -> None:
        for replica, (fetch, _) in list(self._parked.items()):
            if fetch.fetch_offset < self.log_end or self._sent_hw.get(replica, -1) < (
                self.high_watermark
            ):
                self._answer_parked(replica)

    def _answer_parked(self, replica: int) -> None:
        fetch, _ = self._parked.pop(replica)
        self._answer_fetch(fetch)

    def _answer_fetch(self, fetch: Fetch) -> None:
        start = fetch.fetch_offset - self._log_start
        batch = self._log[start : start + self.config.max_fetch_entries]
        budget_bytes = self.config.max_fetch_bytes
        for i, entry in enumerate(batch):
            budget_bytes -= len(entry.data)
            if budget_bytes < 0 and i > 0:  # always send one entry, however large
                del batch[i:]
                break
        entries = tuple(batch)
        self._sent_hw[fetch.replica_id] = self.high_watermark
        self._send(fetch.replica_id, self._fetch_reply(fetch, entries=entries))

    def _fetch_reply(self, fetch: Fetch, **fields: Any) -> FetchResponse:
        """A FetchResponse echoing the request's position, with this node's view of the epoch."""
        leading = isinstance(self._role, Leader)
        return FetchResponse(
            self.epoch,
            self.leader_id,
            fetch.fetch_offset,
            fetch.last_fetched_epoch,
            self.high_watermark if leading else 0,
            read_sequence=self._read_sequence if leading else 0,
            **fields,
        )

    def _answer_reads(self) -> None:
        role = self._role
        if not self._reads or not isinstance(role, Leader):
            return
        if self.high_watermark <= role.epoch_start_offset:
            return  # the HW of a new leader may lag what an older leader committed
        keep: list[tuple[object, int, set[int]]] = []
        for token, sequence, confirmed in self._reads:
            if has_majority(confirmed | {self.node_id}, self.voters):
                self._ready.reads.append((token, self.high_watermark))
            else:
                keep.append((token, sequence, confirmed))
        self._reads = keep

    def _on_fetch(self, now_ms: int, from_id: int, msg: Fetch) -> None:
        role = self._role
        if msg.epoch > role.epoch:
            self._observe(now_ms, msg.epoch, None)
            role = self._role
        if not isinstance(role, Leader) or msg.epoch != role.epoch:
            error = ERROR_FENCED_EPOCH if msg.epoch < role.epoch else ERROR_NOT_LEADER
            self._send(from_id, self._fetch_reply(msg, error=error))
            return
        replica = msg.replica_id
        is_voter = replica in self._acked
        if is_voter:
            self._last_fetch_ms[replica] = now_ms
            for _, sequence, confirmed in self._reads:
                if msg.read_sequence >= sequence:
                    confirmed.add(replica)
        self._parked.pop(replica, None)
        snapshot = self._snapshot
        found = self._end_offset_for_epoch(msg.last_fetched_epoch)
        below_start = msg.fetch_offset < self._log_start or (
            msg.fetch_offset == self._log_start
            and snapshot is not None
            and msg.last_fetched_epoch != snapshot.epoch
        )
        if snapshot is not None and (below_start or found is None):
            snap_id = SnapshotId(snapshot.end_offset, snapshot.epoch)
            self._send(replica, self._fetch_reply(msg, snapshot_id=snap_id))
            self._answer_reads()
            return
        assert found is not None
        found_epoch, end_offset = found
        if found_epoch != msg.last_fetched_epoch or end_offset < msg.fetch_offset:
            diverging = DivergingEpoch(found_epoch, min(end_offset, msg.fetch_offset))
            self._send(replica, self._fetch_reply(msg, diverging_epoch=diverging))
            self._answer_reads()
            return
        # The follower's log matches ours below fetch_offset, and it only fetches once what it
        # has is flushed: fetch_offset is a durable acknowledgement.
        if is_voter:
            self._acked[replica] = msg.fetch_offset
        else:
            # An observer's progress: AddRaftVoter only adds one that has caught up.
            self._observer_fetch[replica] = (msg.fetch_offset, now_ms)
            self._observer_directory[replica] = msg.replica_directory_id
        has_news = msg.fetch_offset < self.log_end or self._sent_hw.get(replica, -1) < (
            self.high_watermark
        )
        # A voter that has not yet seen the newest read sequence gets an answer at once, so
        # that its next fetch (carrying that sequence) confirms the pending reads quickly.
        unconfirmed = is_voter and msg.read_sequence < self._read_sequence and bool(self._reads)
        if has_news or msg.max_wait_ms <= 0 or unconfirmed:
            self._answer_fetch(msg)
        else:
            wait_ms = min(msg.max_wait_ms, self.config.fetch_max_wait_ms)
            self._parked[replica] = (msg, now_ms + wait_ms)
        if is_voter:
            self._advance_high_watermark(now_ms)
        self._answer_reads()

    def _on_fetch_snapshot(self, now_ms: int, from_id: int, msg: FetchSnapshot) -> None:
        role = self._role
        if msg.epoch > role.epoch:
            self._observe(now_ms, msg.epoch, None)
            role = self._role
        snapshot = self._snapshot
        error = ERROR_NONE
        if not isinstance(role, Leader) or msg.epoch != role.epoch:
            error = ERROR_FENCED_EPOCH if msg.epoch < role.epoch else ERROR_NOT_LEADER
        elif snapshot is None or SnapshotId(snapshot.end_offset, snapshot.epoch) != (
            msg.snapshot_id
        ):
            error = ERROR_SNAPSHOT_NOT_FOUND
        if error != ERROR_NONE or snapshot is None:
            self._send(
                from_id,
                FetchSnapshotResponse(
                    role.epoch, self.leader_id, None, msg.position, b"", 0, error
                ),
            )
            return
        if from_id in self._acked:
            self._last_fetch_ms[from_id] = now_ms
        size = min(max(msg.max_bytes, 1), self.config.snapshot_chunk_bytes)
        blob = self._snapshot_blob()
        chunk = blob[msg.position : msg.position + size]
        self._send(
            from_id,
            FetchSnapshotResponse(
                role.epoch,
                self.node_id,
                msg.snapshot_id,
                msg.position,
                chunk,
                len(blob),
            ),
        )

    # ----------------------------------------------------------------- follower side

    def _maybe_fetch(self, now_ms: int | None) -> None:
        """Send the next Fetch (or snapshot chunk request) if one is due.

        A follower fetches again only after everything it appended is flushed, because its
        fetch_offset tells the leader those entries are durable here.
        """
        role = self._role
        target = self._fetch_target
        if not isinstance(role, Follower) or target is None:
            return
        if self._fetch_inflight_deadline_ms is not None or self._flushed < self.log_end:
            return
        if now_ms is None:
            now_ms = self._now_ms  # flushed() carries no time: use the latest time seen
        if self._snapshot_fetch is not None:
            snap_id, buffer = self._snapshot_fetch
            message: Message = FetchSnapshot(
                self.node_id, role.epoch, snap_id, len(buffer), self.config.snapshot_chunk_bytes
            )
        else:
            message = Fetch(
                self.node_id,
                role.epoch,
                self.log_end,
                self.last_epoch,
                self.config.fetch_max_wait_ms,
                self._read_sequence,
                self.directory_id,
            )
        self._send(target, message)
        self._fetch_inflight_deadline_ms = (
            now_ms + self.config.fetch_max_wait_ms + self.config.request_timeout_ms
        )

    def _probe_for_leader(self, now_ms: int) -> None:
        """Observer without a leader: ask a random voter (its answer names the leader)."""
        target = self._rng.choice(sorted(self.voters))
        fetch = Fetch(
            self.node_id,
            self.epoch,
            self.log_end,
            self.last_epoch,
            0,
            replica_directory_id=self.directory_id,
        )
        self._send(target, fetch)

    def _from_leader(self, now_ms: int, from_id: int, epoch: int, leader_id: int | None) -> bool:
        """Observe the response's epoch; True if it is from our leader in our epoch."""
        self._observe(now_ms, epoch, leader_id)
        role = self._role
        if not isinstance(role, Follower) or epoch != role.epoch or from_id != role.leader_id:
            if isinstance(role, Follower) and from_id == self._fetch_target:
                # A non-leader answered the observer's probe: fetch from the leader now.
                self._fetch_target = role.leader_id
                self._fetch_inflight_deadline_ms = None
                self._maybe_fetch(now_ms)
            return False
        return True

    def _on_fetch_response(self, now_ms: int, from_id: int, msg: FetchResponse) -> None:
        if not self._from_leader(now_ms, from_id, msg.epoch, msg.leader_id):
            return
        role = self._role
        assert isinstance(role, Follower)
        if msg.error != ERROR_NONE:
            # FENCED_EPOCH: our fetch named an older epoch, which _observe just fixed (a new
            # fetch is on its way). NOT_LEADER: our leader of this epoch no longer leads
            # (resigned, restarted): elect soon, after a random backoff so the followers do
            # not all start at once.
            if msg.error == ERROR_NOT_LEADER and not role.leader_resigned:
                backoff_ms = self._rng.randrange(self.config.election_backoff_max_ms + 1)
                self._role = dataclasses.replace(
                    role,
                    fetch_deadline_ms=min(role.fetch_deadline_ms, now_ms + backoff_ms),
                    leader_resigned=True,
                )
            return
        if msg.fetch_offset != self.log_end or msg.last_fetched_epoch != self.last_epoch:
            return  # a duplicate or a reply to an older request: our log moved since
        if self._snapshot_fetch is not None:
            return
        expected, last_epoch = self.log_end, self.last_epoch
        for e in msg.entries:
            if e.offset != expected or not last_epoch <= e.epoch <= msg.epoch:
                raise ProtocolViolation(f"node {self.node_id}: bad entry {e!r} from {from_id}")
            expected, last_epoch = expected + 1, e.epoch
        bad_entries = self._check_entries_from_leader(msg.entries)
        if bad_entries is not None:
            raise ProtocolViolation(f"node {self.node_id}: {bad_entries} from {from_id}")
        self._fetch_inflight_deadline_ms = None
        self._read_sequence = max(self._read_sequence, msg.read_sequence)
        self.leader_contact = LeaderContact(role.leader_id, role.epoch, now_ms)
        if not role.leader_resigned:
            self._role = dataclasses.replace(
                role, fetch_deadline_ms=now_ms + self._fetch_timeout(), leader_heard=True
            )
        if msg.snapshot_id is not None:
            if now_ms >= self._snapshot_retry_ms:
                self._snapshot_fetch = (msg.snapshot_id, bytearray())
            else:
                # The last snapshot downloaded could not be applied: no new download until
                # the backoff is over. Fetching goes on at the idle long-poll pace (not at
                # once, which the leader would answer at once, again and again), so leader
                # and follower keep hearing from each other: no needless election.
                self._fetch_inflight_deadline_ms = min(
                    self._snapshot_retry_ms, now_ms + self.config.fetch_max_wait_ms
                )
        elif msg.diverging_epoch is not None:
            div = msg.diverging_epoch
            ours = self._end_offset_for_epoch(div.epoch)
            target = div.end_offset if ours is None else min(div.end_offset, ours[1])
            self._truncate(max(target, self.high_watermark, self._log_start))
        elif msg.entries:
            self._append(list(msg.entries))
        if msg.snapshot_id is None and msg.diverging_epoch is None:
            # Only a consistent response proves our log matches the leader's up to log_end;
            # after a divergence our tail may still hold entries the leader does not have.
            new_hw = min(msg.high_watermark, self.log_end)
            if new_hw > self.high_watermark:
                self.high_watermark = new_hw
        self._maybe_fetch(now_ms)

    def _on_fetch_snapshot_response(
        self, now_ms: int, from_id: int, msg: FetchSnapshotResponse
    ) -> None:
        if not self._from_leader(now_ms, from_id, msg.epoch, msg.leader_id):
            return
        role = self._role
        assert isinstance(role, Follower)
        pending = self._snapshot_fetch
        if pending is None:
            return
        snap_id, buffer = pending
        if msg.error != ERROR_NONE or msg.snapshot_id != snap_id:
            if msg.error == ERROR_SNAPSHOT_NOT_FOUND:
                self._snapshot_fetch = None  # the leader moved on: a plain fetch finds the new one
                self._fetch_inflight_deadline_ms = None
                self._maybe_fetch(now_ms)
            return
        if msg.position != len(buffer):
            return  # duplicate chunk
        if msg.position + len(msg.chunk) > msg.size or (not msg.chunk and msg.position < msg.size):
            raise ProtocolViolation(f"node {self.node_id}: bad snapshot chunk {msg!r:.200}")
        max_bytes = self.config.max_snapshot_bytes
        if msg.size > max_bytes:
            too_big = Snapshot(snap_id.end_offset, snap_id.epoch, b"")
            reason = f"{msg.size} bytes is above max_snapshot_bytes {max_bytes}"
            self._refuse_snapshot(now_ms, too_big, reason, from_id)
            self._maybe_fetch(now_ms)
            return
        self._fetch_inflight_deadline_ms = None
        self.leader_contact = LeaderContact(role.leader_id, role.epoch, now_ms)
        self._role = dataclasses.replace(role, fetch_deadline_ms=now_ms + self._fetch_timeout())
        buffer.extend(msg.chunk)
        if len(buffer) >= msg.size:
            refusal: str | None
            try:
                voters, data = unwrap_snapshot(bytes(buffer))
            except DecodeError as exc:
                voters, data, refusal = None, b"", f"its voter set does not decode: {exc}"
            else:
                refusal = None
            snapshot = Snapshot(snap_id.end_offset, snap_id.epoch, data, voters)
            check = self._snapshot_check
            if refusal is None and check is not None:
                refusal = check(snapshot)
            if refusal is None:
                self._snapshot_refusals = 0
                self._install_snapshot(snapshot)
            else:
                self._refuse_snapshot(now_ms, snapshot, refusal, from_id)
        self._maybe_fetch(now_ms)

    def _refuse_snapshot(
        self, now_ms: int, snapshot: Snapshot, reason: str, leader_id: int
    ) -> None:
        """A downloaded snapshot the state machine cannot apply: drop it, keep everything else.

        Installing it would empty the log for a state this node cannot build, and make that
        durable: after a restart the node would find it again (a crash loop), and as a voter
        it would have given up entries it acknowledged. So the log, the high watermark and
        the applied offset stay as they are; the follower keeps following (its fetches still
        count for check-quorum) and downloads again after a backoff that doubles per
        consecutive refusal, in case the leader moves on to a snapshot this node can apply.
        """
        self._snapshot_fetch = None
        self._snapshot_refusals += 1
        config = self.config
        doublings = min(self._snapshot_refusals - 1, 30)  # bounded shift; capped just below
        backoff_ms = min(
            config.snapshot_retry_backoff_ms << doublings, config.snapshot_retry_backoff_max_ms
        )
        self._snapshot_retry_ms = now_ms + backoff_ms
        self._ready.snapshot_rejected = SnapshotRejected(
            snapshot.end_offset, snapshot.epoch, leader_id, reason, backoff_ms
        )

    def _install_snapshot(self, snapshot: Snapshot) -> None:
        assert snapshot.end_offset >= self._applied, (self.node_id, snapshot, self._applied)
        self._snapshot_fetch = None
        self._snapshot = snapshot
        self._log = []
        self._log_start = snapshot.end_offset
        self._flushed = snapshot.end_offset  # the driver installs it durably before sending
        self.high_watermark = max(self.high_watermark, snapshot.end_offset)
        self._applied = snapshot.end_offset
        ready = self._ready
        ready.snapshot = snapshot
        ready.truncate_to = None
        ready.entries = []
        ready.committed = []
        self._track_snapshot(snapshot.end_offset, snapshot.voters)
