"""TxnCoordinator: Kafka's transaction protocol on one `__transaction_state` partition."""

from __future__ import annotations

import pytest

from raftlog.errors import ErrorCode
from raftlog.groups.hashing import partition_for_group
from raftlog.txn import log_format as fmt
from raftlog.txn.coordinator import COMPLETE_LINGER_MS, TxnCoordinator
from raftlog.txn.log_format import MAX_PRODUCER_EPOCH, TransactionLogValue, TransactionState
from raftlog.txn.messages import (
    AddOffsetsToTxnRequest,
    AddPartitionsTxn,
    EndTxnRequest,
    InitProducerIdRequest,
)
from raftlog.txn.settings import TxnConfig
from tests.txn.harness import TIMEOUT_MS, Harness, txn_id_on

S = TransactionState
E = ErrorCode
T0, T1, U0 = ("t", 0), ("t", 1), ("u", 0)


def begin(h: Harness, txn_id: str = "tx", *partitions: fmt.TopicPartition) -> tuple[int, int]:
    result = h.init(txn_id)
    assert result is not None and result.error_code is E.none
    assert (
        h.add(txn_id, result.producer_id, result.producer_epoch, *(partitions or (T0, T1)))
        is E.none
    )
    return result.producer_id, result.producer_epoch


def stored_states(h: Harness, txn_id: str) -> list[S]:
    return [
        fmt.decode_value(v).state  # type: ignore[union-attr]
        for k, v in h.log
        if fmt.decode_key(k) == txn_id and v is not None
    ]


# ------------------------------------------------------------------ InitProducerId
def test_first_init_gives_a_new_producer_id_at_epoch_0_once_stored():
    h = Harness(auto=False)
    token = h.call("init_producer_id", InitProducerIdRequest("tx", TIMEOUT_MS))
    assert h.reply(token) is None  # persist before you promise
    h.flush_appends()
    result = h.reply(token)
    assert (result.error_code, result.producer_id, result.producer_epoch) == (E.none, 1001, 0)
    assert h.stored()["tx"] == TransactionLogValue(1001, 0, TIMEOUT_MS, S.EMPTY, (), h.now_ms, -1)


def test_init_again_bumps_the_epoch_and_keeps_the_producer_id():
    h = Harness()
    first = h.init("tx")
    second = h.init("tx", timeout_ms=5_000)
    assert (second.producer_id, second.producer_epoch) == (first.producer_id, 1)
    assert h.coord.transactions["tx"].transaction_timeout_ms == 5_000


@pytest.mark.parametrize("timeout_ms", [0, -1, 900_001])
def test_transaction_timeout_is_bounded(timeout_ms):
    h = Harness()
    assert h.init("tx", timeout_ms=timeout_ms).error_code is E.invalid_transaction_timeout
    assert "tx" not in h.coord.transactions


def test_bad_requests():
    h = Harness()
    assert h.init("").error_code is E.invalid_request
    assert h.init("tx", producer_id=5).error_code is E.invalid_request  # epoch missing
    assert h.init("tx", producer_id=5, producer_epoch=2**15).error_code is E.invalid_request
    assert h.add("", 1, 0, T0) is E.invalid_request
    assert h.add("tx", 1, 0, ("t", -1)) is E.invalid_request
    assert h.end("", 1, 0, True) is E.invalid_request


def test_no_producer_id_at_hand_is_retriable():
    h = Harness()
    h.allocator_dry = True
    assert h.init("tx").error_code is E.coordinator_load_in_progress
    assert "tx" not in h.coord.transactions


def test_max_transactional_ids():
    h = Harness(config=TxnConfig(transaction_state_log_num_partitions=1, max_transactional_ids=1))
    assert h.init("a").error_code is E.none
    assert h.init("b").error_code is E.coordinator_not_available
    assert h.init("a").error_code is E.none


def test_kip_360_recovery_with_the_current_producer_id_and_epoch():
    h = Harness()
    first = h.init("tx")
    recovered = h.init("tx", producer_id=first.producer_id, producer_epoch=0)
    assert (recovered.producer_id, recovered.producer_epoch) == (first.producer_id, 1)
    # The producer did not get the answer and retries with the epoch it held: same answer.
    retried = h.init("tx", producer_id=first.producer_id, producer_epoch=0)
    assert (retried.error_code, retried.producer_epoch) == (E.none, 1)
    # Another producer id, or an epoch older than both, is fenced.
    assert h.init("tx", producer_id=999, producer_epoch=0).error_code is E.producer_fenced
    h.init("tx")  # epoch 2: 0 is now neither the current nor the last epoch
    fenced = h.init("tx", producer_id=first.producer_id, producer_epoch=0)
    assert fenced.error_code is E.producer_fenced
    old_client = h.init("tx", producer_id=first.producer_id, producer_epoch=0, api_version=3)
    assert old_client.error_code is E.invalid_producer_epoch


