"""Random request sequences against one coordinator, with failing appends and markers,
timeouts and failovers: no illegal transition is ever attempted, a transaction is completed
only after every one of its partitions acknowledged its marker, a marker is sent only for a
decision already in the log (or, for a one-phase commit, as the decision on the one partition
of an Ongoing record), memory agrees with the log, and once everything is allowed to succeed
every transaction ends."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlog.errors import ErrorCode
from raftlog.txn import log_format as fmt
from raftlog.txn.effects import Append, WriteMarkers
from raftlog.txn.log_format import TransactionState
from raftlog.txn.messages import (
    AddOffsetsToTxnRequest,
    AddPartitionsTxn,
    EndTxnRequest,
    InitProducerIdRequest,
    InitProducerIdResult,
)
from raftlog.txn.settings import TxnConfig
from tests.txn.harness import Harness

S = TransactionState
E = ErrorCode
TXN_IDS = ("a", "b")
PARTITIONS = (("t", 0), ("t", 1), ("u", 0))
APPEND_FAILURES = (E.not_leader_or_follower, E.not_enough_replicas, E.request_timed_out)
MARKER_FAILURES = (E.not_leader_or_follower, E.not_enough_replicas, E.request_timed_out)
CONFIG = TxnConfig(
    transaction_state_log_num_partitions=1,
    transaction_max_timeout_ms=20_000,
    transactional_id_expiration_ms=50_000,
    transaction_abort_timed_out_transaction_cleanup_interval_ms=1_000,
    transaction_remove_expired_transaction_cleanup_interval_ms=5_000,
    transaction_marker_retry_backoff_ms=10,
)


# Weighted: producers mostly make progress, so transactions reach their markers.
OPS = (
    ("init",) * 2
    + ("add",) * 4
    + ("offsets",)
    + ("end",) * 3
    + ("settle",) * 3
    + ("append",) * 2
    + ("marker",) * 2
    + ("tick",) * 2
    + ("failover",)
    + ("verify",) * 2
)


def one_phase(value: fmt.TransactionLogValue) -> bool:
    """Whether the coordinator may commit `value` (Ongoing) with its marker alone."""
    return (
        value.state is S.ONGOING
        and len(value.partitions) == 1
        and value.client_transaction_version < fmt.TV_2
        and value.producer_epoch < fmt.MAX_PRODUCER_EPOCH
    )


class World:
    def __init__(self) -> None:
        self.h = Harness(config=CONFIG, auto=False)
        # What each transactional id's producer believes it holds.
        self.held: dict[str, tuple[int, int]] = {}
        self.init_tokens: dict[int, str] = {}
        # Acknowledged markers: (txn id, partition, producer id, epoch, commit).
        self.acked: set[tuple[str, fmt.TopicPartition, int, int, bool]] = set()

    # ------------------------------------------------------------------ invariants
    def check_append(self, append: Append) -> None:
        """Before `append` lands: a Complete record only with every marker acknowledged."""
        for key, value_bytes in append.records:
            txn_id = fmt.decode_key(key)
            value = fmt.decode_value(value_bytes)
            if value is None or value.state not in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
                continue
            prepare = fmt.replay(self.h.log)[txn_id]
            commit = value.state is S.COMPLETE_COMMIT
            if commit and prepare.state is S.ONGOING:
                assert one_phase(prepare), f"{txn_id}: {prepare} committed without PrepareCommit"
            else:
                assert prepare.state is (S.PREPARE_COMMIT if commit else S.PREPARE_ABORT)
            assert (prepare.producer_id, prepare.producer_epoch) == (
                value.producer_id,
                value.producer_epoch,
            )
            for partition in prepare.partitions:
                marker = (txn_id, partition, value.producer_id, value.producer_epoch, commit)
                assert marker in self.acked, f"{txn_id} completed without {marker}"

    def check_marker(self, marker: WriteMarkers) -> None:
        """A marker goes out only for the decision the log holds."""
        stored = fmt.replay(self.h.log)[marker.transactional_id]
        if stored.state is S.ONGOING:
            assert marker.commit and one_phase(stored), f"{marker} for {stored}"
            assert set(marker.partitions) == set(stored.partitions)
        else:
            assert stored.state is (S.PREPARE_COMMIT if marker.commit else S.PREPARE_ABORT)
        assert (stored.producer_id, stored.producer_epoch) == (
            marker.producer_id,
            marker.producer_epoch,
        )
        assert set(marker.partitions) <= set(stored.partitions)
        assert marker.coordinator_epoch == self.h.coord.coordinator_epoch

    def check_memory_matches_log(self) -> None:
        stored = fmt.replay(self.h.log)
        for txn_id, txn in self.h.coord.transactions.items():
            if txn.pending is not None:
                continue
            value = stored.get(txn_id)
            if value is None:  # created in memory, its first record not (yet) written
                assert txn.state is S.EMPTY and txn.producer_epoch == -1
                continue
            if txn.state is S.PREPARE_COMMIT and value.state is S.ONGOING:
                # A one-phase commit: the decision is its marker, not a record.
                assert one_phase(value) and txn.producer_epoch == value.producer_epoch
                assert txn.partitions <= set(value.partitions)
                continue
            assert (txn.state, txn.producer_id, txn.producer_epoch) == (
                value.state,
                value.producer_id,
                value.producer_epoch,
            )
            if txn.state is S.ONGOING:
                assert txn.partitions == set(value.partitions)
            elif txn.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                assert txn.partitions <= set(value.partitions)

    # ------------------------------------------------------------------ steps
    def collect(self) -> None:
        for token, txn_id in list(self.init_tokens.items()):
            result = self.h.replies.get(token)
            if isinstance(result, InitProducerIdResult):
                del self.init_tokens[token]
                if result.error_code is E.none:
                    self.held[txn_id] = (result.producer_id, result.producer_epoch)

    def held_or_guess(self, txn_id: str, stale: bool) -> tuple[int, int]:
        pid, epoch = self.held.get(txn_id, (1001, 0))
        return (pid, max(0, epoch - 1)) if stale else (pid, epoch)

    def step(self, data: st.DataObject) -> None:
        h = self.h
        op = data.draw(st.sampled_from(OPS))
        txn_id = data.draw(st.sampled_from(TXN_IDS))
        stale = data.draw(st.integers(0, 4)) == 0  # now and then a zombie
        if op == "init":
            kip360 = data.draw(st.booleans()) and txn_id in self.held
            pid, epoch = self.held_or_guess(txn_id, stale) if kip360 else (-1, -1)
            timeout_ms = data.draw(st.sampled_from([500, 5_000, 30_000]))
            req = InitProducerIdRequest(txn_id, timeout_ms, pid, epoch)
            self.init_tokens[h.call("init_producer_id", req)] = txn_id
        elif op == "add":
            pid, epoch = self.held_or_guess(txn_id, stale)
            partitions = data.draw(st.lists(st.sampled_from(PARTITIONS), min_size=1, max_size=3))
            verify_only = data.draw(st.booleans())
            add = AddPartitionsTxn(txn_id, pid, epoch, tuple(partitions), verify_only)
            h.call("add_partitions_to_txn", [add])
        elif op == "offsets":
            pid, epoch = self.held_or_guess(txn_id, stale)
            h.call("add_offsets_to_txn", AddOffsetsToTxnRequest(txn_id, pid, epoch, "g"))
        elif op == "end":
            pid, epoch = self.held_or_guess(txn_id, stale)
            commit = data.draw(st.booleans())
            h.call("end_txn", EndTxnRequest(txn_id, pid, epoch, commit))
        elif op == "append" and h.appends:
            index = data.draw(st.integers(0, len(h.appends) - 1))
            append = h.appends.pop(index)
            code = data.draw(st.sampled_from((E.none, E.none, *APPEND_FAILURES)))
            self.land_append(append, code)
        elif op == "marker" and h.markers:
            index = data.draw(st.integers(0, len(h.markers) - 1))
            marker = h.markers.pop(index)
            failing = data.draw(st.sets(st.sampled_from(marker.partitions)))
            code = data.draw(st.sampled_from(MARKER_FAILURES))
            self.answer_marker(
                marker, {p: code if p in failing else E.none for p in marker.partitions}
            )
        elif op == "settle":
            self.settle(data)
        elif op == "tick":
            h.tick(data.draw(st.sampled_from([0, 10, 10, 100, 1_000, 6_000, 60_000])))
        elif op == "failover":
            # Appends in flight may land although their answer is lost with the leader.
            for append in h.appends:
                if data.draw(st.booleans()):
                    self.check_append(append)
                    h.log.extend(append.records)
            h.failover()
        elif op == "verify":
            pid, epoch = self.held_or_guess(txn_id, stale)
            partition = data.draw(st.sampled_from(PARTITIONS))
            code = h.coord.verify(txn_id, pid, epoch, *partition)
            txn = h.coord.transactions.get(txn_id)
            if code is E.none:
                assert txn is not None and txn.state is S.ONGOING
                assert partition in fmt.replay(h.log)[txn_id].partitions
        self.check_new_markers()
        self.collect()
        self.check_memory_matches_log()

    def check_new_markers(self) -> None:
        for marker in self.h.markers:
            self.check_marker(marker)

    def land_append(self, append: Append, code: ErrorCode) -> None:
        if code is E.none:
            self.check_append(append)
            self.h.log.extend(append.records)
        self.h.apply(self.h.coord.on_append_done(append.append_id, code, self.h.now_ms))

    def answer_marker(
        self, marker: WriteMarkers, results: dict[fmt.TopicPartition, ErrorCode]
    ) -> None:
        for partition, code in results.items():
            if code is E.none:
                self.acked.add(
                    (
                        marker.transactional_id,
                        partition,
                        marker.producer_id,
                        marker.producer_epoch,
                        marker.commit,
                    )
                )
        self.h.apply(self.h.coord.on_markers_done(marker.marker_id, results, self.h.now_ms))

    def settle(self, data: st.DataObject) -> None:
        """Answer what is queued (appends, then markers) as it stands now."""
        h = self.h
        appends, h.appends = h.appends, []
        for append in appends:
            self.land_append(append, data.draw(st.sampled_from((E.none,) * 5 + APPEND_FAILURES)))
        markers, h.markers = h.markers, []
        for marker in markers:
            self.answer_marker(marker, dict.fromkeys(marker.partitions, E.none))

    def drain(self) -> None:
        """Everything succeeds from now on: every transaction must end."""
        h = self.h
        for _ in range(200):
            while h.appends or h.markers:
                if h.appends:
                    self.land_append(h.appends.pop(0), E.none)
                if h.markers:
                    marker = h.markers.pop(0)
                    self.check_marker(marker)
                    self.answer_marker(marker, dict.fromkeys(marker.partitions, E.none))
            h.tick(
                CONFIG.transaction_max_timeout_ms
                + CONFIG.transaction_abort_timed_out_transaction_cleanup_interval_ms
            )
            if not h.appends and not h.markers:
                break
        self.check_memory_matches_log()
        for txn in h.coord.transactions.values():
            assert txn.pending is None
            assert txn.state not in (S.PREPARE_COMMIT, S.PREPARE_ABORT, S.ONGOING), txn


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_request_sequences_keep_transactions_atomic(data):
    world = World()
    steps = data.draw(st.integers(1, 80))
    for _ in range(steps):
        world.step(data)
    world.drain()
