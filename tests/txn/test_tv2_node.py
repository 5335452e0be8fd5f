"""KIP-890 part 2 on three in-process nodes, spoken with kio requests over real sockets (no
stock client negotiates transaction version 2): ApiVersions finalizes `transaction.version`
2; a transactional Produce v12 adds its partition to the transaction without any
AddPartitionsToTxn; EndTxn v5 commits with an epoch bump and answers the new epoch; a
read_committed Fetch then sees the records; a late batch of the ended epoch is fenced."""

from __future__ import annotations

import functools
from typing import Any

import trio

from raftlog.client.protocol import build_request
from raftlog.errors import ErrorCode
from raftlog.records import Record, build_batch, iter_batches, iter_records
from raftlog.txn import node_service
from raftlog.txn.settings import TxnConfig
from tests.kafka.wire import WireClient
from tests.metadata.test_node_quorum import Cluster, create_topic, make_configs
from tests.waiting import wait_until

TOPIC = "tv2-orders"
TXN_ID = "tv2-app"
READ_COMMITTED = 1
KEY_TYPE_TRANSACTION = 1
GROUP = "tv2-group"


def _port(cluster: Cluster, node_id: int) -> int:
    return int(cluster.configs[node_id - 1].client_listener.rsplit(":", 1)[1])


def _leader(cluster: Cluster, topic: str, partition: int) -> int:
    node = cluster.nodes[1]
    found = node.metadata.image.topic(topic) if node.metadata is not None else None
    state = None if found is None else found.partitions.get(partition)
    return -1 if state is None else state.leader


def _produce(pid: int, epoch: int, sequence: int, value: bytes) -> Any:
    batch = build_batch(
        [Record(key=b"k", value=value)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=sequence,
        is_transactional=True,
    )
    return build_request(
        "produce",
        12,
        {
            "transactional_id": TXN_ID,
            "acks": -1,
            "timeout": 10_000,
            "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": batch}]}],
        },
    )


def _fetch() -> Any:
    return build_request(
        "fetch",
        12,
        {
            "replica_id": -1,
            "max_wait": 0,
            "min_bytes": 0,
            "max_bytes": 1 << 20,
            "isolation_level": READ_COMMITTED,
            "topics": [
                {
                    "topic": TOPIC,
                    "partitions": [
                        {
                            "partition": 0,
                            "fetch_offset": 0,
                            "partition_max_bytes": 1 << 20,
                            "current_leader_epoch": -1,
                            "log_start_offset": -1,
                        }
                    ],
                }
            ],
        },
    )


