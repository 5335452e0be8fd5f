"""The transaction code under a hostile client, a hostile or buggy peer and bad bytes.

Each test names what an attacker (a principal without CLUSTER_ACTION, or a peer broker) sends
and what must hold. Tests marked xfail(strict=True) demonstrate a weakness that is still open:
they fail today, and turn into plain regression tests once the code is fixed (the marker is
then removed). The others pin what already holds.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel

from raftlog.batch_validation import validate_client_batches
from raftlog.codec import I32_MAX
from raftlog.errors import ErrorCode, KafkaError
from raftlog.net.kafka.apis import ApiKey
from raftlog.net.kafka.backend import ProducerInfo
from raftlog.records import Record, build_batch, build_txn_marker
from raftlog.replication.produce import TxnProduce
from raftlog.replication.txn_markers import TxnMarkerRequest
from raftlog.txn import log_format as fmt
from raftlog.txn.coordinator import TxnCoordinator
from raftlog.txn.log_format import TransactionLogValue
from raftlog.txn.log_format import TransactionState as S
from raftlog.txn.rpc_bodies import TXN_MARKERS_METHOD, markers_request
from raftlog.txn.settings import TxnConfig
from tests.kafka.test_txn_handlers import TOPIC, Env, txn_batch
from tests.kafka.test_txn_handlers import env as env
from tests.waiting import wait_until

E = ErrorCode
NOW_MS = 1_700_000_000_000


def _batch(pid: int, epoch: int, seq: int, *, transactional: bool) -> bytes:
    return build_batch(
        [Record(key=b"k", value=b"v")],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        is_transactional=transactional,
        now_ms=NOW_MS,
    )


# ---------------------------------------------------------------- produce path (KIP-890)
class _Coordinator:
    """What the transaction coordinator would answer: (transactional id, producer id,
    epoch) -> partitions of its ongoing transaction. Records every question."""

    def __init__(self) -> None:
        self.ongoing: dict[tuple[str, int, int], set[tuple[str, int]]] = {}
        self.asked: list[TxnProduce] = []

    async def verify(self, request: TxnProduce) -> ErrorCode:
        self.asked.append(request)
        owner = (request.transactional_id or "", request.producer_id, request.producer_epoch)
        partitions = self.ongoing.get(owner)
        if partitions is None:
            return E.invalid_producer_id_mapping
        if (request.topic, request.partition) not in partitions:
            return E.invalid_txn_state
        return E.none


async def _victim_with_open_transaction(tmp_path: Path, nursery: trio.Nursery) -> Any:
    """Three real replicas; producer 61 (transactional id "victim", epoch 4) has a verified
    transaction open on orders-0. Returns (cluster, leader manager, coordinator)."""
    from tests.replication.test_manager import TOPIC as REPLICATED
    from tests.replication.test_manager import start_cluster

    cluster = await start_cluster(tmp_path, nursery)
    await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
    leader = cluster.managers[cluster.leader_id]
    coordinator = _Coordinator()
    coordinator.ongoing[("victim", 61, 4)] = {(REPLICATED, 0)}
    leader.writes.verify_transaction = coordinator.verify
    written = await leader.writes.produce(
        REPLICATED, 0, txn_batch(61, 4, 0), -1, 10_000, ProducerInfo(transactional_id="victim")
    )
    assert written.error == E.none, written
    return cluster, leader, coordinator


def _open_txn_first_offset(manager: Any, pid: int) -> int:
    from tests.replication.test_manager import TOPIC as REPLICATED

    hosted = manager.replicas.partitions[(REPLICATED, 0)]
    entry = hosted.producers.table.get(pid)
    return -1 if entry is None else int(entry.current_txn_first_offset)


async def test_a_transactional_batch_with_a_bumped_epoch_cannot_skip_verification(
    tmp_path: Path,
) -> None:
    """An attacker with WRITE on the topic and on its own transactional id only, who read
    the victim's producer id (DescribeProducers, READ on the topic), writes a transactional
    batch of the victim's producer id at epoch+1, sequence 0. Kafka verifies it (its
    hasOngoingTransaction compares the epoch too) and the coordinator refuses it."""
    from tests.replication.test_manager import TOPIC as REPLICATED

    async with trio.open_nursery() as nursery:
        cluster, leader, coordinator = await _victim_with_open_transaction(tmp_path, nursery)
        coordinator.ongoing[("attacker", 99, 0)] = {(REPLICATED, 0)}
        asked_before = len(coordinator.asked)
        forged = await leader.writes.produce(
            REPLICATED,
            0,
            txn_batch(61, 5, 0),
            -1,
            10_000,
            ProducerInfo(transactional_id="attacker"),
        )
        verified = [(q.producer_id, q.producer_epoch) for q in coordinator.asked[asked_before:]]
        # The victim's coordinator ends its transaction: the marker must land and the
        # partition must be stable again.
        (marker,) = await leader.write_txn_markers(
            [TxnMarkerRequest(61, 4, 0, True, ((REPLICATED, 0),))]
        )
        still_open = _open_txn_first_offset(leader, 61)
        await cluster.stop_all()
    assert (61, 5) in verified, "the epoch-5 batch was appended unverified"
    assert (forged.error, marker, still_open) == (
        E.invalid_producer_id_mapping,
        {(REPLICATED, 0): E.none},
        -1,
    )


async def test_a_plain_batch_cannot_bump_the_epoch_of_an_open_transaction(tmp_path: Path) -> None:
    """No transactional id and no verification needed: an idempotent (non-transactional)
    batch of the victim's producer id at epoch+1, sequence 0, needs only WRITE on the topic.
    Accepted, it moves the producer's epoch past the transaction's, the coordinator's
    COMMIT marker is refused as stale, the coordinator stalls, and the partition's last
    stable offset stays at the transaction's first offset for ever."""
    from tests.replication.test_manager import TOPIC as REPLICATED

    async with trio.open_nursery() as nursery:
        cluster, leader, _ = await _victim_with_open_transaction(tmp_path, nursery)
        forged = await leader.writes.produce(
            REPLICATED, 0, _batch(61, 5, 0, transactional=False), -1, 10_000, ProducerInfo()
        )
        (marker,) = await leader.write_txn_markers(
            [TxnMarkerRequest(61, 4, 0, True, ((REPLICATED, 0),))]
        )
        still_open = _open_txn_first_offset(leader, 61)
        await cluster.stop_all()
    assert (forged.error, marker, still_open) == (
        E.invalid_txn_state,
        {(REPLICATED, 0): E.none},
        -1,
    )


