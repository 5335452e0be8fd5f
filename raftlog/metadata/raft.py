"""Sans-IO core of the metadata-quorum Raft (pull-based, after KIP-595 / KIP-996 / etcd raft).

The core never touches a socket, a disk or a clock: the driver feeds it ``tick(now_ms)``,
``receive(now_ms, from_id, message)``, ``propose``, ``flushed``, ``snapshot_written``,
``resign`` and ``read_index``, then drains ``take_ready()`` and executes it in field order
(persist quorum state -> truncate -> append -> install snapshot -> send -> apply -> reads).
docs/raft.md describes the roles, messages and persistence rules; this module implements them.

Offsets are 0-based; every "offset" that bounds a range (high watermark, flushed, log end,
snapshot end) is exclusive.
"""

from __future__ import annotations

import bisect
import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from raftlog.metadata.raft_messages import (
    ERROR_FENCED_EPOCH,
    ERROR_NONE,
    ERROR_NOT_LEADER,
    ERROR_SNAPSHOT_NOT_FOUND,
    BeginQuorumEpoch,
    BeginQuorumEpochResponse,
    DivergingEpoch,
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
from raftlog.metadata.raft_roles import (
    Elections,
    Follower,
    Leader,
    NotLeader,
    Overloaded,
    ProtocolViolation,
    QuorumState,
    RaftConfig,
    Ready,
    Resigned,
    Role,
    RoleChange,
    Snapshot,
)

__all__ = [
    "NotLeader",
    "Overloaded",
    "ProtocolViolation",
    "QuorumState",
    "RaftConfig",
    "RaftCore",
    "Ready",
    "Snapshot",
]


def _epoch_of(entry: Entry) -> int:
    return entry.epoch


def _has_negative(message: Fetch | FetchSnapshot) -> bool:
    """Offsets and positions index the log and the snapshot: a negative one is malformed."""
    if isinstance(message, Fetch):
        return min(message.fetch_offset, message.last_fetched_epoch, message.epoch) < 0
    snap = message.snapshot_id
    return min(message.position, message.max_bytes, snap.end_offset, snap.epoch) < 0


class RaftCore(Elections):
    """One node's Raft state machine. Voter iff node_id in voters; otherwise an observer."""

    def __init__(
        self,
        node_id: int,
        voters: frozenset[int],
        config: RaftConfig,
        persisted: QuorumState,
        entries: Sequence[Entry] = (),
        snapshot: Snapshot | None = None,
        *,
        rng: random.Random,
        now_ms: int = 0,
    ) -> None:
        if not voters:
            raise ValueError("voters must not be empty")
        self.node_id = node_id
        self.voters = frozenset(voters)
        self.is_voter = node_id in self.voters
        self.config = config
        self._rng = rng
        self._majority = len(self.voters) // 2 + 1
        self._snapshot = snapshot
        self._log_start = snapshot.end_offset if snapshot else 0
        self._log: list[Entry] = []
        for e in entries:
            if e.offset < self._log_start:
                continue  # the driver may hand over a prefix the snapshot already covers
            if e.offset != self._log_start + len(self._log):
                raise ValueError(f"node {node_id}: log from disk has a gap at {e!r}")
            self._log.append(e)
        self._flushed = self.log_end  # whatever the driver loaded from disk is durable
        self.high_watermark = self._log_start  # a snapshot only ever holds committed entries
        self._applied = self._log_start
        self._ready = Ready()
        self._persisted = persisted
        # follower side
        self._fetch_inflight_deadline_ms: int | None = None
        self._fetch_target: int | None = None
        self._snapshot_fetch: tuple[SnapshotId, bytearray] | None = None
        # leader side (reset by _become)
        self._acked: dict[int, int] = {}
        self._last_fetch_ms: dict[int, int] = {}
        self._parked: dict[int, tuple[Fetch, int]] = {}
        self._sent_hw: dict[int, int] = {}
        self._reads: list[tuple[object, int, set[int]]] = []  # token, sequence, confirmed by
        self._read_sequence = 0  # leader: read_index() calls this epoch; follower: last seen
        self._begin_resend_ms = 0
        self._now_ms = now_ms  # the latest time any input carried (flushed() carries none)
        self._role: Role = self._initial_role(persisted, now_ms)
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
            if len(self._last_fetch_ms) < len(self.voters) - 1:
                deadline = min(deadline, self._begin_resend_ms)
            return deadline
        return role.election_deadline_ms

    def tick(self, now_ms: int) -> None:
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

    def receive(self, now_ms: int, from_id: int, message: Message) -> None:
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

    def propose(self, now_ms: int, payloads: list[bytes]) -> list[int]:
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

    def flushed(self, offset: int) -> None:
        """The driver made the log durable below offset (exclusive)."""
        offset = min(offset, self.log_end)
        if offset <= self._flushed:
            return
        self._flushed = offset
        if isinstance(self._role, Leader):
            self._advance_high_watermark(None)
        else:
            self._maybe_fetch(None)

    def snapshot_written(self, end_offset: int, epoch: int, data: bytes) -> None:
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
        del self._log[: end_offset - self._log_start]
        self._snapshot = Snapshot(end_offset, epoch, bytes(data))
        self._log_start = end_offset

    def resign(self, now_ms: int) -> None:
        """Graceful shutdown: hand leadership over (EndQuorumEpoch) before stopping."""
        self._now_ms = max(self._now_ms, now_ms)
        role = self._role
        if not isinstance(role, Leader):
            return
        others = [v for v in self.voters if v != self.node_id]
        successors = tuple(sorted(others, key=lambda v: (-self._acked.get(v, 0), v)))
        self._send_end_quorum_epoch(successors)
        self._become(Resigned(role.epoch, self._election_deadline(now_ms), successors))

    def read_index(self, now_ms: int, token: object) -> None:
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

    def _truncate(self, offset: int) -> None:
        assert offset >= self.high_watermark, (self.node_id, offset, self.high_watermark)
        if offset >= self.log_end:
            return
        del self._log[offset - self._log_start :]
        self._flushed = min(self._flushed, offset)
        ready = self._ready
        ready.truncate_to = offset if ready.truncate_to is None else min(ready.truncate_to, offset)
        ready.entries = [e for e in ready.entries if e.offset < offset]

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

    # ----------------------------------------------------------------- leader side

    def _check_quorum_deadline_ms(self) -> int:
        """When this leader stops having heard from a majority within the fetch timeout."""
        others = [self._last_fetch_ms.get(v, self._leader_since_ms) for v in self._acked]
        # The leader counts itself as always heard from, so it needs majority-1 others.
        needed = self._majority - 1
        if needed == 0:
            return 1 << 62
        others.sort(reverse=True)
        return others[needed - 1] + self.config.fetch_timeout_ms

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
        offsets = sorted([self._flushed, *self._acked.values()], reverse=True)
        candidate = offsets[self._majority - 1]
        if candidate <= self.high_watermark:
            return
        if self._log[candidate - 1 - self._log_start].epoch != role.epoch:
            return  # only an offset of the current epoch may commit (Raft figure 8)
        self.high_watermark = candidate
        self._wake_parked(now_ms)
        self._answer_reads()

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
            if len(confirmed) + 1 >= self._majority:
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
        chunk = snapshot.data[msg.position : msg.position + size]
        self._send(
            from_id,
            FetchSnapshotResponse(
                role.epoch,
                self.node_id,
                msg.snapshot_id,
                msg.position,
                chunk,
                len(snapshot.data),
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
            )
        self._send(target, message)
        self._fetch_inflight_deadline_ms = (
            now_ms + self.config.fetch_max_wait_ms + self.config.request_timeout_ms
        )

    def _probe_for_leader(self, now_ms: int) -> None:
        """Observer without a leader: ask a random voter (its answer names the leader)."""
        target = self._rng.choice(sorted(self.voters))
        self._send(target, Fetch(self.node_id, self.epoch, self.log_end, self.last_epoch, 0))

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
        self._fetch_inflight_deadline_ms = None
        self._read_sequence = max(self._read_sequence, msg.read_sequence)
        if not role.leader_resigned:
            self._role = dataclasses.replace(
                role, fetch_deadline_ms=now_ms + self.config.fetch_timeout_ms, leader_heard=True
            )
        if msg.snapshot_id is not None:
            self._snapshot_fetch = (msg.snapshot_id, bytearray())
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
        self._fetch_inflight_deadline_ms = None
        self._role = dataclasses.replace(
            role, fetch_deadline_ms=now_ms + self.config.fetch_timeout_ms
        )
        buffer.extend(msg.chunk)
        if len(buffer) >= msg.size:
            self._install_snapshot(Snapshot(snap_id.end_offset, snap_id.epoch, bytes(buffer)))
        self._maybe_fetch(now_ms)

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

    _HANDLERS: ClassVar[dict[type, Callable[[RaftCore, int, int, Any], None]]] = {
        Fetch: _on_fetch,
        FetchResponse: _on_fetch_response,
        FetchSnapshot: _on_fetch_snapshot,
        FetchSnapshotResponse: _on_fetch_snapshot_response,
        Vote: Elections._on_vote,
        VoteResponse: Elections._on_vote_response,
        BeginQuorumEpoch: Elections._on_begin_quorum_epoch,
        BeginQuorumEpochResponse: Elections._on_response,
        EndQuorumEpoch: Elections._on_end_quorum_epoch,
        EndQuorumEpochResponse: Elections._on_response,
    }