def loaded(state: S, epoch: int, **fields: object) -> Harness:
    """A coordinator that loaded one transactional id "tx" in `state` at `epoch`."""
    h = Harness()
    value = TransactionLogValue(500, epoch, TIMEOUT_MS, state, (), h.now_ms, h.now_ms, **fields)  # type: ignore[arg-type]
    h.log.append(fmt.record("tx", value))
    h.failover()
    return h


def test_epoch_exhaustion_rotates_to_a_new_producer_id():
    h = loaded(S.COMPLETE_COMMIT, MAX_PRODUCER_EPOCH - 1)
    result = h.init("tx")
    assert (result.producer_id, result.producer_epoch) == (1001, 0)
    stored = h.stored()["tx"]
    assert (stored.producer_id, stored.previous_producer_id) == (1001, 500)
    # The rotation was a new producer instance's: the one that held the old id is fenced.
    again = h.init("tx", producer_id=500, producer_epoch=MAX_PRODUCER_EPOCH - 1)
    assert again.error_code is E.producer_fenced


def test_kip_360_recovery_at_an_exhausted_epoch_rotates_and_remembers_it():
    h = loaded(S.EMPTY, MAX_PRODUCER_EPOCH - 1)
    result = h.init("tx", producer_id=500, producer_epoch=MAX_PRODUCER_EPOCH - 1)
    assert (result.producer_id, result.producer_epoch) == (1001, 0)
    retry = h.init("tx", producer_id=500, producer_epoch=MAX_PRODUCER_EPOCH - 1)
    assert (retry.error_code, retry.producer_id, retry.producer_epoch) == (E.none, 1001, 0)
    wrong = loaded(S.EMPTY, MAX_PRODUCER_EPOCH - 1).init("tx", producer_id=500, producer_epoch=3)
    assert wrong.error_code is E.producer_fenced


# ------------------------------------------------------------------ commit and abort
@pytest.mark.parametrize("commit", [True, False])
def test_full_flow_with_markers(commit):
    h = Harness()
    pid, epoch = begin(h, "tx", T0, T1)
    assert h.add("tx", pid, epoch, U0) is E.none
    assert h.add("tx", pid, epoch, T0) is E.none  # already in: nothing written
    assert h.end("tx", pid, epoch, commit) is E.none
    assert sorted(h.written) == [(p, pid, epoch, commit) for p in (T0, T1, U0)]
    done = S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT
    prepare = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
    assert stored_states(h, "tx") == [S.EMPTY, S.ONGOING, S.ONGOING, prepare, done]
    assert h.state_of("tx") is done
    assert h.stored()["tx"].partitions == ()
    # The next transaction of the same producer.
    assert h.add("tx", pid, epoch, U0) is E.none
    assert h.coord.transactions["tx"].partitions == {U0}


def test_markers_only_after_the_prepare_record_and_complete_only_after_markers():
    h = Harness(auto=False)
    token = h.call("init_producer_id", InitProducerIdRequest("tx", TIMEOUT_MS))
    h.flush_appends()
    pid = h.reply(token).producer_id
    h.call("add_partitions_to_txn", [AddPartitionsTxn("tx", pid, 0, (T0, T1))])
    h.flush_appends()
    end = h.call("end_txn", EndTxnRequest("tx", pid, 0, True))
    assert h.markers == [] and h.reply(end) is None
    h.flush_appends()
    assert h.reply(end).error_code is E.none  # answered when the decision is durable
    assert len(h.markers) == 1 and h.markers[0].commit and h.markers[0].coordinator_epoch == 0
    assert h.state_of("tx") is S.PREPARE_COMMIT
    # In PrepareCommit: the producer's next steps wait (an add waits for the markers:
    # test_waiting_add.py), a retry of EndTxn knows its outcome.
    assert h.end("tx", pid, 0, True) is E.concurrent_transactions
    assert h.end("tx", pid, 0, False) is E.invalid_txn_state
    assert h.init("tx").error_code is E.concurrent_transactions
    h.write_markers()
    assert h.state_of("tx") is S.PREPARE_COMMIT and len(h.appends) == 1  # Complete pending
    assert h.end("tx", pid, 0, True) is E.concurrent_transactions
    h.flush_appends()
    assert h.state_of("tx") is S.COMPLETE_COMMIT
    assert h.end("tx", pid, 0, True) is E.none  # a late retry
    assert h.end("tx", pid, 0, False) is E.invalid_txn_state


