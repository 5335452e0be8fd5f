"""Sans-IO follower state of one partition: build fetches, act on the leader's answers.

The follower's fetch offset is its LEO and its last fetched epoch the epoch of its last
batch, both read from the log. Under flush_policy=always it sends the next fetch only once
everything it appended is fsynced, because that fetch offset is what the leader counts as
durable (persist before you promise). Divergence after a leader change is repaired with the
leader's (epoch, end offset) as in KIP-320/KIP-279: the follower reads its log, and returns
the cut as a step (TRUNCATE or RESET) for the driver to perform; no fetch goes out until the
driver reports it done with `on_truncated`.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from raftlog.constants import UNDEFINED_EPOCH
from raftlog.errors import ErrorCode
from raftlog.replication.core.types import (
    FLUSH_ALWAYS,
    DivergingEpoch,
    LeaderAndIsr,
    ReplicaLogView,
    ReplicationSettings,
)


@dataclass(frozen=True)
class FetchRequest:
    """One replica fetch for this partition (the driver batches them per leader)."""

    request_id: int
    replica_id: int
    leader_id: int
    fetch_offset: int
    last_fetched_epoch: int
    current_leader_epoch: int


@dataclass(frozen=True)
class FetchResponse:
    """The leader's answer; `has_records` says the response carries batches at fetch_offset."""

    request_id: int
    error: ErrorCode
    high_watermark: int
    log_start_offset: int
    diverging_epoch: DivergingEpoch | None = None
    has_records: bool = False


class FollowerAction(enum.Enum):
    APPEND = "append"  # append the response's records, then flush and call on_flushed
    # Diverging epoch: drop every offset >= truncate_to_offset, then call on_truncated.
    TRUNCATE = "truncate"
    # Out of the leader's range: empty the log so the next offset is reset_to_offset, then
    # call on_truncated.
    RESET = "reset"
    NOTHING = "nothing"  # an empty answer: fetch again
    BACKOFF = "backoff"  # an error: wait (fetch after the backoff or new metadata)
    IGNORED = "ignored"  # an answer to a request we no longer wait for


@dataclass(frozen=True)
class FollowerStep:
    action: FollowerAction
    error: ErrorCode = ErrorCode.none
    reset_to_offset: int | None = None
    truncate_to_offset: int | None = None


