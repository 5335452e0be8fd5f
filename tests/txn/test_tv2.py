"""KIP-890 part 2 (transaction version 2) in the sans-IO coordinator and on a partition's
producer table: an epoch bump at every end, retried EndTxn, the overflow to a next producer
id, replay of old and new records, and the late write the bump fences."""

from __future__ import annotations

import pytest

from raftlog.errors import ErrorCode
from raftlog.records import BatchHeader, ControlType, TxnMarker, make_attributes
from raftlog.replication.core.producer_table import ProducerStateTable, Verdict
from raftlog.replication.idempotence import VerificationGuards
from raftlog.txn import log_format as fmt
from raftlog.txn.log_format import (
    MAX_PRODUCER_EPOCH,
    TV_2,
    TransactionLogValue,
    TransactionState,
)
from raftlog.txn.messages import AddPartitionsTxn, EndTxnRequest, EndTxnResult
from tests.txn.harness import TIMEOUT_MS, Harness

S = TransactionState
E = ErrorCode
T0, T1 = ("t", 0), ("t", 1)
V5 = 5  # EndTxn v5: TV2


def produce_add(h: Harness, pid: int, epoch: int, *partitions: fmt.TopicPartition) -> ErrorCode:
    """What a partition leader asks for a Produce v12 batch (node_service, mode ADD)."""
    req = AddPartitionsTxn("tx", pid, epoch, partitions, client_transaction_version=TV_2)
    results = h.reply(h.call("add_partitions_to_txn", [req]))
    assert results is not None
    (code,) = set(results[0].errors.values())
    return code


def end_v5(h: Harness, pid: int, epoch: int, commit: bool = True) -> EndTxnResult | None:
    result: EndTxnResult | None = h.reply(
        h.call("end_txn", EndTxnRequest("tx", pid, epoch, commit, V5))
    )
    return result


def values_of(h: Harness) -> list[TransactionLogValue]:
    return [v for k, v in fmt.decode_records(h.log) if k == "tx" and v is not None]


def start(h: Harness) -> tuple[int, int]:
    init = h.init("tx")
    assert init is not None and init.error_code is E.none
    return init.producer_id, init.producer_epoch


# ------------------------------------------------------------------ the epoch bump
@pytest.mark.parametrize("commit", [True, False])
def test_every_end_bumps_the_epoch_and_markers_carry_it(commit):
    h = Harness()
    pid, epoch = start(h)
    assert produce_add(h, pid, epoch, T0, T1) is E.none
    assert values_of(h)[-1].client_transaction_version == TV_2
    result = end_v5(h, pid, epoch, commit)
    assert result == EndTxnResult(E.none, pid, epoch + 1)
    assert sorted(h.written) == [(p, pid, epoch + 1, commit) for p in (T0, T1)]
    prepare, complete = values_of(h)[-2:]
    assert (prepare.producer_epoch, prepare.client_transaction_version) == (epoch + 1, TV_2)
    assert complete.state is (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT)
    # The next transaction runs at the new epoch; the old one is fenced.
    assert produce_add(h, pid, epoch, T0) is E.producer_fenced
    assert produce_add(h, pid, epoch + 1, T0) is E.none
    assert end_v5(h, pid, epoch + 1) == EndTxnResult(E.none, pid, epoch + 2)


def test_a_retried_end_txn_gets_its_outcome_and_the_current_epoch():
    h = Harness()
    pid, epoch = start(h)
    assert produce_add(h, pid, epoch, T0) is E.none
    h.auto = False
    end = h.call("end_txn", EndTxnRequest("tx", pid, epoch, True, V5))
    h.flush_appends()  # PrepareCommit stored, markers not written yet
    assert h.reply(end) == EndTxnResult(E.none, pid, epoch + 1)
    # A retry while the markers are written: CONCURRENT_TRANSACTIONS, not PRODUCER_FENCED.
    assert end_v5(h, pid, epoch).error_code is E.concurrent_transactions
    assert end_v5(h, pid, epoch, commit=False).error_code is E.invalid_txn_state
    h.settle()
    assert end_v5(h, pid, epoch) == EndTxnResult(E.none, pid, epoch + 1)
    assert end_v5(h, pid, epoch, commit=False).error_code is E.invalid_txn_state
    # An older epoch still is fenced, and an error names no epoch.
    assert end_v5(h, pid, epoch + 5) == EndTxnResult(E.producer_fenced)
    # The retry survives a coordinator failover: the record says which epoch ended it.
    h.auto = True
    h.failover()
    assert end_v5(h, pid, epoch) == EndTxnResult(E.none, pid, epoch + 1)


