"""One transactional id's state machine (Kafka's TransactionMetadata), pure.

Every change is a transition to a TxnTransit, the complete next state, in two steps as Kafka
does: `prepare_*` checks the transition against VALID_PREVIOUS_STATES and parks it as the
pending transit (the coordinator appends its record), then `complete(transit)` applies it once
the record is replicated, or `abort_pending()` drops it when the append failed. While a transit
is pending every other request of the id is answered CONCURRENT_TRANSACTIONS by the
coordinator, so records of one id are written one at a time, in order.

An illegal transition is a bug of the coordinator, never a client's doing (requests are
checked before anything is prepared): it raises IllegalTransitionError with the full state.

PrepareEpochFence is in the table because it is Kafka's state id, but raftlog never enters
it: Kafka parks a fenced epoch there before writing PrepareAbort; here the bumped epoch is part
of the PrepareAbort transit itself, so a failed append leaves no half-fenced epoch behind.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from raftlog.errors import ErrorCode, LocalError
from raftlog.txn.log_format import (
    MAX_PRODUCER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_TIMESTAMP,
    TopicPartition,
    TransactionLogValue,
    TransactionState,
)

S = TransactionState

# state -> the states it may be entered from (Kafka's TransactionState.validPreviousStates).
VALID_PREVIOUS_STATES: dict[TransactionState, frozenset[TransactionState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}

# States in which a transaction is open on its partitions (markers are owed).
PREPARE_STATES = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})
# States with no transaction in progress: a new one may begin, the id may expire.
IDLE_STATES = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka keeps the last epoch for fencing: at MAX-1 the next InitProducerId rotates the
    producer id instead of bumping, so a timeout abort can still bump to MAX."""
    return epoch >= MAX_PRODUCER_EPOCH - 1


class IllegalTransitionError(LocalError):
    """The coordinator tried a transition its state forbids (a bug); says the full state."""


@dataclass(frozen=True)
class TxnTransit:
    """The complete state an id moves to; what its record stores."""

    producer_id: int
    previous_producer_id: int
    producer_epoch: int
    last_producer_epoch: int  # in memory only (KIP-360 retries), as in Kafka
    transaction_timeout_ms: int
    state: TransactionState
    partitions: frozenset[TopicPartition]
    start_timestamp_ms: int
    last_update_timestamp_ms: int

    def to_value(self) -> TransactionLogValue:
        return TransactionLogValue(
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            transaction_timeout_ms=self.transaction_timeout_ms,
            state=self.state,
            partitions=tuple(sorted(self.partitions)),
            last_update_timestamp_ms=self.last_update_timestamp_ms,
            start_timestamp_ms=self.start_timestamp_ms,
            previous_producer_id=self.previous_producer_id,
        )