class FollowerState:
    """The follower's half of a partition for one leader epoch."""

    def __init__(
        self,
        *,
        replica_id: int,
        log: ReplicaLogView,
        state: LeaderAndIsr,
        settings: ReplicationSettings,
        high_watermark: int,
        request_ids: Iterator[int] | None = None,
    ) -> None:
        self.replica_id = replica_id
        self.log = log
        self.state = state
        self.settings = settings
        self._leader_high_watermark = high_watermark
        self._request_ids = request_ids if request_ids is not None else itertools.count(1)
        self.in_flight: FetchRequest | None = None
        self._in_flight_since_ms = 0
        self._backoff_until_ms = 0
        # The step out for the driver (TRUNCATE or RESET) and the log end it asked for.
        self._truncation: tuple[FollowerAction, int] | None = None

    @property
    def leader_id(self) -> int:
        return self.state.leader_id

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch

    @property
    def fetch_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def last_fetched_epoch(self) -> int:
        return self.log.latest_epoch()

    @property
    def high_watermark(self) -> int:
        # The leader's HW may be ahead of what we have; ours never is.
        return min(self._leader_high_watermark, self.log.log_end_offset)

    @property
    def leader_high_watermark(self) -> int:
        """The leader's HW as its last answer gave it (what this replica lags behind)."""
        return self._leader_high_watermark

    @property
    def awaiting_flush(self) -> bool:
        return (
            self.settings.flush_policy == FLUSH_ALWAYS
            and self.log.flushed_offset < self.log.log_end_offset
        )

    @property
    def awaiting_truncation(self) -> bool:
        """A TRUNCATE/RESET step is out: our offsets are not the ones to fetch from yet."""
        return self._truncation is not None

    def fetch_request(self, *, now_ms: int) -> FetchRequest | None:
        """The next fetch to send, or None (one in flight, unflushed data, a truncation not
        yet done, backing off)."""
        if self.in_flight is not None:
            if now_ms - self._in_flight_since_ms < self.settings.replica_fetch_timeout_ms:
                return None
            self.in_flight = None  # lost on the way: ask again
        if now_ms < self._backoff_until_ms or self.awaiting_flush or self.awaiting_truncation:
            return None
        request = FetchRequest(
            request_id=next(self._request_ids),
            replica_id=self.replica_id,
            leader_id=self.leader_id,
            fetch_offset=self.fetch_offset,
            last_fetched_epoch=self.last_fetched_epoch,
            current_leader_epoch=self.leader_epoch,
        )
        self.in_flight = request
        self._in_flight_since_ms = now_ms
        return request

    def on_flushed(self, *, now_ms: int) -> bool:
        """The driver fsynced; True when the next fetch may go out (nothing left unflushed)."""
        return not self.awaiting_flush

    def on_truncated(self, *, now_ms: int) -> None:
        """The driver performed (or gave up on) the last TRUNCATE/RESET step: fetch again.

        A log still longer than the step asked means the cut failed; the next fetch then
        waits the backoff and meets the same divergence, which asks for the cut again.
        """
        truncation, self._truncation = self._truncation, None
        if truncation is None:
            return
        action, target = truncation
        end = self.log.log_end_offset
        # A cut drops whole batches, so it may end below its target; a reset ends exactly on it.
        failed = end != target if action is FollowerAction.RESET else end > target
        if failed:
            self._backoff_until_ms = now_ms + self.settings.replica_fetch_backoff_ms

    def truncation_for_damage(self, *, offset: int) -> FollowerStep | None:
        """The batch holding `offset` is damaged on our disk (the scrubber found it): cut the
        log before it and fetch it again from the leader. None while another cut is out (the
        next scrub pass finds the damage again if that cut left it).

        A fetch in flight asked from the old end: its answer must not be appended after the
        cut, so it is forgotten (its answer is then IGNORED).
        """
        if self._truncation is not None:
            return None
        log = self.log
        target = max(log.log_start_offset, min(offset, log.log_end_offset))
        self.in_flight = None
        self._truncation = (FollowerAction.TRUNCATE, target)
        return FollowerStep(FollowerAction.TRUNCATE, truncate_to_offset=target)

    def on_fetch_response(self, *, now_ms: int, response: FetchResponse) -> FollowerStep:
        request = self.in_flight
        if request is None or response.request_id != request.request_id:
            return FollowerStep(FollowerAction.IGNORED)
        self.in_flight = None
        if response.error == ErrorCode.offset_out_of_range:
            # Our offset is not in the leader's log (below its start, or past its end with no
            # epoch to compare): drop everything and restart at the leader's log start.
            self._truncation = (FollowerAction.RESET, response.log_start_offset)
            return FollowerStep(
                FollowerAction.RESET,
                error=response.error,
                reset_to_offset=response.log_start_offset,
            )
        if response.error != ErrorCode.none:
            # Fenced or unknown epoch, or not the leader: new metadata will sort it out.
            self._backoff_until_ms = now_ms + self.settings.replica_fetch_backoff_ms
            return FollowerStep(FollowerAction.BACKOFF, error=response.error)
        if response.diverging_epoch is not None:
            offset = self.truncation_offset(response.diverging_epoch)
            self._truncation = (FollowerAction.TRUNCATE, offset)
            return FollowerStep(FollowerAction.TRUNCATE, truncate_to_offset=offset)
        # A valid answer: our log matches the leader's up to request.fetch_offset.
        self._leader_high_watermark = response.high_watermark
        if response.has_records:
            return FollowerStep(FollowerAction.APPEND)
        return FollowerStep(FollowerAction.NOTHING)

    def truncation_offset(self, diverging: DivergingEpoch) -> int:
        """KIP-279: min(leader's end offset for the epoch, our own end offset for it)."""
        log = self.log
        own_epoch, own_end = (
            log.end_offset_for_epoch(diverging.epoch)
            if diverging.epoch != UNDEFINED_EPOCH
            else (UNDEFINED_EPOCH, log.log_start_offset)
        )
        if own_epoch == UNDEFINED_EPOCH:
            own_end = log.log_start_offset
        target = min(diverging.end_offset, own_end) if diverging.end_offset >= 0 else own_end
        return max(log.log_start_offset, min(target, log.log_end_offset))
