"""Three in-process nodes on loopback: real RPC, real metadata logs on disk, real clock."""

import socket
import uuid

import pytest
import trio

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode
from raftlog.metadata.controller import messages as cm
from raftlog.node import DataDirError, Node, format_data_dir
from tests.waiting import wait_until

FAST = {
    "election_timeout_ms": 150,
    "fetch_timeout_ms": 300,
    "election_backoff_max_ms": 100,
    "raft_fetch_max_wait_ms": 50,
    "broker_session_timeout_ms": 1500,
    "broker_heartbeat_interval_ms": 100,
}


def _ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def make_configs(tmp_path, n=3, **extra):
    internal = _ports(n)
    client = _ports(n)
    voters = ",".join(f"{i + 1}@127.0.0.1:{internal[i]}" for i in range(n))
    cluster_id = uuid.uuid4().hex
    return [
        NodeConfig.from_dict(
            {
                "node_id": i + 1,
                "data_dir": str(tmp_path / f"node-{i + 1}"),
                "cluster_id": cluster_id,
                "client_listener": f"127.0.0.1:{client[i]}",
                "internal_listener": f"127.0.0.1:{internal[i]}",
                "controller_quorum_voters": voters,
                **FAST,
                **extra,
            }
        )
        for i in range(n)
    ]


class Cluster:
    def __init__(self, nursery, configs):
        self.nursery = nursery
        self.configs = configs
        self.nodes: dict[int, Node] = {}
        self.scopes: dict[int, trio.CancelScope] = {}
        self.stopped: dict[int, trio.Event] = {}

    async def start(self, node_id):
        node = Node(self.configs[node_id - 1])
        scope = trio.CancelScope()
        stopped = trio.Event()

        async def run(task_status=trio.TASK_STATUS_IGNORED):
            try:
                with scope:
                    await node.run(task_status=task_status)
                node.close()
            finally:
                stopped.set()

        await self.nursery.start(run)
        self.nodes[node_id] = node
        self.scopes[node_id] = scope
        self.stopped[node_id] = stopped
        return node

    def kill(self, node_id):
        self.scopes.pop(node_id).cancel()
        return self.nodes.pop(node_id)

    async def kill_and_wait(self, node_id):
        """kill, then wait until the node's tasks and worker threads are done with its disk."""
        node = self.kill(node_id)
        await self.stopped.pop(node_id).wait()
        return node

    def leaders(self):
        return [n for n in self.nodes.values() if n.metadata.controller is not None]

    async def any_change(self):
        """Return when any node applies a metadata change, or after 50 ms at the latest."""
        with trio.move_on_after(0.05):
            async with trio.open_nursery() as waiters:
                for node in self.nodes.values():
                    waiters.start_soon(_wait_then_cancel, node, waiters.cancel_scope)

    async def controller(self):
        await wait_until(
            "one active controller", lambda: len(self.leaders()) == 1, wake=self.any_change
        )
        return self.leaders()[0]

    async def start_all(self):
        """Start nodes 1-3; return the active controller once it sees every broker unfenced."""
        for i in (1, 2, 3):
            await self.start(i)

        def ready() -> bool:
            # Leadership may still move on a loaded machine (a first leader resigns when its
            # followers' pre-votes run ahead of its fetch answers): ask whoever leads now.
            leaders = self.leaders()
            return (
                len(leaders) == 1
                and len(leaders[0].metadata.controller.image.unfenced_brokers()) == 3
            )

        await wait_until(
            "one active controller that sees every broker unfenced", ready, wake=self.any_change
        )
        return self.leaders()[0]


async def _wait_then_cancel(node, scope):
    await node.metadata.wait_for_change()
    scope.cancel()


async def create_topic(node, name, partitions=3, rf=3):
    reply = await node.controller_client.call(cm.CreateTopics((cm.NewTopic(name, partitions, rf),)))
    return reply.results[0]