# ---------------------------------------------------------------- client requests
async def test_describe_producers_answers_a_repeated_partition_once(env: Env) -> None:
    """A principal with READ on one topic names the same partition MAX_DESCRIBED_PARTITIONS
    times: at up to max_producer_ids (10 000) producers each, one request builds 10 million
    producer entries. The partition must be answered once, as every other transaction API
    answers a repeated partition."""
    from raftlog.net.kafka.handlers_txn_partitions import MAX_DESCRIBED_PARTITIONS

    producers = 20
    for pid in range(100, 100 + producers):
        result = await env.backend.produce(
            TOPIC, 0, _batch(pid, 0, 0, transactional=False), -1, 5000, ProducerInfo()
        )
        assert result.error == E.none
    response = await env.call(
        ApiKey.DESCRIBE_PRODUCERS,
        0,
        topics=[{"name": TOPIC, "partition_indexes": [0] * MAX_DESCRIBED_PARTITIONS}],
    )
    answered = [p for t in response.topics for p in t.partitions]
    entries = sum(len(p.active_producers) for p in answered)
    assert (len(answered), entries) == (1, producers)


@pytest.mark.parametrize("internal", ["__transaction_state", "__consumer_offsets"])
async def test_clients_cannot_produce_to_the_coordinators_topics(env: Env, internal: str) -> None:
    """What holds: a client's produce to an internal topic is refused before any byte is
    appended, so no client-made record reaches a coordinator's load."""
    record = fmt.record(
        "poison",
        TransactionLogValue(1, 0, 60_000, S.PREPARE_COMMIT, ((internal, 0),), NOW_MS, NOW_MS),
    )
    batch = build_batch([Record(key=record[0], value=record[1])], now_ms=NOW_MS)
    response = await env.call(
        ApiKey.PRODUCE,
        9,
        transactional_id=None,
        acks=-1,
        timeout=5000,
        topic_data=[{"name": internal, "partition_data": [{"index": 0, "records": batch}]}],
    )
    (topic,) = response.responses
    (partition,) = topic.partition_responses
    assert partition.error_code == E.invalid_topic_exception


