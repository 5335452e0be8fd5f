"""One transactional id's state machine (Kafka's TransactionMetadata), pure.

Every change is a transition to a TxnTransit, the complete next state, in two steps as Kafka
does: `prepare_*` checks the transition against VALID_PREVIOUS_STATES and parks it as the
pending transit (the coordinator appends its record), then `complete(transit)` applies it once
the record is replicated, or `abort_pending()` drops it when the append failed. While a transit
is pending every other request of the id is answered CONCURRENT_TRANSACTIONS by the
coordinator, so records of one id are written one at a time, in order.

An illegal transition is a bug of the coordinator, never a client's doing (requests are
checked before anything is prepared): it raises IllegalTransitionError with the full state.

KIP-890 part 2 (transaction version 2, `client_transaction_version` >= TV2): every end of a
transaction bumps the producer epoch in its Prepare record, so the markers carry an epoch the
producer's late batches of the ended transaction do not have, and each partition fences them.
The epoch the producer ended with stays in `last_producer_epoch` (a retried EndTxn with it
finds its answer); at the top of the epoch range (MAX_PRODUCER_EPOCH - 1) the Prepare record
names a fresh producer id (`next_producer_id`) that the Complete record moves the producer to,
at epoch 0. A record says all of this in Kafka's own TransactionLogValue v1 fields: one end
bumps by exactly one, so the previous epoch is the stored one minus one (`from_value`).

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
    TV_0,
    TV_2,
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
    # From an idle state only a TV2 client's abort with nothing added (prepare_empty_abort),
    # as in Kafka 4.0.
    S.PREPARE_ABORT: frozenset(
        {S.ONGOING, S.PREPARE_EPOCH_FENCE, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
    ),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}

# States in which a transaction is open on its partitions (markers are owed).
PREPARE_STATES = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})
# States with no transaction in progress: a new one may begin, the id may expire.
IDLE_STATES = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
# States a transaction's end leaves behind (a retried EndTxn finds one of them).
ENDED_STATES = PREPARE_STATES | {S.COMPLETE_COMMIT, S.COMPLETE_ABORT}


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
    # KIP-890 part 2: the id the producer moves to when this end overflows the epoch, and
    # the transaction version of the client (TV2: an epoch bump per end).
    next_producer_id: int = NO_PRODUCER_ID
    client_transaction_version: int = TV_0

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
            next_producer_id=self.next_producer_id,
            client_transaction_version=self.client_transaction_version,
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
        next_producer_id: int = NO_PRODUCER_ID,
        client_transaction_version: int = TV_0,
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
        self.next_producer_id = next_producer_id
        self.client_transaction_version = client_transaction_version
        self.pending: TxnTransit | None = None
        # The Complete transit written in the same append as `pending` (an Ongoing one):
        # prepare_complete_then_add.
        self.pending_via: TxnTransit | None = None

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
        last_epoch = NO_PRODUCER_EPOCH
        if value.client_transaction_version >= TV_2 and value.state in ENDED_STATES:
            # The epoch the client ended with (a retried EndTxn names it): one below the
            # stored one, or, once an overflow moved the producer to a new id at epoch 0,
            # the top epoch of the previous id.
            if value.state in PREPARE_STATES or value.producer_epoch > 0:
                last_epoch = max(0, value.producer_epoch - 1)
            elif value.previous_producer_id != NO_PRODUCER_ID:
                last_epoch = MAX_PRODUCER_EPOCH - 1
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
            last_producer_epoch=last_epoch,
            next_producer_id=value.next_producer_id,
            client_transaction_version=value.client_transaction_version,
        )

    def __repr__(self) -> str:
        return (
            f"TransactionMetadata({self.transactional_id!r}, state={self.state.name}, "
            f"producer_id={self.producer_id}, producer_epoch={self.producer_epoch}, "
            f"previous_producer_id={self.previous_producer_id}, "
            f"last_producer_epoch={self.last_producer_epoch}, "
            f"next_producer_id={self.next_producer_id}, "
            f"client_transaction_version={self.client_transaction_version}, "
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
            next_producer_id=self.next_producer_id,
            client_transaction_version=self.client_transaction_version,
        )

    @property
    def is_tv2(self) -> bool:
        return self.client_transaction_version >= TV_2

    def client_producer(self) -> tuple[int, int]:
        """The producer id and epoch the client holds once its EndTxn is answered: the
        next producer id at epoch 0 while an overflow moves it there."""
        if self.next_producer_id != NO_PRODUCER_ID:
            return self.next_producer_id, 0
        return self.producer_id, self.producer_epoch

    def ended_by(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether (producer id, epoch) is what the client held when it ended the
        transaction this state is the end of (TV2 only): a retried EndTxn."""
        if not self.is_tv2 or self.state not in ENDED_STATES:
            return False
        if self.last_producer_epoch == NO_PRODUCER_EPOCH:
            return False
        rotated = (
            self.state not in PREPARE_STATES
            and self.producer_epoch == 0
            and self.previous_producer_id != NO_PRODUCER_ID
            and self.last_producer_epoch >= MAX_PRODUCER_EPOCH - 1
        )
        ended_id = self.previous_producer_id if rotated else self.producer_id
        return (producer_id, producer_epoch) == (ended_id, self.last_producer_epoch)

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
        """Apply the pending `transit`: its record is replicated (after the Complete one
        it was appended with, if any)."""
        if self.pending != transit:
            raise IllegalTransitionError(f"{self!r}: complete({transit}) is not the pending one")
        previous = self.state
        via = self.pending_via
        if via is not None:
            if previous not in VALID_PREVIOUS_STATES[via.state]:
                raise IllegalTransitionError(f"{self!r}: {previous.name} -> {via.state.name}")
            previous = via.state
        if previous not in VALID_PREVIOUS_STATES[transit.state]:
            raise IllegalTransitionError(f"{self!r}: {previous.name} -> {transit.state.name}")
        self.pending = None
        self.pending_via = None
        self.producer_id = transit.producer_id
        self.previous_producer_id = transit.previous_producer_id
        self.producer_epoch = transit.producer_epoch
        self.last_producer_epoch = transit.last_producer_epoch
        self.transaction_timeout_ms = transit.transaction_timeout_ms
        self.state = transit.state
        self.partitions = set(transit.partitions)
        self.start_timestamp_ms = transit.start_timestamp_ms
        self.last_update_timestamp_ms = transit.last_update_timestamp_ms
        self.next_producer_id = transit.next_producer_id
        self.client_transaction_version = transit.client_transaction_version

    def abort_pending(self) -> None:
        """The pending transit's record was not written: the state stays as it was."""
        self.pending = None
        self.pending_via = None

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
        self,
        partitions: frozenset[TopicPartition],
        now_ms: int,
        client_transaction_version: int = TV_0,
    ) -> TxnTransit:
        """AddPartitionsToTxn / AddOffsetsToTxn, or a TV2 produce's implicit add: the
        transaction is (or becomes) Ongoing. A new transaction takes the version of the
        request that begins it; an open one keeps the highest it has seen."""
        beginning = self.state in IDLE_STATES
        start_ms = now_ms if beginning else self.start_timestamp_ms
        version = (
            client_transaction_version
            if beginning
            else max(self.client_transaction_version, client_transaction_version)
        )
        return self._prepare(
            replace(
                self.snapshot(),
                state=S.ONGOING,
                partitions=frozenset(self.partitions | partitions),
                start_timestamp_ms=start_ms,
                last_update_timestamp_ms=now_ms,
                next_producer_id=NO_PRODUCER_ID,
                client_transaction_version=version,
            )
        )

    def prepare_end(
        self,
        commit: bool,
        now_ms: int,
        *,
        fence_epoch: bool = False,
        client_transaction_version: int | None = None,
        next_producer_id: int = NO_PRODUCER_ID,
    ) -> TxnTransit:
        """EndTxn (or an abort by the coordinator): PrepareCommit / PrepareAbort.

        `fence_epoch` bumps the epoch with the abort (a timed-out transaction, or a new
        producer taking the id over), so markers carry it and the old producer is fenced on
        every partition; at the last epoch the abort goes on without a bump.

        `client_transaction_version` is the EndTxn's (None: the coordinator ends it, the
        transaction keeps its own). TV2 bumps the epoch at every end, once even when it also
        fences, and remembers the epoch it ended with; `next_producer_id` is the fresh id a
        TV2 end at the top of the epoch range moves the producer to (needs_new_producer_id).
        """
        if commit and fence_epoch:
            raise IllegalTransitionError(f"{self!r}: an epoch fence always aborts")
        version = (
            self.client_transaction_version
            if client_transaction_version is None
            else client_transaction_version
        )
        tv2 = version >= TV_2
        if tv2 and client_transaction_version is not None:
            if (next_producer_id != NO_PRODUCER_ID) != self.needs_new_producer_id():
                raise IllegalTransitionError(
                    f"{self!r}: next producer id {next_producer_id} at this epoch"
                )
        elif next_producer_id != NO_PRODUCER_ID:
            raise IllegalTransitionError(f"{self!r}: a next producer id without a TV2 end")
        epoch = self.producer_epoch
        last_epoch = self.last_producer_epoch
        if (fence_epoch or tv2) and epoch < MAX_PRODUCER_EPOCH:
            epoch += 1
        if tv2:
            last_epoch = self.producer_epoch
        return self._prepare(
            replace(
                self.snapshot(),
                producer_epoch=epoch,
                last_producer_epoch=last_epoch,
                state=S.PREPARE_COMMIT if commit else S.PREPARE_ABORT,
                last_update_timestamp_ms=now_ms,
                next_producer_id=next_producer_id,
                client_transaction_version=version,
            )
        )

    def needs_new_producer_id(self) -> bool:
        """A TV2 end here would pass the epochs a producer may hold (the top one fences)."""
        return is_epoch_exhausted(self.producer_epoch)

    def prepare_empty_abort(self, now_ms: int, next_producer_id: int) -> TxnTransit:
        """A TV2 client aborts with no partition added (EndTxn v5 abort in an idle state):
        PrepareAbort with no partitions and a bumped epoch, completed at once."""
        if self.state not in IDLE_STATES:
            raise IllegalTransitionError(f"{self!r}: an empty abort of an open transaction")
        epoch = min(self.producer_epoch + 1, MAX_PRODUCER_EPOCH)
        if (next_producer_id != NO_PRODUCER_ID) != self.needs_new_producer_id():
            raise IllegalTransitionError(f"{self!r}: next producer id {next_producer_id}")
        transit = replace(
            self.snapshot(),
            producer_epoch=epoch,
            last_producer_epoch=self.producer_epoch,
            state=S.PREPARE_ABORT,
            partitions=frozenset(),
            start_timestamp_ms=now_ms,
            last_update_timestamp_ms=now_ms,
            next_producer_id=next_producer_id,
            client_transaction_version=TV_2,
        )
        return self._prepare(transit)

    def remove_partition(self, partition: TopicPartition) -> None:
        """The marker of `partition` is written (in memory only, as Kafka)."""
        if self.state not in PREPARE_STATES:
            raise IllegalTransitionError(f"{self!r}: marker written outside a Prepare state")
        self.partitions.discard(partition)

    def prepare_complete(self, now_ms: int) -> TxnTransit:
        """Every marker is written: CompleteCommit / CompleteAbort. A TV2 end that overflowed
        the epoch moves the producer to its next producer id at epoch 0 here (the markers
        went out under the old id)."""
        if self.partitions:
            raise IllegalTransitionError(f"{self!r}: complete with markers still owed")
        target = S.COMPLETE_COMMIT if self.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
        changes: dict[str, object] = {}
        if self.next_producer_id != NO_PRODUCER_ID:
            changes = {
                "producer_id": self.next_producer_id,
                "previous_producer_id": self.producer_id,
                "producer_epoch": 0,
                "next_producer_id": NO_PRODUCER_ID,
            }
        return self._prepare(
            replace(
                self.snapshot(),
                state=target,
                partitions=frozenset(),
                last_update_timestamp_ms=now_ms,
                **changes,  # type: ignore[arg-type]
            )
        )

    def prepare_complete_then_add(
        self,
        partitions: frozenset[TopicPartition],
        now_ms: int,
        client_transaction_version: int = TV_0,
    ) -> tuple[TxnTransit, TxnTransit]:
        """Every marker is written and the producer already asks to add partitions to its
        next transaction: the Complete transit and the next transaction's Ongoing transit,
        whose records are appended together (one replicated write where there were two, on
        the path of every producer that begins a transaction as soon as the last one is
        committed). The Ongoing transit is the pending one; `complete` applies it as if
        the Complete one had been applied first, `abort_pending` drops both."""
        if self.is_tv2 or client_transaction_version >= TV_2:
            # A TV2 Complete may move the producer to a new id: its next transaction's
            # producer is only known once that is applied.
            raise IllegalTransitionError(f"{self!r}: a TV2 end is completed on its own")
        done = self.prepare_complete(now_ms)
        self.pending = None
        ahead = TransactionMetadata(
            self.transactional_id,
            producer_id=done.producer_id,
            producer_epoch=done.producer_epoch,
            transaction_timeout_ms=done.transaction_timeout_ms,
            state=done.state,
            partitions=done.partitions,
            start_timestamp_ms=done.start_timestamp_ms,
            last_update_timestamp_ms=done.last_update_timestamp_ms,
            previous_producer_id=done.previous_producer_id,
            last_producer_epoch=done.last_producer_epoch,
            next_producer_id=done.next_producer_id,
            client_transaction_version=done.client_transaction_version,
        )
        add = ahead.prepare_add_partitions(partitions, now_ms, client_transaction_version)
        self.pending = add
        self.pending_via = done
        return done, add

    def prepare_dead(self) -> TxnTransit:
        """transactional.id.expiration.ms passed: the id is forgotten (a tombstone)."""
        return self._prepare(replace(self.snapshot(), state=S.DEAD))