def test_end_without_a_transaction_is_invalid():
    h = Harness()
    result = h.init("tx")
    assert h.end("tx", result.producer_id, 0, True) is E.invalid_txn_state
    assert h.end("tx", result.producer_id, 0, False) is E.invalid_txn_state


def test_abort_after_abort_is_a_retry_and_commit_after_abort_is_invalid():
    h = Harness()
    pid, epoch = begin(h)
    assert h.end("tx", pid, epoch, False) is E.none
    assert h.end("tx", pid, epoch, False) is E.none
    assert h.end("tx", pid, epoch, True) is E.invalid_txn_state


def test_unknown_producer_id_mapping():
    h = Harness()
    pid, epoch = begin(h)
    assert h.add("other", pid, epoch, T0) is E.invalid_producer_id_mapping
    assert h.add("tx", pid + 1, epoch, T0) is E.invalid_producer_id_mapping
    assert h.end("tx", pid + 1, epoch, True) is E.invalid_producer_id_mapping


def test_add_offsets_adds_the_groups_offsets_partition():
    h = Harness()
    pid, epoch = begin(h)
    assert h.add_offsets("tx", pid, epoch, "group-a") is E.none
    expected = ("__consumer_offsets", partition_for_group("group-a", 6))
    assert expected in h.coord.transactions["tx"].partitions
    assert h.add_offsets("tx", pid, epoch, "") is E.invalid_group_id
    assert h.add_offsets("tx", pid, epoch + 1, "group-a") is E.producer_fenced
    h.end("tx", pid, epoch, True)
    assert (expected, pid, epoch, True) in h.written


def test_batched_add_partitions_answers_every_transaction_together():
    h = Harness(auto=False)
    for txn_id in ("a", "b"):
        h.call("init_producer_id", InitProducerIdRequest(txn_id, TIMEOUT_MS))
    h.flush_appends()
    pa, pb = h.coord.transactions["a"].producer_id, h.coord.transactions["b"].producer_id
    token = h.call(
        "add_partitions_to_txn",
        [
            AddPartitionsTxn("a", pa, 0, (T0,), api_version=4),
            AddPartitionsTxn("b", pb, 7, (T1,), api_version=4),
            AddPartitionsTxn("b", pb, 0, (U0,), api_version=4),
        ],
    )
    assert h.reply(token) is None and len(h.appends) == 2
    h.flush_appends()
    results = h.reply(token)
    assert [(r.transactional_id, r.errors) for r in results] == [
        ("a", {T0: E.none}),
        ("b", {T1: E.producer_fenced}),
        ("b", {U0: E.none}),
    ]


# ------------------------------------------------------------------ fencing and timeouts
def test_zombie_fencing_two_producers_one_transactional_id():
    h = Harness()
    pid, zombie_epoch = begin(h)
    # A second instance starts with the same transactional id while the first's
    # transaction is open: it is aborted with a bumped epoch, and the newcomer retries.
    assert h.init("tx").error_code is E.concurrent_transactions
    assert sorted(h.written) == [(T0, pid, 1, False), (T1, pid, 1, False)]
    assert h.state_of("tx") is S.COMPLETE_ABORT
    newcomer = h.init("tx")
    assert (newcomer.error_code, newcomer.producer_id, newcomer.producer_epoch) == (E.none, pid, 2)
    # The zombie is fenced everywhere the coordinator decides.
    assert h.add("tx", pid, zombie_epoch, U0) is E.producer_fenced
    assert h.add("tx", pid, zombie_epoch, U0, api_version=1) is E.invalid_producer_epoch
    assert h.end("tx", pid, zombie_epoch, True) is E.producer_fenced
    assert h.end("tx", pid, zombie_epoch, True, api_version=1) is E.invalid_producer_epoch
    assert h.coord.verify("tx", pid, zombie_epoch, *T0) is E.producer_fenced
    assert h.add("tx", pid, 2, U0) is E.none


def test_timed_out_transaction_is_aborted_with_a_bumped_epoch():
    config = TxnConfig(transaction_state_log_num_partitions=1)
    h = Harness(config=config)
    result = h.init("tx", timeout_ms=5_000)
    pid = result.producer_id
    assert h.add("tx", pid, 0, T0) is E.none
    interval = config.transaction_abort_timed_out_transaction_cleanup_interval_ms
    h.tick(interval)  # 10 s > 5 s: the scan finds it
    assert h.state_of("tx") is S.COMPLETE_ABORT
    assert h.written == [(T0, pid, 1, False)]
    assert h.coord.transactions["tx"].producer_epoch == 1
    assert h.end("tx", pid, 0, True) is E.producer_fenced
    assert h.end("tx", pid, 0, True, api_version=0) is E.invalid_producer_epoch
    assert h.add("tx", pid, 0, T0) is E.producer_fenced


