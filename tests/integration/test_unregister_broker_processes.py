"""UnregisterBroker with real processes: three voters and a broker-only node 4. Node 4 is
stopped, unregistered with the project's admin client, and then no node lists it in
DescribeCluster, not even with fenced brokers included; unregistering it again answers
BROKER_ID_NOT_REGISTERED."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio

from raftlog.client import Admin, open_cluster
from raftlog.client.connection import call_negotiated
from raftlog.errors import ErrorCode, KafkaError
from tests.integration.test_membership_processes import NEW_NODE, _observer_cluster

pytestmark = pytest.mark.cluster

DEADLINE_S = 30
# DescribeCluster v2 (KIP-1073) for include_fenced_brokers; the client's own table stops at 1.
DESCRIBE_CLUSTER_V2 = {"describe_cluster": (2, 2)}


async def _registered(address: str) -> set[int]:
    """Every broker `address` lists, fenced ones included."""
    async with open_cluster(address, client_id="unregister-test") as cluster:
        connection = await cluster.any_broker()
        response = await call_negotiated(
            connection,
            "describe_cluster",
            {
                "include_cluster_authorized_operations": False,
                "endpoint_type": 1,
                "include_fenced_brokers": True,
            },
            DESCRIBE_CLUSTER_V2,
        )
    assert response.error_code == ErrorCode.none, response
    return {int(b.broker_id) for b in response.brokers}


async def _unregister(bootstrap: str, broker_id: int) -> ErrorCode:
    """The error code unregistering `broker_id` answers (NONE when done)."""
    codes: list[ErrorCode] = []
    with trio.fail_after(DEADLINE_S):
        try:
            async with open_cluster(bootstrap, client_id="unregister-test") as cluster:
                await Admin(cluster, timeout_ms=10_000).unregister_broker(broker_id)
        except* KafkaError as group:
            codes.extend(e.code for e in group.exceptions if isinstance(e, KafkaError))
    return codes[0] if codes else ErrorCode.none


def test_a_stopped_broker_is_unregistered(tmp_path: Path) -> None:
    with _observer_cluster(tmp_path / "c") as cluster:
        others = [n for n in cluster.nodes.values() if n.node_id != NEW_NODE]
        assert NEW_NODE in trio.run(_registered, others[0].client_address)
        cluster.kill(NEW_NODE, signal.SIGTERM)  # the operator stops it first
        # Stopped, it stays registered (fenced) until it is unregistered.
        assert NEW_NODE in trio.run(_registered, others[0].client_address)
        bootstrap = cluster.live_bootstrap_servers()
        assert trio.run(_unregister, bootstrap, NEW_NODE) == ErrorCode.none
        # The broker that forwarded it answers once its image has it; the others follow.
        cluster.wait_for(
            lambda: all(trio.run(_registered, n.client_address) == {1, 2, 3} for n in others),
            f"every node to stop listing broker {NEW_NODE}",
            timeout_s=DEADLINE_S,
        )
        again = trio.run(_unregister, bootstrap, NEW_NODE)
        assert again == ErrorCode.broker_id_not_registered
