"""Transactional offset commits in the pure GroupCoordinator (KIP-98, KIP-447): pending per
producer until the marker, require_stable, fencing, and replay of markers from the log."""

from __future__ import annotations

import random

import pytest

from raftlog.errors import CorruptRecordError, ErrorCode
from raftlog.groups import offsets_format as fmt
from raftlog.groups.coordinator import GroupCoordinator, TxnProducer
from raftlog.groups.messages import (
    OffsetCommitPartition,
    OffsetCommitTopic,
    OffsetFetchRequest,
    OffsetFetchTopic,
    TxnOffsetCommitRequest,
)
from raftlog.groups.offsets_format import TxnEnd, TxnRecord
from tests.groups.harness import Harness, join_req
from tests.groups.test_coordinator import codes, commit, failover, fetched
from tests.groups.test_group import G, stable_two

TXN_ID = "txn-1"
PID = 4000
EPOCH = 2


def txn_commit(
    group: str,
    offsets: dict[tuple[str, int], int],
    producer_id: int = PID,
    **kw,
) -> TxnOffsetCommitRequest:
    topics: dict[str, list[OffsetCommitPartition]] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append(
            OffsetCommitPartition(partition, offset, leader_epoch=1, metadata=f"x{offset}")
        )
    return TxnOffsetCommitRequest(
        transactional_id=kw.pop("transactional_id", TXN_ID),
        group_id=group,
        producer_id=producer_id,
        producer_epoch=kw.pop("producer_epoch", EPOCH),
        topics=tuple(OffsetCommitTopic(t, tuple(ps)) for t, ps in topics.items()),
        **kw,
    )


def stable_fetch(coord, group: str, topics=None) -> dict[tuple[str, int], tuple[int, ErrorCode]]:
    response = coord.offset_fetch(OffsetFetchRequest(group, topics, require_stable=True))
    assert response.error_code is ErrorCode.none
    return {
        (t.name, p.partition): (p.offset, p.error_code)
        for t in response.topics
        for p in t.partitions
    }


def ask(*pairs: tuple[str, int]) -> tuple[OffsetFetchTopic, ...]:
    topics: dict[str, list[int]] = {}
    for topic, partition in pairs:
        topics.setdefault(topic, []).append(partition)
    return tuple(OffsetFetchTopic(t, tuple(ps)) for t, ps in topics.items())


UNSTABLE = ErrorCode.unstable_offset_commit


def test_offsets_count_only_after_the_commit_marker() -> None:
    h = Harness()
    h.call("offset_commit", commit(G, {("t", 0): 5}))
    token = h.call("txn_offset_commit", txn_commit(G, {("t", 0): 10, ("t", 1): 20}))
    assert codes(h.replies[token]) == {ErrorCode.none}
    partition = h.coord.partition_for(G)
    assert h.coord.has_pending_txn_offsets(partition, PID)
    # Not committed yet: a plain fetch sees the old offsets, a stable one is told to wait.
    assert fetched(h, G, ask(("t", 0), ("t", 1))) == {("t", 0): 5, ("t", 1): -1}
    assert stable_fetch(h.coord, G, ask(("t", 0), ("t", 1), ("u", 0))) == {
        ("t", 0): (-1, UNSTABLE),
        ("t", 1): (-1, UNSTABLE),
        ("u", 0): (-1, ErrorCode.none),
    }
    # Only the committed partitions are listed when all are asked for.
    assert stable_fetch(h.coord, G) == {("t", 0): (-1, UNSTABLE)}
    h.marker(partition, PID, commit=True)
    assert not h.coord.has_pending_txn_offsets(partition, PID)
    assert fetched(h, G) == {("t", 0): 10, ("t", 1): 20}
    assert stable_fetch(h.coord, G) == {
        ("t", 0): (10, ErrorCode.none),
        ("t", 1): (20, ErrorCode.none),
    }


def test_abort_marker_drops_the_offsets() -> None:
    h = Harness()
    h.call("offset_commit", commit(G, {("t", 0): 5}))
    h.call("txn_offset_commit", txn_commit(G, {("t", 0): 10}))
    partition = h.coord.partition_for(G)
    h.marker(partition, PID, commit=False)
    assert fetched(h, G) == {("t", 0): 5}
    assert stable_fetch(h.coord, G) == {("t", 0): (5, ErrorCode.none)}
    # A second marker for a producer with nothing pending changes nothing.
    h.marker(partition, PID, commit=True)
    assert fetched(h, G) == {("t", 0): 5}


