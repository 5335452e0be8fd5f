"""A controller-only node (roles = ["controller"]) in a quorum with two combined nodes: it
starts and, as the active controller, fences a broker whose listener refuses it (its own
reachability watch: a broker's lifecycle runs one, a controller-only node has none)."""

from __future__ import annotations

import dataclasses

import trio

from tests.metadata.test_node_quorum import Cluster, make_configs
from tests.waiting import wait_until


async def test_a_controller_only_node_watches_and_fences_brokers(tmp_path) -> None:
    configs = make_configs(tmp_path)
    configs[0] = dataclasses.replace(configs[0], roles=["controller"])
    async with trio.open_nursery() as nursery:
        cluster = Cluster(nursery, configs)
        for node_id in (1, 2, 3):
            await cluster.start(node_id)
        only = cluster.nodes[1]
        assert not only.kafka_ports and only.reachability is not None  # serves no clients
        # Only the active controller fences: restart the others until node 1 holds the role.
        while (controller := await cluster.controller()) is not only:
            node_id = controller.config.node_id
            await cluster.kill_and_wait(node_id)
            await cluster.start(node_id)
        await wait_until(
            "both brokers unfenced",
            lambda: set(only.metadata.controller.image.unfenced_brokers()) == {2, 3},
            wake=cluster.any_change,
        )
        await cluster.kill_and_wait(3)
        await wait_until(
            "node 1 sees broker 3 refuse", lambda: 3 in only.reachability.unreachable_since_ms()
        )
        await wait_until(
            "broker 3 fenced",
            lambda: set(only.metadata.controller.image.unfenced_brokers()) == {2},
            wake=cluster.any_change,
        )
        nursery.cancel_scope.cancel()
