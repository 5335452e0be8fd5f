"""raftlog's client over SASL_SSL against two real node processes with the files and settings
of `raftlog cluster up --secure` (node certificates, mutual TLS between the nodes, the
authorizer keys), plus a loopback PLAINTEXT listener the first SCRAM user is created over
(instead of bootstrap_scram_credentials, so the test sees the credential arrive through
AlterUserScramCredentials), then topics, produce and fetch as that user over SASL_SSL."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from raftlog_cli import cluster_local as local
from raftlog_cli import cluster_secure as secure

from raftlog.client import (
    Admin,
    AuthenticationFailed,
    ClientSecurity,
    Consumer,
    NewTopic,
    Producer,
    ScramUpsertion,
    open_cluster,
)
from raftlog.client.properties import load_client_properties
from raftlog.records import Record
from raftlog.security.acl import ScramMechanism
from raftlog.testing.cluster import FAST_TIMINGS, free_ports
from tests.waiting import wait_until

READY_TIMEOUT_S = 60.0
NODES = 2


@dataclasses.dataclass
class SecureNodes:
    cluster: local.LocalCluster
    security: ClientSecurity
    plaintext_ports: dict[int, int]

    @property
    def plaintext(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.plaintext_ports.values())

    @property
    def sasl_ssl(self) -> str:
        return self.cluster.bootstrap_servers


def overrides(
    cluster: local.LocalCluster,
    node: local.LocalNode,
    material: secure.SecureMaterial,
    plaintext_port: int,
) -> dict[str, Any]:
    values = secure.node_overrides(cluster, node, material)
    values.pop(secure.BOOTSTRAP_SCRAM_KEY, None)
    values["listeners"] = (
        f"PLAINTEXT://127.0.0.1:{plaintext_port},SASL_SSL://127.0.0.1:{node.client_port}"
    )
    values["listener_security_protocol_map"] = "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL"
    # The PLAINTEXT stand-in for the bootstrap key must be allowed to create the first user.
    values["super_users"] = "User:admin;User:ANONYMOUS"
    return {**values, **FAST_TIMINGS}


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[SecureNodes]:
    ports = free_ports(3 * NODES)
    planned = local.plan_cluster(tmp_path / ".raftlog", NODES, 0)
    members = tuple(
        dataclasses.replace(n, client_port=ports[i], internal_port=ports[NODES + i])
        for i, n in enumerate(planned.nodes)
    )
    plaintext_ports = {n.node_id: ports[2 * NODES + i] for i, n in enumerate(members)}
    cluster = local.LocalCluster(
        planned.root, planned.cluster_id, members, secure.client_properties_path(planned)
    )
    material = secure.prepare(cluster)
    local.write_cluster(
        cluster,
        {},
        lambda node: overrides(cluster, node, material, plaintext_ports[node.node_id]),
    )
    started = [local.start_node(n) for n in cluster.nodes]
    try:
        security = load_client_properties(material.client_properties).security
        yield SecureNodes(cluster, security, plaintext_ports)
    finally:
        with trio.CancelScope(shield=True):
            await local.stop_nodes(list(cluster.nodes))
        for process in started:
            process.wait()


async def ready(bootstrap: str, security: ClientSecurity | None = None) -> bool:
    try:
        kwargs = {"security": security} if security else {}
        async with open_cluster(bootstrap, **kwargs) as client:
            quorum = await Admin(client).describe_quorum()
            return quorum["leader_id"] >= 0 and len(client.brokers) == NODES
    except Exception:  # not up yet, whatever the reason; the deadline reports it
        return False


async def test_scram_over_tls_against_real_nodes(nodes: SecureNodes) -> None:
    await wait_until("the nodes serve PLAINTEXT", lambda: ready(nodes.plaintext), READY_TIMEOUT_S)
    password = nodes.security.sasl_password
    assert password
    async with open_cluster(nodes.plaintext) as client:
        results = await Admin(client).alter_user_scram_credentials(
            [ScramUpsertion("admin", ScramMechanism.SCRAM_SHA_512, password)]
        )
        assert results["admin"].error.value == 0

    await wait_until(
        "the nodes serve SASL_SSL", lambda: ready(nodes.sasl_ssl, nodes.security), READY_TIMEOUT_S
    )
    async with open_cluster(nodes.sasl_ssl, security=nodes.security) as client:
        # Metadata over SASL_SSL names the brokers' SASL_SSL endpoints.
        assert sorted(client.brokers.values()) == sorted(
            ("127.0.0.1", n.client_port) for n in nodes.cluster.nodes
        )
        admin = Admin(client)
        created = await admin.create_topics([NewTopic("secure", 2, NODES)])
        assert created["secure"].error.value == 0
        await wait_until(
            "the topic has leaders",
            lambda: _has_leaders(client, "secure"),
            READY_TIMEOUT_S,
        )
        for partition in (0, 1):
            await Producer(client).produce("secure", [Record(value=b"sealed")], partition=partition)
        for partition in (0, 1):
            fetched = await Consumer(client).fetch_range("secure", partition, 0, 1)
            assert [r.value for r in fetched] == [b"sealed"]

    wrong = dataclasses.replace(nodes.security, sasl_password="guess")
    with pytest.raises(BaseException) as caught:
        async with open_cluster(nodes.sasl_ssl, security=wrong):
            pass
    leaf: BaseException = caught.value
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    assert isinstance(leaf, AuthenticationFailed)


async def _has_leaders(client: Any, topic: str) -> bool:
    await client.refresh_metadata([topic])
    info = client.topics.get(topic)
    return bool(info and info.partitions and all(p.leader_id >= 0 for p in info.partitions))