@pytest.mark.parametrize(
    "batch",
    [
        pytest.param(_batch(-1, 0, 0, transactional=True), id="transactional-without-producer"),
        pytest.param(
            build_txn_marker(
                producer_id=7, producer_epoch=0, coordinator_epoch=0, commit=True, timestamp_ms=0
            ),
            id="control-batch",
        ),
    ],
)
def test_clients_cannot_write_markers_or_producerless_transactions(batch: bytes) -> None:
    """What holds: batch validation (every client produce) refuses a control batch (a
    forged COMMIT/ABORT) and a transactional batch without a producer id (which no
    coordinator could verify or end)."""
    with pytest.raises(KafkaError) as refused:
        validate_client_batches(batch, max_message_bytes=1 << 20, require_keys=False)
    assert refused.value.code in (E.invalid_record, E.corrupt_message)


# ---------------------------------------------------------------- internal RPC
@pytest.mark.parametrize(
    ("coordinator_epoch", "partition"),
    [
        pytest.param(I32_MAX, ("orders", 0), id="epoch-from-a-non-coordinator"),
        pytest.param(3, ("__transaction_state", 0), id="marker-on-the-coordinator-log"),
    ],
)
async def test_txn_markers_rpc_only_from_the_coordinator_and_for_data_partitions(
    autojump_clock: Any, coordinator_epoch: int, partition: tuple[str, int]
) -> None:
    """Broker 2 leads no `__transaction_state` partition (node 1 leads both, at epoch 3),
    yet its "txn.markers" call is written. With coordinator epoch 2**31-1 it ends another
    producer's transaction, and the partition then refuses every later marker of that
    producer from the real coordinator (TRANSACTION_COORDINATOR_FENCED: its epoch is lower),
    which stalls: the next transaction of the producer hangs. A marker on
    `__transaction_state` puts a control batch in the coordinator's own log."""
    from raftlog.txn.log_format import TRANSACTION_STATE_TOPIC
    from tests.txn.test_node_service import Cluster, roundtrip, start_cluster

    cluster = Cluster()
    cluster.set_topic("orders", {0: (1, 0)})
    cluster.set_topic(TRANSACTION_STATE_TOPIC, {0: (1, 3), 1: (1, 3)})
    async with trio.open_nursery() as nursery:
        await start_cluster(nursery, cluster)
        handle = cluster.rpc[1][TXN_MARKERS_METHOD]
        body = roundtrip(markers_request(5000, 0, coordinator_epoch, False, (partition,)))
        try:
            answer = await handle(2, body)
        except KafkaError:
            answer = None  # refused: the fix may raise or answer an error code
        nursery.cancel_scope.cancel()
    assert cluster.written == [], answer


# ---------------------------------------------------------------- __transaction_state load
@pytest.mark.parametrize(
    ("start_ms", "timeout_ms"),
    [
        pytest.param(2**62, 60_000, id="start-in-the-far-future"),
        pytest.param(NOW_MS, 2**31 - 1, id="timeout-above-the-maximum"),
    ],
)
def test_a_loaded_transaction_is_still_aborted_within_the_maximum_timeout(
    start_ms: int, timeout_ms: int
) -> None:
    """A record that decodes and passes every range check (CRC-correct: written by a buggy
    or older writer, or replicated from a damaged leader) holds an Ongoing transaction on
    orders-0. Whatever it says, the coordinator must abort it once
    transaction_max_timeout_ms passed, or the partition's read_committed consumers and
    compaction are stuck behind it for ever (days, or 146 000 years)."""
    config = TxnConfig(transaction_state_log_num_partitions=1)
    coordinator = TxnCoordinator(0, 1, config, allocate_producer_id=lambda: None)
    value = TransactionLogValue(7, 0, timeout_ms, S.ONGOING, (("orders", 0),), start_ms, start_ms)
    assert value.check() is None  # what the load accepts today
    coordinator.load([fmt.record("loaded", value)], NOW_MS)
    later_ms = (
        NOW_MS
        + config.transaction_max_timeout_ms
        + config.transaction_abort_timed_out_transaction_cleanup_interval_ms
    )
    fx = coordinator.tick(later_ms)
    aborting = [a for a in fx.appends for key, _ in a.records if fmt.decode_key(key) == "loaded"]
    assert aborting, "the loaded transaction is never timed out"