def test_an_end_txn_below_v5_keeps_the_epoch_and_writes_version_0_records():
    h = Harness()
    pid, epoch = start(h)
    assert h.add("tx", pid, epoch, T0) is E.none
    assert h.end("tx", pid, epoch, True, api_version=4) is E.none
    assert {w[2] for w in h.written} == {epoch}
    assert all(v.client_transaction_version == 0 for v in values_of(h))
    assert all(value[:2] == b"\x00\x00" for _, value in h.log if value is not None)


def test_abort_with_nothing_added_bumps_the_epoch_and_commit_is_invalid():
    h = Harness()
    pid, epoch = start(h)
    assert end_v5(h, pid, epoch) == EndTxnResult(E.invalid_txn_state)
    assert end_v5(h, pid, epoch, commit=False) == EndTxnResult(E.none, pid, epoch + 1)
    assert h.state_of("tx") is S.COMPLETE_ABORT and not h.written
    assert end_v5(h, pid, epoch, commit=False) == EndTxnResult(E.none, pid, epoch + 1)


def test_the_epoch_overflows_to_the_next_producer_id():
    h = Harness()
    top = MAX_PRODUCER_EPOCH - 1
    value = TransactionLogValue(500, top, TIMEOUT_MS, S.ONGOING, (T0,), h.now_ms, h.now_ms)
    h.log.append(fmt.record("tx", value))
    h.auto = False
    h.failover()
    end = h.call("end_txn", EndTxnRequest("tx", 500, top, True, V5))
    h.flush_appends()
    assert h.reply(end) == EndTxnResult(E.none, 1001, 0)
    prepare = values_of(h)[-1]
    assert (prepare.producer_id, prepare.producer_epoch) == (500, MAX_PRODUCER_EPOCH)
    assert prepare.next_producer_id == 1001
    # The new id cannot begin while the markers of the old one are written.
    assert produce_add(h, 1001, 0, T1) is E.concurrent_transactions
    # A failover mid-commit finishes it with the bumped epoch, under the old id.
    h.auto = True
    h.failover()
    assert set(h.written) == {(T0, 500, MAX_PRODUCER_EPOCH, True)}
    complete = values_of(h)[-1]
    assert (complete.state, complete.producer_id, complete.producer_epoch) == (
        S.COMPLETE_COMMIT,
        1001,
        0,
    )
    assert (complete.previous_producer_id, complete.next_producer_id) == (500, -1)
    # The retry with the old id and epoch is answered with the new ones, before and after
    # another failover.
    assert end_v5(h, 500, top) == EndTxnResult(E.none, 1001, 0)
    h.failover()
    assert end_v5(h, 500, top) == EndTxnResult(E.none, 1001, 0)
    assert produce_add(h, 1001, 0, T1) is E.none
    assert produce_add(h, 500, top, T1) is E.invalid_producer_id_mapping


def test_a_timeout_abort_of_a_tv2_transaction_bumps_once():
    h = Harness()
    pid, epoch = start(h)
    assert produce_add(h, pid, epoch, T0) is E.none
    h.tick(TIMEOUT_MS + 1)
    h.tick(h.config.transaction_abort_timed_out_transaction_cleanup_interval_ms)
    assert h.state_of("tx") is S.COMPLETE_ABORT
    assert h.written == [(T0, pid, epoch + 1, False)]
    # The client's abort of it is a retry; its commit is not.
    assert end_v5(h, pid, epoch, commit=False) == EndTxnResult(E.none, pid, epoch + 1)
    assert end_v5(h, pid, epoch).error_code is E.invalid_txn_state