async def test_produce_v12_adds_the_partition_and_end_txn_v5_bumps_the_epoch(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(
        node_service,
        "TxnConfig",
        functools.partial(TxnConfig, transaction_state_log_num_partitions=1),
    )
    async with trio.open_nursery() as nursery:
        cluster = Cluster(nursery, make_configs(tmp_path))
        await cluster.start_all()
        result = await create_topic(cluster.nodes[1], TOPIC, partitions=1, rf=3)
        assert result.error_code == ErrorCode.none, result
        await wait_until(
            "a leader", lambda: _leader(cluster, TOPIC, 0) > 0, wake=cluster.any_change
        )

        any_node = await WireClient.connect(_port(cluster, 1))
        versions = await any_node.request(
            build_request(
                "api_versions",
                3,
                {"client_software_name": "tv2-test", "client_software_version": "1"},
            )
        )
        finalized = {f.name: int(f.max_version_level) for f in versions.finalized_features}
        assert finalized == {"transaction.version": 2}
        advertised = {int(k.api_key): int(k.max_version) for k in versions.api_keys}
        assert advertised[26] == 5 and advertised[0] == 13  # EndTxn, Produce
        # DescribeQuorum v0-2 comes from handlers_quorum, which every node registers.
        quorum_api = next(k for k in versions.api_keys if int(k.api_key) == 55)
        assert (int(quorum_api.min_version), int(quorum_api.max_version)) == (0, 2)

        async def coordinator() -> int | None:
            found = await any_node.request(
                build_request(
                    "find_coordinator",
                    4,
                    {"key_type": KEY_TYPE_TRANSACTION, "coordinator_keys": [TXN_ID]},
                )
            )
            (answer,) = found.coordinators
            return int(answer.node_id) if answer.error_code == ErrorCode.none else None

        coordinator_id = await wait_until("a coordinator", coordinator, wake=cluster.any_change)
        txn_client = await WireClient.connect(_port(cluster, coordinator_id))

        async def init() -> Any:
            answer = await txn_client.request(
                build_request(
                    "init_producer_id",
                    4,
                    {"transactional_id": TXN_ID, "transaction_timeout": 60_000},
                )
            )
            return answer if answer.error_code == ErrorCode.none else None

        initialized = await wait_until("InitProducerId", init, wake=cluster.any_change)
        pid, epoch = int(initialized.producer_id), int(initialized.producer_epoch)

        leader = await WireClient.connect(_port(cluster, _leader(cluster, TOPIC, 0)))

        async def produced() -> bool:
            response = await leader.request(_produce(pid, epoch, 0, b"committed"))
            (partition,) = response.responses[0].partition_responses
            # NOT_ENOUGH_REPLICAS while the coordinator is out of reach: retried.
            assert partition.error_code in (ErrorCode.none, ErrorCode.not_enough_replicas)
            return partition.error_code == ErrorCode.none

        await wait_until("Produce v12", produced, wake=cluster.any_change)
        described = await txn_client.request(
            build_request("describe_transactions", 0, {"transactional_ids": [TXN_ID]})
        )
        (state,) = described.transaction_states
        assert state.transaction_state == "Ongoing"  # added by the produce alone
        assert [(t.topic, list(t.partitions)) for t in state.topics] == [(TOPIC, [0])]

        ended = await txn_client.request(
            build_request(
                "end_txn",
                5,
                {
                    "transactional_id": TXN_ID,
                    "producer_id": pid,
                    "producer_epoch": epoch,
                    "committed": True,
                },
            )
        )
        assert ended.error_code == ErrorCode.none
        assert (int(ended.producer_id), int(ended.producer_epoch)) == (pid, epoch + 1)

        async def visible() -> list[bytes] | None:
            fetched = await leader.request(_fetch())
            (partition,) = fetched.responses[0].partitions
            if int(partition.last_stable_offset) < 2:  # the data batch and its marker
                return None
            data = partition.records or b""
            return [
                r.value
                for pos, header in iter_batches(data)
                if not header.is_control
                for r in iter_records(data, pos)
            ]

        assert await wait_until("the commit", visible, wake=cluster.any_change) == [b"committed"]

        # A retried EndTxn with the epoch the commit was sent with finds its answer.
        retried = await txn_client.request(
            build_request(
                "end_txn",
                5,
                {
                    "transactional_id": TXN_ID,
                    "producer_id": pid,
                    "producer_epoch": epoch,
                    "committed": True,
                },
            )
        )
        assert (retried.error_code, int(retried.producer_epoch)) == (ErrorCode.none, epoch + 1)

        # A late batch of the ended epoch cannot join the next transaction (KIP-890's aim).
        late = await leader.request(_produce(pid, epoch, 1, b"late"))
        (partition,) = late.responses[0].partition_responses
        assert partition.error_code == ErrorCode.invalid_producer_epoch
        # A forged batch of an epoch the coordinator never gave out adds nothing.
        forged = await leader.request(_produce(pid, 30_000, 0, b"forged"))
        (partition,) = forged.responses[0].partition_responses
        assert partition.error_code == ErrorCode.invalid_producer_epoch
        # The next transaction, at the bumped epoch, starts its sequences over.
        await wait_until(
            "the next transaction",
            functools.partial(_produce_ok, leader, pid, epoch + 1),
            wake=cluster.any_change,
        )

        # TxnOffsetCommit v5 adds the group's offsets partition itself (no AddOffsetsToTxn).
        group_node = await wait_until(
            "a group coordinator",
            functools.partial(_coordinator_of, any_node, GROUP, 0),
            wake=cluster.any_change,
        )
        groups = await WireClient.connect(_port(cluster, group_node))
        await wait_until(
            "TxnOffsetCommit v5",
            functools.partial(_commit_offset, groups, pid, epoch + 1, 7),
            wake=cluster.any_change,
        )
        described = await txn_client.request(
            build_request("describe_transactions", 0, {"transactional_ids": [TXN_ID]})
        )
        (state,) = described.transaction_states
        assert {t.topic for t in state.topics} == {TOPIC, "__consumer_offsets"}
        ended = await txn_client.request(
            build_request(
                "end_txn",
                5,
                {
                    "transactional_id": TXN_ID,
                    "producer_id": pid,
                    "producer_epoch": epoch + 1,
                    "committed": True,
                },
            )
        )
        assert (ended.error_code, int(ended.producer_epoch)) == (ErrorCode.none, epoch + 2)
        assert (
            await wait_until(
                "the committed offset",
                functools.partial(_stable_offset, groups),
                wake=cluster.any_change,
            )
            == 7
        )
        for client in (any_node, txn_client, leader, groups):
            await client.aclose()
        nursery.cancel_scope.cancel()


async def _produce_ok(leader: WireClient, pid: int, epoch: int) -> bool:
    response = await leader.request(_produce(pid, epoch, 0, b"next"))
    (partition,) = response.responses[0].partition_responses
    return partition.error_code == ErrorCode.none


async def _coordinator_of(client: WireClient, key: str, key_type: int) -> int | None:
    found = await client.request(
        build_request("find_coordinator", 4, {"key_type": key_type, "coordinator_keys": [key]})
    )
    (answer,) = found.coordinators
    return int(answer.node_id) if answer.error_code == ErrorCode.none else None


async def _commit_offset(groups: WireClient, pid: int, epoch: int, offset: int) -> bool:
    response = await groups.request(
        build_request(
            "txn_offset_commit",
            5,
            {
                "transactional_id": TXN_ID,
                "group_id": GROUP,
                "producer_id": pid,
                "producer_epoch": epoch,
                "generation_id": -1,
                "member_id": "",
                "topics": [
                    {
                        "name": TOPIC,
                        "partitions": [
                            {
                                "partition_index": 0,
                                "committed_offset": offset,
                                "committed_leader_epoch": -1,
                                "committed_metadata": "",
                            }
                        ],
                    }
                ],
            },
        )
    )
    ((code,),) = [[p.error_code for p in t.partitions] for t in response.topics]
    # Retriable while the offsets topic is new: the node FindCoordinator named may not yet
    # know it leads the group's partition (its image lags the one that answered), or its
    # group coordinator is still loading.
    retriable = (ErrorCode.coordinator_load_in_progress, ErrorCode.not_coordinator)
    assert code == ErrorCode.none or code in retriable, code
    return code == ErrorCode.none


async def _stable_offset(groups: WireClient) -> int | None:
    response = await groups.request(
        build_request(
            "offset_fetch",
            7,
            {
                "group_id": GROUP,
                "topics": [{"name": TOPIC, "partition_indexes": [0]}],
                "require_stable": True,
            },
        )
    )
    ((partition,),) = [t.partitions for t in response.topics]
    if partition.error_code != ErrorCode.none:
        return None
    return int(partition.committed_offset) if int(partition.committed_offset) >= 0 else None
