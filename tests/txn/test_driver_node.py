"""The transaction coordinator wired into three in-process nodes: real RPC on loopback, real
logs, the real replica manager and controller. A transactional produce is verified through
its coordinator (KIP-890), then committed: the markers reach the leaders of both partitions
(one of them, at least, over "txn.markers") and the transaction completes."""

from __future__ import annotations

import functools

import trio

from raftlog.errors import ErrorCode
from raftlog.node import Node
from raftlog.records import Record, build_batch
from raftlog.replication.produce import TxnProduce
from raftlog.txn import node_service
from raftlog.txn.messages import AddPartitionsTxn, EndTxnRequest, InitProducerIdRequest
from raftlog.txn.settings import TxnConfig
from tests.metadata.test_node_quorum import Cluster, create_topic, make_configs
from tests.waiting import wait_until

TOPIC = "orders"


async def test_a_transaction_commits_across_three_nodes(tmp_path, monkeypatch) -> None:
    # Three `__transaction_state` partitions instead of Kafka's 50: the test stays light.
    monkeypatch.setattr(
        node_service,
        "TxnConfig",
        functools.partial(TxnConfig, transaction_state_log_num_partitions=3),
    )
    async with trio.open_nursery() as nursery:
        cluster = Cluster(nursery, make_configs(tmp_path))
        await cluster.start_all()
        nodes = cluster.nodes
        result = await create_topic(nodes[1], TOPIC, partitions=2, rf=3)
        assert result.error_code == ErrorCode.none, result

        leaders = {}
        for partition in (0, 1):
            await wait_until(
                f"{TOPIC}-{partition} has a leader",
                functools.partial(_leads, nodes[1], partition),
                wake=cluster.any_change,
            )
            leaders[partition] = _leader(nodes[1], TOPIC, partition)

        async def located(txn_id: str) -> int | None:
            assert nodes[1].txn is not None
            location = await nodes[1].txn.coordinator_for(txn_id)
            return location.node_id if location.error_code is ErrorCode.none else None

        # The first FindCoordinator creates `__transaction_state`; then pick an id whose
        # coordinator does not lead orders-0, so its marker goes over "txn.markers".
        await wait_until("a coordinator", lambda: located("any"), wake=cluster.any_change)
        for n in range(1000):
            txn_id = f"driver-tx-{n}"
            coordinator_id = await wait_until(
                "a coordinator", functools.partial(located, txn_id), wake=cluster.any_change
            )
            if coordinator_id != leaders[0]:
                break
        else:
            raise AssertionError(f"node {leaders[0]} leads every __transaction_state partition")
        coordinator = nodes[coordinator_id].txn
        assert coordinator is not None
        producer = _Producer(txn_id)

        async def initialized() -> object:
            assert coordinator is not None
            answer = await coordinator.init_producer_id(InitProducerIdRequest(txn_id, 60_000))
            return answer if answer.error_code is ErrorCode.none else None

        init = await wait_until("InitProducerId", initialized, wake=cluster.any_change)
        pid, epoch = init.producer_id, init.producer_epoch
        partitions = ((TOPIC, 0), (TOPIC, 1))
        [added] = await coordinator.add_partitions_to_txn(
            [AddPartitionsTxn(txn_id, pid, epoch, partitions)]
        )
        assert set(added.errors.values()) == {ErrorCode.none}, added

        # A transactional batch opens the transaction on each partition's leader, which asks
        # the coordinator first (over txn.verify when it is another node).
        for partition, leader_id in leaders.items():
            leader = nodes[leader_id]
            assert leader.txn is not None and leader.replicas is not None
            request = TxnProduce(txn_id, pid, epoch, TOPIC, partition)
            assert await leader.txn.verify(request) is ErrorCode.none
            stranger = TxnProduce(txn_id, pid, epoch, "elsewhere", 0)
            assert await leader.txn.verify(stranger) is ErrorCode.invalid_txn_state
            batch = build_batch(
                [Record(key=b"k", value=b"v")],
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=0,
                is_transactional=True,
            )
            produced = await leader.replicas.writes.produce(
                TOPIC, partition, batch, -1, 10_000, producer=producer
            )
            assert produced.error == ErrorCode.none, produced

        ended = await coordinator.end_txn(EndTxnRequest(txn_id, pid, epoch, committed=True))
        assert ended.error_code is ErrorCode.none

        async def completed() -> bool:
            assert coordinator is not None
            [described] = await coordinator.describe_transactions([txn_id])
            return described.state == "CompleteCommit"

        await wait_until("CompleteCommit", completed, wake=cluster.any_change)
        for partition, leader_id in leaders.items():
            replicas = nodes[leader_id].replicas
            assert replicas is not None
            hosted = replicas.replicas.partitions[(TOPIC, partition)]
            entry = hosted.producers.table.get(pid)
            assert entry is not None and entry.current_txn_first_offset < 0  # marker written
        nursery.cancel_scope.cancel()


class _Producer:
    """What the Kafka handler passes as `producer`: the request's transactional id."""

    def __init__(self, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self.client_id = "driver-test"


def _leads(node: Node, partition: int) -> bool:
    return _leader(node, TOPIC, partition) > 0


def _leader(node: Node, topic: str, partition: int) -> int:
    found = node.metadata.image.topic(topic) if node.metadata is not None else None
    state = None if found is None else found.partitions.get(partition)
    return -1 if state is None else state.leader
