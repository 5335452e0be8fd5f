"""TransactionMetadata: Kafka's transition table, the two-step transit, epoch rules."""

from __future__ import annotations

from dataclasses import replace

import pytest

from raftlog.errors import ErrorCode
from raftlog.txn.log_format import MAX_PRODUCER_EPOCH, TransactionState
from raftlog.txn.state import (
    VALID_PREVIOUS_STATES,
    IllegalTransitionError,
    TransactionMetadata,
    is_epoch_exhausted,
)

S = TransactionState

# Kafka's TransactionState.validPreviousStates, written out independently of state.py.
# Kafka 4.0's, with KIP-890 part 2's abort of a TV2 transaction that added nothing.
KAFKA_TABLE = {
    S.EMPTY: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
    S.ONGOING: {S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
    S.PREPARE_COMMIT: {S.ONGOING},
    S.PREPARE_ABORT: {
        S.ONGOING,
        S.PREPARE_EPOCH_FENCE,
        S.EMPTY,
        S.COMPLETE_COMMIT,
        S.COMPLETE_ABORT,
    },
    S.COMPLETE_COMMIT: {S.PREPARE_COMMIT},
    S.COMPLETE_ABORT: {S.PREPARE_ABORT},
    S.DEAD: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
    S.PREPARE_EPOCH_FENCE: {S.ONGOING},
}


def meta(state: TransactionState, *, epoch: int = 3, partitions=frozenset()) -> TransactionMetadata:
    return TransactionMetadata(
        "tx",
        producer_id=7,
        producer_epoch=epoch,
        transaction_timeout_ms=1_000,
        state=state,
        partitions=frozenset(partitions),
        start_timestamp_ms=5,
        last_update_timestamp_ms=5,
    )


def test_the_table_is_kafkas():
    assert {k: set(v) for k, v in VALID_PREVIOUS_STATES.items()} == KAFKA_TABLE


@pytest.mark.parametrize("source", list(S))
@pytest.mark.parametrize("target", list(S))
def test_every_transition(source, target):
    txn = meta(source)
    transit = replace(txn.snapshot(), state=target, last_update_timestamp_ms=9)
    if source in KAFKA_TABLE[target]:
        assert txn._prepare(transit) is transit
        assert txn.state is source  # nothing changes before the record is written
        txn.complete(transit)
        assert txn.state is target and txn.pending is None
        assert txn.last_update_timestamp_ms == 9
    else:
        with pytest.raises(IllegalTransitionError) as raised:
            txn._prepare(transit)
        message = str(raised.value)
        assert f"{source.name} -> {target.name}" in message
        assert "'tx'" in message and "producer_id=7" in message  # the full state
        assert txn.pending is None


def test_one_transit_at_a_time():
    txn = meta(S.EMPTY)
    first = txn.prepare_add_partitions(frozenset({("t", 0)}), 10)
    with pytest.raises(IllegalTransitionError, match="pending"):
        txn.prepare_add_partitions(frozenset({("t", 1)}), 11)
    with pytest.raises(IllegalTransitionError, match="not the pending one"):
        txn.complete(replace(first, start_timestamp_ms=0))
    txn.abort_pending()
    assert txn.state is S.EMPTY and txn.partitions == set()
    again = txn.prepare_add_partitions(frozenset({("t", 1)}), 12)
    txn.complete(again)
    assert txn.state is S.ONGOING and txn.partitions == {("t", 1)}
    assert txn.start_timestamp_ms == 12


def test_adding_to_an_ongoing_transaction_keeps_its_start():
    txn = meta(S.ONGOING, partitions={("t", 0)})
    txn.complete(txn.prepare_add_partitions(frozenset({("u", 1)}), 99))
    assert txn.partitions == {("t", 0), ("u", 1)} and txn.start_timestamp_ms == 5


def test_increment_epoch_rules():
    txn = meta(S.COMPLETE_COMMIT, epoch=3)
    plain = txn.prepare_increment_epoch(2_000, None, 10)
    assert not isinstance(plain, ErrorCode)
    assert (plain.producer_epoch, plain.state, plain.transaction_timeout_ms) == (4, S.EMPTY, 2_000)
    txn.complete(plain)
    # KIP-360: the producer holding epoch 4 recovers to 5 and 4 is remembered...
    recovery = txn.prepare_increment_epoch(2_000, 4, 11)
    assert not isinstance(recovery, ErrorCode)
    txn.complete(recovery)
    assert (txn.producer_epoch, txn.last_producer_epoch) == (5, 4)
    # ...so a retry of that recovery gets epoch 5 again, and an older epoch is fenced.
    retry = txn.prepare_increment_epoch(2_000, 4, 12)
    assert not isinstance(retry, ErrorCode) and retry.producer_epoch == 5
    txn.abort_pending()
    assert txn.prepare_increment_epoch(2_000, 2, 13) is ErrorCode.producer_fenced
    assert txn.pending is None


def test_exhausted_epoch_rotates_the_producer_id():
    txn = meta(S.COMPLETE_ABORT, epoch=MAX_PRODUCER_EPOCH - 1)
    assert is_epoch_exhausted(txn.producer_epoch)
    with pytest.raises(IllegalTransitionError, match="exhausted"):
        txn.prepare_increment_epoch(1_000, None, 10)
    transit = txn.prepare_producer_id_rotation(8, 1_000, 10, record_last_epoch=True)
    txn.complete(transit)
    assert (txn.producer_id, txn.producer_epoch, txn.previous_producer_id) == (8, 0, 7)
    assert txn.last_producer_epoch == MAX_PRODUCER_EPOCH - 1
    assert transit.to_value().previous_producer_id == 7


def test_fencing_abort_bumps_the_epoch_but_never_past_the_last():
    txn = meta(S.ONGOING, epoch=4, partitions={("t", 0)})
    transit = txn.prepare_end(False, 10, fence_epoch=True)
    assert (transit.state, transit.producer_epoch) == (S.PREPARE_ABORT, 5)
    txn.abort_pending()
    last = meta(S.ONGOING, epoch=MAX_PRODUCER_EPOCH, partitions={("t", 0)})
    assert last.prepare_end(False, 10, fence_epoch=True).producer_epoch == MAX_PRODUCER_EPOCH
    with pytest.raises(IllegalTransitionError):
        meta(S.ONGOING).prepare_end(True, 10, fence_epoch=True)


def test_complete_only_when_every_marker_is_written():
    txn = meta(S.ONGOING, partitions={("t", 0), ("t", 1)})
    txn.complete(txn.prepare_end(True, 10))
    assert txn.state is S.PREPARE_COMMIT
    txn.remove_partition(("t", 0))
    with pytest.raises(IllegalTransitionError, match="markers still owed"):
        txn.prepare_complete(11)
    txn.remove_partition(("t", 1))
    done = txn.prepare_complete(12)
    assert done.state is S.COMPLETE_COMMIT and done.partitions == frozenset()
    with pytest.raises(IllegalTransitionError, match="outside a Prepare"):
        meta(S.ONGOING).remove_partition(("t", 0))


def test_loading_refuses_states_never_stored():
    from raftlog.txn.log_format import TransactionLogValue

    value = TransactionLogValue(1, 0, 1_000, S.EMPTY, (), 0, -1)
    assert TransactionMetadata.from_value("x", value).state is S.EMPTY
    with pytest.raises(IllegalTransitionError):
        TransactionMetadata.from_value("x", replace(value, state=S.DEAD))
