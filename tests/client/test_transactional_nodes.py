"""raftlog's TransactionalProducer against three in-process nodes: the coordinators of the
transactional id and of the group are found (the first FindCoordinator of each creates
`__transaction_state` or `__consumer_offsets` and answers COORDINATOR_NOT_AVAILABLE, which
coordinator.with_coordinator retries), a transaction with offsets commits, the offsets read
back with require_stable, and a newer producer of the id fences the older."""

from __future__ import annotations

import pytest
import trio

from raftlog.client import open_cluster
from raftlog.client.transactional import ProducerFenced, TransactionalProducer, committed_offset
from raftlog.errors import ErrorCode
from raftlog.records import Record
from tests.metadata.test_node_quorum import Cluster, create_topic, make_configs
from tests.waiting import wait_until

TOPIC = "txn-client-orders"
GROUP = "txn-client-group"
TXN_ID = "txn-client-app"


def _bootstrap(cluster: Cluster) -> str:
    return ",".join(c.client_listener for c in cluster.configs)


def _has_leader(cluster: Cluster) -> bool:
    node = cluster.nodes[1]
    found = node.metadata.image.topic(TOPIC) if node.metadata is not None else None
    state = None if found is None else found.partitions.get(0)
    return state is not None and state.leader > 0


async def test_a_transaction_with_offsets_commits_and_a_newer_producer_fences(tmp_path) -> None:
    async with trio.open_nursery() as nursery:
        # One partition of each internal topic instead of Kafka's 50: the test stays light.
        configs = make_configs(
            tmp_path, offsets_topic_num_partitions=1, transaction_state_log_num_partitions=1
        )
        cluster = Cluster(nursery, configs)
        await cluster.start_all()
        result = await create_topic(cluster.nodes[1], TOPIC, partitions=1, rf=3)
        assert result.error_code == ErrorCode.none, result
        await wait_until("a leader", lambda: _has_leader(cluster), wake=cluster.any_change)

        async with open_cluster(_bootstrap(cluster), client_id="txn-client") as client:
            producer = TransactionalProducer(client, TXN_ID, max_block_ms=30_000)
            await producer.init()
            producer.begin()
            offset = await producer.send(TOPIC, 0, [Record(key=b"k", value=b"v1")])
            await producer.send_offsets(GROUP, {(TOPIC, 0): offset + 1})
            await producer.commit()
            assert await committed_offset(client, GROUP, TOPIC, 0) == offset + 1

            successor = TransactionalProducer(client, TXN_ID, max_block_ms=30_000)
            await successor.init()
            producer.begin()
            with pytest.raises(ProducerFenced):
                await producer.send(TOPIC, 0, [Record(key=b"k", value=b"stale")])
        nursery.cancel_scope.cancel()