def test_a_loaded_complete_transaction_brings_no_partitions_into_the_next_one() -> None:
    """A CompleteCommit record naming `__cluster_metadata-0` (a writer bug or damage that
    kept its CRC) passes the load; the producer's next transaction, on orders-0 only, then
    writes its COMMIT marker on `__cluster_metadata-0` too."""
    from raftlog.txn.messages import AddPartitionsTxn, EndTxnRequest

    config = TxnConfig(transaction_state_log_num_partitions=1)
    coordinator = TxnCoordinator(0, 1, config, allocate_producer_id=lambda: None)
    value = TransactionLogValue(
        7, 0, 60_000, S.COMPLETE_COMMIT, (("__cluster_metadata", 0),), NOW_MS, NOW_MS
    )
    try:
        coordinator.load([fmt.record("x", value)], NOW_MS)
    except fmt.TxnLogRecordError:
        return  # refused at load: what the fix may do
    add = AddPartitionsTxn("x", 7, 0, (("orders", 0),))
    fx = coordinator.add_partitions_to_txn(1, [add], NOW_MS)
    for append in fx.appends:
        coordinator.on_append_done(append.append_id, E.none, NOW_MS)
    fx = coordinator.end_txn(2, EndTxnRequest("x", 7, 0, True), NOW_MS)
    # One partition: a one-phase commit sends its marker at once.
    marked: list[tuple[str, int]] = [p for m in fx.markers for p in m.partitions]
    for append in fx.appends:
        done = coordinator.on_append_done(append.append_id, E.none, NOW_MS)
        marked.extend(p for m in done.markers for p in m.partitions)
    assert marked == [("orders", 0)]


async def test_produce_errors_do_not_reveal_another_producers_epoch_or_sequence(
    tmp_path: Path,
) -> None:
    """Anyone who may write to the topic (anonymous on PLAINTEXT without an authorizer) can
    probe any producer id: the answers tell its current epoch and last sequence, exactly
    what forging a batch of that producer needs (the two tests above, or appending into its
    open transaction). The error code alone tells a real producer what to do."""
    import re

    from tests.replication.test_manager import TOPIC as REPLICATED

    async with trio.open_nursery() as nursery:
        cluster, leader, _ = await _victim_with_open_transaction(tmp_path, nursery)
        stale = await leader.writes.produce(
            REPLICATED, 0, _batch(61, 3, 0, transactional=False), -1, 10_000, ProducerInfo()
        )
        gap = await leader.writes.produce(
            REPLICATED, 0, txn_batch(61, 4, 9), -1, 10_000, ProducerInfo(transactional_id="x")
        )
        await cluster.stop_all()
    assert (stale.error, gap.error) == (E.invalid_producer_epoch, E.out_of_order_sequence_number)
    # The victim is at epoch 4, its last sequence is 1 (txn_batch holds two records).
    assert not re.search(r"\b4\b", stale.error_message or ""), stale.error_message
    assert not re.search(r"\b1\b", gap.error_message or ""), gap.error_message


async def test_describe_transactions_answers_a_repeated_id_once(env: Env) -> None:
    from raftlog.net.kafka.handlers_txn import MAX_IDS_PER_REQUEST

    await env.begin("tx-open", 0, 1)
    states = await env.describe(*(["tx-open"] * MAX_IDS_PER_REQUEST))
    assert len(states) == 1


# ---------------------------------------------------------------- work per event-loop step
async def _ticks_while(n_records: int, what: str) -> int:
    """How often a task that only yields ran while the shell loaded `n_records` Empty
    transactions (what="load") or listed them (what="list"): 0 more for more records
    means the work ran in one event-loop step."""
    from tests.txn.test_shell import CONFIG, START_MS, FakeNode, start_shell

    node = FakeNode()
    # Ids the shell's config routes to partition 0 (a coordinator skips others' ids).
    ids = (f"id-{n}" for n in itertools.count())
    ours = itertools.islice((i for i in ids if CONFIG.partition_for(i) == 0), n_records)
    node.log[0] = [
        fmt.record(txn_id, TransactionLogValue(1000 + i, 0, 60_000, S.EMPTY, (), START_MS, -1))
        for i, txn_id in enumerate(ours)
    ]
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.lowlevel.checkpoint()
        before = ticks
        shell = await start_shell(nursery, node, partitions=(0,))
        loaded = ticks - before
        await trio.lowlevel.checkpoint()
        before = ticks
        listed = await shell.list_transactions()
        assert len(listed.transactions) == n_records
        listing = ticks - before
        nursery.cancel_scope.cancel()
    return loaded if what == "load" else listing


