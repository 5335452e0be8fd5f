"""Sans-IO leader state of one partition: follower progress, the high watermark, the ISR.

The rules (Kafka's Partition.scala, KIP-320 and KIP-497; docs/replication.md explains them):
- A follower's fetch offset is its acknowledgement: it fetches offset N only after it has
  fsynced everything below N. The leader's own acknowledgement is its flushed offset under
  flush_policy=always (its LEO under interval, which trusts replication instead of fsync).
- HW = min over the maximal ISR (committed ISR plus pending additions) of the
  acknowledgements, and never moves back. An unknown follower (fetch offset -1, the state
  right after becoming leader) holds the HW where it is.
- A shrink or an expansion is an AlterPartition request; at most one is in flight, and the
  committed ISR changes only when the controller's answer (or newer metadata) arrives, so the
  HW keeps using the larger set while a shrink is pending.
"""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.constants import ACKS_ALL, UNDEFINED_EPOCH
from raftlog.errors import ErrorCode
from raftlog.replication.core.types import (
    FLUSH_ALWAYS,
    UNKNOWN_OFFSET,
    AlterPartitionRequest,
    DivergingEpoch,
    FetchDecision,
    FetchOutcome,
    LeaderAndIsr,
    LeaderEffects,
    PartitionProgress,
    ReplicaLogView,
    ReplicationSettings,
    ReplicationStateError,
)

# AlterPartition errors after which a retry with the same epochs can only fail again: the
# leader waits for newer metadata instead of asking the controller over and over.
# After any other refusal (e.g. INELIGIBLE_REPLICA: the follower's broker is fenced, which
# the partition's own metadata does not show), wait this long before asking again, instead of
# re-proposing on the follower's very next fetch.
ALTER_PARTITION_RETRY_BACKOFF_MS = 1000

_WAIT_FOR_METADATA_ERRORS = frozenset(
    {
        ErrorCode.fenced_leader_epoch,
        ErrorCode.invalid_update_version,
        ErrorCode.not_leader_or_follower,
        ErrorCode.unknown_topic_or_partition,
    }
)


@dataclass
class ReplicaProgress:
    """What the leader knows about one follower (Kafka's ReplicaState)."""

    replica_id: int
    # The follower's LEO, acknowledged as durable; UNKNOWN_OFFSET until its first valid fetch.
    fetch_offset: int = UNKNOWN_OFFSET
    last_caught_up_time_ms: int = 0
    last_fetch_time_ms: int = -1
    # The leader's LEO when this follower fetched last time (for the caught-up rule).
    last_fetch_leader_log_end_offset: int = UNKNOWN_OFFSET