def test_a_transaction_within_its_timeout_is_left_alone():
    h = Harness()
    begin(h)
    h.tick(30_000)  # a scan at 30 s: younger than 60 s
    assert h.state_of("tx") is S.ONGOING
    assert h.coord.next_deadline_ms() == h.now_ms + 10_000  # the next scan
    h.tick(30_000)
    assert h.state_of("tx") is S.COMPLETE_ABORT


def test_idle_transactional_id_expires():
    config = TxnConfig(transaction_state_log_num_partitions=1, transactional_id_expiration_ms=1_000)
    h = Harness(config=config)
    pid, epoch = begin(h)
    h.end("tx", pid, epoch, True)
    h.tick(config.transaction_remove_expired_transaction_cleanup_interval_ms)
    assert "tx" not in h.coord.transactions
    assert h.log[-1] == (fmt.encode_key("tx"), None)
    assert h.stored() == {}
    (described,) = h.coord.describe_transactions(["tx"])
    assert described.error_code is E.transactional_id_not_found
    assert h.init("tx").producer_id != pid


def test_an_open_transaction_never_expires():
    config = TxnConfig(
        transaction_state_log_num_partitions=1,
        transactional_id_expiration_ms=1_000,
        transaction_max_timeout_ms=2**31 - 1,
    )
    h = Harness(config=config)
    h.init("tx", timeout_ms=2**31 - 1)
    h.add("tx", 1001, 0, T0)
    h.tick(config.transaction_remove_expired_transaction_cleanup_interval_ms)
    assert h.state_of("tx") is S.ONGOING


# ------------------------------------------------------------------ failover
def test_reload_mid_prepare_commit_writes_the_markers_again_and_completes():
    h = Harness()
    pid, epoch = begin(h)
    h.auto = False
    h.end("tx", pid, epoch, True)
    h.flush_appends()  # PrepareCommit stored
    assert len(h.markers) == 1
    h.write_markers(E.not_leader_or_follower, failing=frozenset({T1}))  # T0 written
    h.auto = True
    h.failover()
    assert h.coord.coordinator_epoch == 1
    assert h.state_of("tx") is S.COMPLETE_COMMIT
    assert stored_states(h, "tx")[-2:] == [S.PREPARE_COMMIT, S.COMPLETE_COMMIT]
    # Every partition got a marker from the new coordinator (T0 twice: a retry it dedups).
    assert sorted(h.written) == [(T0, pid, 0, True), (T0, pid, 0, True), (T1, pid, 0, True)]


def test_reload_mid_prepare_abort_and_keeps_ongoing_transactions():
    h = Harness()
    pid_a, _ = begin(h, "a")
    pid_b, _ = begin(h, "b")
    h.auto = False
    h.end("a", pid_a, 0, False)
    h.flush_appends()
    h.auto = True
    h.failover()
    assert h.state_of("a") is S.COMPLETE_ABORT
    assert h.state_of("b") is S.ONGOING
    assert h.coord.transactions["b"].partitions == {T0, T1}
    assert h.coord.verify("b", pid_b, 0, *T0) is E.none


def test_resign_answers_parked_callers_and_ignores_late_completions():
    h = Harness(auto=False)
    token = h.call("init_producer_id", InitProducerIdRequest("tx", TIMEOUT_MS))
    appends = list(h.appends)
    h.apply(h.coord.resign(h.now_ms))
    assert h.reply(token).error_code is E.not_coordinator
    assert h.coord.on_append_done(appends[0].append_id, E.none, h.now_ms).replies == []
    assert h.init("tx").error_code is E.not_coordinator
    assert h.coord.verify("tx", 1, 0, *T0) is E.not_coordinator
    assert h.coord.next_deadline_ms() is None


def test_loading_and_routing():
    config = TxnConfig(transaction_state_log_num_partitions=4)
    coord = TxnCoordinator(2, 5, config, lambda: 1)
    mine, other = txn_id_on(2, config), txn_id_on(3, config)
    fx = coord.init_producer_id(1, InitProducerIdRequest(mine, TIMEOUT_MS), 0)
    assert fx.replies[0][1].error_code is E.coordinator_load_in_progress
    assert coord.describe_transactions([mine])[0].error_code is E.coordinator_load_in_progress
    assert coord.list_transactions().error_code is E.coordinator_load_in_progress
    coord.load([], 0)
    fx = coord.init_producer_id(2, InitProducerIdRequest(other, TIMEOUT_MS), 0)
    assert fx.replies[0][1].error_code is E.not_coordinator
    assert coord.verify(other, 1, 0, "t", 0) is E.not_coordinator
    with pytest.raises(AssertionError):
        coord.load([], 0)


