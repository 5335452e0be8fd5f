"""TxnCoordinator: the transactions of one `__transaction_state` partition, sans-IO.

One object per leadership of the partition: the driver creates it when this broker becomes
the partition's leader, with the partition leader epoch as the coordinator epoch (every marker
carries it, so partitions refuse a deposed coordinator's markers), answers
COORDINATOR_LOAD_IN_PROGRESS until `load(records)`, and calls `resign()` when leadership moves
(every parked caller gets NOT_COORDINATOR; the object is done for good, the next leadership
gets a new one).

Every method takes `now_ms` (wall-clock: it is stored in the records) and returns Effects:
- replies (token, result) to deliver;
- appends of records to this `__transaction_state` partition (acks=all); the driver calls
  `on_append_done(append_id, error_code)` when each is replicated or failed;
- marker writes (WriteTxnMarkers to every partition of a transaction); the driver calls
  `on_markers_done(marker_id, {partition: error_code})` with one code per partition.

Persist before you promise, and the order that makes transactions atomic:
  PrepareCommit/PrepareAbort record replicated -> EndTxn answered, markers written ->
  every marker acknowledged -> CompleteCommit/CompleteAbort record.
A transaction is completed only when every one of its partitions has its marker; a marker is
written only after the decision is durable, so a coordinator that fails over finds the Prepare
record when it loads and writes the same markers again (`load` emits them).

One-phase commit: a transaction of one partition (part 1 client, epoch below the top, and the
log known to hold what memory holds) commits with no PrepareCommit record. Its COMMIT marker
is the durable decision, and EndTxn is answered once the marker is replicated:
  COMMIT marker replicated -> EndTxn answered -> CompleteCommit record.
After the marker, the Complete record waits COMPLETE_LINGER_MS for the producer's next add to
go with it; an add of the same partition needs no record at all (`_start_standing`).
A coordinator that loads an Ongoing transaction that could have been committed this way (one
partition, part 1, epoch below the top) cannot tell whether an earlier coordinator did. It
holds the transaction in doubt (`_in_doubt`) until it ends, whatever is added to it meanwhile.
A commit is answered as usual, because only COMMIT markers can have been written for it. An
abort bumps the producer epoch (markers of the old epoch are refused from then on) and answers
PRODUCER_FENCED rather than NONE: its records may already be committed. A one-phase commit is
never made while the coordinator's last append for the id failed (it may have landed, and
the log then hold more partitions than memory), so the record a coordinator loads names
exactly the partition a one-phase commit may have committed.

KIP-890 part 2 (transaction version 2, docs/transactions.md): EndTxn v5 bumps the epoch in
the Prepare record (`_end_txn_tv2`; a retry naming the epoch it ended with gets the outcome),
moves the producer to a fresh id when the epoch would pass the top, and the partition leaders'
implicit adds for Produce v12 / TxnOffsetCommit v5 arrive as AddPartitionsTxn with
client_transaction_version 2. An EndTxn below v5 keeps the part 1 behaviour exactly.

Kafka's TransactionCoordinator and TransactionStateManager decide what is answered; the
comments name the Kafka rule where it is not obvious.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum, auto
from typing import Any

from raftlog.codec import I32_MAX, I64_MAX
from raftlog.errors import ErrorCode
from raftlog.groups.hashing import partition_for_group
from raftlog.groups.settings import OFFSETS_TOPIC
from raftlog.txn import describe
from raftlog.txn import log_format as fmt
from raftlog.txn.effects import (
    MARKER_NOT_NEEDED,
    MARKER_STALE,
    Append,
    Effects,
    Token,
    WriteMarkers,
    map_append_error,
)
from raftlog.txn.log_format import (
    MAX_PRODUCER_EPOCH,
    MAX_TRANSACTIONAL_ID_BYTES,
    NO_MARKER_TOPICS,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TV_2,
    Record,
    TopicPartition,
    TransactionState,
)
from raftlog.txn.messages import (
    END_TXN_TV2_SINCE,
    AddOffsetsToTxnRequest,
    AddPartitionsTxn,
    AddPartitionsTxnResult,
    DescribedTransaction,
    EndTxnRequest,
    EndTxnResult,
    InitProducerIdRequest,
    InitProducerIdResult,
    ListTransactionsResult,
    TxnApi,
    end_txn_transaction_version,
    for_version,
)
from raftlog.txn.settings import TxnConfig
from raftlog.txn.state import (
    IDLE_STATES,
    PREPARE_STATES,
    TransactionMetadata,
    TxnTransit,
    is_epoch_exhausted,
)

log = logging.getLogger(__name__)

# Returns a fresh producer id, or None while none is at hand (the driver fetches blocks of
# ids from the controller with AllocateProducerIds); the caller then retries.
ProducerIdAllocator = Callable[[], int | None]

S = TransactionState

# How long an add may wait for the markers of its producer's last transaction before it is
# answered CONCURRENT_TRANSACTIONS (which clients retry after a backoff; librdkafka: 20 ms).
ADD_WAIT_MAX_MS = 1_000
# After a one-phase commit's marker lands, its Complete record waits this long for the
# producer's next add, answered with the EndTxn a moment before: the two records then go in
# one append. Without the wait the add would find that append under way and be answered
# CONCURRENT_TRANSACTIONS.
COMPLETE_LINGER_MS = 20


class _Why(Enum):
    INIT = auto()  # InitProducerId: reply the new id and epoch
    FENCE_FOR_INIT = auto()  # InitProducerId found a transaction Ongoing: abort it first
    ADD = auto()  # AddPartitionsToTxn / AddOffsetsToTxn
    END = auto()  # EndTxn from the producer
    TIMEOUT = auto()  # the coordinator aborts a timed-out transaction
    COMPLETE = auto()  # every marker written
    # Every marker written, and the producer's add for its next transaction was waiting:
    # the Complete record and the next Ongoing one, appended together.
    COMPLETE_AND_ADD = auto()
    EXPIRE = auto()  # transactional.id.expiration.ms
    # EndTxn abort of a transaction in doubt: the Prepare record bumps the epoch, the reply
    # is PRODUCER_FENCED (its records may have been committed in one phase before).
    END_IN_DOUBT = auto()


@dataclass
class _AddBatch:
    """One AddPartitionsToTxn / AddOffsetsToTxn request: its transactions' results."""

    token: Token
    results: list[AddPartitionsTxnResult | None]
    remaining: int
    offsets: bool  # AddOffsetsToTxn: the reply is one error code


