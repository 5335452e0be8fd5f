"""A controller request in flight to a silent node follows the metadata quorum's new leader.

A SIGSTOPped controller keeps its TCP connections: the kernel completes the handshake and
buffers what is sent, nothing answers. Its requests must not wait out their timeout (for a
heartbeat, a whole broker session) once the quorum knows another leader.
"""

import functools
import socket
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from raftlog.config import NodeConfig
from raftlog.metadata.controller import messages as cm
from raftlog.metadata.controller.broker_lifecycle import ControllerClient
from raftlog.net.rpc import PeerSet, RpcLimits, serve_rpc

# Far longer than any wait of these tests: a reply that comes at all came from re-sending.
REQUEST_TIMEOUT_MS = 60_000
# Generous on a loaded machine, still far below the request timeout.
FOLLOW_DEADLINE_S = 10.0


def _heartbeat() -> cm.BrokerHeartbeat:
    return cm.BrokerHeartbeat(1, 1, 0, want_shutdown=False)


def _silent_listener() -> socket.socket:
    """A listening socket nobody accepts from: connects succeed, nothing is ever answered."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


class _Quorum:
    """What ControllerClient reads of the local metadata quorum: who leads."""

    def __init__(self, leader_id: int | None) -> None:
        self.core = SimpleNamespace(leader_id=leader_id)

    def address_of(self, node_id: int) -> tuple[str, int] | None:
        return None  # no voter set endpoints: the static controller_quorum_voters answer


async def _controller(reached: dict[int, trio.Event], node_id: int, sender_id, method, body):
    reached.setdefault(node_id, trio.Event()).set()
    reply = cm.BrokerHeartbeatReply(is_caught_up=True, is_fenced=node_id == 3)
    return ["ok", cm.CODEC.encode(reply, cm.ControllerReply)]


async def _start_controller(nursery: trio.Nursery, handler) -> int:
    listeners = await nursery.start(functools.partial(serve_rpc, handler, "127.0.0.1", 0))
    return listeners[0].socket.getsockname()[1]


def _config(ports: dict[int, int]) -> NodeConfig:
    voters = ",".join(f"{node_id}@127.0.0.1:{port}" for node_id, port in sorted(ports.items()))
    return NodeConfig.from_dict({"node_id": 1, "controller_quorum_voters": voters})


async def test_a_request_to_a_silent_controller_is_re_sent_to_the_new_leader():
    silent = _silent_listener()
    reached: dict[int, trio.Event] = {}
    async with trio.open_nursery() as nursery:
        port_3 = await _start_controller(nursery, functools.partial(_controller, reached, 3))
        peers = PeerSet(1)
        await nursery.start(peers.run)
        quorum = _Quorum(leader_id=2)
        metadata = SimpleNamespace(quorum=quorum, cluster_id="c")
        client = ControllerClient(
            _config({1: 1, 2: silent.getsockname()[1], 3: port_3}), peers, metadata
        )
        replies: list[cm.BrokerHeartbeatReply] = []
        replied = trio.Event()

        async def heartbeat() -> None:
            replies.append(await client.call(_heartbeat(), timeout_ms=REQUEST_TIMEOUT_MS))
            replied.set()

        nursery.start_soon(heartbeat)
        await trio.testing.wait_all_tasks_blocked()  # the request is on its way to node 2
        assert list(client._inflight.values()) == [2]

        quorum.core.leader_id = 3  # the quorum elected node 3 ...
        client.leader_changed(3)  # ... and the driver reports the role change
        with trio.fail_after(FOLLOW_DEADLINE_S):
            await replied.wait()
        assert replies[0].is_fenced  # node 3's answer
        assert client.abandoned_requests == 1
        assert not client._inflight
        nursery.cancel_scope.cancel()
    silent.close()


@pytest.mark.parametrize("reported", [None, 2], ids=["leader-unknown", "same-leader"])
async def test_a_request_is_kept_while_no_other_leader_is_known(reported):
    # Between elections the leader is unknown, and a new epoch may keep the same leader:
    # neither is a reason to send the request twice.
    answer = trio.Event()
    reached: dict[int, trio.Event] = {}

    async def slow_controller(sender_id, method, body):
        reached.setdefault(2, trio.Event()).set()
        await answer.wait()
        return await _controller(reached, 2, sender_id, method, body)

    async with trio.open_nursery() as nursery:
        port_2 = await _start_controller(nursery, slow_controller)
        peers = PeerSet(1)
        await nursery.start(peers.run)
        quorum = _Quorum(leader_id=2)
        metadata = SimpleNamespace(quorum=quorum, cluster_id="c")
        client = ControllerClient(_config({1: 1, 2: port_2}), peers, metadata)
        replies: list[cm.BrokerHeartbeatReply] = []
        replied = trio.Event()

        async def heartbeat() -> None:
            replies.append(await client.call(_heartbeat(), timeout_ms=REQUEST_TIMEOUT_MS))
            replied.set()

        nursery.start_soon(heartbeat)
        with trio.fail_after(FOLLOW_DEADLINE_S):
            await reached.setdefault(2, trio.Event()).wait()
        quorum.core.leader_id = reported
        client.leader_changed(reported)
        assert client._inflight and not any(s.cancel_called for s in client._inflight)
        quorum.core.leader_id = 2
        answer.set()
        with trio.fail_after(FOLLOW_DEADLINE_S):
            await replied.wait()
        assert not replies[0].is_fenced
        assert client.abandoned_requests == 0
        nursery.cancel_scope.cancel()


async def test_only_requests_to_other_nodes_are_abandoned():
    client = ControllerClient(_config({1: 1, 2: 2, 3: 3}), PeerSet(1), SimpleNamespace())
    to_2, to_3 = trio.CancelScope(), trio.CancelScope()
    client._inflight.update({to_2: 2, to_3: 3})
    client.leader_changed(3)
    assert to_2.cancel_called and not to_3.cancel_called


async def test_requests_waiting_for_a_commit_leave_room_for_the_raft_fetch_that_commits_them():
    # After a failover a broker asks the controller to change the ISR of every partition it
    # leads, at once. Each request waits for its metadata entry to commit, which takes this
    # node's next Raft fetch, sent as a cast on the same connection. The controller reads a
    # connection in order with at most RpcLimits.max_inflight_per_connection requests in
    # flight: had the broker sent more than that, the Raft fetch would wait behind them.
    requests = 3 * RpcLimits().max_inflight_per_connection
    committed = trio.Event()

    async def controller(sender_id, method, body):
        if method == "raft":
            committed.set()  # the follower's fetch: the pending entry commits
            return None
        await committed.wait()
        reply = cm.BrokerHeartbeatReply(is_caught_up=True, is_fenced=False)
        return ["ok", cm.CODEC.encode(reply, cm.ControllerReply)]

    async with trio.open_nursery() as nursery:
        port_2 = await _start_controller(nursery, controller)
        peers = PeerSet(1)
        await nursery.start(peers.run)
        config = _config({1: 1, 2: port_2})
        client = ControllerClient(config, peers, SimpleNamespace(quorum=_Quorum(leader_id=2)))
        answered = 0

        async def request() -> None:
            nonlocal answered
            await client.call(_heartbeat(), timeout_ms=REQUEST_TIMEOUT_MS)
            answered += 1

        with trio.fail_after(FOLLOW_DEADLINE_S):
            async with trio.open_nursery() as requests_nursery:
                for _ in range(requests):
                    requests_nursery.start_soon(request)
                await trio.testing.wait_all_tasks_blocked()
                assert peers.peer(2, *config.voters[2]).cast("raft", None)
        assert answered == requests
        nursery.cancel_scope.cancel()
