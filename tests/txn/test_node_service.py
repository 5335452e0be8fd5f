"""NodeTxnService on two brokers of a fake cluster, on a MockClock.

The services, their shells and the real TxnCoordinators run as on a node; only the node's
edges are fakes: the metadata image (set by the test), the controller (CreateTopics,
AllocateProducerIds), the replica manager (a shared "replicated" log per partition, markers
taken by a partition's leader) and the internal RPC (bodies go through msgpack to the other
service's registered handler).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import msgpack
import trio
import trio.testing

from raftlog.errors import ErrorCode
from raftlog.groups.hashing import partition_for_group
from raftlog.metadata.controller import messages as cm
from raftlog.metadata.image import (
    BrokerRegistration,
    MetadataDelta,
    MetadataImage,
    PartitionState,
    TopicImage,
)
from raftlog.net.kafka.backend import ProduceResult
from raftlog.net.rpc import RpcError
from raftlog.records import iter_batches, iter_records, set_offset_and_epoch
from raftlog.replication.produce import TxnProduce
from raftlog.replication.txn_markers import TxnMarkerRequest
from raftlog.txn import log_format as fmt
from raftlog.txn.log_format import TRANSACTION_STATE_TOPIC
from raftlog.txn.log_format import TransactionState as S
from raftlog.txn.messages import (
    AddOffsetsToTxnRequest,
    AddPartitionsTxn,
    EndTxnRequest,
    EndTxnResult,
    InitProducerIdRequest,
)
from raftlog.txn.node_service import NodeTxnService, start_node_txn_service
from raftlog.txn.rpc_bodies import TXN_MARKERS_METHOD, markers_request
from raftlog.txn.settings import TxnConfig
from tests.txn.harness import txn_id_on
from tests.waiting import wait_until

OFFSETS = "__consumer_offsets"
DATA = "orders"
START_MS = 1_700_000_000_000
CONFIG = TxnConfig(transaction_state_log_num_partitions=2, offsets_topic_num_partitions=2)
NODES = (1, 2)


def trio_clock_ms() -> int:
    return START_MS + math.ceil(trio.current_time() * 1000)


def roundtrip(body: Any) -> Any:
    return msgpack.unpackb(msgpack.packb(body, use_bin_type=True), raw=False)


@dataclass
class Cluster:
    image: MetadataImage = field(default_factory=MetadataImage.empty)
    listeners: list[Any] = field(default_factory=list)
    logs: dict[tuple[str, int], list[bytes]] = field(default_factory=dict)
    rpc: dict[int, dict[str, Any]] = field(default_factory=lambda: {n: {} for n in NODES})
    down: set[int] = field(default_factory=set)
    created: list[cm.NewTopic] = field(default_factory=list)
    # (node, partition, producer id, epoch, coordinator epoch, commit) per marker written.
    written: list[tuple[int, tuple[str, int], int, int, int, bool]] = field(default_factory=list)
    markers_refused: bool = False
    refusals: int = 0  # markers refused while markers_refused was set
    completed: list[tuple[int, int, int, bool]] = field(default_factory=list)
    blocks: int = 0

    def __post_init__(self) -> None:
        brokers = {
            n: BrokerRegistration(
                n, uuid.uuid4(), 1, (f"host-{n}", 9092), (f"host-{n}", 9093), None, fenced=False
            )
            for n in NODES
        }
        self.image = replace(self.image, brokers=brokers)

    def set_topic(self, name: str, leaders: dict[int, tuple[int, int]]) -> None:
        """Create or change `name`: partition -> (leader, leader epoch)."""
        topic_id = self.image.topic_ids_by_name.get(name, uuid.uuid4())
        partitions = {
            p: PartitionState(NODES, NODES, leader, epoch) for p, (leader, epoch) in leaders.items()
        }
        self.image = replace(
            self.image,
            topics_by_id={
                **self.image.topics_by_id,
                topic_id: TopicImage(name, topic_id, partitions),
            },
            topic_ids_by_name={**self.image.topic_ids_by_name, name: topic_id},
        )
        for partition in leaders:
            self.logs.setdefault((name, partition), [])
        for listener in list(self.listeners):
            listener(self.image, MetadataDelta())

    def leader(self, topic: str, partition: int) -> int | None:
        found = self.image.topic(topic)
        state = None if found is None else found.partitions.get(partition)
        return None if state is None else state.leader

    def stored(self, partition: int) -> dict[str, fmt.TransactionLogValue]:
        records: list[fmt.Record] = []
        for batch in self.logs.get((TRANSACTION_STATE_TOPIC, partition), []):
            records.extend((r.key, r.value) for r in iter_records(batch) if r.key is not None)
        return fmt.replay(records)


class FakeMetadata:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    @property
    def image(self) -> MetadataImage:
        return self.cluster.image

    def add_listener(self, listener: Any) -> None:
        self.cluster.listeners.append(listener)
        listener(self.cluster.image, MetadataDelta())


class FakeController:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def call(self, request: Any, *, timeout_ms: int | None = None) -> Any:
        await trio.sleep(0.01)
        if isinstance(request, cm.CreateTopics):
            [topic] = request.topics
            self.cluster.created.append(topic)
            leaders = {p: (NODES[p % 2], 0) for p in range(topic.num_partitions)}
            self.cluster.set_topic(topic.name, leaders)
            return cm.CreateTopicsReply((cm.CreateTopicResult(topic.name),))
        assert isinstance(request, cm.AllocateProducerIds)
        assert request.broker_epoch == 5
        start = 5000 + 100 * self.cluster.blocks
        self.cluster.blocks += 1
        return cm.AllocateProducerIdsReply(producer_id_start=start, producer_id_len=100)


class FakeLog:
    def __init__(self, batches: list[bytes]) -> None:
        self.batches = batches
        self.log_start_offset = 0

    @property
    def log_end_offset(self) -> int:
        return sum(_count(b) for b in self.batches)

    def read(self, offset: int, max_bytes: int, max_offset: int) -> Any:
        data = b"".join(self.batches)
        return SimpleNamespace(read_bytes=lambda: data if offset == 0 else b"")


def _count(batch: bytes) -> int:
    [(_, header)] = list(iter_batches(batch))
    return header.next_offset - header.base_offset


class FakeReplicas:
    def __init__(self, node_id: int, cluster: Cluster) -> None:
        self.node_id, self.cluster = node_id, cluster
        self.writes = SimpleNamespace(produce=self.produce, verify_transaction=None)
        self.replicas = SimpleNamespace(partitions=self)

    def get(self, key: tuple[str, int]) -> Any:
        batches = self.cluster.logs.get(key)
        if batches is None:
            return None

        async def no_cut() -> None:
            await trio.lowlevel.checkpoint()

        log = FakeLog(batches)
        # Appends here are replicated before they return: the HW is the log end.
        leader = SimpleNamespace(high_watermark=log.log_end_offset)
        return SimpleNamespace(
            key=key, log=log, wait_for_log_cut=no_cut, replica=SimpleNamespace(leader=leader)
        )

    async def produce(
        self, topic: str, partition: int, batch: bytes, acks: int, timeout_ms: int
    ) -> ProduceResult:
        assert acks == -1
        await trio.sleep(0.005)
        if self.cluster.leader(topic, partition) != self.node_id:
            return ProduceResult(ErrorCode.not_leader_or_follower)
        log = self.cluster.logs[(topic, partition)]
        stamped = bytearray(batch)
        set_offset_and_epoch(stamped, 0, sum(_count(b) for b in log), 0)
        log.append(bytes(stamped))
        return ProduceResult()

    async def write_txn_markers(
        self, markers: list[TxnMarkerRequest], timeout_ms: int | None = None
    ) -> list[dict[tuple[str, int], ErrorCode]]:
        await trio.sleep(0.005)
        answers = []
        for marker in markers:
            assert isinstance(marker, TxnMarkerRequest)
            answer = {}
            for key in marker.partitions:
                if self.cluster.leader(*key) != self.node_id:
                    answer[key] = ErrorCode.not_leader_or_follower
                elif self.cluster.markers_refused:
                    answer[key] = ErrorCode.not_enough_replicas
                    self.cluster.refusals += 1
                else:
                    answer[key] = ErrorCode.none
                    self.cluster.written.append(
                        (
                            self.node_id,
                            key,
                            marker.producer_id,
                            marker.producer_epoch,
                            marker.coordinator_epoch,
                            marker.commit,
                        )
                    )
            answers.append(answer)
        return answers


class FakePeers:
    """Internal RPC between the fake nodes: msgpack both ways, failures as RpcError."""

    def __init__(self, node_id: int, cluster: Cluster) -> None:
        self.node_id, self.cluster = node_id, cluster

    def peer(self, node_id: int, host: str, port: int) -> Any:
        assert (host, port) == (f"host-{node_id}", 9093)
        cluster, sender = self.cluster, self.node_id

        async def call(method: str, body: Any, *, timeout_s: float = 5.0) -> Any:
            if node_id in cluster.down:
                raise RpcError(f"node {node_id} is not reachable")
            handler = cluster.rpc[node_id][method]
            try:
                return roundtrip(await handler(sender, roundtrip(body)))
            except Exception as exc:
                raise RpcError(type(exc).__name__) from None

        return SimpleNamespace(call=call)


def node_config(node_id: int) -> Any:
    """The NodeConfig fields the service reads."""
    return SimpleNamespace(
        node_id=node_id,
        offsets_topic_num_partitions=2,
        voters={},
        request_timeout_ms=30_000,
        transaction_state_log_replication_factor=3,
        transaction_state_log_min_isr=2,
    )


async def start_cluster(nursery: trio.Nursery, cluster: Cluster) -> dict[int, NodeTxnService]:
    services = {}
    for node_id in NODES:
        replicas = FakeReplicas(node_id, cluster)

        async def complete(
            partition: int, pid: int, committed: bool, node_id: int = node_id
        ) -> None:
            cluster.completed.append((node_id, partition, pid, committed))

        services[node_id] = await start_node_txn_service(
            nursery,
            node_config(node_id),
            FakeMetadata(cluster),
            FakeController(cluster),
            SimpleNamespace(broker_epoch=5),
            replicas,
            FakePeers(node_id, cluster),  # type: ignore[arg-type]
            cluster.rpc[node_id],
            complete,
            txn_config=CONFIG,
            clock_ms=trio_clock_ms,
        )
        assert replicas.writes.verify_transaction == services[node_id].verify
    return services


async def find(service: NodeTxnService, txn_id: str) -> int:
    """FindCoordinator until answered, as a client does; the coordinator's node id."""
    location = await wait_until(
        "a coordinator",
        lambda: _found(service, txn_id),
        60,
    )
    return int(location.node_id)