@pytest.mark.parametrize("what", ["load", "list"])
async def test_loading_and_listing_many_transactions_let_the_node_run(
    autojump_clock: Any, what: str
) -> None:
    """ListTransactions needs no permission to be asked (the DESCRIBE filter runs after the
    whole list is built), and a partition is loaded at every leadership change: both must
    yield to the event loop as they go (20 000 records take ~0.2 s of one step here; a
    partition may hold millions)."""
    small = await _ticks_while(100, what)
    large = await _ticks_while(20_000, what)
    # One yield per few thousand records would do; the machinery around adds a handful.
    assert large >= small + 10, (small, large)


def test_one_produce_of_many_transactional_producers_is_linear_work() -> None:
    """One partition's data of 20 000 tiny transactional batches, each of a different
    producer id: every one would open a transaction, and finding the repeated ones must not
    compare each with all the others. Needs WRITE on the topic and on any transactional id
    (nothing at all without an authorizer): validation refuses none of it."""
    import time

    from raftlog.replication.core.producer_table import ProducerStateTable
    from raftlog.replication.produce import _opening_transactions
    from raftlog.replication.producer_state import ProducerStateConfig

    batches = 20_000
    data = b"".join(
        build_batch(
            [Record(key=None, value=b"")],
            producer_id=pid,
            producer_epoch=0,
            base_sequence=0,
            is_transactional=True,
            now_ms=NOW_MS,
        )
        for pid in range(batches)
    )
    assert len(data) < 1_400_000
    headers = validate_client_batches(data, max_message_bytes=1 << 20, require_keys=False)
    started = time.perf_counter()
    opening = _opening_transactions(ProducerStateTable(ProducerStateConfig()), headers)
    elapsed_s = time.perf_counter() - started
    assert len(opening) == batches
    # A set makes this ~10 ms; 1 s leaves room for a loaded machine.
    assert elapsed_s < 1.0, f"{elapsed_s:.1f} s in one event-loop step"


async def test_kip360_recovery_with_a_guessed_producer_needs_write_on_the_id(env: Env) -> None:
    """What holds: InitProducerId naming another principal's transactional id with its
    (guessed or described) producer id and epoch is refused before the coordinator is
    asked; the victim keeps its epoch and its open transaction."""
    from raftlog.security.acl import AclOperation, ResourceType
    from tests.kafka.test_txn_handlers import acl

    pid, epoch = await env.begin("tx-victim", 0)
    env.set_acls(
        acl(ResourceType.TRANSACTIONAL_ID, "tx-mine", AclOperation.WRITE),
        acl(ResourceType.TOPIC, TOPIC, AclOperation.WRITE),
    )
    for version in (3, 4):
        answer = await env.init("tx-victim", version, pid=pid, epoch=epoch)
        assert (answer.error_code, answer.producer_id, answer.producer_epoch) == (
            E.transactional_id_authorization_failed,
            -1,
            -1,
        )
    env.authorizer = None
    (state,) = await env.describe("tx-victim")
    assert (state.producer_id, state.producer_epoch, state.transaction_state) == (
        pid,
        epoch,
        "Ongoing",
    )


def test_a_loaded_id_of_another_partition_is_skipped() -> None:
    """A CRC-correct record of an id that routes to another partition (a writer bug, damage,
    a changed partition count) would leave an Ongoing transaction no client can reach: its
    producer is sent to the other coordinator, and nothing here would ever time it out."""
    from tests.txn.harness import txn_id_on

    config = TxnConfig(transaction_state_log_num_partitions=2)
    coordinator = TxnCoordinator(0, 1, config, allocate_producer_id=lambda: None)
    stray, own = txn_id_on(1, config), txn_id_on(0, config)
    ongoing = TransactionLogValue(7, 0, 60_000, S.ONGOING, (("orders", 0),), NOW_MS, NOW_MS)
    coordinator.load([fmt.record(stray, ongoing), fmt.record(own, ongoing)], NOW_MS)
    assert set(coordinator.transactions) == {own}
