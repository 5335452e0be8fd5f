"""Replica fetch wire format and follower fetcher behaviour under failures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from raftlog.errors import ErrorCode
from raftlog.replication.core.types import DivergingEpoch
from raftlog.replication.fetch_wire import (
    MAX_PARTITIONS_PER_REPLICA_FETCH,
    ReplicaFetchAnswer,
    ReplicaFetchPartition,
    ReplicaFetchRequest,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from tests.replication.test_manager import TOPIC, followers, produce, start_cluster
from tests.waiting import wait_until

# Within each field's declared range (fetch_wire.py); the codec's own tests cover the bounds.
offsets = st.integers(min_value=-1, max_value=2**62)
epochs = st.integers(min_value=-1, max_value=2**31 - 1)
sizes = st.integers(min_value=0, max_value=2**62)
indexes = st.integers(min_value=0, max_value=2**31 - 1)
names = st.text(min_size=1, max_size=20)

partitions = st.builds(ReplicaFetchPartition, names, indexes, offsets, epochs, epochs, offsets)
requests = st.builds(
    ReplicaFetchRequest, epochs, sizes, sizes, st.lists(partitions, max_size=5).map(tuple)
)
answers = st.builds(
    ReplicaFetchAnswer,
    names,
    indexes,
    st.sampled_from(list(ErrorCode)),
    offsets,
    offsets,
    st.none() | st.builds(DivergingEpoch, epochs, offsets),
    st.binary(max_size=64),
)


def wire(value: Any) -> Any:
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False)


@given(requests)
def test_request_round_trips_through_msgpack(request: ReplicaFetchRequest) -> None:
    assert decode_request(wire(encode_request(request))) == request


@given(st.lists(answers, max_size=5))
def test_response_round_trips_through_msgpack(items: list[ReplicaFetchAnswer]) -> None:
    assert decode_response(wire(encode_response(items))) == items


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        {"replica_id": 1, "max_wait_ms": 1, "min_bytes": 1},
        {"replica_id": "1", "max_wait_ms": 1, "min_bytes": 1, "partitions": []},
        {"replica_id": 1, "max_wait_ms": 1, "min_bytes": 1, "partitions": [7]},
        {"replica_id": 1, "max_wait_ms": 1, "min_bytes": 1, "partitions": [{"topic": "t"}]},
        {
            "replica_id": 1,
            "max_wait_ms": 1,
            "min_bytes": 1,
            "partitions": [{}] * (MAX_PARTITIONS_PER_REPLICA_FETCH + 1),
        },
        {"replica_id": 1, "max_wait_ms": -5, "min_bytes": 1, "partitions": []},
        {
            "replica_id": 1,
            "max_wait_ms": 1,
            "min_bytes": 1,
            "partitions": [
                {
                    "topic": "t",
                    "partition": -1,
                    "fetch_offset": 0,
                    "last_fetched_epoch": 0,
                    "leader_epoch": 0,
                }
            ],
        },
    ],
)
def test_malformed_requests_are_refused_whole(body: Any) -> None:
    with pytest.raises(ValueError):
        decode_request(body)


def test_an_error_code_this_build_does_not_know_becomes_unknown_server_error() -> None:
    body = encode_response([ReplicaFetchAnswer("t", 0, ErrorCode.none, 0, 0)])
    body["partitions"][0]["error"] = 31_999
    assert decode_response(body)[0].error == ErrorCode.unknown_server_error
    body["partitions"][0]["records"] = "text"
    with pytest.raises(ValueError):
        decode_response(body)


async def test_follower_survives_garbage_answers_and_catches_up(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery, min_isr=1)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        victim = followers(cluster)[0]
        pool = cluster.managers[victim].fetchers
        honest = pool.send_fetch
        garbage_answers = 0

        async def garbage(leader_id: int, body: dict) -> dict:
            nonlocal garbage_answers
            await trio.lowlevel.checkpoint()
            garbage_answers += 1
            return {"partitions": "not a list"}

        pool.send_fetch = garbage
        # A fetch sent before the swap may be parked at the leader: its answer is lost.
        cluster.paused.add(victim)
        assert (await produce(cluster, acks=1)).error == ErrorCode.none
        await wait_until("a few failed rounds", lambda: garbage_answers >= 3)
        assert cluster.status(victim).log_end_offset == 0
        cluster.paused.discard(victim)
        pool.send_fetch = honest
        await wait_until("the follower to catch up", cluster.in_sync)
        await cluster.stop_all()


async def test_leader_refuses_fetches_from_a_broker_that_is_not_a_replica(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        leader = cluster.managers[cluster.leader_id]
        epoch = cluster.partition().leader_epoch
        request = ReplicaFetchRequest(
            replica_id=99,
            max_wait_ms=10_000,
            min_bytes=1,
            partitions=(
                ReplicaFetchPartition(TOPIC, 0, 0, -1, epoch),
                ReplicaFetchPartition("missing", 0, 0, -1, 0),
            ),
        )
        with trio.fail_after(5):  # refusals answer at once, they never park
            reply = decode_response(
                await leader.reads.handle_replica_fetch(99, encode_request(request))
            )
        assert [a.error for a in reply] == [
            ErrorCode.not_leader_or_follower,
            ErrorCode.unknown_topic_or_partition,
        ]
        with pytest.raises(ValueError):
            await leader.reads.handle_replica_fetch(99, {"partitions": 3})
        await cluster.stop_all()