async def _found(service: NodeTxnService, txn_id: str) -> Any:
    location = await service.coordinator_for(txn_id)
    return location if location.error_code is ErrorCode.none else None


async def init(service: NodeTxnService, txn_id: str) -> tuple[int, int]:
    async def attempt() -> Any:
        result = await service.init_producer_id(InitProducerIdRequest(txn_id, 60_000))
        return result if result.error_code is ErrorCode.none else None

    result = await wait_until("InitProducerId", attempt, 60)
    return result.producer_id, result.producer_epoch


async def test_find_coordinator_creates_the_topic_then_names_the_leader(autojump_clock) -> None:
    cluster = Cluster()
    async with trio.open_nursery() as nursery:
        services = await start_cluster(nursery, cluster)
        first = await services[2].coordinator_for("tx")
        assert first.error_code is ErrorCode.coordinator_not_available
        await services[2].coordinator_for("tx")  # one creation in flight, not two
        node = await find(services[2], "tx")
        [created] = cluster.created
        assert created.name == TRANSACTION_STATE_TOPIC
        assert created.num_partitions == 2
        assert created.replication_factor == 2  # Kafka's 3, capped by the live brokers
        assert created.configs == {"cleanup.policy": "compact", "min.insync.replicas": "2"}
        partition = CONFIG.partition_for("tx")
        assert node == cluster.leader(TRANSACTION_STATE_TOPIC, partition)
        location = await services[1].coordinator_for("tx")
        assert (location.host, location.port) == (f"host-{node}", 9092)
        # Each node coordinates the partitions it leads, at their leader epochs.
        assert services[1].shell.partitions == {0: 0}
        assert services[2].shell.partitions == {1: 0}
        nursery.cancel_scope.cancel()