async def test_elect_commit_failover_restart(tmp_path):
    configs = make_configs(tmp_path)
    async with trio.open_nursery() as nursery:
        cluster = Cluster(nursery, configs)
        for i in (1, 2, 3):
            await cluster.start(i)
        await cluster.controller()
        await wait_until(
            "all brokers unfenced",
            lambda: all(n.lifecycle.unfenced.is_set() for n in cluster.nodes.values()),
            wake=cluster.any_change,
        )
        result = await create_topic(cluster.nodes[1], "orders")
        assert result.error_code == ErrorCode.none, result
        await wait_until(
            "topic on every node",
            lambda: all(n.metadata.image.topic("orders") for n in cluster.nodes.values()),
            wake=cluster.any_change,
        )

        leader = await cluster.controller()
        killed = leader.config.node_id
        cluster.kill(killed)
        survivor = next(iter(cluster.nodes.values()))
        result = await create_topic(survivor, "after-failover", rf=2)
        assert result.error_code == ErrorCode.none, result
        # The killed broker is fenced once its session expires.
        await wait_until(
            "killed broker fenced",
            lambda: survivor.metadata.image.brokers[killed].fenced,
            wake=cluster.any_change,
        )

        restarted = await cluster.start(killed)
        await wait_until(
            "restarted node caught up",
            lambda: restarted.metadata.image.topic("after-failover") is not None,
            wake=cluster.any_change,
        )
        await wait_until(
            "restarted broker unfenced",
            lambda: restarted.lifecycle.unfenced.is_set(),
            wake=cluster.any_change,
        )
        images = [n.metadata.image for n in cluster.nodes.values()]
        await wait_until(
            "same applied offset",
            lambda: (
                len({n.metadata.image.last_applied_offset for n in cluster.nodes.values()}) == 1
            ),
            wake=cluster.any_change,
        )
        assert {tuple(sorted(i.topics_by_name)) for i in images} == {("after-failover", "orders")}
        nursery.cancel_scope.cancel()


async def test_snapshot_catch_up(tmp_path):
    configs = make_configs(tmp_path, metadata_snapshot_max_records=10)
    async with trio.open_nursery() as nursery:
        cluster = Cluster(nursery, configs)
        leader = await cluster.start_all()
        lagging = next(i for i in (1, 2, 3) if i != leader.config.node_id)
        cluster.kill(lagging)
        for k in range(12):
            result = await create_topic(leader, f"t{k}", partitions=1, rf=2)
            assert result.error_code == ErrorCode.none, result
        await wait_until(
            "leader snapshot", lambda: leader.quorum.core.log_start > 0, wake=cluster.any_change
        )
        restarted = await cluster.start(lagging)
        await wait_until(
            "catch-up through the snapshot",
            lambda: restarted.metadata.image.topic("t11") is not None,
            wake=cluster.any_change,
        )
        nursery.cancel_scope.cancel()


def test_data_dir_identity_is_checked(tmp_path):
    config = make_configs(tmp_path, n=1)[0]
    cluster_id = format_data_dir(config)
    assert format_data_dir(config) == cluster_id
    other = NodeConfig.from_dict({**_as_dict(config), "cluster_id": "someone-else"})
    with pytest.raises(DataDirError, match="belongs to cluster"):
        format_data_dir(other)


def _as_dict(config):
    import dataclasses

    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


async def test_linearizable_read_index(tmp_path):
    from raftlog.metadata.raft.types import NotLeader

    configs = make_configs(tmp_path)
    async with trio.open_nursery() as nursery:
        cluster = Cluster(nursery, configs)
        for i in (1, 2, 3):
            await cluster.start(i)
        leader = await cluster.controller()
        read_point = await leader.quorum.read_index()
        # The read point covers everything committed before the read was asked for.
        assert read_point >= leader.metadata.applied_offset + 1
        follower = next(n for n in cluster.nodes.values() if n is not leader)
        with pytest.raises(NotLeader):
            await follower.quorum.read_index()
        # A leader cut off from its quorum cannot serve a linearizable read.
        for node_id in [i for i in cluster.nodes if cluster.nodes[i] is not leader]:
            cluster.kill(node_id)
        with pytest.raises(NotLeader):
            with trio.fail_after(10):
                await leader.quorum.read_index()
        nursery.cancel_scope.cancel()


async def test_controller_that_cannot_append_resigns_so_another_takes_over(tmp_path):
    from raftlog.metadata.raft.types import Overloaded
    from raftlog.metadata.service import NotControllerError

    configs = make_configs(tmp_path)
    async with trio.open_nursery() as nursery:
        cluster = Cluster(nursery, configs)
        leader = await cluster.start_all()
        quorum = leader.quorum
        epoch = quorum.core.epoch

        def overloaded(payload):
            raise Overloaded("backlog full (injected)")

        quorum.propose = overloaded
        with pytest.raises(NotControllerError):
            await leader.metadata.handle(cm.CreateTopics((cm.NewTopic("x", 1, 1),)))
        del quorum.propose  # the instance attribute shadowed the method
        # The dropped controller must not leave the cluster without one: a new epoch's
        # controller (on any node) takes over.
        await wait_until(
            "a controller in a later epoch",
            lambda: any(n.quorum.core.epoch > epoch for n in cluster.leaders()),
            wake=cluster.any_change,
        )
        new_leader = await cluster.controller()
        result = await create_topic(new_leader, "after-renounce", partitions=1, rf=1)
        assert result.error_code == ErrorCode.none, result
        nursery.cancel_scope.cancel()