def test_corrupt_log_leaves_the_partition_loading():
    h = Harness()
    coord = TxnCoordinator(0, 1, h.config, lambda: 1)
    with pytest.raises(fmt.TxnLogRecordError):
        coord.load([(fmt.encode_key("tx"), b"\x00\x07junk")], 0)
    assert coord.loading


def test_load_drops_internal_partitions():
    """A loaded transaction holds no partition of the coordinator's or the metadata log (no
    marker may go there), whatever its record says."""
    h = Harness()
    coord = TxnCoordinator(0, 1, h.config, lambda: 1)
    ongoing = TransactionLogValue(
        7, 0, TIMEOUT_MS, S.ONGOING, (("__cluster_metadata", 0), T0), 10, 10
    )
    coord.replay_chunk([fmt.record("tx", ongoing)], 10)
    coord.finish_load(10)
    assert coord.transactions["tx"].partitions == {T0}


def test_no_internal_partition_joins_a_transaction():
    h = Harness()
    pid, epoch = begin(h, "tx", T0)
    for internal in (("__transaction_state", 0), ("__cluster_metadata", 0)):
        assert h.add("tx", pid, epoch, internal) is E.invalid_request
    assert h.coord.transactions["tx"].partitions == {T0}


# ------------------------------------------------------------------ failures
@pytest.mark.parametrize(
    ("append_error", "answered"),
    [
        (E.not_leader_or_follower, E.not_coordinator),
        (E.not_enough_replicas, E.coordinator_not_available),
        (E.request_timed_out, E.coordinator_not_available),
        (E.message_too_large, E.unknown_server_error),
    ],
)
def test_failed_appends_change_nothing(append_error, answered):
    h = Harness()
    pid, epoch = begin(h)
    h.auto = False
    token = h.call("end_txn", EndTxnRequest("tx", pid, epoch, True))
    assert h.end("tx", pid, epoch, False) is E.concurrent_transactions  # one at a time
    h.flush_appends(append_error)
    assert h.reply(token).error_code is answered
    assert h.state_of("tx") is S.ONGOING and h.markers == []
    h.auto = True
    assert h.end("tx", pid, epoch, True) is E.none
    assert h.state_of("tx") is S.COMPLETE_COMMIT


def test_failed_markers_are_retried_after_the_backoff_for_the_missing_partitions():
    h = Harness()
    pid, epoch = begin(h)
    h.auto = False
    h.end("tx", pid, epoch, True)
    h.flush_appends()
    h.write_markers(E.not_enough_replicas, failing=frozenset({T1}))
    assert h.markers == [] and h.state_of("tx") is S.PREPARE_COMMIT
    assert h.coord.transactions["tx"].partitions == {T1}
    (described,) = h.coord.describe_transactions(["tx"])
    assert described.state == "PrepareCommit" and described.topics == (("t", (1,)),)
    backoff = h.config.transaction_marker_retry_backoff_ms
    assert h.coord.next_deadline_ms() == h.now_ms + backoff
    h.tick(backoff)
    assert [m.partitions for m in h.markers] == [(T1,)]
    h.write_markers()
    h.flush_appends()
    assert h.state_of("tx") is S.COMPLETE_COMMIT


def test_failed_completion_record_is_retried():
    h = Harness()
    pid, epoch = begin(h)
    h.auto = False
    h.end("tx", pid, epoch, False)
    h.flush_appends()
    h.write_markers()
    h.flush_appends(E.not_enough_replicas)
    assert h.state_of("tx") is S.PREPARE_ABORT
    h.tick(h.config.transaction_marker_retry_backoff_ms)
    assert len(h.markers) == 0 and len(h.appends) == 1
    h.flush_appends()
    assert h.state_of("tx") is S.COMPLETE_ABORT


def test_markers_refused_by_a_newer_coordinator_stop_this_one():
    h = Harness()
    pid, epoch = begin(h)
    h.auto = False
    h.end("tx", pid, epoch, True)
    h.flush_appends()
    h.write_markers(E.transaction_coordinator_fenced)
    h.tick(10_000)
    assert h.markers == [] and h.appends == []
    assert h.state_of("tx") is S.PREPARE_COMMIT and "tx" in h.coord.stalled