async def test_commit_across_brokers_writes_every_marker_and_completes_offsets(
    autojump_clock,
) -> None:
    cluster = Cluster()
    txn_id = txn_id_on(0, CONFIG)  # partition 0: coordinated by node 1
    cluster.set_topic(DATA, {0: (1, 0), 1: (2, 0)})
    cluster.set_topic(OFFSETS, {0: (2, 0), 1: (1, 0)})
    async with trio.open_nursery() as nursery:
        services = await start_cluster(nursery, cluster)
        coordinator = await find(services[2], txn_id)
        assert coordinator == 1
        wrong = await services[2].init_producer_id(InitProducerIdRequest(txn_id, 60_000))
        assert wrong.error_code is ErrorCode.not_coordinator
        coord = services[1]
        pid, epoch = await init(coord, txn_id)
        assert pid >= 5000  # from the controller's block
        [added] = await coord.add_partitions_to_txn(
            [AddPartitionsTxn(txn_id, pid, epoch, ((DATA, 0), (DATA, 1)))]
        )
        assert set(added.errors.values()) == {ErrorCode.none}
        group = next(g for g in (f"g{n}" for n in range(100)) if _offsets_partition(g) == 0)
        code = await coord.add_offsets_to_txn(AddOffsetsToTxnRequest(txn_id, pid, epoch, group))
        assert code is ErrorCode.none

        # KIP-890: node 2 leads orders-1 and asks node 1, the coordinator, over RPC.
        verify = services[2].verify
        assert await verify(TxnProduce(txn_id, pid, epoch, DATA, 1)) is ErrorCode.none
        assert await verify(TxnProduce(txn_id, pid, epoch, DATA, 7)) is ErrorCode.invalid_txn_state
        fenced = await verify(TxnProduce(txn_id, pid, epoch + 1, DATA, 1))
        assert fenced is ErrorCode.invalid_producer_epoch
        assert await services[1].verify(TxnProduce(txn_id, pid, epoch, DATA, 0)) is ErrorCode.none

        result = await coord.end_txn(EndTxnRequest(txn_id, pid, epoch, committed=True))
        assert result.error_code is ErrorCode.none
        await wait_until(
            "CompleteCommit", lambda: cluster.stored(0)[txn_id].state is S.COMPLETE_COMMIT, 60
        )
        assert sorted(cluster.written) == [
            (1, (DATA, 0), pid, epoch, 0, True),
            (2, (OFFSETS, 0), pid, epoch, 0, True),
            (2, (DATA, 1), pid, epoch, 0, True),
        ]
        # The offsets partition's leader told its group coordinator.
        assert cluster.completed == [(2, 0, pid, True)]
        listed = await services[1].list_transactions([], [], -1)
        assert [(t.transactional_id, t.state) for t in listed.transactions] == [
            (txn_id, "CompleteCommit")
        ]
        nursery.cancel_scope.cancel()