def test_txn_append_is_a_batch_of_the_producer() -> None:
    h = Harness(auto_flush=False)
    h.call("txn_offset_commit", txn_commit(G, {("t", 0): 10}))
    (append,) = h.queued
    assert append.txn == TxnProducer(TXN_ID, PID, EPOCH)
    assert append.partition == h.coord.partition_for(G)
    # In flight is unstable already: the batch may land before the marker.
    assert stable_fetch(h.coord, G, ask(("t", 0))) == {("t", 0): (-1, UNSTABLE)}
    h.flush(ErrorCode.not_enough_replicas)
    (reply,) = h.replies.values()
    assert codes(reply) == {ErrorCode.coordinator_not_available}
    assert not h.coord.has_pending_txn_offsets(append.partition, PID)
    assert stable_fetch(h.coord, G, ask(("t", 0))) == {("t", 0): (-1, ErrorCode.none)}


def test_plain_commit_written_after_the_transactional_one_wins() -> None:
    """Log order decides, not marker order: the replay agrees with the live coordinator."""
    h = Harness()
    h.call("txn_offset_commit", txn_commit(G, {("t", 0): 10, ("t", 1): 11}))
    h.call("offset_commit", commit(G, {("t", 0): 99}))
    h.marker(h.coord.partition_for(G), PID, commit=True)
    assert fetched(h, G) == {("t", 0): 99, ("t", 1): 11}
    assert failover(h).committed_offsets() == h.coord.committed_offsets()


def test_metadata_bound_and_routing_errors() -> None:
    h = Harness()
    big = "m" * (h.config.offset_metadata_max_bytes + 1)
    req = txn_commit(G, {("t", 0): 1})
    topic = OffsetCommitTopic(
        "t", (req.topics[0].partitions[0], OffsetCommitPartition(1, 2, metadata=big))
    )
    token = h.call("txn_offset_commit", TxnOffsetCommitRequest(TXN_ID, G, PID, EPOCH, (topic,)))
    errors = {p.partition: p.error_code for p in h.replies[token].topics[0].partitions}
    assert errors == {0: ErrorCode.none, 1: ErrorCode.offset_metadata_too_large}
    empty = h.call("txn_offset_commit", txn_commit("", {("t", 0): 1}))
    assert codes(h.replies[empty]) == {ErrorCode.invalid_group_id}
    h.apply(h.coord.resign(h.coord.partition_for(G), h.now_ms))
    moved = h.call("txn_offset_commit", txn_commit(G, {("t", 0): 1}))
    assert codes(h.replies[moved]) == {ErrorCode.not_coordinator}


def test_kip447_generation_fencing() -> None:
    h = Harness()
    a, b, gen = stable_two(h)
    cases = {
        "current": txn_commit(G, {("t", 0): 1}, generation_id=gen, member_id=a),
        "stale": txn_commit(G, {("t", 0): 2}, generation_id=gen - 1, member_id=a),
        "ghost": txn_commit(G, {("t", 0): 3}, generation_id=gen, member_id="ghost"),
        # v0-2 clients send no member: allowed even while the group is live.
        "old_client": txn_commit(G, {("t", 1): 4}),
    }
    tokens = {name: h.call("txn_offset_commit", req) for name, req in cases.items()}
    got = {name: codes(h.replies[t]) for name, t in tokens.items()}
    assert got == {
        "current": {ErrorCode.none},
        "stale": {ErrorCode.illegal_generation},
        "ghost": {ErrorCode.unknown_member_id},
        "old_client": {ErrorCode.none},
    }
    # Mid-rebalance, a member of the current generation may still commit (unlike OffsetCommit).
    h.call("join_group", join_req(G, a, protocols=(("range", b"x"),)))
    h.call("join_group", join_req(G, b))
    new_gen = h.coord._groups[G].generation_id
    mid = h.call(
        "txn_offset_commit", txn_commit(G, {("t", 0): 9}, generation_id=new_gen, member_id=a)
    )
    assert codes(h.replies[mid]) == {ErrorCode.none}
    # A member of a group this coordinator does not know is unknown.
    lost = h.call("txn_offset_commit", txn_commit("gone", {("t", 0): 1}, member_id=a))
    assert codes(h.replies[lost]) == {ErrorCode.unknown_member_id}
    stale_gen = h.call("txn_offset_commit", txn_commit("gone", {("t", 0): 1}, generation_id=3))
    assert codes(h.replies[stale_gen]) == {ErrorCode.illegal_generation}
    assert "gone" not in h.coord._groups


def test_static_member_fencing() -> None:
    h = Harness()
    first = h.call("join_group", join_req(G, group_instance_id="inst-1"))
    member = h.replies[first].member_id
    gen = h.replies[first].generation_id
    zombie = h.call(
        "txn_offset_commit",
        txn_commit(
            G, {("t", 0): 1}, generation_id=gen, member_id="old", group_instance_id="inst-1"
        ),
    )
    assert codes(h.replies[zombie]) == {ErrorCode.fenced_instance_id}
    owner = h.call(
        "txn_offset_commit",
        txn_commit(
            G, {("t", 0): 1}, generation_id=gen, member_id=member, group_instance_id="inst-1"
        ),
    )
    assert codes(h.replies[owner]) == {ErrorCode.none}