# ------------------------------------------------------------------ KIP-890 verification
def test_verify_only_the_partitions_of_the_ongoing_transaction():
    h = Harness()
    pid, epoch = begin(h, "tx", T0)
    assert h.coord.verify("tx", pid, epoch, *T0) is E.none
    assert h.coord.verify("tx", pid, epoch, *T1) is E.invalid_txn_state
    assert h.coord.verify("tx", pid, epoch + 1, *T0) is E.producer_fenced
    assert h.coord.verify("tx", pid + 1, epoch, *T0) is E.invalid_producer_id_mapping
    assert h.coord.verify("nobody", pid, epoch, *T0) is E.invalid_producer_id_mapping
    log_size = len(h.log)
    assert h.add("tx", pid, epoch, T0, verify_only=True, api_version=4) is E.none
    assert h.add("tx", pid, epoch, T1, verify_only=True, api_version=4) is E.invalid_txn_state
    assert len(h.log) == log_size  # verification writes nothing
    h.auto = False
    h.end("tx", pid, epoch, True)
    # Being ended: a late produce to a partition of it may not open a new transaction.
    assert h.coord.verify("tx", pid, epoch, *T0) is E.invalid_txn_state
    h.auto = True
    h.settle()
    assert h.coord.verify("tx", pid, epoch, *T0) is E.invalid_txn_state


# ------------------------------------------------------------------ admin
def test_describe_and_list():
    h = Harness()
    pid, epoch = begin(h, "a", U0, T1)
    h.now_ms += 5_000
    h.init("b")
    (a, b, missing) = h.coord.describe_transactions(["a", "b", "zz"])
    assert (a.state, a.producer_id, a.producer_epoch, a.transaction_timeout_ms) == (
        "Ongoing",
        pid,
        epoch,
        TIMEOUT_MS,
    )
    assert a.topics == (("t", (1,)), ("u", (0,)))
    assert a.transaction_start_time_ms == h.now_ms - 5_000
    assert (b.state, b.transaction_start_time_ms, b.topics) == ("Empty", -1, ())
    assert missing.error_code is E.transactional_id_not_found
    listed = h.coord.list_transactions()
    assert [(t.transactional_id, t.state) for t in listed.transactions] == [
        ("a", "Ongoing"),
        ("b", "Empty"),
    ]
    only = h.coord.list_transactions(state_filters=["Ongoing", "Bogus"])
    assert [t.transactional_id for t in only.transactions] == ["a"]
    assert only.unknown_state_filters == ("Bogus",)
    by_pid = h.coord.list_transactions(producer_id_filters=[pid])
    assert [t.transactional_id for t in by_pid.transactions] == ["a"]
    long_running = h.coord.list_transactions(duration_filter_ms=4_000, now_ms=h.now_ms)
    assert [t.transactional_id for t in long_running.transactions] == ["a"]
    assert h.coord.list_transactions(duration_filter_ms=6_000, now_ms=h.now_ms).transactions == ()


def test_resign_answers_batched_and_offsets_requests():
    h = Harness()
    pid, epoch = begin(h)
    h.auto = False
    batch = h.call(
        "add_partitions_to_txn",
        [AddPartitionsTxn("tx", pid, epoch, (U0,)), AddPartitionsTxn("zz", 1, 0, (U0,))],
    )
    h2 = Harness()
    pid2, epoch2 = begin(h2)
    h2.auto = False
    offsets = h2.call(
        "add_offsets_to_txn",
        AddOffsetsToTxnRequest("tx", pid2, epoch2, "g"),
    )
    h.apply(h.coord.resign(h.now_ms))
    h2.apply(h2.coord.resign(h2.now_ms))
    results = h.reply(batch)
    assert [r.errors for r in results] == [
        {U0: E.not_coordinator},
        {U0: E.invalid_producer_id_mapping},
    ]
    assert h2.reply(offsets) is E.not_coordinator


def test_marker_answers_missing_partitions_are_retried_and_old_formats_count_as_written():
    h = Harness()
    pid, epoch = begin(h, "tx", T0, T1, U0)
    h.auto = False
    h.end("tx", pid, epoch, False)
    h.flush_appends()
    (marker,) = h.markers
    h.markers.clear()
    h.apply(
        h.coord.on_markers_done(
            marker.marker_id, {T0: E.none, T1: E.unsupported_for_message_format}, h.now_ms
        )
    )
    assert h.coord.transactions["tx"].partitions == {U0}
    h.tick(h.config.transaction_marker_retry_backoff_ms)
    assert [m.partitions for m in h.markers] == [(U0,)]


def test_fencing_abort_whose_record_fails_answers_the_error():
    h = Harness()
    begin(h)
    h.auto = False
    token = h.call("init_producer_id", InitProducerIdRequest("tx", TIMEOUT_MS))
    h.flush_appends(E.not_enough_replicas)
    assert h.reply(token).error_code is E.coordinator_not_available
    assert h.state_of("tx") is S.ONGOING and h.coord.transactions["tx"].producer_epoch == 0
    assert h.markers == []