# ------------------------------------------------------------------ records
def test_replay_of_old_and_new_records():
    old = TransactionLogValue(7, 3, TIMEOUT_MS, S.COMPLETE_COMMIT, (), 1, 1)
    assert fmt.encode_value(old)[:2] == b"\x00\x00"  # version 0, as before part 2
    new = TransactionLogValue(
        7, 4, TIMEOUT_MS, S.PREPARE_COMMIT, (T0,), 1, 1, client_transaction_version=TV_2
    )
    assert fmt.encode_value(new)[:2] == b"\x00\x01"
    h = Harness()
    h.log.extend([fmt.record("a", old), fmt.record("b", new)])
    h.failover()
    a, b = h.coord.transactions["a"], h.coord.transactions["b"]
    assert (a.client_transaction_version, a.last_producer_epoch) == (0, -1)
    assert (b.client_transaction_version, b.last_producer_epoch) == (TV_2, 3)
    assert (T0, 7, 4, True) in h.written  # b completed with its bumped epoch


# ------------------------------------------------------------------ the flaw it fixes
def _batch(offset: int, pid: int, epoch: int, seq: int, control: bool = False) -> BatchHeader:
    return BatchHeader(
        base_offset=offset,
        batch_length=49,
        partition_leader_epoch=0,
        magic=2,
        crc=0,
        attributes=make_attributes(is_transactional=True, is_control=control),
        last_offset_delta=0,
        base_timestamp_ms=0,
        max_timestamp_ms=0,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=-1 if control else seq,
        record_count=1,
    )


def test_a_late_write_of_the_ended_epoch_cannot_join_the_next_transaction():
    """The hanging / misattributed write KIP-890 part 2 closes: a batch of transaction 1,
    delayed past its commit marker, reaches the partition after transaction 2 (same
    producer) has added it. With part 1 alone (same epoch) it would join transaction 2 and
    commit or abort with it; with TV2 the marker's bumped epoch fences it on the partition,
    and the coordinator refuses to add the partition for it."""
    h = Harness()
    pid, epoch = start(h)
    table = ProducerStateTable()
    assert produce_add(h, pid, epoch, T0) is E.none
    table.update([_batch(0, pid, epoch, 0)])
    assert end_v5(h, pid, epoch).producer_epoch == epoch + 1
    ((_, marker_pid, marker_epoch, commit),) = h.written
    control = ControlType.COMMIT if commit else ControlType.ABORT
    marker = TxnMarker(marker_pid, marker_epoch, control, 0)
    assert table.check_marker(marker).verdict is Verdict.OK
    table.update([_batch(1, pid, marker_epoch, 0, control=True)], {1: marker})
    # Transaction 2 adds the partition; then the late batch of transaction 1 arrives.
    assert produce_add(h, pid, epoch + 1, T0) is E.none
    late = _batch(2, pid, epoch, 1)
    check = table.check_headers([late])
    assert (check.verdict, check.error) == (Verdict.ERROR, E.invalid_producer_epoch)
    assert produce_add(h, pid, epoch, T0) is E.producer_fenced
    # Transaction 2's own batch, sequences restarted at the new epoch, is accepted.
    assert table.check_headers([_batch(2, pid, epoch + 1, 0)]).verdict is Verdict.OK


def test_an_add_survives_the_previous_transactions_marker_but_not_its_own():
    guards = VerificationGuards()
    first = guards.start(7)
    guards.end_transaction(7, 4)  # the previous transaction's marker, at the batch's epoch
    assert not guards.holds(7, first)  # part 1's verification is void...
    assert guards.stands_after_add(7, first, 4)  # ...an add at epoch 4 is not
    guards.end_transaction(7, 5)  # its own transaction ended (a timeout abort)
    assert not guards.stands_after_add(7, first, 4)
    top = guards.start(8)
    guards.end_transaction(8, MAX_PRODUCER_EPOCH)
    assert not guards.stands_after_add(8, top, MAX_PRODUCER_EPOCH)
    guards.finish(7, first)
    guards.finish(8, top)
    assert len(guards) == 0
