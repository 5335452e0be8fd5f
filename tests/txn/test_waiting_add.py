"""An add that arrives while its producer's last transaction writes its markers waits for
them, then rides in one append with the Complete record (TV1 producers begin their next
transaction at once: librdkafka, kafka-python, aiokafka)."""

from __future__ import annotations

from raftlog.errors import ErrorCode
from raftlog.txn import log_format as fmt
from raftlog.txn.coordinator import ADD_WAIT_MAX_MS
from raftlog.txn.log_format import TransactionState
from raftlog.txn.messages import AddOffsetsToTxnRequest, AddPartitionsTxn, EndTxnRequest
from tests.txn.harness import Harness

S = TransactionState
E = ErrorCode
T0, T1, U0 = ("t", 0), ("t", 1), ("u", 0)


def committing(h: Harness, txn_id: str = "tx") -> tuple[int, int]:
    """`txn_id` in PrepareCommit over T0 and T1, its markers sent but not answered."""
    h.auto = True
    result = h.init(txn_id)
    assert result is not None and result.error_code is E.none
    pid, epoch = result.producer_id, result.producer_epoch
    assert h.add(txn_id, pid, epoch, T0, T1) is E.none
    h.auto = False
    end = h.call("end_txn", EndTxnRequest(txn_id, pid, epoch, True))
    h.flush_appends()
    assert h.reply(end).error_code is E.none
    assert h.state_of(txn_id) is S.PREPARE_COMMIT and len(h.markers) == 1
    return pid, epoch


def add_call(h: Harness, pid: int, epoch: int, *partitions: fmt.TopicPartition) -> int:
    return h.call("add_partitions_to_txn", [AddPartitionsTxn("tx", pid, epoch, partitions)])


def code_of(h: Harness, token: int) -> ErrorCode | None:
    results = h.reply(token)
    if results is None:
        return None
    [result] = results
    [code] = set(result.errors.values())
    return code


def states_in_log(h: Harness) -> list[S]:
    return [fmt.decode_value(v).state for _, v in h.log if v is not None]  # type: ignore[union-attr]


def test_add_waits_for_the_markers_and_shares_the_complete_records_append() -> None:
    h = Harness(auto=False)
    pid, epoch = committing(h)
    token = add_call(h, pid, epoch, U0)
    assert code_of(h, token) is None and h.appends == []  # nothing written for it yet
    # One waits per id; anything else of the id is CONCURRENT_TRANSACTIONS as before.
    assert h.add("tx", pid, epoch, T1) is E.concurrent_transactions
    assert h.init("tx").error_code is E.concurrent_transactions
    h.write_markers()
    [append] = h.appends
    assert len(append.records) == 2  # Complete, then the next transaction's Ongoing
    assert h.state_of("tx") is S.PREPARE_COMMIT and code_of(h, token) is None
    assert h.end("tx", pid, epoch, True) is E.concurrent_transactions  # still a retry
    h.flush_appends()
    assert code_of(h, token) is E.none
    assert h.state_of("tx") is S.ONGOING
    assert states_in_log(h)[-2:] == [S.COMPLETE_COMMIT, S.ONGOING]
    assert h.stored()["tx"].partitions == (U0,)
    assert h.written == [(T0, pid, epoch, True), (T1, pid, epoch, True)]
    # A new coordinator reads the same: the next transaction Ongoing over U0.
    h.failover()
    assert h.state_of("tx") is S.ONGOING
    assert h.coord.transactions["tx"].partitions == {U0}


def test_a_failed_shared_append_answers_the_add_and_the_complete_record_is_retried() -> None:
    h = Harness(auto=False)
    pid, epoch = committing(h)
    token = add_call(h, pid, epoch, U0)
    h.write_markers()
    h.flush_appends(E.not_enough_replicas)
    assert code_of(h, token) not in (None, E.none)
    assert h.state_of("tx") is S.PREPARE_COMMIT and h.appends == []
    h.tick(h.config.transaction_marker_retry_backoff_ms)
    h.flush_appends()
    assert h.state_of("tx") is S.COMPLETE_COMMIT
    assert h.add("tx", pid, epoch, U0) is None  # the client's retry: a fresh add
    h.flush_appends()
    assert h.state_of("tx") is S.ONGOING


def test_markers_that_keep_failing_answer_the_waiting_add_after_its_bound() -> None:
    h = Harness(auto=False)
    pid, epoch = committing(h)
    token = add_call(h, pid, epoch, U0)
    h.write_markers(E.not_enough_replicas)
    assert code_of(h, token) is None  # waits through a marker retry
    assert h.coord.next_deadline_ms() is not None
    h.tick(ADD_WAIT_MAX_MS)
    assert code_of(h, token) is E.concurrent_transactions
    h.write_markers()  # whatever the retry sent
    h.settle()
    assert h.state_of("tx") is S.COMPLETE_COMMIT


def test_a_waiting_add_gets_not_coordinator_when_leadership_moves() -> None:
    h = Harness(auto=False)
    pid, epoch = committing(h)
    token = add_call(h, pid, epoch, U0)
    h.failover()
    assert code_of(h, token) is E.not_coordinator


def test_a_stale_coordinators_waiting_add_is_answered() -> None:
    h = Harness(auto=False)
    pid, epoch = committing(h)
    token = add_call(h, pid, epoch, U0)
    h.write_markers(E.transaction_coordinator_fenced)
    assert "tx" in h.coord.stalled
    assert code_of(h, token) is E.concurrent_transactions


def test_a_fenced_or_foreign_producer_never_waits() -> None:
    h = Harness(auto=False)
    pid, epoch = committing(h)
    assert h.add("tx", pid, epoch + 1, U0) is E.producer_fenced
    assert h.add("tx", pid + 7, epoch, U0) is E.invalid_producer_id_mapping
    assert h.coord.next_deadline_ms() is not None
    h.write_markers()
    [append] = h.appends
    assert len(append.records) == 1  # the Complete record alone


def test_add_offsets_waits_too_and_answers_one_code() -> None:
    h = Harness(auto=False)
    pid, epoch = committing(h)
    token = h.call("add_offsets_to_txn", AddOffsetsToTxnRequest("tx", pid, epoch, "group"))
    assert h.reply(token) is None
    h.write_markers()
    h.flush_appends()
    assert h.reply(token) is E.none
    assert h.state_of("tx") is S.ONGOING


def test_a_batch_answers_once_its_waiting_transaction_is_added() -> None:
    h = Harness(auto=True)
    other = h.init("ty")
    assert other is not None
    pid, epoch = committing(h)
    token = h.call(
        "add_partitions_to_txn",
        [
            AddPartitionsTxn("tx", pid, epoch, (U0,), api_version=4),
            AddPartitionsTxn("ty", other.producer_id, other.producer_epoch, (T0,), api_version=4),
        ],
    )
    h.flush_appends()  # ty's record
    assert h.reply(token) is None  # tx still waits for its markers
    h.write_markers()
    h.flush_appends()
    results = h.reply(token)
    assert [set(r.errors.values()) for r in results] == [{E.none}, {E.none}]
