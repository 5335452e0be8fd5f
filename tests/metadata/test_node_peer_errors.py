"""What a node makes of a peer that answers badly or not at all: Kafka errors, not crashes."""

import functools
import socket
from types import SimpleNamespace

import msgpack
import pytest
import trio

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode, KafkaError
from raftlog.metadata.controller import messages as cm
from raftlog.metadata.controller.broker_lifecycle import ControllerClient
from raftlog.metadata.raft.types import NotLeader
from raftlog.net.rpc import PeerSet, RpcLimits, serve_rpc


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _config(leader_port: int) -> NodeConfig:
    return NodeConfig.from_dict(
        {
            "node_id": 1,
            "controller_quorum_voters": f"1@127.0.0.1:{_free_port()},2@127.0.0.1:{leader_port}",
            "request_timeout_ms": 2000,
        }
    )


def _metadata_led_by(leader_id: int) -> SimpleNamespace:
    core = SimpleNamespace(leader_id=leader_id, replica_progress=lambda: None)
    # No voter set endpoints (address_of: None): the config's controller_quorum_voters answer.
    quorum = SimpleNamespace(core=core, address_of=lambda node_id: None)
    return SimpleNamespace(quorum=quorum, cluster_id="c")


@pytest.mark.parametrize(
    "answer",
    [
        ["ok", b"\xc1"],
        ["ok", msgpack.packb(msgpack.ExtType(3, msgpack.packb(["Unheard", []])))],
        "not a pair",
        ["weird-status", None],
    ],
    ids=["undecodable", "unregistered-type", "not-a-pair", "unknown-status"],
)
async def test_controller_client_turns_a_malformed_reply_into_a_kafka_error(answer):
    # e.g. a controller of another version: its reply must fail the request with a Kafka
    # error (which the broker's heartbeat loop logs and retries), not kill the caller.
    async def controller(sender_id, method, body):
        return answer

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(serve_rpc, controller, "127.0.0.1", 0))
        port = listeners[0].socket.getsockname()[1]
        peers = PeerSet(1)
        await nursery.start(peers.run)
        client = ControllerClient(_config(port), peers, _metadata_led_by(2))
        with pytest.raises(KafkaError) as caught:
            await client.call(cm.BrokerHeartbeat(1, 1, 0, want_shutdown=False))
        assert caught.value.code == ErrorCode.unknown_server_error
        nursery.cancel_scope.cancel()


async def test_describe_quorum_with_an_unreachable_leader_is_retriable():
    from raftlog.node import Node

    config = _config(_free_port())  # node 2 "leads" but nothing listens there
    node = Node(config)
    node.quorum = _metadata_led_by(2).quorum
    async with trio.open_nursery() as nursery:
        node.peers = PeerSet(1, RpcLimits(connect_timeout_s=0.2))
        await nursery.start(node.peers.run)
        # NotLeader, which DescribeQuorum answers as NOT_LEADER_OR_FOLLOWER (handlers_quorum):
        # a client retries that, where UNKNOWN_SERVER_ERROR it would give up on.
        with pytest.raises(NotLeader) as caught:
            await node.describe_quorum_description()
        assert caught.value.leader_id == 2
        nursery.cancel_scope.cancel()


async def test_registration_retries_are_paced_when_the_controller_fails_at_once(autojump_clock):
    from raftlog.metadata.controller.broker_lifecycle import BrokerLifecycle

    config = NodeConfig.from_dict({"node_id": 1, "broker_heartbeat_interval_ms": 100})
    calls = 0

    class FailingClient:
        async def call(self, request, **_):
            nonlocal calls
            calls += 1
            assert calls < 1000, "registration retries in a tight loop"
            await trio.lowlevel.checkpoint()
            raise KafkaError(ErrorCode.unknown_server_error, "malformed controller reply")

    lifecycle = BrokerLifecycle(config, FailingClient(), SimpleNamespace(cluster_id="c"))
    with trio.move_on_after(1.0):
        await lifecycle._register()
    assert calls <= 11, calls


async def test_replica_fetch_to_a_voter_uses_its_voter_address():
    # One client per peer id, re-created whenever a caller names another address. A voter
    # registered as 127.0.0.1 but configured in controller_quorum_voters as localhost must
    # not have its connection torn down by every replica fetch and again by every Raft cast.
    from raftlog.node import Node

    async def peer(sender_id, method, body):
        return {"answered": method}

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(serve_rpc, peer, "127.0.0.1", 0))
        port = listeners[0].socket.getsockname()[1]
        config = NodeConfig.from_dict(
            {
                "node_id": 1,
                "controller_quorum_voters": f"1@127.0.0.1:{_free_port()},2@localhost:{port}",
            }
        )
        node = Node(config)
        registration = SimpleNamespace(internal_endpoint=("127.0.0.1", port))
        node.metadata = SimpleNamespace(image=SimpleNamespace(brokers={2: registration}))
        node.peers = PeerSet(1)
        await nursery.start(node.peers.run)
        raft_client = node.peers.peer(2, *config.voters[2])  # what the quorum driver uses
        assert await node._send_replica_fetch(2, {}) == {"answered": "replica.fetch"}
        assert node.peers.get(2) is raft_client
        nursery.cancel_scope.cancel()