class TransactionMetadata:
    """The state of one transactional id on its coordinator."""

    def __init__(
        self,
        transactional_id: str,
        *,
        producer_id: int,
        producer_epoch: int,
        transaction_timeout_ms: int,
        state: TransactionState,
        partitions: frozenset[TopicPartition] = frozenset(),
        start_timestamp_ms: int = NO_TIMESTAMP,
        last_update_timestamp_ms: int = NO_TIMESTAMP,
        previous_producer_id: int = NO_PRODUCER_ID,
        last_producer_epoch: int = NO_PRODUCER_EPOCH,
    ) -> None:
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.previous_producer_id = previous_producer_id
        self.producer_epoch = producer_epoch
        self.last_producer_epoch = last_producer_epoch
        self.transaction_timeout_ms = transaction_timeout_ms
        self.state = state
        # In a Prepare state: the partitions whose marker is not written yet.
        self.partitions: set[TopicPartition] = set(partitions)
        self.start_timestamp_ms = start_timestamp_ms
        self.last_update_timestamp_ms = last_update_timestamp_ms
        self.pending: TxnTransit | None = None

    @classmethod
    def new(
        cls, transactional_id: str, producer_id: int, timeout_ms: int, now_ms: int
    ) -> TransactionMetadata:
        """A transactional id seen for the first time: Empty, no epoch yet (the first
        InitProducerId bumps it to 0)."""
        return cls(
            transactional_id,
            producer_id=producer_id,
            producer_epoch=NO_PRODUCER_EPOCH,
            transaction_timeout_ms=timeout_ms,
            state=S.EMPTY,
            last_update_timestamp_ms=now_ms,
        )

    @classmethod
    def from_value(cls, transactional_id: str, value: TransactionLogValue) -> TransactionMetadata:
        """The state a coordinator resumes from its log. Loading is not a transition."""
        if value.state in (S.DEAD, S.PREPARE_EPOCH_FENCE):
            raise IllegalTransitionError(f"{transactional_id!r}: {value.state.name} is not loaded")
        return cls(
            transactional_id,
            producer_id=value.producer_id,
            producer_epoch=value.producer_epoch,
            transaction_timeout_ms=value.transaction_timeout_ms,
            state=value.state,
            partitions=frozenset(value.partitions),
            start_timestamp_ms=value.start_timestamp_ms,
            last_update_timestamp_ms=value.last_update_timestamp_ms,
            previous_producer_id=value.previous_producer_id,
        )

    def __repr__(self) -> str:
        return (
            f"TransactionMetadata({self.transactional_id!r}, state={self.state.name}, "
            f"producer_id={self.producer_id}, producer_epoch={self.producer_epoch}, "
            f"previous_producer_id={self.previous_producer_id}, "
            f"last_producer_epoch={self.last_producer_epoch}, "
            f"timeout_ms={self.transaction_timeout_ms}, partitions={sorted(self.partitions)}, "
            f"start_ms={self.start_timestamp_ms}, update_ms={self.last_update_timestamp_ms}, "
            f"pending={self.pending})"
        )

    @property
    def pending_in_progress(self) -> bool:
        return self.pending is not None

    def snapshot(self) -> TxnTransit:
        return TxnTransit(
            producer_id=self.producer_id,
            previous_producer_id=self.previous_producer_id,
            producer_epoch=self.producer_epoch,
            last_producer_epoch=self.last_producer_epoch,
            transaction_timeout_ms=self.transaction_timeout_ms,
            state=self.state,
            partitions=frozenset(self.partitions),
            start_timestamp_ms=self.start_timestamp_ms,
            last_update_timestamp_ms=self.last_update_timestamp_ms,
        )

    # ------------------------------------------------------------------ the two steps
    def _check(self, target: TransactionState) -> None:
        if self.pending is not None:
            raise IllegalTransitionError(f"{self!r}: {target.name} while a transit is pending")
        if self.state not in VALID_PREVIOUS_STATES[target]:
            raise IllegalTransitionError(f"{self!r}: {self.state.name} -> {target.name}")

    def _prepare(self, transit: TxnTransit) -> TxnTransit:
        self._check(transit.state)
        self.pending = transit
        return transit

    def complete(self, transit: TxnTransit) -> None:
        """Apply the pending `transit`: its record is replicated."""
        if self.pending != transit:
            raise IllegalTransitionError(f"{self!r}: complete({transit}) is not the pending one")
        if self.state not in VALID_PREVIOUS_STATES[transit.state]:
            raise IllegalTransitionError(f"{self!r}: {self.state.name} -> {transit.state.name}")
        self.pending = None
        self.producer_id = transit.producer_id
        self.previous_producer_id = transit.previous_producer_id
        self.producer_epoch = transit.producer_epoch
        self.last_producer_epoch = transit.last_producer_epoch
        self.transaction_timeout_ms = transit.transaction_timeout_ms
        self.state = transit.state
        self.partitions = set(transit.partitions)
        self.start_timestamp_ms = transit.start_timestamp_ms
        self.last_update_timestamp_ms = transit.last_update_timestamp_ms

    def abort_pending(self) -> None:
        """The pending transit's record was not written: the state stays as it was."""
        self.pending = None

    # ------------------------------------------------------------------ transitions
    def prepare_increment_epoch(
        self, timeout_ms: int, expected_epoch: int | None, now_ms: int
    ) -> TxnTransit | ErrorCode:
        """InitProducerId on an idle id: bump the epoch (fencing every older producer).

        `expected_epoch` is the epoch a KIP-360 producer says it holds: its own epoch is
        bumped, a retry of that bump (it holds the previous epoch) gets the current one
        again, anything else is PRODUCER_FENCED.
        """
        if is_epoch_exhausted(self.producer_epoch):
            raise IllegalTransitionError(f"{self!r}: epoch exhausted, rotate the producer id")
        bumped = self.producer_epoch + 1
        if expected_epoch is None:
            # A new producer instance: no earlier recovery of this id may be retried now.
            epoch, last_epoch = bumped, NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            epoch, last_epoch = bumped, self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            epoch, last_epoch = self.producer_epoch, self.last_producer_epoch
        else:
            return ErrorCode.producer_fenced
        return self._prepare(
            self._idle_transit(self.producer_id, epoch, last_epoch, timeout_ms, now_ms)
        )

    def prepare_producer_id_rotation(
        self, new_producer_id: int, timeout_ms: int, now_ms: int, *, record_last_epoch: bool
    ) -> TxnTransit:
        """InitProducerId when the epoch is exhausted: a new producer id at epoch 0."""
        if new_producer_id == self.producer_id:
            raise IllegalTransitionError(f"{self!r}: rotation to the same producer id")
        last_epoch = self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH
        transit = self._idle_transit(new_producer_id, 0, last_epoch, timeout_ms, now_ms)
        return self._prepare(replace(transit, previous_producer_id=self.producer_id))

    def _idle_transit(
        self, producer_id: int, epoch: int, last_epoch: int, timeout_ms: int, now_ms: int
    ) -> TxnTransit:
        return TxnTransit(
            producer_id=producer_id,
            previous_producer_id=self.previous_producer_id,
            producer_epoch=epoch,
            last_producer_epoch=last_epoch,
            transaction_timeout_ms=timeout_ms,
            state=S.EMPTY,
            partitions=frozenset(),
            start_timestamp_ms=NO_TIMESTAMP,
            last_update_timestamp_ms=now_ms,
        )

    def prepare_add_partitions(
        self, partitions: frozenset[TopicPartition], now_ms: int
    ) -> TxnTransit:
        """AddPartitionsToTxn / AddOffsetsToTxn: the transaction is (or becomes) Ongoing."""
        start_ms = now_ms if self.state in IDLE_STATES else self.start_timestamp_ms
        return self._prepare(
            replace(
                self.snapshot(),
                state=S.ONGOING,
                partitions=frozenset(self.partitions | partitions),
                start_timestamp_ms=start_ms,
                last_update_timestamp_ms=now_ms,
            )
        )

    def prepare_end(self, commit: bool, now_ms: int, *, fence_epoch: bool = False) -> TxnTransit:
        """EndTxn (or an abort by the coordinator): PrepareCommit / PrepareAbort.

        `fence_epoch` bumps the epoch with the abort (a timed-out transaction, or a new
        producer taking the id over), so markers carry it and the old producer is fenced on
        every partition; at the last epoch the abort goes on without a bump.
        """
        if commit and fence_epoch:
            raise IllegalTransitionError(f"{self!r}: an epoch fence always aborts")
        epoch = self.producer_epoch
        if fence_epoch and epoch < MAX_PRODUCER_EPOCH:
            epoch += 1
        return self._prepare(
            replace(
                self.snapshot(),
                producer_epoch=epoch,
                state=S.PREPARE_COMMIT if commit else S.PREPARE_ABORT,
                last_update_timestamp_ms=now_ms,
            )
        )

    def remove_partition(self, partition: TopicPartition) -> None:
        """The marker of `partition` is written (in memory only, as Kafka)."""
        if self.state not in PREPARE_STATES:
            raise IllegalTransitionError(f"{self!r}: marker written outside a Prepare state")
        self.partitions.discard(partition)

    def prepare_complete(self, now_ms: int) -> TxnTransit:
        """Every marker is written: CompleteCommit / CompleteAbort."""
        if self.partitions:
            raise IllegalTransitionError(f"{self!r}: complete with markers still owed")
        target = S.COMPLETE_COMMIT if self.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
        return self._prepare(
            replace(
                self.snapshot(),
                state=target,
                partitions=frozenset(),
                last_update_timestamp_ms=now_ms,
            )
        )

    def prepare_dead(self) -> TxnTransit:
        """transactional.id.expiration.ms passed: the id is forgotten (a tombstone)."""
        return self._prepare(replace(self.snapshot(), state=S.DEAD))