def _offsets_partition(group: str) -> int:
    return partition_for_group(group, CONFIG.offsets_topic_num_partitions)


async def test_verify_without_a_coordinator_is_retriable_for_the_producer(autojump_clock) -> None:
    cluster = Cluster()
    txn_id = txn_id_on(1, CONFIG)
    async with trio.open_nursery() as nursery:
        services = await start_cluster(nursery, cluster)
        request = TxnProduce(txn_id, 5000, 0, DATA, 0)
        # No `__transaction_state` yet: NOT_ENOUGH_REPLICAS, which every producer retries.
        assert await services[1].verify(request) is ErrorCode.not_enough_replicas
        no_id = TxnProduce(None, 5000, 0, DATA, 0)
        assert await services[1].verify(no_id) is ErrorCode.invalid_txn_state
        await find(services[1], txn_id)
        # The coordinator (node 2) is unreachable, then reachable without this producer.
        cluster.down.add(2)
        assert await services[1].verify(request) is ErrorCode.not_enough_replicas
        cluster.down.clear()
        # (Whether node 2 still loads its partition while node 1 waited is a race: wait.)
        await services[2].shell.wait_loaded(1)
        assert await services[1].verify(request) is ErrorCode.invalid_producer_id_mapping
        # Leaderless: NOT_ENOUGH_REPLICAS again.
        cluster.set_topic(TRANSACTION_STATE_TOPIC, {0: (1, 0), 1: (-1, 1)})
        assert await services[1].verify(request) is ErrorCode.not_enough_replicas
        assert services[2].shell.partitions == {}
        nursery.cancel_scope.cancel()


async def test_refused_markers_are_retried_after_their_backoff_not_the_next_scan(
    autojump_clock,
) -> None:
    """The shell's timer loop sleeps until the earliest coordinator deadline it knows (here
    the timed-out transaction scan, 10 s away); a marker retry due sooner must wake it."""
    cluster = Cluster()
    txn_id = txn_id_on(0, CONFIG)
    cluster.set_topic(DATA, {0: (1, 0)})
    async with trio.open_nursery() as nursery:
        services = await start_cluster(nursery, cluster)
        assert await find(services[1], txn_id) == 1
        pid, epoch = await init(services[1], txn_id)
        await services[1].add_partitions_to_txn(
            [AddPartitionsTxn(txn_id, pid, epoch, ((DATA, 0),))]
        )
        cluster.markers_refused = True
        answers: list[EndTxnResult] = []

        async def commit() -> None:
            request = EndTxnRequest(txn_id, pid, epoch, committed=True)
            answers.append(await services[1].end_txn(request))

        nursery.start_soon(commit)
        await wait_until("a refused marker", lambda: cluster.refusals > 0, 60)
        # A commit of one partition is answered once its marker is written, not before.
        assert answers == []
        cluster.markers_refused = False
        refused_s = trio.current_time()
        await wait_until(
            "CompleteCommit", lambda: cluster.stored(0)[txn_id].state is S.COMPLETE_COMMIT, 60
        )
        # transaction_marker_retry_backoff_ms is 100: far sooner than the scan.
        assert trio.current_time() - refused_s < 1.0
        assert [a.error_code for a in answers] == [ErrorCode.none]
        nursery.cancel_scope.cancel()


