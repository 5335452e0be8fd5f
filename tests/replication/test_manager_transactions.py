"""Transactions on three ReplicaManagers over real storage (no sockets): markers written as
leader and committed like acks=all, read_committed fetches stopping at the LSO with the aborted
transactions in range, ListOffsets answering the LSO, fencing, retried markers, the KIP-890
verification seam, restarts, a lost .txnindex, and a leader change."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import trio

from raftlog.constants import LATEST_TIMESTAMP
from raftlog.errors import ErrorCode
from raftlog.metadata.controller.messages import CreateTopics, NewTopic
from raftlog.net.kafka.backend import IsolationLevel
from raftlog.records import (
    Record,
    build_batch,
    build_txn_marker,
    iter_all_records,
    iter_batches,
)
from raftlog.replication.idempotence import VerificationGuards
from raftlog.replication.manager import ReplicaManager
from raftlog.replication.produce import TxnProduce
from raftlog.replication.txn_markers import TxnMarkerRequest
from tests.replication.test_manager import (
    BROKERS,
    TOPIC,
    Cluster,
    cluster_config,
    start_cluster,
    trio_read,
)
from tests.replication.txn_reader import CommittedReader
from tests.waiting import wait_until

CONFIG = cluster_config(replica_lag_time_max_ms=3_000)
COMMITTED = IsolationLevel.READ_COMMITTED


def txn(pid: int, seq: int, count: int = 2, *, epoch: int = 0, tag: str = "") -> bytes:
    now_ms = time.time_ns() // 1_000_000
    records = [Record(value=f"{tag or pid}-{seq + i}".encode()) for i in range(count)]
    return build_batch(
        records,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        is_transactional=True,
        now_ms=now_ms,
    )


def plain(value: bytes = b"plain") -> bytes:
    return build_batch([Record(value=value)], now_ms=time.time_ns() // 1_000_000)


def end(pid: int, *, commit: bool, epoch: int = 0, coordinator_epoch: int = 0) -> TxnMarkerRequest:
    return TxnMarkerRequest(pid, epoch, coordinator_epoch, commit, ((TOPIC, 0),))


async def send(cluster: Cluster, data: bytes, *, producer: Any = None) -> Any:
    leader = cluster.managers[cluster.leader_id]
    result = await leader.writes.produce(TOPIC, 0, data, -1, 10_000, producer)
    return result


async def mark(cluster: Cluster, marker: TxnMarkerRequest, broker: int | None = None) -> ErrorCode:
    manager = cluster.managers[cluster.leader_id if broker is None else broker]
    (result,) = await manager.write_txn_markers([marker], 10_000)
    return result[(TOPIC, 0)]


async def read(manager: ReplicaManager, offset: int, isolation: IsolationLevel) -> tuple[Any, list]:
    result = await manager.reads.fetch(TOPIC, 0, offset, 1 << 20, -1, isolation)
    data = b"".join(trio_read(r) for r in result.records)
    return result, list(iter_all_records(data)) if data else []


def lso(cluster: Cluster, broker_id: int) -> int:
    return cluster.status(broker_id).last_stable_offset


async def test_commit_abort_lso_and_aborted_list_survive_a_restart(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        assert (await send(cluster, txn(1, 0))).base_offset == 0  # A: 0-1
        assert (await send(cluster, txn(2, 0))).base_offset == 2  # B: 2-3
        assert (await send(cluster, plain())).base_offset == 4
        leader = cluster.managers[cluster.leader_id]
        assert lso(cluster, cluster.leader_id) == 0
        result, records = await read(leader, 0, COMMITTED)
        assert (result.high_watermark, result.last_stable_offset, records) == (5, 0, [])
        latest = await leader.reads.list_offset(TOPIC, 0, LATEST_TIMESTAMP, -1, COMMITTED)
        assert latest.offset == 0
        assert await mark(cluster, end(2, commit=False)) == ErrorCode.none  # 5
        assert lso(cluster, cluster.leader_id) == 0  # A still open
        assert await mark(cluster, end(1, commit=True)) == ErrorCode.none  # 6
        await wait_until("replicas in sync", cluster.in_sync)
        for broker_id in BROKERS:
            assert lso(cluster, broker_id) == 7, broker_id
        result, records = await read(leader, 0, COMMITTED)
        assert result.last_stable_offset == 7
        assert result.aborted_transactions == ((2, 2),)
        assert [r.offset for r in records] == [0, 1, 2, 3, 4, 5, 6]
        # read_uncommitted is unchanged: no aborted list, the HW as LSO.
        plain_read, _ = await read(leader, 0, IsolationLevel.READ_UNCOMMITTED)
        assert (
            not hasattr(plain_read, "aborted_transactions") or not plain_read.aborted_transactions
        )
        later, _ = await read(leader, 4, COMMITTED)
        assert later.aborted_transactions == ((2, 2),)  # B's marker at 5 is in range
        beyond, _ = await read(leader, 6, COMMITTED)
        assert beyond.aborted_transactions == ()
        latest = await leader.reads.list_offset(TOPIC, 0, LATEST_TIMESTAMP, -1, COMMITTED)
        assert latest.offset == 7

        leader_id = cluster.leader_id
        await cluster.stop(leader_id)
        # The aborted index is rebuilt from the log when its file is gone.
        directory = tmp_path / f"broker-{leader_id}" / f"{TOPIC}-0"
        for index in directory.glob("*.txnindex"):
            index.unlink()
        await cluster.start(leader_id)
        hosted = cluster.managers[leader_id].replicas.partitions[(TOPIC, 0)]
        await wait_until("the producer state to load", lambda: hosted.producers.loaded)
        assert cluster.leader_id == leader_id
        result, records = await read(cluster.managers[leader_id], 0, COMMITTED)
        assert result.last_stable_offset == 7 and result.aborted_transactions == ((2, 2),)
        assert len(records) == 7
        await cluster.stop_all()


async def test_an_open_transaction_survives_a_restart(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        assert (await send(cluster, plain())).base_offset == 0
        assert (await send(cluster, txn(1, 0))).base_offset == 1
        assert (await send(cluster, plain())).base_offset == 3
        await wait_until("replicas in sync", cluster.in_sync)
        leader_id = cluster.leader_id
        await cluster.stop(leader_id)
        await cluster.start(leader_id)
        hosted = cluster.managers[leader_id].replicas.partitions[(TOPIC, 0)]
        await wait_until("the producer state to load", lambda: hosted.producers.loaded)
        assert lso(cluster, leader_id) == 1
        assert await mark(cluster, end(1, commit=False)) == ErrorCode.none  # 4
        result, _records = await read(cluster.managers[leader_id], 0, COMMITTED)
        assert result.last_stable_offset == 5
        assert result.aborted_transactions == ((1, 1),)
        await cluster.stop_all()


async def test_read_committed_never_passes_the_lso_with_interleaved_transactions(
    tmp_path: Path,
) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        leader = cluster.managers[cluster.leader_id]
        seqs = {1: 0, 2: 0}
        seen_lsos: list[int] = []
        steps = [
            "p",
            1,
            "p",
            2,
            1,
            ("end", 1, True),
            2,
            "p",
            1,
            ("end", 2, False),
            ("end", 1, True),
        ]
        for step in steps:
            if step == "p":
                assert (await send(cluster, plain())).error == ErrorCode.none
            elif isinstance(step, int):
                assert (await send(cluster, txn(step, seqs[step]))).error == ErrorCode.none
                seqs[step] += 2
            else:
                _, pid, commit = step
                assert await mark(cluster, end(pid, commit=commit)) == ErrorCode.none
            for start in range(0, leader.replicas.partitions[(TOPIC, 0)].log.log_end_offset):
                result, records = await read(leader, start, COMMITTED)
                assert result.last_stable_offset <= result.high_watermark
                assert all(r.offset < result.last_stable_offset for r in records), (step, start)
            seen_lsos.append(lso(cluster, cluster.leader_id))
        assert seen_lsos == sorted(seen_lsos)  # monotonic on the leader
        assert seen_lsos[-1] == leader.replicas.partitions[(TOPIC, 0)].log.log_end_offset
        result, _ = await read(leader, 0, COMMITTED)
        assert result.aborted_transactions == ((2, 4),)
        await cluster.stop_all()


async def test_fencing_and_retried_markers(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        plog = cluster.managers[cluster.leader_id].replicas.partitions[(TOPIC, 0)].log
        assert (await send(cluster, txn(1, 0, epoch=3))).error == ErrorCode.none
        commit = end(1, commit=True, epoch=3, coordinator_epoch=7)
        assert await mark(cluster, commit) == ErrorCode.none
        end_offset = plog.log_end_offset
        # The coordinator did not get the answer and retries: not appended a second time.
        assert await mark(cluster, commit) == ErrorCode.none
        assert plog.log_end_offset == end_offset
        # An older coordinator (a zombie after a coordinator failover) is fenced.
        stale = end(1, commit=False, epoch=3, coordinator_epoch=6)
        assert await mark(cluster, stale) == ErrorCode.transaction_coordinator_fenced
        # An older producer epoch is fenced.
        assert await mark(cluster, end(1, commit=False, epoch=2, coordinator_epoch=7)) == (
            ErrorCode.invalid_producer_epoch
        )
        # Zombie fencing: a new transaction of epoch 3, aborted by the coordinator with epoch 4;
        # the zombie's next transactional batch of epoch 3 is refused.
        assert (await send(cluster, txn(1, 2, epoch=3))).error == ErrorCode.none
        assert await mark(cluster, end(1, commit=False, epoch=4, coordinator_epoch=7)) == (
            ErrorCode.none
        )
        zombie = await send(cluster, txn(1, 4, epoch=3))
        assert zombie.error == ErrorCode.invalid_producer_epoch, zombie
        # Clients may still not write control batches themselves.
        forged = build_txn_marker(producer_id=1, producer_epoch=4, coordinator_epoch=9, commit=True)
        assert (await send(cluster, forged)).error == ErrorCode.invalid_record
        # Out-of-range marker fields are refused before anything is written.
        bad = TxnMarkerRequest(1, -1, 7, True, ((TOPIC, 0),))
        assert await mark(cluster, bad) == ErrorCode.invalid_request
        await wait_until("replicas in sync", cluster.in_sync)
        expected = [h.base_offset for _, h in iter_batches(cluster.log_bytes(cluster.leader_id))]
        for broker_id in BROKERS:
            got = [h.base_offset for _, h in iter_batches(cluster.log_bytes(broker_id))]
            assert got == expected
        await cluster.stop_all()


async def test_markers_on_a_follower_are_refused(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        follower = next(b for b in BROKERS if b != cluster.leader_id)
        assert await mark(cluster, end(1, commit=True), broker=follower) == (
            ErrorCode.not_leader_or_follower
        )
        await cluster.stop_all()


async def test_kip_890_verification_refuses_a_transaction_the_coordinator_does_not_know(
    tmp_path: Path,
) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        leader = cluster.managers[cluster.leader_id]
        asked: list[TxnProduce] = []
        allowed = {7}

        async def verify(request: TxnProduce) -> ErrorCode:
            asked.append(request)
            if request.producer_id in allowed:
                return ErrorCode.none
            return ErrorCode.invalid_txn_state

        leader.writes.verify_transaction = verify
        producer = type("Producer", (), {"transactional_id": "app-1", "client_id": "c"})()
        refused = await send(cluster, txn(8, 0), producer=producer)
        assert refused.error == ErrorCode.invalid_txn_state
        assert (await send(cluster, txn(7, 0), producer=producer)).error == ErrorCode.none
        assert (await send(cluster, txn(7, 2), producer=producer)).error == ErrorCode.none
        assert (await send(cluster, plain())).error == ErrorCode.none
        # Asked only when a batch would open a transaction: not for 7's second batch.
        assert [(r.producer_id, r.transactional_id, r.topic) for r in asked] == [
            (8, "app-1", TOPIC),
            (7, "app-1", TOPIC),
        ]
        assert leader.replicas.partitions[(TOPIC, 0)].log.log_end_offset == 5
        await cluster.stop_all()


async def test_a_marker_that_lands_during_verification_voids_its_answer(tmp_path: Path) -> None:
    """The coordinator answers NONE for the producer's next transaction, but the abort marker
    of the one the batch belonged to landed while it was asked: the batch must not open a
    transaction (it would hang: no coordinator would ever end it)."""
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        leader = cluster.managers[cluster.leader_id]
        hosted = leader.replicas.partitions[(TOPIC, 0)]
        asked = trio.Event()
        answer = trio.Event()

        async def held_verify(request: TxnProduce) -> ErrorCode:
            asked.set()
            await answer.wait()
            return ErrorCode.none

        leader.writes.verify_transaction = held_verify
        late: list[Any] = []

        async def late_batch() -> None:
            late.append(await send(cluster, txn(7, 0)))

        nursery.start_soon(late_batch)
        await asked.wait()
        assert len(hosted.producers.verifications) == 1
        assert await mark(cluster, end(7, commit=False)) == ErrorCode.none
        answer.set()
        await wait_until("the late batch's answer", lambda: bool(late))
        assert late[0].error == ErrorCode.invalid_txn_state
        # Nothing opened: the LSO is the log end, and no guard is left behind.
        await wait_until("replicas in sync", cluster.in_sync)
        assert lso(cluster, cluster.leader_id) == hosted.log.log_end_offset == 1
        assert len(hosted.producers.verifications) == 0
        await cluster.stop_all()


def test_verifications_of_one_producer_share_a_guard_that_a_marker_voids() -> None:
    guards = VerificationGuards()
    first, second = guards.start(7), guards.start(7)
    assert first is second and guards.holds(7, first)
    guards.finish(7, first)
    assert guards.holds(7, second) and len(guards) == 1
    guards.end_transaction(7)
    third = guards.start(7)
    assert not guards.holds(7, second) and guards.holds(7, third)
    guards.finish(7, second)  # a voided guard's holder finishing leaves the new one
    assert guards.holds(7, third)
    guards.finish(7, third)
    assert len(guards) == 0


async def test_followers_agree_on_the_lso_after_a_leader_change(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        assert (await send(cluster, txn(1, 0))).base_offset == 0
        assert (await send(cluster, txn(2, 0))).base_offset == 2
        assert await mark(cluster, end(2, commit=False)) == ErrorCode.none  # 4
        assert (await send(cluster, plain())).base_offset == 5
        await wait_until("replicas in sync", cluster.in_sync)
        for broker_id in BROKERS:
            assert lso(cluster, broker_id) == 0
        old_leader = cluster.leader_id
        cluster.heartbeat(old_leader, want_fence=True)
        new_leader = cluster.leader_id
        assert new_leader != old_leader
        new = cluster.managers[new_leader]
        hosted = new.replicas.partitions[(TOPIC, 0)]
        await wait_until("the new leader's producer state", lambda: hosted.producers.loaded)
        # The new leader knows transaction 1 is open and 2 aborted, from what it replicated.
        result, records = await read(new, 0, COMMITTED)
        assert result.error == ErrorCode.none and result.last_stable_offset == 0 and not records
        assert await mark(cluster, end(1, commit=True)) == ErrorCode.none  # 6
        cluster.heartbeat(old_leader)
        await wait_until("the ISR to expand", lambda: len(cluster.partition().isr) == 3)
        await wait_until("replicas in sync", cluster.in_sync)
        for broker_id in BROKERS:
            await wait_until(f"broker {broker_id}'s LSO", lambda b=broker_id: lso(cluster, b) == 7)
        result, records = await read(new, 0, COMMITTED)
        assert result.aborted_transactions == ((2, 2),)
        assert [r.offset for r in records] == list(range(7))
        await cluster.stop_all()


async def test_a_read_committed_consumer_reading_one_batch_at_a_time(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        assert (await send(cluster, txn(1, 0, tag="a1"))).error == ErrorCode.none  # 0-1
        assert (await send(cluster, txn(2, 0, tag="b1"))).error == ErrorCode.none  # 2-3
        assert (await send(cluster, plain(b"p1"))).error == ErrorCode.none  # 4
        assert (await send(cluster, txn(1, 2, tag="a2"))).error == ErrorCode.none  # 5-6
        assert await mark(cluster, end(1, commit=False)) == ErrorCode.none  # 7
        assert (await send(cluster, txn(1, 4, tag="a3"))).error == ErrorCode.none  # 8-9
        assert await mark(cluster, end(2, commit=True)) == ErrorCode.none  # 10
        assert await mark(cluster, end(1, commit=True)) == ErrorCode.none  # 11
        leader = cluster.managers[cluster.leader_id]
        reader = CommittedReader()
        while True:
            result = await leader.reads.fetch(TOPIC, 0, reader.next_offset, 1, -1, COMMITTED)
            assert result.error == ErrorCode.none
            if not result.records:
                break
            data = b"".join(trio_read(r) for r in result.records)
            reader.consume(data, result.aborted_transactions)
        assert reader.next_offset == result.last_stable_offset == 12
        assert [r.value for r in reader.records] == [
            b"b1-0",
            b"b1-1",
            b"p1",
            b"a3-4",
            b"a3-5",
        ]
        await cluster.stop_all()


async def test_retention_is_not_held_by_a_transaction_that_never_ends(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        configs = {"segment.bytes": "300", "retention.bytes": "1", "retention.ms": "-1"}
        reply = cluster.handle(CreateTopics((NewTopic("kept", 1, 3, configs=configs),)))
        assert reply.results[0].error_code == ErrorCode.none, reply
        await cluster.settle()
        leader_id = cluster.image.topic("kept").partitions[0].leader  # type: ignore[union-attr]
        leader = cluster.managers[leader_id]

        async def produce(data: bytes) -> None:
            result = await leader.writes.produce("kept", 0, data, -1, 10_000)
            assert result.error == ErrorCode.none, result

        await produce(plain())  # 0
        await produce(txn(1, 0))  # 1-2: opens a transaction nobody ends
        for _ in range(10):
            await produce(plain())
        plog = leader.replicas.partitions[("kept", 0)].log
        assert len(plog.segments) >= 3
        status = leader.partition_states()[("kept", 0)]
        assert status.last_stable_offset == 1
        # Retention stops at the HW only (Kafka's rule): the disk is freed regardless, and the
        # LSO stays at the log start, never below it.
        await leader.run_log_cleanup()
        assert plog.log_start_offset > 1
        status = leader.partition_states()[("kept", 0)]
        assert status.last_stable_offset == plog.log_start_offset < status.high_watermark
        result = await leader.reads.fetch("kept", 0, plog.log_start_offset, 1 << 20, -1, COMMITTED)
        assert result.error == ErrorCode.none and not result.records
        marker = TxnMarkerRequest(1, 0, 0, True, (("kept", 0),))
        (answer,) = await leader.write_txn_markers([marker])
        assert answer[("kept", 0)] == ErrorCode.none
        status = leader.partition_states()[("kept", 0)]
        assert status.last_stable_offset == status.high_watermark == plog.log_end_offset
        await cluster.stop_all()


async def test_a_config_change_during_verification_is_checked_before_the_append(
    tmp_path: Path,
) -> None:
    """The topic turned compacted while a first transactional batch awaited the coordinator:
    its keyless records are refused as they would be had they arrived a moment later."""
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, config=CONFIG)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        leader = cluster.managers[cluster.leader_id]
        hosted = leader.replicas.partitions[(TOPIC, 0)]

        async def verify_while_compaction_starts(request: TxnProduce) -> ErrorCode:
            hosted.log.update_config(
                dataclasses.replace(hosted.log.config, cleanup_policy="compact")
            )
            return ErrorCode.none

        leader.writes.verify_transaction = verify_while_compaction_starts
        refused = await send(cluster, txn(7, 0))
        assert refused.error == ErrorCode.invalid_record
        assert hosted.log.log_end_offset == 0
        await cluster.stop_all()