# ------------------------------------------------------------------ one-phase commit
def test_a_commit_of_one_partition_is_answered_by_its_marker():
    h = Harness()
    pid, epoch = begin(h, "tx", T0)
    h.auto = False
    token = h.call("end_txn", EndTxnRequest("tx", pid, epoch, True, 3))
    assert h.appends == [] and [m.partitions for m in h.markers] == [(T0,)]
    assert h.markers[0].commit and h.reply(token) is None
    assert h.stored()["tx"].state is S.ONGOING  # no PrepareCommit record
    h.write_markers()
    assert h.reply(token).error_code is E.none
    # The Complete record waits a moment for the producer's next add, to go with it.
    assert h.appends == []
    h.tick(COMPLETE_LINGER_MS)
    h.flush_appends()
    assert stored_states(h, "tx")[-2:] == [S.ONGOING, S.COMPLETE_COMMIT]


def test_the_next_add_goes_with_the_complete_record_of_a_one_phase_commit():
    h = Harness()
    pid, epoch = begin(h, "tx", T0)
    h.auto = False
    h.end("tx", pid, epoch, True)
    h.write_markers()
    token = h.call("add_partitions_to_txn", [AddPartitionsTxn("tx", pid, epoch, (T1,))])
    (append,) = h.appends  # at once, not after COMPLETE_LINGER_MS
    assert len(append.records) == 2
    h.flush_appends()
    assert stored_states(h, "tx")[-2:] == [S.COMPLETE_COMMIT, S.ONGOING]
    assert h.reply(token)[0].errors == {T1: E.none}


def test_a_one_phase_commit_refused_by_a_newer_coordinator_says_not_coordinator():
    """The newer coordinator decides: it may have aborted the transaction."""
    h = Harness()
    pid, epoch = begin(h, "tx", T0)
    h.auto = False
    token = h.call("end_txn", EndTxnRequest("tx", pid, epoch, True, 3))
    h.write_markers(E.transaction_coordinator_fenced)
    assert h.reply(token).error_code is E.not_coordinator
    assert "tx" in h.coord.stalled and h.appends == []


def test_an_abort_of_one_partition_keeps_two_phases():
    h = Harness()
    pid, epoch = begin(h, "tx", T0)
    assert h.end("tx", pid, epoch, False) is E.none
    assert S.PREPARE_ABORT in stored_states(h, "tx")


def _load_ongoing(h: Harness, epoch: int, *partitions: fmt.TopicPartition) -> None:
    value = TransactionLogValue(
        producer_id=1001,
        producer_epoch=epoch,
        transaction_timeout_ms=60_000,
        state=S.ONGOING,
        partitions=tuple(sorted(partitions)),
        last_update_timestamp_ms=h.now_ms,
        start_timestamp_ms=h.now_ms,
    )
    h.log.append(fmt.record("tx", value))
    h.failover()


def test_an_ongoing_transaction_of_one_partition_loaded_is_in_doubt():
    """Its abort bumps the epoch and never answers NONE: an earlier coordinator may have
    committed it in one phase. It may grow, and stays in doubt; it commits as usual."""
    h = Harness()
    _load_ongoing(h, 4, T0)
    assert h.add("tx", 1001, 4, T1) is E.none
    assert h.end("tx", 1001, 4, False) is E.producer_fenced
    assert h.stored()["tx"].state is S.COMPLETE_ABORT
    assert h.stored()["tx"].producer_epoch == 5  # the old epoch's markers are refused
    h = Harness()
    _load_ongoing(h, 4, T0)
    assert h.end("tx", 1001, 4, True) is E.none
    h.tick(COMPLETE_LINGER_MS)
    assert h.stored()["tx"].state is S.COMPLETE_COMMIT


def test_an_ongoing_transaction_of_two_partitions_loaded_is_not_in_doubt():
    """No coordinator commits it in one phase: its record would have named one partition."""
    h = Harness()
    _load_ongoing(h, 4, T0, T1)
    assert h.end("tx", 1001, 4, False) is E.none
    assert h.stored()["tx"].producer_epoch == 4


def test_an_ongoing_transaction_at_the_top_epoch_is_not_in_doubt():
    """A commit at the top epoch writes PrepareCommit, so it cannot have been committed in
    one phase."""
    h = Harness()
    _load_ongoing(h, MAX_PRODUCER_EPOCH, T0)
    assert h.end("tx", 1001, MAX_PRODUCER_EPOCH, False) is E.none
    assert h.stored()["tx"].state is S.COMPLETE_ABORT
    assert h.stored()["tx"].producer_epoch == MAX_PRODUCER_EPOCH


