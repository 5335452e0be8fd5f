"""Dynamic membership of the Raft core (KIP-853; the Raft dissertation's single-server change).

The voter set is a control record in the log (voters.VoterSet). This mixin keeps, for the
in-memory log, where each VotersRecord sits, so that a node's voter set is always the latest
one in its log, committed or not: appending one switches the node to it at once, truncating
one switches back. Below the log start the snapshot's voter set applies, and the static
bootstrap set below everything.

The leader changes the set one voter at a time, and only
- once it has committed an entry of its own epoch (its no-op): until then an older leader's
  uncommitted change may still be in the log of a majority, and a second change on top of
  it could leave two disjoint majorities (the bug in the dissertation's first version);
- while no earlier change is uncommitted (one change at a time, REQUEST_TIMED_OUT otherwise).
A leader that removes itself keeps leading, without counting itself in majorities, until the
change commits, then resigns. A new voter must be an observer that fetched recently and has
caught up to the high watermark, so the new majority can commit at once.
"""

from __future__ import annotations

import dataclasses
import uuid

from raftlog.codec import DecodeError
from raftlog.errors import ErrorCode, LocalError
from raftlog.metadata.raft.messages import EndQuorumEpoch, Entry
from raftlog.metadata.raft.replication import Replication
from raftlog.metadata.raft.roles import Leader, Resigned
from raftlog.metadata.raft.types import NotLeader
from raftlog.metadata.raft.voters import (
    NO_DIRECTORY_ID,
    Voter,
    VoterSet,
    decode_voters_record,
    encode_voters_record,
    is_voters_record,
)

__all__ = ["Membership", "MembershipRefused"]