class LeaderState:
    """The leader's half of a partition for one leader epoch."""

    def __init__(
        self,
        *,
        replica_id: int,
        log: ReplicaLogView,
        state: LeaderAndIsr,
        settings: ReplicationSettings,
        now_ms: int,
        high_watermark: int,
    ) -> None:
        if state.leader_id != replica_id or replica_id not in state.isr:
            raise ReplicationStateError(f"replica {replica_id} cannot lead {state}")
        self.replica_id = replica_id
        self.log = log
        self.settings = settings
        self.state = state
        # Followers must reach this offset (the first one of this epoch) to join the ISR: an
        # offset below it may sit on a log that diverges from ours.
        self.leader_epoch_start_offset = log.log_end_offset
        self._high_watermark = max(log.log_start_offset, min(high_watermark, log.log_end_offset))
        self.pending: AlterPartitionRequest | None = None
        self._awaiting_metadata = False
        self._refused = False  # the last AlterPartition was refused: back off
        self._retry_not_before_ms = 0
        # Every follower starts unknown so the HW never moves on a previous leader's info; ISR
        # members count as caught up now so they are not shrunk before their first fetch.
        self.followers: dict[int, ReplicaProgress] = {
            r: ReplicaProgress(r, last_caught_up_time_ms=now_ms if r in state.isr else 0)
            for r in state.replicas
            if r != replica_id
        }

    # ------------------------------------------------------------------ views
    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch

    @property
    def partition_epoch(self) -> int:
        return self.state.partition_epoch

    @property
    def isr(self) -> frozenset[int]:
        """The committed ISR (used for min.insync.replicas checks)."""
        return self.state.isr

    @property
    def maximal_isr(self) -> frozenset[int]:
        """Committed ISR plus pending additions (used for the HW)."""
        if self.pending is None:
            return self.state.isr
        return self.state.isr | self.pending.new_isr

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    def progress(self) -> PartitionProgress:
        return PartitionProgress(
            high_watermark=self._high_watermark,
            log_end_offset=self.log.log_end_offset,
            flushed_offset=self.log.flushed_offset,
            isr_size=len(self.state.isr),
        )

    def _own_acknowledged_offset(self) -> int:
        if self.settings.flush_policy == FLUSH_ALWAYS:
            return self.log.flushed_offset
        return self.log.log_end_offset

    # ------------------------------------------------------------------ produce
    def check_produce(self, *, acks: int, min_insync_replicas: int) -> ErrorCode:
        """Refuse acks=all before the append when the committed ISR is too small."""
        if acks == ACKS_ALL and len(self.state.isr) < min_insync_replicas:
            return ErrorCode.not_enough_replicas
        return ErrorCode.none

    def on_local_append(self, *, now_ms: int) -> LeaderEffects:
        """The driver appended to the log (the LEO moved)."""
        return self._effects(self._maybe_advance_high_watermark())

    def on_flushed(self, *, now_ms: int) -> LeaderEffects:
        """The driver fsynced the log up to log.flushed_offset."""
        return self._effects(self._maybe_advance_high_watermark())

    # ------------------------------------------------------------------ replica fetch
    def on_follower_fetch(
        self,
        *,
        now_ms: int,
        replica_id: int,
        fetch_offset: int,
        last_fetched_epoch: int,
        current_leader_epoch: int,
    ) -> FetchDecision:
        """Validate a follower's fetch, record its acknowledgement, maybe grow the ISR/HW."""
        log = self.log
        if current_leader_epoch < self.leader_epoch:
            return self._refuse(ErrorCode.fenced_leader_epoch)
        if current_leader_epoch > self.leader_epoch:
            return self._refuse(ErrorCode.unknown_leader_epoch)
        follower = self.followers.get(replica_id)
        if follower is None:
            # Not in the replica set (or ourselves): its offsets must never count.
            return self._refuse(ErrorCode.not_leader_or_follower)
        if last_fetched_epoch != UNDEFINED_EPOCH:
            latest_epoch = log.latest_epoch()
            if UNDEFINED_EPOCH != latest_epoch < last_fetched_epoch:
                # An epoch we never appended in (a leader that lost its data): ours ends at the
                # LEO. Asked directly, a log may answer "unknown", which would wipe the follower.
                epoch, end_offset = latest_epoch, log.log_end_offset
            else:
                epoch, end_offset = log.end_offset_for_epoch(last_fetched_epoch)
            if epoch == UNDEFINED_EPOCH:
                # Nothing of ours is as old as the follower's epoch: it restarts from our start.
                return self._diverging(DivergingEpoch(UNDEFINED_EPOCH, log.log_start_offset))
            if epoch < last_fetched_epoch or end_offset < fetch_offset:
                return self._diverging(DivergingEpoch(epoch, end_offset))
        if not log.log_start_offset <= fetch_offset <= log.log_end_offset:
            return FetchDecision(
                FetchOutcome.OUT_OF_RANGE,
                ErrorCode.offset_out_of_range,
                self._high_watermark,
                log.log_start_offset,
                log.log_end_offset,
                effects=LeaderEffects(self._high_watermark),
            )
        self._record_fetch(now_ms, follower, fetch_offset)
        alter = self._maybe_expand_isr(now_ms, follower)
        advanced = self._maybe_advance_high_watermark()
        return FetchDecision(
            FetchOutcome.READ,
            ErrorCode.none,
            self._high_watermark,
            log.log_start_offset,
            log.log_end_offset,
            read_from_offset=fetch_offset,
            effects=LeaderEffects(self._high_watermark, advanced, alter),
        )

    def _record_fetch(self, now_ms: int, follower: ReplicaProgress, fetch_offset: int) -> None:
        leader_end = self.log.log_end_offset
        # Kafka's rule: caught up now if it reached our LEO; caught up as of its previous fetch
        # if it reached the LEO we had then (a steady producer never lets LEO be "reached").
        if fetch_offset >= leader_end:
            follower.last_caught_up_time_ms = max(follower.last_caught_up_time_ms, now_ms)
        elif (
            follower.last_fetch_leader_log_end_offset != UNKNOWN_OFFSET
            and fetch_offset >= follower.last_fetch_leader_log_end_offset
        ):
            follower.last_caught_up_time_ms = max(
                follower.last_caught_up_time_ms, follower.last_fetch_time_ms
            )
        follower.fetch_offset = fetch_offset
        follower.last_fetch_time_ms = now_ms
        follower.last_fetch_leader_log_end_offset = leader_end

    def _refuse(self, error: ErrorCode) -> FetchDecision:
        return FetchDecision(
            FetchOutcome.ERROR,
            error,
            self._high_watermark,
            self.log.log_start_offset,
            self.log.log_end_offset,
            effects=LeaderEffects(self._high_watermark),
        )

    def _diverging(self, diverging: DivergingEpoch) -> FetchDecision:
        # The follower's offset is not acknowledged: its log does not match ours there.
        return FetchDecision(
            FetchOutcome.DIVERGING,
            ErrorCode.none,
            self._high_watermark,
            self.log.log_start_offset,
            self.log.log_end_offset,
            diverging_epoch=diverging,
            effects=LeaderEffects(self._high_watermark),
        )

    # ------------------------------------------------------------------ high watermark
    def _maybe_advance_high_watermark(self) -> bool:
        candidate = self._own_acknowledged_offset()
        for replica_id in self.maximal_isr:
            if replica_id != self.replica_id:
                candidate = min(candidate, self.followers[replica_id].fetch_offset)
        if candidate > self._high_watermark:
            self._high_watermark = candidate
            return True
        return False

    def _effects(self, advanced: bool, alter: AlterPartitionRequest | None = None) -> LeaderEffects:
        return LeaderEffects(self._high_watermark, advanced, alter)

    # ------------------------------------------------------------------ ISR
    def _can_send_alter_partition(self) -> bool:
        return self.pending is None and not self._awaiting_metadata

    def _propose(self, new_isr: frozenset[int]) -> AlterPartitionRequest:
        self.pending = AlterPartitionRequest(
            self.replica_id, self.leader_epoch, self.partition_epoch, new_isr
        )
        return self.pending

    def _maybe_expand_isr(
        self, now_ms: int, follower: ReplicaProgress
    ) -> AlterPartitionRequest | None:
        if self._refused:  # the answer carried no time; start the back-off at the next event
            self._refused = False
            self._retry_not_before_ms = now_ms + ALTER_PARTITION_RETRY_BACKOFF_MS
        if now_ms < self._retry_not_before_ms:
            return None
        if follower.replica_id in self.maximal_isr or not self._can_send_alter_partition():
            return None
        if (
            follower.fetch_offset >= self._high_watermark
            and follower.fetch_offset >= self.leader_epoch_start_offset
        ):
            return self._propose(self.state.isr | {follower.replica_id})
        return None

    def out_of_sync_replicas(self, *, now_ms: int) -> frozenset[int]:
        leader_end = self.log.log_end_offset
        lag_max_ms = self.settings.replica_lag_time_max_ms
        return frozenset(
            r
            for r in self.state.isr
            if r != self.replica_id
            and self.followers[r].fetch_offset != leader_end
            and now_ms - self.followers[r].last_caught_up_time_ms > lag_max_ms
        )

    def on_tick(self, *, now_ms: int) -> LeaderEffects:
        """Periodic check: shrink the ISR of followers that lag more than the lag time."""
        if not self._can_send_alter_partition():
            return self._effects(False)
        lagging = self.out_of_sync_replicas(now_ms=now_ms)
        if not lagging:
            return self._effects(False)
        return self._effects(False, self._propose(self.state.isr - lagging))

    def on_alter_partition_result(
        self, *, request: AlterPartitionRequest, result: LeaderAndIsr | ErrorCode
    ) -> LeaderEffects:
        """Apply the controller's answer to our in-flight AlterPartition."""
        if request != self.pending:
            return self._effects(False)  # answer to a request we no longer wait for
        self.pending = None
        if isinstance(result, ErrorCode):
            if result in _WAIT_FOR_METADATA_ERRORS:
                self._awaiting_metadata = True
            else:
                self._refused = True
            # Dropping an addition can only lower the HW candidate: nothing to do.
            return self._effects(False)
        if (
            result.leader_epoch != self.leader_epoch
            or result.partition_epoch <= self.partition_epoch
            or result.leader_id != self.replica_id
        ):
            # Newer metadata will tell us; never apply a state of another epoch here.
            self._awaiting_metadata = result.leader_epoch != self.leader_epoch
            return self._effects(self._maybe_advance_high_watermark())
        self._set_state(result)
        return self._effects(self._maybe_advance_high_watermark())

    def update_state(self, state: LeaderAndIsr) -> LeaderEffects:
        """Newer metadata for our leader epoch (the controller changed the ISR)."""
        if state.leader_epoch != self.leader_epoch or state.leader_id != self.replica_id:
            raise ReplicationStateError(f"leader {self.replica_id}: {self.state} -> {state}")
        if state.partition_epoch <= self.partition_epoch:
            return self._effects(False)
        # A pending request carries the old partition epoch: the controller will refuse it.
        self.pending = None
        self._awaiting_metadata = False
        self._set_state(state)
        return self._effects(self._maybe_advance_high_watermark())

    def _set_state(self, state: LeaderAndIsr) -> None:
        if self.replica_id not in state.isr:
            raise ReplicationStateError(f"leader {self.replica_id} left its own ISR: {state}")
        for replica_id in state.replicas:
            if replica_id != self.replica_id and replica_id not in self.followers:
                self.followers[replica_id] = ReplicaProgress(replica_id)
        self.state = state