async def test_failover_mid_commit_the_new_leader_finishes_it(autojump_clock) -> None:
    cluster = Cluster()
    txn_id = txn_id_on(0, CONFIG)
    cluster.set_topic(DATA, {0: (1, 0), 1: (2, 0)})
    async with trio.open_nursery() as nursery:
        services = await start_cluster(nursery, cluster)
        assert await find(services[1], txn_id) == 1
        pid, epoch = await init(services[1], txn_id)
        await services[1].add_partitions_to_txn(
            [AddPartitionsTxn(txn_id, pid, epoch, ((DATA, 0), (DATA, 1)))]
        )
        cluster.markers_refused = True  # markers fail (and are retried) until the failover
        result = await services[1].end_txn(EndTxnRequest(txn_id, pid, epoch, committed=True))
        assert result.error_code is ErrorCode.none
        assert cluster.stored(0)[txn_id].state is S.PREPARE_COMMIT

        # Node 2 takes `__transaction_state`-0 over at leader epoch 1 and replays it.
        cluster.set_topic(TRANSACTION_STATE_TOPIC, {0: (2, 1), 1: (2, 0)})
        assert services[1].shell.partitions == {}
        assert services[2].shell.partitions == {0: 1, 1: 0}
        cluster.markers_refused = False
        await wait_until(
            "CompleteCommit", lambda: cluster.stored(0)[txn_id].state is S.COMPLETE_COMMIT, 60
        )
        # The new coordinator wrote the markers again with its own epoch (a marker of the
        # old one may land too: it was in flight when leadership moved).
        assert {(w[1], w[4]) for w in cluster.written if w[4] == 1} == {
            ((DATA, 0), 1),
            ((DATA, 1), 1),
        }
        described = await services[2].describe_transactions([txn_id])
        assert described[0].state == "CompleteCommit"
        nursery.cancel_scope.cancel()


async def test_internal_methods_refuse_unknown_nodes_and_bad_bodies(autojump_clock) -> None:
    cluster = Cluster()
    cluster.set_topic(DATA, {0: (1, 0)})
    async with trio.open_nursery() as nursery:
        await start_cluster(nursery, cluster)
        handle = cluster.rpc[1][TXN_MARKERS_METHOD]
        body = roundtrip(markers_request(5000, 0, 0, True, ((DATA, 0),)))
        try:
            await handle(99, body)
        except Exception as exc:
            assert type(exc).__name__ == "NotABrokerError"
        else:
            raise AssertionError("a marker from node 99 was accepted")
        bad = dict(body, coordinator_epoch=-5)
        try:
            await handle(2, bad)
        except Exception as exc:
            assert type(exc).__name__ == "DecodeError"
        else:
            raise AssertionError("a marker with coordinator epoch -5 was accepted")
        assert cluster.written == []
        # A broker, but not a coordinator at the marker's epoch: refused too.
        try:
            await handle(2, body)
        except Exception as exc:
            assert type(exc).__name__ == "NotACoordinatorError"
        else:
            raise AssertionError("a marker from a non-coordinator was accepted")
        assert cluster.written == []
        cluster.set_topic(TRANSACTION_STATE_TOPIC, {0: (2, 0)})
        answer = await handle(2, body)
        assert answer == {"results": [[DATA, 0, 0]]}
        # Never a marker on the coordinator's own log, even from a coordinator.
        written = list(cluster.written)
        internal = roundtrip(markers_request(5000, 0, 0, True, ((TRANSACTION_STATE_TOPIC, 0),)))
        answer = await handle(2, internal)
        refused = [TRANSACTION_STATE_TOPIC, 0, ErrorCode.invalid_topic_exception]
        assert answer == {"results": [refused]}
        assert cluster.written == written
        nursery.cancel_scope.cancel()