class MembershipRefused(LocalError):
    """A voter change the leader refuses; error_code is Kafka's code for the reply."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message


def voters_of(entry: Entry) -> VoterSet | None:
    """The voter set an entry carries, None for any other entry. A VotersRecord that does not
    decode raises DecodeError (the caller decides whether that is a peer's fault or disk's)."""
    if not is_voters_record(entry.data):
        return None
    return decode_voters_record(entry.data)


class Membership(Replication):
    """Voter-set tracking and the leader's voter changes (mixed into RaftCore)."""

    _bootstrap_voters: VoterSet
    _base_voters: VoterSet  # the snapshot's voter set, else the bootstrap set
    _voter_records: list[tuple[int, VoterSet]]  # VotersRecords in the in-memory log, by offset
    voter_set: VoterSet
    # leader: non-voters that fetched this epoch -> (fetch offset, last fetch ms), and the
    # directory id each named in its last fetch
    _observer_fetch: dict[int, tuple[int, int]]
    _observer_directory: dict[int, uuid.UUID | None]

    # ---------------------------------------------------------------- tracking

    def _init_voters(self, bootstrap: VoterSet, snapshot_voters: VoterSet | None) -> None:
        self._bootstrap_voters = bootstrap
        self._base_voters = snapshot_voters or bootstrap
        self._voter_records = []
        self._observer_fetch = {}
        self._observer_directory = {}
        self.voter_set = self._base_voters
        self.voters = self.voter_set.ids
        self.is_voter = self.node_id in self.voters

    def _track_appended(self, entries: list[Entry]) -> None:
        changed = False
        for entry in entries:
            voters = voters_of(entry)
            if voters is not None:
                self._voter_records.append((entry.offset, voters))
                changed = True
        if changed:
            self._refresh_voters()

    def _track_truncated(self, offset: int) -> None:
        kept = [(o, v) for o, v in self._voter_records if o < offset]
        if len(kept) != len(self._voter_records):
            self._voter_records = kept
            self._refresh_voters()

    def _track_snapshot(self, end_offset: int, snapshot_voters: VoterSet | None) -> None:
        """The log now starts at end_offset; snapshot_voters is the set in force there."""
        self._base_voters = snapshot_voters or self._bootstrap_voters
        self._voter_records = [
            (o, v) for o, v in self._voter_records if end_offset <= o < self.log_end
        ]
        self._refresh_voters()

    def voters_at(self, end_offset: int) -> VoterSet:
        """The voter set in force for a prefix ending at end_offset (exclusive)."""
        voters = self._base_voters
        for offset, record in self._voter_records:
            if offset < end_offset:
                voters = record
        return voters

    def _refresh_voters(self) -> None:
        voters = self._voter_records[-1][1] if self._voter_records else self._base_voters
        if voters == self.voter_set:
            return
        self.voter_set = voters
        self.voters = voters.ids
        self.is_voter = self.node_id in self.voters
        if isinstance(self._role, Leader):
            now_ms = self._now_ms
            for v in self.voters:
                if v != self.node_id and v not in self._acked:
                    # A new voter was an observer: start from what it fetched, and count it
                    # as heard from now so check-quorum gives it a fair chance.
                    fetched, heard_ms = self._observer_fetch.pop(v, (0, now_ms))
                    self._acked[v] = fetched
                    self._last_fetch_ms[v] = max(heard_ms, self._leader_since_ms)
            for v in list(self._acked):
                if v not in self.voters:
                    # A removed voter's progress no longer counts; it fetches as an observer.
                    fetched = self._acked.pop(v)
                    heard_ms = self._last_fetch_ms.pop(v, now_ms)
                    self._observer_fetch[v] = (fetched, heard_ms)

    def known_voter_ids(self) -> frozenset[int]:
        """Every node this one knows as a voter in some set: the bootstrap set, the
        snapshot's and each VotersRecord in its log. The driver takes election messages from
        these only (a node never named a voter anywhere has no business voting)."""
        ids = set(self._bootstrap_voters.ids) | self._base_voters.ids
        for _, voters in self._voter_records:
            ids |= voters.ids
        return frozenset(ids)

    @property
    def voter_change_pending(self) -> bool:
        """True while the latest VotersRecord in the log is not committed."""
        return bool(self._voter_records) and self._voter_records[-1][0] >= self.high_watermark

    def _check_entries_from_leader(self, entries: tuple[Entry, ...]) -> str | None:
        """Why entries from the leader cannot be appended (a damaged VotersRecord), or None."""
        for entry in entries:
            try:
                voters_of(entry)
            except DecodeError as exc:
                return f"bad VotersRecord at offset {entry.offset}: {exc}"
        return None

    # ---------------------------------------------------------------- leader: changes

    def add_voter(self, *, now_ms: int, voter: Voter) -> int:
        """Append a VotersRecord adding voter (an observer that has caught up); returns its
        offset, which commits like any entry. Raises NotLeader or MembershipRefused."""
        self._check_can_change(now_ms)
        if voter.voter_id in self.voters:
            raise MembershipRefused(
                ErrorCode.duplicate_voter, f"node {voter.voter_id} is already a voter"
            )
        if not voter.endpoints:
            raise MembershipRefused(ErrorCode.invalid_request, "a new voter needs an endpoint")
        progress = self._observer_fetch.get(voter.voter_id)
        fetched_directory = self._observer_directory.get(voter.voter_id)
        if progress is None or now_ms - progress[1] > self.config.fetch_timeout_ms:
            raise MembershipRefused(
                ErrorCode.request_timed_out,
                f"node {voter.voter_id} is not an observer fetching from this leader",
            )
        if voter.directory_id != NO_DIRECTORY_ID and fetched_directory not in (
            None,
            voter.directory_id,
        ):
            # KIP-853 adds a replica key (id, directory): not another disk of the same id.
            raise MembershipRefused(
                ErrorCode.request_timed_out,
                f"node {voter.voter_id} fetches with directory {fetched_directory}, "
                f"not {voter.directory_id}",
            )
        if voter.directory_id == NO_DIRECTORY_ID and fetched_directory is not None:
            voter = dataclasses.replace(voter, directory_id=fetched_directory)
        if progress[0] < self.high_watermark:
            raise MembershipRefused(
                ErrorCode.request_timed_out,
                f"node {voter.voter_id} has not caught up: fetched to {progress[0]}, "
                f"high watermark {self.high_watermark}",
            )
        return self._append_voters(self.voter_set.with_voter(voter))

    def remove_voter(
        self, *, now_ms: int, voter_id: int, directory_id: uuid.UUID = NO_DIRECTORY_ID
    ) -> int:
        """Append a VotersRecord without voter_id; a zero directory_id matches any."""
        self._check_can_change(now_ms)
        current = self._find_voter(voter_id, directory_id)
        if len(self.voters) == 1:
            raise MembershipRefused(ErrorCode.invalid_request, "cannot remove the last voter")
        return self._append_voters(self.voter_set.without(current.voter_id))

    def update_voter(self, *, now_ms: int, voter: Voter) -> int:
        """Append a VotersRecord with voter's new endpoints (same id and directory id)."""
        self._check_can_change(now_ms)
        self._find_voter(voter.voter_id, voter.directory_id)
        if not voter.endpoints:
            raise MembershipRefused(ErrorCode.invalid_request, "a voter needs an endpoint")
        current = self.voter_set.get(voter.voter_id)
        assert current is not None
        # A voter from the static config has no directory id yet: an update records it.
        return self._append_voters(self.voter_set.with_voter(voter))

    def _find_voter(self, voter_id: int, directory_id: uuid.UUID) -> Voter:
        current = self.voter_set.get(voter_id)
        if current is None or (
            directory_id != NO_DIRECTORY_ID
            and current.directory_id != NO_DIRECTORY_ID
            and current.directory_id != directory_id
        ):
            raise MembershipRefused(
                ErrorCode.voter_not_found, f"no voter {voter_id} with directory {directory_id}"
            )
        return current

    def _check_can_change(self, now_ms: int) -> None:
        self._now_ms = max(self._now_ms, now_ms)
        role = self._role
        if not isinstance(role, Leader):
            raise NotLeader(self.leader_id, self.epoch)
        if self.high_watermark <= role.epoch_start_offset:
            raise MembershipRefused(
                ErrorCode.request_timed_out,
                "the leader has not yet committed an entry of its epoch",
            )
        if self.voter_change_pending:
            raise MembershipRefused(
                ErrorCode.request_timed_out,
                f"the voter change at offset {self._voter_records[-1][0]} is not committed",
            )

    def _append_voters(self, voters: VoterSet) -> int:
        role = self._role
        assert isinstance(role, Leader)
        offset = self.log_end
        self._append([Entry(offset, role.epoch, encode_voters_record(voters))])
        self._wake_parked(self._now_ms)
        # A single voter (or none left but this leader) may commit at once.
        self._advance_high_watermark(self._now_ms)
        return offset

    def _after_commit(self, now_ms: int | None) -> None:
        """Leader: once a change removing this node commits, hand leadership over."""
        role = self._role
        if not isinstance(role, Leader) or self.is_voter or self.voter_change_pending:
            return
        others = [v for v in self.voters if v != self.node_id]
        successors = tuple(sorted(others, key=lambda v: (-self._acked.get(v, 0), v)))
        for v in others:
            self._send(v, EndQuorumEpoch(role.epoch, self.node_id, successors))
        now = self._now_ms if now_ms is None else now_ms
        self._become(Resigned(role.epoch, self._election_deadline(now), successors))

    # ---------------------------------------------------------------- leader: describe

    def observer_progress(self) -> dict[int, tuple[int, int]] | None:
        """On the leader: observer id -> (fetch offset, last fetch ms); None elsewhere."""
        if not isinstance(self._role, Leader):
            return None
        return dict(self._observer_fetch)

    def observer_directory(self, replica_id: int) -> uuid.UUID | None:
        """The directory id an observer named in its last fetch (None: unknown)."""
        return self._observer_directory.get(replica_id)