def test_replay_resolves_markers_in_the_log_and_keeps_the_rest_pending() -> None:
    h = Harness()
    partition = h.coord.partition_for(G)
    h.call("offset_commit", commit(G, {("t", 0): 1, ("t", 1): 1, ("t", 2): 1}))
    h.call("txn_offset_commit", txn_commit(G, {("t", 0): 10}, producer_id=1))
    h.call("txn_offset_commit", txn_commit(G, {("t", 1): 20}, producer_id=2))
    h.call("txn_offset_commit", txn_commit(G, {("t", 2): 30}, producer_id=3))
    h.marker(partition, 1, commit=True)
    h.marker(partition, 2, commit=False)
    coord = failover(h)
    assert coord.committed_offsets() == h.coord.committed_offsets()
    assert fetched(coord, G) == {("t", 0): 10, ("t", 1): 1, ("t", 2): 1}
    assert coord.has_pending_txn_offsets(partition, 3)
    assert not coord.has_pending_txn_offsets(partition, 1)
    assert stable_fetch(coord, G)[("t", 2)] == (-1, UNSTABLE)
    # The driver finishes producer 3's transaction on the new coordinator.
    coord.complete_transaction(partition, 3, True, h.now_ms)
    assert fetched(coord, G) == {("t", 0): 10, ("t", 1): 1, ("t", 2): 30}


def test_marker_reported_during_the_load_is_applied_after_it() -> None:
    h = Harness()
    partition = h.coord.partition_for(G)
    h.call("txn_offset_commit", txn_commit(G, {("t", 0): 10}))
    coord = GroupCoordinator(h.config)
    coord.begin_load(partition, h.now_ms)
    coord.complete_transaction(partition, PID, True, h.now_ms)  # the read missed the marker
    coord.complete_load(partition, h.log[partition], h.now_ms)
    assert fetched(coord, G) == {("t", 0): 10}
    # Had the read seen the marker too, the second application is a no-op.
    again = GroupCoordinator(h.config)
    again.begin_load(partition, h.now_ms)
    again.complete_transaction(partition, PID, False, h.now_ms)
    again.complete_load(partition, [*h.log[partition], TxnEnd(PID, True)], h.now_ms)
    assert fetched(again, G) == {("t", 0): 10}


def test_resign_forgets_pending_and_later_markers_are_ignored() -> None:
    h = Harness()
    partition = h.coord.partition_for(G)
    h.call("txn_offset_commit", txn_commit(G, {("t", 0): 10}))
    h.apply(h.coord.resign(partition, h.now_ms))
    assert not h.coord.has_pending_txn_offsets(partition, PID)
    h.coord.complete_transaction(partition, PID, True, h.now_ms)
    assert h.coord.committed_offsets() == {}


def test_replay_refuses_group_metadata_inside_a_transaction() -> None:
    bad = TxnRecord(PID, fmt.group_key(G), None)
    with pytest.raises(CorruptRecordError):
        fmt.replay([bad])
    tombstone = TxnRecord(PID, fmt.offset_key(G, "t", 0), None)
    with pytest.raises(CorruptRecordError):
        fmt.replay([tombstone])


@pytest.mark.parametrize("seed", range(8))
def test_random_transactions_replay_to_the_same_state(seed: int) -> None:
    """Plain and transactional commits of several producers, markers, failed appends and
    deletions in any order: a coordinator loaded from the log holds the same committed
    offsets and the same undecided ones."""
    rng = random.Random(seed)
    h = Harness(auto_flush=False)
    producers = [11, 12, 13]
    groups = ["g0", "g1"]
    for step in range(200):
        group = rng.choice(groups)
        partition = h.coord.partition_for(group)
        offsets = {(f"t{rng.randrange(2)}", rng.randrange(2)): rng.randrange(1000)}
        op = rng.random()
        if op < 0.3:
            h.call("offset_commit", commit(group, offsets))
        elif op < 0.65:
            h.call(
                "txn_offset_commit", txn_commit(group, offsets, producer_id=rng.choice(producers))
            )
        elif op < 0.85:
            h.flush()
            h.marker(partition, rng.choice(producers), commit=rng.random() < 0.6)
        elif op < 0.9:
            h.call("delete_groups", [group])
        if rng.random() < 0.5:
            h.flush(ErrorCode.none if rng.random() < 0.9 else ErrorCode.request_timed_out)
        if step % 20 == 19:
            h.flush()
            coord = failover(h)
            where = f"seed={seed} step={step}"
            assert coord.committed_offsets() == h.coord.committed_offsets(), where
            for g in groups:
                assert stable_fetch(coord, g) == stable_fetch(h.coord, g), where
                for pid in producers:
                    p = h.coord.partition_for(g)
                    assert coord.has_pending_txn_offsets(p, pid) == h.coord.has_pending_txn_offsets(
                        p, pid
                    ), where