@dataclass
class _Pending:
    transactional_id: str
    transit: TxnTransit
    why: _Why
    token: Token | None = None
    api: TxnApi | None = None
    api_version: int = 0
    batch: _AddBatch | None = None
    batch_index: int = 0
    partitions: tuple[TopicPartition, ...] = ()
    # The transit whose record goes first in the same append (COMPLETE_AND_ADD).
    via: TxnTransit | None = None


@dataclass
class _WaitingAdd:
    """An add that came while the producer's last transaction was writing its markers."""

    pending: _Pending  # its transit is a placeholder until the markers are written
    request: AddPartitionsTxn
    since_ms: int


@dataclass(frozen=True)
class _MarkerSend:
    transactional_id: str
    producer_id: int
    producer_epoch: int


class TxnCoordinator:
    def __init__(
        self,
        partition: int,
        coordinator_epoch: int,
        config: TxnConfig,
        allocate_producer_id: ProducerIdAllocator,
    ) -> None:
        if not 0 <= partition < config.transaction_state_log_num_partitions:
            raise ValueError(f"partition {partition} out of range")
        if not 0 <= coordinator_epoch <= I32_MAX:
            raise ValueError(f"coordinator epoch {coordinator_epoch} out of range")
        self.partition = partition
        self.coordinator_epoch = coordinator_epoch
        self.config = config
        self._allocate = allocate_producer_id
        self.loading = True
        self.resigned = False
        self.transactions: dict[str, TransactionMetadata] = {}
        # What replay_chunk has loaded so far; served from finish_load on.
        self._replayed: dict[str, TransactionMetadata] = {}
        # What replay_chunk repaired, logged once by finish_load: what -> how many records.
        self._load_repairs: Counter[str] = Counter()
        self._pending: dict[int, _Pending] = {}
        self._markers: dict[int, _MarkerSend] = {}
        self._markers_inflight: set[str] = set()
        # transactional id -> its producer's add for the next transaction, answered once
        # the markers are written (COMPLETE_AND_ADD) or after ADD_WAIT_MAX_MS.
        self._waiting_adds: dict[str, _WaitingAdd] = {}
        # transactional id -> when its markers (or completion record) are tried again.
        self._retry_at_ms: dict[str, int] = {}
        # Transactions whose markers a newer coordinator or producer epoch refused.
        self.stalled: set[str] = set()
        # transactional id -> the EndTxn of a one-phase commit, answered when its marker is
        # replicated (the marker is the decision: nothing was recorded before it).
        self._committing: dict[str, _Pending] = {}
        # Ongoing transactions loaded that an earlier coordinator may have committed in one
        # phase (see the module docstring).
        self._in_doubt: set[str] = set()
        # Transactional ids whose last append failed: it may have landed all the same, so
        # the log may hold a record memory does not (until the next append succeeds).
        self._log_unsure: set[str] = set()
        # transactional id -> (partitions, start) of the Ongoing record that is the id's
        # newest in the log, while it is: what a failover would load (_start_standing).
        self._standing: dict[str, tuple[frozenset[TopicPartition], int]] = {}
        self._next_id = 0
        self._next_abort_scan_ms = 0
        self._next_expire_scan_ms = 0

    # ------------------------------------------------------------------ lifecycle
    def load(self, records: Iterable[Record], now_ms: int) -> Effects:
        """Replay the partition's records (its log, in order) and start serving it, in one
        step: replay_chunk of them all, then finish_load."""
        self.replay_chunk(records, now_ms)
        return self.finish_load(now_ms)

    def replay_chunk(self, records: Iterable[Record], now_ms: int) -> None:
        """Fold the next records of the partition's log (in order) into the load; a driver
        replays a large partition a chunk at a time and lets other work run in between.

        What a loaded value may hold is bounded as if it were a request (_loadable): a
        CRC-correct record may still come from a writer's bug or from damage. Raises
        TxnLogRecordError on a record that does not decode; the coordinator stays loading.
        """
        if not self.loading or self.resigned:
            raise AssertionError(f"load of partition {self.partition} after it finished")
        replayed = self._replayed
        for txn_id, value in fmt.decode_records(records):
            if self.config.partition_for(txn_id) != self.partition:
                # Not this partition's id: no client would be routed here for it, so its
                # transaction could never be ended or timed out by anyone who asks.
                self._load_repairs["records of other partitions' ids skipped"] += 1
                continue
            if value is None:
                replayed.pop(txn_id, None)
            else:
                replayed[txn_id] = TransactionMetadata.from_value(
                    txn_id, self._loadable(value, now_ms)
                )

    def finish_load(self, now_ms: int) -> Effects:
        """Every record is replayed: serve the partition. Transactions found in
        PrepareCommit/PrepareAbort get their markers written again (with this coordinator's
        epoch), then their Complete record."""
        if not self.loading or self.resigned:
            raise AssertionError(f"load of partition {self.partition} finished twice")
        transactions = self.transactions = self._replayed
        self._replayed = {}
        self.loading = False
        self._next_abort_scan_ms = (
            now_ms + self.config.transaction_abort_timed_out_transaction_cleanup_interval_ms
        )
        self._next_expire_scan_ms = (
            now_ms + self.config.transaction_remove_expired_transaction_cleanup_interval_ms
        )
        if self._load_repairs:
            log.warning(
                "transaction state partition %d: %s",
                self.partition,
                ", ".join(f"{count} {what}" for what, count in sorted(self._load_repairs.items())),
            )
            self._load_repairs.clear()
        fx = Effects()
        self._in_doubt = {
            t.transactional_id
            for t in transactions.values()
            if t.state is S.ONGOING and self._commits_in_one_phase(t)
        }
        owed = [t for t in transactions.values() if t.state in PREPARE_STATES]
        for txn in owed:
            self._advance(fx, txn, now_ms)
        log.info(
            "transaction state partition %d loaded at coordinator epoch %d: %d transactional "
            "ids, %d transactions to complete, %d in doubt",
            self.partition,
            self.coordinator_epoch,
            len(transactions),
            len(owed),
            len(self._in_doubt),
        )
        return fx

    def _loadable(self, value: fmt.TransactionLogValue, now_ms: int) -> fmt.TransactionLogValue:
        """`value`, repaired where it would hold a transaction or a partition for ever
        (each repair is counted, finish_load logs the counts once):
        - a time after now is now and a timeout over transaction_max_timeout_ms is the
          maximum, so an Ongoing transaction is still aborted within the maximum timeout;
        - a Complete value holds no partitions (Kafka writes none: kept, they would join
          the producer's next transaction and get its markers);
        - no partition of NO_MARKER_TOPICS (no transaction may add one)."""
        repairs = self._load_repairs
        changes: dict[str, Any] = {}
        if value.start_timestamp_ms > now_ms:
            changes["start_timestamp_ms"] = now_ms
        if value.last_update_timestamp_ms > now_ms:
            changes["last_update_timestamp_ms"] = now_ms
        if changes:
            repairs["records with a time in the future set to now"] += 1
        if value.transaction_timeout_ms > self.config.transaction_max_timeout_ms:
            changes["transaction_timeout_ms"] = self.config.transaction_max_timeout_ms
            repairs["timeouts above transaction_max_timeout_ms lowered to it"] += 1
        if value.partitions:
            if value.state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
                changes["partitions"] = ()
                repairs["Complete records with partitions cleared"] += 1
            elif any(topic in NO_MARKER_TOPICS for topic, _ in value.partitions):
                changes["partitions"] = tuple(
                    p for p in value.partitions if p[0] not in NO_MARKER_TOPICS
                )
                repairs["records with internal topics' partitions dropped"] += 1
        return replace(value, **changes) if changes else value

    def resign(self, now_ms: int) -> Effects:
        """Leadership moved away: every parked caller gets NOT_COORDINATOR; later
        completions are ignored. The new leader's coordinator finishes what is owed."""
        fx = Effects()
        answered: set[int] = set()
        for pending in self._unanswered():
            if pending.batch is not None:
                if id(pending.batch) not in answered:
                    answered.add(id(pending.batch))
                    self._fail_batch(fx, pending.batch, ErrorCode.not_coordinator)
            elif pending.token is not None:
                fx.replies.append(
                    (pending.token, self._error_reply(pending, ErrorCode.not_coordinator))
                )
        self._pending.clear()
        self._waiting_adds.clear()
        self._committing.clear()
        self._in_doubt.clear()
        self._log_unsure.clear()
        self._standing.clear()
        self._markers.clear()
        self._markers_inflight.clear()
        self._retry_at_ms.clear()
        self.transactions.clear()
        self._replayed.clear()
        self.resigned = True
        self.loading = False
        return fx

    def _route(self, transactional_id: str) -> ErrorCode:
        if self.resigned:
            return ErrorCode.not_coordinator
        if self.config.partition_for(transactional_id) != self.partition:
            return ErrorCode.not_coordinator
        if self.loading:
            return ErrorCode.coordinator_load_in_progress
        return ErrorCode.none

    # ------------------------------------------------------------------ plumbing
    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _append(self, fx: Effects, pending: _Pending) -> None:
        append_id = self._new_id()
        self._pending[append_id] = pending
        value = None if pending.transit.state is S.DEAD else pending.transit.to_value()
        record = fmt.record(pending.transactional_id, value)
        if pending.via is None:
            fx.appends.append(Append(append_id, self.partition, (record,)))
        else:
            first = fmt.record(pending.transactional_id, pending.via.to_value())
            fx.appends.append(Append(append_id, self.partition, (first, record)))

    def _unanswered(self) -> Iterable[_Pending]:
        """Every request still owed an answer: appending, or waiting for markers."""
        yield from self._pending.values()
        for waiting in self._waiting_adds.values():
            yield waiting.pending
        yield from self._committing.values()

    def _commits_in_one_phase(self, txn: TransactionMetadata) -> bool:
        """Whether a commit of `txn` (Ongoing) skips the PrepareCommit record: one partition,
        so its one marker is the whole decision. Not for TV2, whose Prepare record carries
        the epoch bump; not at the top epoch, where an abort of the transaction in doubt
        could not bump it; not while the log may hold another record for it than memory."""
        return (
            len(txn.partitions) == 1
            and not txn.is_tv2
            and txn.producer_epoch < MAX_PRODUCER_EPOCH
            and txn.transactional_id not in self._log_unsure
        )

    def _complete(self, txn: TransactionMetadata, transit: TxnTransit) -> None:
        txn.complete(transit)
        if txn.state is not S.ONGOING:
            self._in_doubt.discard(txn.transactional_id)

    def _error_reply(self, pending: _Pending, code: ErrorCode) -> object:
        if pending.api is TxnApi.INIT_PRODUCER_ID:
            return InitProducerIdResult(for_version(code, pending.api, pending.api_version))
        if pending.api is TxnApi.END_TXN:
            return EndTxnResult(for_version(code, pending.api, pending.api_version))
        raise AssertionError(f"no single reply for {pending}")

    # ------------------------------------------------------------------ InitProducerId
    def init_producer_id(self, token: Token, req: InitProducerIdRequest, now_ms: int) -> Effects:
        """InitProducerId with a transactional id: replies InitProducerIdResult once the
        new epoch (or producer id) is replicated."""
        fx = Effects()
        code = self._init_producer_id(token, req, fx, now_ms)
        if code is not None:
            api = TxnApi.INIT_PRODUCER_ID
            fx.replies.append(
                (token, InitProducerIdResult(for_version(code, api, req.api_version)))
            )
        return fx

    def _init_producer_id(
        self, token: Token, req: InitProducerIdRequest, fx: Effects, now_ms: int
    ) -> ErrorCode | None:
        """The error to answer now, or None: a record was appended and answers later."""
        if not _valid_transactional_id(req.transactional_id):
            return ErrorCode.invalid_request
        expected: tuple[int, int] | None = None
        if req.producer_id != NO_PRODUCER_ID or req.producer_epoch != NO_PRODUCER_EPOCH:
            # KIP-360: both or neither, and in range.
            producer_id_ok = 0 <= req.producer_id <= I64_MAX
            if not (producer_id_ok and 0 <= req.producer_epoch <= MAX_PRODUCER_EPOCH):
                return ErrorCode.invalid_request
            expected = (req.producer_id, req.producer_epoch)
        timeout_ms = req.transaction_timeout_ms
        if not 0 < timeout_ms <= self.config.transaction_max_timeout_ms:
            return ErrorCode.invalid_transaction_timeout
        code = self._route(req.transactional_id)
        if code is not ErrorCode.none:
            return code
        txn = self.transactions.get(req.transactional_id)
        if txn is None:
            if len(self.transactions) >= self.config.max_transactional_ids:
                log.warning(
                    "refusing transactional id %r: max_transactional_ids reached",
                    req.transactional_id,
                )
                return ErrorCode.coordinator_not_available
            producer_id = self._allocate()
            if producer_id is None:
                return ErrorCode.coordinator_load_in_progress
            txn = TransactionMetadata.new(req.transactional_id, producer_id, timeout_ms, now_ms)
            self.transactions[req.transactional_id] = txn
        if txn.pending_in_progress:
            return ErrorCode.concurrent_transactions
        if expected is not None and not (
            # KIP-360: the producer may recover if the id is new, if it holds the current
            # producer id (its epoch is checked below), or if it retries a rotation.
            txn.producer_epoch == NO_PRODUCER_EPOCH
            or expected[0] == txn.producer_id
            or (expected[0] == txn.previous_producer_id and is_epoch_exhausted(expected[1]))
        ):
            return ErrorCode.producer_fenced
        pending = _Pending(
            req.transactional_id,
            txn.snapshot(),
            _Why.INIT,
            token=token,
            api=TxnApi.INIT_PRODUCER_ID,
            api_version=req.api_version,
        )
        if txn.state in PREPARE_STATES:
            return ErrorCode.concurrent_transactions
        if txn.state is S.ONGOING:
            # Abort the open transaction first, fencing its producer with a bumped epoch;
            # the client retries (CONCURRENT_TRANSACTIONS) and gets the epoch after that.
            pending.transit = txn.prepare_end(False, now_ms, fence_epoch=True)
            pending.why = _Why.FENCE_FOR_INIT
            self._append(fx, pending)
            return None
        if txn.state not in IDLE_STATES:
            raise AssertionError(f"{txn!r}: InitProducerId in {txn.state.name}")
        expected_epoch = None if expected is None else expected[1]
        if is_epoch_exhausted(txn.producer_epoch):
            if expected_epoch is not None and expected_epoch != txn.producer_epoch:
                return ErrorCode.producer_fenced
            new_producer_id = self._allocate()
            if new_producer_id is None:
                return ErrorCode.coordinator_load_in_progress
            pending.transit = txn.prepare_producer_id_rotation(
                new_producer_id, timeout_ms, now_ms, record_last_epoch=expected is not None
            )
        else:
            transit = txn.prepare_increment_epoch(timeout_ms, expected_epoch, now_ms)
            if isinstance(transit, ErrorCode):
                return transit
            pending.transit = transit
        self._append(fx, pending)
        return None

    # ------------------------------------------------------------------ AddPartitionsToTxn
    def add_partitions_to_txn(
        self, token: Token, transactions: Sequence[AddPartitionsTxn], now_ms: int
    ) -> Effects:
        """AddPartitionsToTxn: v3 and older carry one transaction, v4+ a batch (which may be
        verify_only, KIP-890). Replies list[AddPartitionsTxnResult], in request order, once
        every transaction's record (if one is needed) is replicated."""
        fx = Effects()
        # remaining starts at 1, held until every transaction is looked at: one may be
        # answered at once by _finish_add (a record-less start), which must not reply for
        # the batch before the others are in it.
        batch = _AddBatch(token, [None] * len(transactions), 1, offsets=False)
        for index, txn_req in enumerate(transactions):
            self._add_partitions(fx, batch, index, txn_req, now_ms)
        batch.remaining -= 1
        if batch.remaining == 0:
            fx.replies.append((token, list(batch.results)))
        return fx

    def add_offsets_to_txn(self, token: Token, req: AddOffsetsToTxnRequest, now_ms: int) -> Effects:
        """AddOffsetsToTxn: the group's `__consumer_offsets` partition joins the transaction
        (its offsets then commit or abort with it). Replies an ErrorCode."""
        fx = Effects()
        if not req.group_id:
            fx.replies.append((token, ErrorCode.invalid_group_id))
            return fx
        partition = partition_for_group(req.group_id, self.config.offsets_topic_num_partitions)
        txn_req = AddPartitionsTxn(
            req.transactional_id,
            req.producer_id,
            req.producer_epoch,
            ((OFFSETS_TOPIC, partition),),
            api_version=req.api_version,
        )
        batch = _AddBatch(token, [None], 1, offsets=True)  # held: see add_partitions_to_txn
        self._add_partitions(fx, batch, 0, txn_req, now_ms, api=TxnApi.ADD_OFFSETS_TO_TXN)
        batch.remaining -= 1
        if batch.remaining == 0:
            fx.replies.append((token, _offsets_reply(batch)))
        return fx

    def _add_partitions(
        self,
        fx: Effects,
        batch: _AddBatch,
        index: int,
        req: AddPartitionsTxn,
        now_ms: int,
        api: TxnApi = TxnApi.ADD_PARTITIONS_TO_TXN,
    ) -> None:
        def pending_add(transit: TxnTransit) -> _Pending:
            return _Pending(
                req.transactional_id,
                transit,
                _Why.ADD,
                api=api,
                api_version=req.api_version,
                batch=batch,
                batch_index=index,
                partitions=req.partitions,
            )

        def answer(code: ErrorCode) -> None:
            code = for_version(code, api, req.api_version)
            batch.results[index] = AddPartitionsTxnResult(
                req.transactional_id, {p: code for p in req.partitions}
            )

        if not _valid_transactional_id(req.transactional_id) or not _valid_partitions(
            req.partitions, self.config.max_partitions_per_transaction
        ):
            return answer(ErrorCode.invalid_request)
        if req.verify_only:
            batch.results[index] = AddPartitionsTxnResult(
                req.transactional_id,
                {
                    p: for_version(
                        self.verify(req.transactional_id, req.producer_id, req.producer_epoch, *p),
                        api,
                        req.api_version,
                    )
                    for p in req.partitions
                },
            )
            return None
        code = self._check_producer(req.transactional_id, req.producer_id, req.producer_epoch)
        if code is not ErrorCode.none:
            return answer(code)
        txn = self.transactions[req.transactional_id]
        if self._may_wait(txn, req):
            # The producer begins its next transaction while the last one's markers are
            # written (librdkafka, kafka-python and aiokafka all do, at once): answered
            # once they are, with the Complete record and this add's record in one append,
            # rather than CONCURRENT_TRANSACTIONS and the client's backoff.
            batch.remaining += 1
            placeholder = pending_add(txn.snapshot())  # its transit is chosen at the Complete
            self._waiting_adds[req.transactional_id] = _WaitingAdd(placeholder, req, now_ms)
            if not txn.partitions and req.transactional_id not in self._markers_inflight:
                # Every marker is written: the Complete record was only waiting (for this
                # add, COMPLETE_LINGER_MS, or a retry of its append).
                self._retry_at_ms.pop(req.transactional_id, None)
                self._advance(fx, txn, now_ms)
            return None
        if txn.pending_in_progress or txn.state in PREPARE_STATES:
            return answer(ErrorCode.concurrent_transactions)
        wanted = frozenset(req.partitions)
        if txn.state is S.ONGOING and wanted <= txn.partitions:
            return answer(ErrorCode.none)  # nothing new: no record
        if len(txn.partitions | wanted) > self.config.max_partitions_per_transaction:
            return answer(ErrorCode.invalid_request)
        if txn.state not in IDLE_STATES and txn.state is not S.ONGOING:
            raise AssertionError(f"{txn!r}: AddPartitionsToTxn in {txn.state.name}")
        transit = txn.prepare_add_partitions(wanted, now_ms, req.client_transaction_version)
        batch.remaining += 1
        self._append(fx, pending_add(transit))
        return None

    def _may_wait(self, txn: TransactionMetadata, req: AddPartitionsTxn) -> bool:
        """Whether an add (its producer checked) may wait for the markers of the
        transaction its producer just ended: one add per id, TV1 only (a TV2 Complete may
        move the producer to a new id), and only while markers are on their way."""
        txn_id = txn.transactional_id
        return (
            txn.state in PREPARE_STATES
            and not txn.pending_in_progress
            and not txn.is_tv2
            and req.client_transaction_version < TV_2
            and txn_id not in self._waiting_adds
            and txn_id not in self.stalled
            and (txn_id in self._markers_inflight or txn_id in self._retry_at_ms)
        )

    def _answer_waiting(self, fx: Effects, txn_id: str, code: ErrorCode) -> None:
        waiting = self._waiting_adds.pop(txn_id, None)
        if waiting is not None:
            self._finish_add(fx, waiting.pending, code)

    def _check_producer(
        self, transactional_id: str, producer_id: int, producer_epoch: int
    ) -> ErrorCode:
        code = self._route(transactional_id)
        if code is not ErrorCode.none:
            return code
        txn = self.transactions.get(transactional_id)
        if txn is not None and (producer_id, producer_epoch) == (txn.next_producer_id, 0):
            # A TV2 end moved the producer to this id; the move is done with the Complete
            # record, after the markers (KIP-890 part 2).
            return ErrorCode.concurrent_transactions
        if txn is None or txn.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping
        if txn.producer_epoch != producer_epoch:
            return ErrorCode.producer_fenced
        return ErrorCode.none

    def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
    ) -> ErrorCode:
        """KIP-890 part 1: may this producer's transactional batch open a transaction on
        `topic`-`partition`? NONE only if the partition is in the producer's Ongoing
        transaction (not one being ended): a late or retried produce cannot join the next
        transaction, and a marker cannot commit a write the coordinator never added."""
        code = self._check_producer(transactional_id, producer_id, producer_epoch)
        if code is not ErrorCode.none:
            return code
        txn = self.transactions[transactional_id]
        ending = txn.pending is not None and txn.pending.state is not S.ONGOING
        if txn.state is S.ONGOING and not ending and (topic, partition) in txn.partitions:
            return ErrorCode.none
        return ErrorCode.invalid_txn_state

    # ------------------------------------------------------------------ EndTxn
    def end_txn(self, token: Token, req: EndTxnRequest, now_ms: int) -> Effects:
        """EndTxn: replies EndTxnResult once the PrepareCommit/PrepareAbort record is
        replicated (markers follow), or at once when nothing is to be written."""
        fx = Effects()
        code = self._end_txn(fx, token, req, now_ms)
        if code is not None:
            fx.replies.append(
                (token, EndTxnResult(for_version(code, TxnApi.END_TXN, req.api_version)))
            )
        return fx

    def _end_txn(
        self, fx: Effects, token: Token, req: EndTxnRequest, now_ms: int
    ) -> ErrorCode | None:
        if not _valid_transactional_id(req.transactional_id):
            return ErrorCode.invalid_request
        version = end_txn_transaction_version(req.api_version)
        if version >= TV_2:
            return self._end_txn_tv2(fx, token, req, now_ms)
        code = self._check_producer(req.transactional_id, req.producer_id, req.producer_epoch)
        if code is not ErrorCode.none:
            return code
        txn = self.transactions[req.transactional_id]
        if txn.pending_in_progress:
            return ErrorCode.concurrent_transactions
        commit = req.committed
        state = txn.state
        if state is S.ONGOING:
            in_doubt_abort = not commit and req.transactional_id in self._in_doubt
            pending = _Pending(
                req.transactional_id,
                txn.prepare_end(
                    commit, now_ms, fence_epoch=in_doubt_abort, client_transaction_version=version
                ),
                _Why.END_IN_DOUBT if in_doubt_abort else _Why.END,
                token=token,
                api=TxnApi.END_TXN,
                api_version=req.api_version,
            )
            if commit and self._commits_in_one_phase(txn):
                # The COMMIT marker is the decision; PrepareCommit is only held in memory.
                self._complete(txn, pending.transit)
                self._committing[req.transactional_id] = pending
                self._advance(fx, txn, now_ms)
                return None
            self._append(fx, pending)
            return None
        # A retry of an EndTxn whose answer was lost finds its own outcome: the same outcome
        # is NONE (done) or CONCURRENT_TRANSACTIONS (markers still being written); the
        # other outcome, or no transaction at all, is INVALID_TXN_STATE.
        if state is (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT):
            return ErrorCode.none
        if state is (S.PREPARE_COMMIT if commit else S.PREPARE_ABORT):
            return ErrorCode.concurrent_transactions
        return ErrorCode.invalid_txn_state

    def _end_txn_tv2(
        self, fx: Effects, token: Token, req: EndTxnRequest, now_ms: int
    ) -> ErrorCode | None:
        """EndTxn v5+ (KIP-890 part 2): the Prepare record bumps the epoch, the answer
        carries the producer id and epoch of the next transaction. A retry names the epoch
        the transaction was ended with (one below the current): its outcome is answered
        with the current id and epoch, never PRODUCER_FENCED."""
        code = self._route(req.transactional_id)
        if code is not ErrorCode.none:
            return code
        txn = self.transactions.get(req.transactional_id)
        if txn is None:
            return ErrorCode.invalid_producer_id_mapping
        if txn.pending_in_progress:
            return ErrorCode.concurrent_transactions
        commit = req.committed
        state = txn.state
        if txn.ended_by(req.producer_id, req.producer_epoch):
            if state is (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT):
                done = EndTxnResult(ErrorCode.none, *txn.client_producer())
                fx.replies.append((token, done))
                return None
            if state is (S.PREPARE_COMMIT if commit else S.PREPARE_ABORT):
                return ErrorCode.concurrent_transactions
            return ErrorCode.invalid_txn_state
        code = self._check_producer(req.transactional_id, req.producer_id, req.producer_epoch)
        if code is not ErrorCode.none:
            return code
        if state in PREPARE_STATES:
            # The client holds the epoch this end gave it and ends its next transaction
            # while the markers of this one are still being written.
            return ErrorCode.concurrent_transactions
        if state is not S.ONGOING and commit:
            return ErrorCode.invalid_txn_state  # nothing was added: nothing to commit
        next_producer_id = NO_PRODUCER_ID
        if txn.needs_new_producer_id():
            allocated = self._allocate()
            if allocated is None:
                return ErrorCode.coordinator_load_in_progress
            next_producer_id = allocated
        # A part 1 transaction loaded in doubt, ended with EndTxn v5: its abort bumps the
        # epoch as any v5 end does, and is answered PRODUCER_FENCED as in _end_txn.
        in_doubt_abort = not commit and req.transactional_id in self._in_doubt
        if state is S.ONGOING:
            transit = txn.prepare_end(
                commit, now_ms, client_transaction_version=TV_2, next_producer_id=next_producer_id
            )
        else:
            # An abort with nothing added (a TV2 client aborts after a failed first send):
            # the epoch is bumped all the same, so nothing the client sent may land later.
            transit = txn.prepare_empty_abort(now_ms, next_producer_id)
        self._append(
            fx,
            _Pending(
                req.transactional_id,
                transit,
                _Why.END_IN_DOUBT if in_doubt_abort else _Why.END,
                token=token,
                api=TxnApi.END_TXN,
                api_version=req.api_version,
            ),
        )
        return None

    # ------------------------------------------------------------------ completions
    def on_append_done(self, append_id: int, error_code: ErrorCode, now_ms: int) -> Effects:
        """The Append `append_id` finished: none = replicated to every ISR member."""
        fx = Effects()
        pending = self._pending.pop(append_id, None)
        if pending is None:
            return fx  # resigned since: the new coordinator answers
        txn = self.transactions[pending.transactional_id]
        code = map_append_error(error_code)
        if code is not ErrorCode.none:
            self._log_unsure.add(pending.transactional_id)
            self._standing.pop(pending.transactional_id, None)
            txn.abort_pending()
            log.warning(
                "appending %s of %r to %s-%d failed: %s",
                pending.transit.state.name,
                pending.transactional_id,
                fmt.TRANSACTION_STATE_TOPIC,
                self.partition,
                error_code.name,
            )
            self._append_failed(fx, pending, code, now_ms)
            return fx
        self._log_unsure.discard(pending.transactional_id)
        transit = pending.transit
        if transit.state is S.ONGOING:
            self._standing[pending.transactional_id] = (
                frozenset(transit.partitions),
                transit.start_timestamp_ms,
            )
        else:
            self._standing.pop(pending.transactional_id, None)
        self._complete(txn, transit)
        why = pending.why
        if why is _Why.INIT:
            fx.replies.append(
                (
                    pending.token,
                    InitProducerIdResult(ErrorCode.none, txn.producer_id, txn.producer_epoch),
                )
            )
        elif why is _Why.FENCE_FOR_INIT:
            fx.replies.append(
                (pending.token, self._error_reply(pending, ErrorCode.concurrent_transactions))
            )
            self._advance(fx, txn, now_ms)
        elif why is _Why.ADD:
            self._finish_add(fx, pending, ErrorCode.none)
        elif why is _Why.END:
            if txn.is_tv2 and pending.api_version >= END_TXN_TV2_SINCE:
                producer_id, producer_epoch = txn.client_producer()
                reply = EndTxnResult(ErrorCode.none, producer_id, producer_epoch)
            else:
                reply = EndTxnResult(ErrorCode.none)
            fx.replies.append((pending.token, reply))
            self._advance(fx, txn, now_ms)
        elif why is _Why.END_IN_DOUBT:
            fenced = self._error_reply(pending, ErrorCode.producer_fenced)
            fx.replies.append((pending.token, fenced))
            self._advance(fx, txn, now_ms)
        elif why is _Why.TIMEOUT:
            self._advance(fx, txn, now_ms)
        elif why is _Why.COMPLETE:
            self._retry_at_ms.pop(pending.transactional_id, None)
        elif why is _Why.COMPLETE_AND_ADD:
            self._retry_at_ms.pop(pending.transactional_id, None)
            self._finish_add(fx, pending, ErrorCode.none)
        elif why is _Why.EXPIRE:
            del self.transactions[pending.transactional_id]
        return fx

    def _append_failed(self, fx: Effects, pending: _Pending, code: ErrorCode, now_ms: int) -> None:
        why = pending.why
        if why is _Why.ADD:
            self._finish_add(fx, pending, code)
        elif why in (_Why.INIT, _Why.FENCE_FOR_INIT, _Why.END, _Why.END_IN_DOUBT):
            fx.replies.append((pending.token, self._error_reply(pending, code)))
        elif why in (_Why.COMPLETE, _Why.COMPLETE_AND_ADD):
            # Tried again until it lands or this coordinator resigns (a lost leadership
            # resigns it; the next one writes the markers and this record itself). The add
            # that rode along gets the error, which its client retries.
            if why is _Why.COMPLETE_AND_ADD:
                self._finish_add(fx, pending, code)
            self._retry_at_ms[pending.transactional_id] = (
                now_ms + self.config.transaction_marker_retry_backoff_ms
            )
        # TIMEOUT and EXPIRE: the next scan tries again.

    def _finish_add(self, fx: Effects, pending: _Pending, code: ErrorCode) -> None:
        batch = pending.batch
        assert batch is not None and pending.api is not None
        code = for_version(code, pending.api, pending.api_version)
        batch.results[pending.batch_index] = AddPartitionsTxnResult(
            pending.transactional_id, {p: code for p in pending.partitions}
        )
        batch.remaining -= 1
        if batch.remaining == 0:
            reply: object = _offsets_reply(batch) if batch.offsets else list(batch.results)
            fx.replies.append((batch.token, reply))

    def _fail_batch(self, fx: Effects, batch: _AddBatch, code: ErrorCode) -> None:
        """Answer a batch now: transactions still waiting for their record get `code`."""
        results = list(batch.results)
        for pending in self._unanswered():
            if pending.batch is batch and pending.api is not None:
                mapped = for_version(code, pending.api, pending.api_version)
                results[pending.batch_index] = AddPartitionsTxnResult(
                    pending.transactional_id, {p: mapped for p in pending.partitions}
                )
        batch.remaining = 0
        done = [r for r in results if r is not None]
        fx.replies.append((batch.token, _offsets_reply_of(done) if batch.offsets else done))

    # ------------------------------------------------------------------ markers
    def _advance(self, fx: Effects, txn: TransactionMetadata, now_ms: int) -> None:
        """A Prepare transaction moves on: markers for the partitions still owed one, or the
        Complete record once none is."""
        txn_id = txn.transactional_id
        if txn.state not in PREPARE_STATES or txn.pending_in_progress:
            return
        if txn_id in self._markers_inflight or txn_id in self.stalled:
            return
        self._retry_at_ms.pop(txn_id, None)
        if txn.partitions:
            marker_id = self._new_id()
            self._markers[marker_id] = _MarkerSend(txn_id, txn.producer_id, txn.producer_epoch)
            self._markers_inflight.add(txn_id)
            fx.markers.append(
                WriteMarkers(
                    marker_id=marker_id,
                    transactional_id=txn_id,
                    producer_id=txn.producer_id,
                    producer_epoch=txn.producer_epoch,
                    coordinator_epoch=self.coordinator_epoch,
                    commit=txn.state is S.PREPARE_COMMIT,
                    partitions=tuple(sorted(txn.partitions)),
                )
            )
            return
        waiting = self._waiting_adds.pop(txn_id, None)
        if waiting is not None:
            req = waiting.request
            code = self._check_producer(txn_id, req.producer_id, req.producer_epoch)
            if code is ErrorCode.none:
                done, add = txn.prepare_complete_then_add(
                    frozenset(req.partitions), now_ms, req.client_transaction_version
                )
                pending = replace(waiting.pending, transit=add, why=_Why.COMPLETE_AND_ADD, via=done)
                if self._start_standing(txn, add, now_ms):
                    self._complete(txn, add)
                    self._finish_add(fx, pending, ErrorCode.none)
                    return
                self._append(fx, pending)
                return
            self._finish_add(fx, waiting.pending, code)
        self._append(fx, _Pending(txn_id, txn.prepare_complete(now_ms), _Why.COMPLETE))

    def _start_standing(self, txn: TransactionMetadata, add: TxnTransit, now_ms: int) -> bool:
        """Whether the next transaction of a producer whose last one committed in one phase
        may start with no record at all: the log's newest record for the id is still that
        transaction's Ongoing one, naming exactly the partitions the next one adds. A
        coordinator that loads it then finds an Ongoing transaction of those partitions, in
        doubt, which is what it would find after a Complete and a new Ongoing record, but
        for the start time: so only while the stored start is less than half the timeout
        old (a failover may time the transaction out that much sooner)."""
        if txn.state is not S.PREPARE_COMMIT:
            return False
        standing = self._standing.get(txn.transactional_id)
        return (
            standing is not None
            and standing[0] == add.partitions
            and now_ms - standing[1] < add.transaction_timeout_ms // 2
        )

    def on_markers_done(
        self, marker_id: int, results: Mapping[TopicPartition, ErrorCode], now_ms: int
    ) -> Effects:
        """The WriteMarkers `marker_id` finished, one error code per partition."""
        fx = Effects()
        send = self._markers.pop(marker_id, None)
        if send is None:
            return fx  # resigned since
        txn_id = send.transactional_id
        self._markers_inflight.discard(txn_id)
        txn = self.transactions.get(txn_id)
        if (
            txn is None
            or txn.state not in PREPARE_STATES
            or (txn.producer_id, txn.producer_epoch) != (send.producer_id, send.producer_epoch)
        ):
            raise AssertionError(f"markers {marker_id} done for {txn!r}, sent for {send}")
        retry = False
        for partition, code in results.items():
            if partition not in txn.partitions:
                continue
            if code is ErrorCode.none or code in MARKER_NOT_NEEDED:
                txn.remove_partition(partition)
            elif code in MARKER_STALE:
                log.warning(
                    "marker of %r on %s-%d refused (%s): a newer coordinator finishes it",
                    txn_id,
                    *partition,
                    code.name,
                )
                self.stalled.add(txn_id)
            else:
                retry = True
        if txn_id in self.stalled:
            self._answer_waiting(fx, txn_id, ErrorCode.concurrent_transactions)
            # A one-phase commit whose outcome a newer coordinator decides.
            self._answer_committing(fx, txn_id, ErrorCode.not_coordinator)
            return fx
        if retry or txn.partitions:
            # Partitions missing from the answer count as failed: retried, never assumed.
            self._retry_at_ms[txn_id] = now_ms + self.config.transaction_marker_retry_backoff_ms
            return fx
        if self._answer_committing(fx, txn_id, ErrorCode.none) and txn_id not in self._waiting_adds:
            self._retry_at_ms[txn_id] = now_ms + COMPLETE_LINGER_MS
            return fx
        self._advance(fx, txn, now_ms)
        return fx

    def _answer_committing(self, fx: Effects, txn_id: str, code: ErrorCode) -> bool:
        """Answer the EndTxn of a one-phase commit of `txn_id`, if one waits."""
        pending = self._committing.pop(txn_id, None)
        if pending is None:
            return False
        fx.replies.append((pending.token, self._error_reply(pending, code)))
        return True

    # ------------------------------------------------------------------ timers
    def next_deadline_ms(self) -> int | None:
        if self.loading or self.resigned:
            return None
        return min(
            self._next_abort_scan_ms,
            self._next_expire_scan_ms,
            *self._retry_at_ms.values(),
            *(w.since_ms + ADD_WAIT_MAX_MS for w in self._waiting_adds.values()),
        )

    def tick(self, now_ms: int) -> Effects:
        fx = Effects()
        if self.loading or self.resigned:
            return fx
        for txn_id, due_ms in list(self._retry_at_ms.items()):
            if due_ms <= now_ms:
                del self._retry_at_ms[txn_id]
                self._advance(fx, self.transactions[txn_id], now_ms)
        for txn_id, waiting in list(self._waiting_adds.items()):
            if waiting.since_ms + ADD_WAIT_MAX_MS <= now_ms:
                # Markers still failing: the client backs off and asks again.
                self._answer_waiting(fx, txn_id, ErrorCode.concurrent_transactions)
        if now_ms >= self._next_abort_scan_ms:
            self._next_abort_scan_ms = (
                now_ms + self.config.transaction_abort_timed_out_transaction_cleanup_interval_ms
            )
            self._abort_timed_out(fx, now_ms)
        if now_ms >= self._next_expire_scan_ms:
            self._next_expire_scan_ms = (
                now_ms + self.config.transaction_remove_expired_transaction_cleanup_interval_ms
            )
            self._expire_transactional_ids(fx, now_ms)
        return fx

    def _abort_timed_out(self, fx: Effects, now_ms: int) -> None:
        """Abort every Ongoing transaction older than its timeout, bumping the epoch so its
        producer (perhaps a zombie) is fenced on the coordinator and on every partition."""
        for txn in list(self.transactions.values()):
            if (
                txn.state is S.ONGOING
                and not txn.pending_in_progress
                and txn.start_timestamp_ms + txn.transaction_timeout_ms <= now_ms
            ):
                log.info(
                    "aborting %r: older than its timeout of %d ms",
                    txn.transactional_id,
                    txn.transaction_timeout_ms,
                )
                transit = txn.prepare_end(False, now_ms, fence_epoch=True)
                self._append(fx, _Pending(txn.transactional_id, transit, _Why.TIMEOUT))

    def _expire_transactional_ids(self, fx: Effects, now_ms: int) -> None:
        expiration_ms = self.config.transactional_id_expiration_ms
        for txn in list(self.transactions.values()):
            if (
                txn.state in IDLE_STATES
                and not txn.pending_in_progress
                and txn.last_update_timestamp_ms + expiration_ms <= now_ms
            ):
                self._append(fx, _Pending(txn.transactional_id, txn.prepare_dead(), _Why.EXPIRE))

    # ------------------------------------------------------------------ admin
    def describe_transactions(self, transactional_ids: Iterable[str]) -> list[DescribedTransaction]:
        described = []
        for txn_id in transactional_ids:
            code = (
                self._route(txn_id)
                if _valid_transactional_id(txn_id)
                else ErrorCode.invalid_request
            )
            txn = self.transactions.get(txn_id)
            if code is ErrorCode.none and txn is None:
                code = ErrorCode.transactional_id_not_found
            if code is not ErrorCode.none or txn is None:
                described.append(DescribedTransaction(txn_id, code))
            else:
                described.append(describe.describe(txn))
        return described

    def list_transactions(
        self,
        *,
        state_filters: Iterable[str] = (),
        producer_id_filters: Iterable[int] = (),
        duration_filter_ms: int = -1,
        now_ms: int = 0,
    ) -> ListTransactionsResult:
        """This partition's part of ListTransactions (a broker merges its partitions')."""
        return describe.list_transactions(
            self.transactions.values(),
            state_filters=state_filters,
            producer_id_filters=producer_id_filters,
            duration_filter_ms=duration_filter_ms,
            now_ms=now_ms,
            loading=self.loading,
        )


def _valid_transactional_id(transactional_id: str) -> bool:
    return 0 < len(transactional_id.encode()) <= MAX_TRANSACTIONAL_ID_BYTES


def _valid_partitions(partitions: Sequence[TopicPartition], limit: int) -> bool:
    """In range, and none of a topic that never holds a marker (AddPartitionsToTxn v4
    reaches the coordinator without the client handler's topic checks)."""
    if len(partitions) > limit:
        return False
    return all(
        topic and topic not in NO_MARKER_TOPICS and 0 <= partition <= I32_MAX
        for topic, partition in partitions
    )


def _offsets_reply(batch: _AddBatch) -> ErrorCode:
    return _offsets_reply_of([r for r in batch.results if r is not None])


def _offsets_reply_of(results: Sequence[AddPartitionsTxnResult]) -> ErrorCode:
    for result in results:
        for code in result.errors.values():
            return code
    return ErrorCode.none
