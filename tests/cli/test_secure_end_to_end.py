"""The files `raftlog cluster up --secure` writes, used for real: a SASL_SSL listener (the
server's own TLS and SASL) presents node-1's certificate and knows the admin credential the
node config seeds; the one client.properties then serves raftlog --command-config, kcat -F
and confluent-kafka alike."""

from __future__ import annotations

import base64
import functools
import json
import re
import shutil
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from raftlog_cli import cluster_local as local
from raftlog_cli import cluster_secure as secure

from raftlog.client.properties import load_properties_file
from raftlog.config import NodeConfig
from raftlog.net.kafka.server import ListenerSecurity, serve
from raftlog.security import tls
from raftlog.security.acl import ScramMechanism
from raftlog.security.certs import make_ca
from raftlog.security.scram import credential_from_salted_password
from tests.cli.conftest import invoke
from tests.cli.security_backend import SecureMemoryBackend, security_registry

CLIENT_DEADLINE_S = 60


@dataclass
class SecureServer:
    backend: SecureMemoryBackend
    cluster: local.LocalCluster
    material: secure.SecureMaterial

    @property
    def properties(self) -> str:
        return str(self.material.client_properties)

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap_servers


def seed(backend: SecureMemoryBackend, entry: str) -> None:
    """What a node does with the bootstrap key on a fresh cluster (kafka-storage's --add-scram)."""
    match = re.fullmatch(
        r'(SCRAM-SHA-\d+)=\[name=(\w+),iterations=(\d+),salt="(.+)",saltedpassword="(.+)"\]', entry
    )
    assert match is not None
    mechanism = ScramMechanism[match.group(1).replace("-", "_")]
    backend.credentials[(match.group(2), mechanism)] = credential_from_salted_password(
        mechanism,
        salt=base64.b64decode(match.group(4)),
        salted_password=base64.b64decode(match.group(5)),
        iterations=int(match.group(3)),
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
async def server(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[SecureServer]:
    planned = local.plan_cluster(tmp_path / ".raftlog", 1, free_port())
    cluster = local.LocalCluster(
        planned.root, planned.cluster_id, planned.nodes, secure.client_properties_path(planned)
    )
    material = secure.prepare(cluster)
    node = cluster.nodes[0]
    (tmp_path / "data").mkdir()
    backend = SecureMemoryBackend(tmp_path / "data")
    seed(backend, material.bootstrap_credentials)
    listener = ListenerSecurity(
        name="SASL_SSL",
        security_protocol="SASL_SSL",
        ssl_context=tls.server_context(
            certfile=str(secure.node_cert_path(node)),
            keyfile=str(secure.node_key_path(node)),
            cafile=str(material.ca_location),
        ),
        sasl_mechanisms=("SCRAM-SHA-512", "SCRAM-SHA-256"),
    )
    await nursery.start(
        functools.partial(
            serve, backend, "127.0.0.1", node.client_port, NodeConfig(),
            registry=security_registry(), security=listener,
        )
    )  # fmt: skip
    backend.port = node.client_port
    yield SecureServer(backend, cluster, material)
    backend.close()


async def test_raftlog_commands_with_the_properties_file(server: SecureServer) -> None:
    config = ["--command-config", server.properties]
    r = await invoke(["topics", "create", "events", "--partitions", "2", *config])
    assert (r.exit_code, r.stderr) == (0, "")
    assert r.stdout == "Created topic events (2 partitions, replication factor 1)\n"
    r = await invoke(["users", "create", "--user", "bob", "--password-stdin", *config],
                     input="bob-secret\n")  # fmt: skip
    assert r.stdout == "Set the SCRAM-SHA-512 credential of user bob (8192 iterations)\n"
    r = await invoke(["users", "list", "--json", *config])
    assert [u["user"] for u in json.loads(r.stdout)] == ["admin", "bob"]


async def test_confluent_kafka_reads_the_same_file(server: SecureServer) -> None:
    r = await invoke(["topics", "create", "events", "--command-config", server.properties])
    assert r.exit_code == 0, r.stderr
    settings = load_properties_file(server.properties)

    def produce() -> int:
        from confluent_kafka import Producer

        producer = Producer(settings)
        producer.produce("events", b"over SASL_SSL")
        return int(producer.flush(CLIENT_DEADLINE_S))

    with trio.fail_after(CLIENT_DEADLINE_S):
        assert await trio.to_thread.run_sync(produce) == 0
    r = await invoke(
        ["consume", "events", "--from-beginning", "-n", "1", "--command-config", server.properties]
    )
    assert (r.exit_code, r.stdout) == (0, "over SASL_SSL\n")


async def test_kcat_reads_the_same_file(server: SecureServer) -> None:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed")
    with trio.fail_after(CLIENT_DEADLINE_S):
        listed = await trio.run_process(
            ["kcat", "-F", server.properties, "-L", "-J", "-m", "10"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert listed.returncode == 0, listed.stderr.decode()
    brokers = json.loads(listed.stdout)["brokers"]
    # kcat names a broker HOST:PORT or HOST:PORT/ID depending on its librdkafka.
    assert [(b["id"], b["name"].split("/")[0]) for b in brokers] == [(1, server.bootstrap)]


async def test_a_wrong_ca_or_password_is_one_line(server: SecureServer, tmp_path: Path) -> None:
    other_ca = tmp_path / "other-ca.pem"
    other_ca.write_bytes(make_ca("another CA").cert_pem)
    text = await trio.Path(server.properties).read_text()
    wrong_ca = tmp_path / "wrong-ca.properties"
    wrong_ca.write_text(re.sub(r"ssl.ca.location=.*", f"ssl.ca.location={other_ca}", text))
    r = await invoke(["topics", "list", "--command-config", str(wrong_ca)])
    assert (r.exit_code, r.stdout) == (1, "")
    assert r.stderr == (
        f"error: TLS handshake with {server.bootstrap} failed: certificate verify failed: "
        "unable to get local issuer certificate\n"
    )
    wrong_password = tmp_path / "wrong-password.properties"
    wrong_password.write_text(re.sub(r"sasl.password=.*", "sasl.password=guess", text))
    r = await invoke(["topics", "list", "--command-config", str(wrong_password)])
    assert r.exit_code == 1
    assert r.stderr.startswith(
        f"error: authentication as 'admin' with SCRAM-SHA-512 at {server.bootstrap} failed: "
    )
    r = await invoke(["topics", "list", "--bootstrap-server", server.bootstrap])
    assert r.exit_code == 1
    assert "closed the connection; if it is secured, pass --command-config" in r.stderr