def test_a_failed_append_that_may_have_landed_means_two_phases():
    """The add of T1 is reported failed but lands: memory holds T0 only, the log T0 and T1.
    A one-phase commit of T0 would leave the next coordinator an Ongoing record of two
    partitions; PrepareCommit makes the log say what was decided."""
    h = Harness()
    pid, epoch = begin(h, "tx", T0)
    h.auto = False
    h.add("tx", pid, epoch, T1)
    (append,) = h.appends
    h.log.extend(append.records)
    h.flush_appends(E.not_enough_replicas)
    assert h.coord.transactions["tx"].partitions == {T0}
    h.end("tx", pid, epoch, True)
    assert h.markers == [] and len(h.appends) == 1
    h.flush_appends()
    assert h.stored()["tx"].state is S.PREPARE_COMMIT
    assert h.stored()["tx"].partitions == (T0,)


def test_at_the_top_epoch_a_commit_of_one_partition_writes_prepare_commit():
    """Its abort after a failover could not bump the epoch, so it never goes in doubt."""
    h = Harness()
    _load_ongoing(h, MAX_PRODUCER_EPOCH, T0)
    h.auto = False
    h.end("tx", 1001, MAX_PRODUCER_EPOCH, True)
    assert h.markers == [] and len(h.appends) == 1
    h.flush_appends()
    assert h.stored()["tx"].state is S.PREPARE_COMMIT


def _commit_in_one_phase_with_next_add(h: Harness, pid: int, epoch: int, *partitions) -> int:
    """Commit "tx" (one partition) and ask for the next transaction's partitions as the
    marker is written: the add's token."""
    h.end("tx", pid, epoch, True)
    token = h.call("add_partitions_to_txn", [AddPartitionsTxn("tx", pid, epoch, partitions)])
    h.write_markers()
    return token


def test_the_next_transaction_on_the_same_partition_starts_with_no_record():
    h = Harness()
    pid, epoch = begin(h, "tx", T0)
    h.auto = False
    log_size = len(h.log)
    for _ in range(3):
        token = _commit_in_one_phase_with_next_add(h, pid, epoch, T0)
        assert h.reply(token)[0].errors == {T0: E.none}
        assert h.appends == [] and len(h.log) == log_size
        assert h.state_of("tx") is S.ONGOING
    # What a failover would load: an Ongoing transaction of T0, in doubt.
    h.failover()
    assert h.state_of("tx") is S.ONGOING and "tx" in h.coord._in_doubt


def test_the_next_transaction_writes_its_record_when_the_log_would_not_say_it():
    # Other partitions than the stored Ongoing record's.
    h = Harness()
    pid, epoch = begin(h, "tx", T0)
    h.auto = False
    _commit_in_one_phase_with_next_add(h, pid, epoch, T1)
    (append,) = h.appends
    assert len(append.records) == 2  # CompleteCommit and the new Ongoing
    # The stored record older than half the timeout: a failover would time the transaction
    # out too soon after its real start.
    h = Harness()
    pid, epoch = begin(h, "tx", T0)
    h.auto = False
    h.now_ms += TIMEOUT_MS // 2
    _commit_in_one_phase_with_next_add(h, pid, epoch, T0)
    (append,) = h.appends
    h.flush_appends()
    assert h.stored()["tx"].start_timestamp_ms == h.now_ms


def test_an_add_answered_with_no_record_is_answered_once_and_with_its_whole_batch():
    """The add comes during the Complete record's linger (the markers written): answered at
    once with no record, and only once; in a v4 batch, with the other transactions'."""
    h = Harness()
    pid, epoch = begin(h, "tx", T0)
    other_pid, other_epoch = begin(h, "other", T1)
    h.auto = False
    h.end("tx", pid, epoch, True)
    h.write_markers()
    # (Harness.apply fails on a token answered twice.)
    token = h.call("add_partitions_to_txn", [AddPartitionsTxn("tx", pid, epoch, (T0,))])
    assert h.reply(token)[0].errors == {T0: E.none}
    h.end("tx", pid, epoch, True)
    h.write_markers()
    batch = [
        AddPartitionsTxn("tx", pid, epoch, (T0,), api_version=4),
        AddPartitionsTxn("other", other_pid, other_epoch, (U0,), api_version=4),
    ]
    token = h.call("add_partitions_to_txn", batch)
    assert h.reply(token) is None  # "other" needs its record first
    h.flush_appends()
    assert [r.errors for r in h.reply(token)] == [{T0: E.none}, {U0: E.none}]
