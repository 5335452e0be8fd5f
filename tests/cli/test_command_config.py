"""--command-config: a client properties file (as for kcat and Kafka's tools) gives every
command its SASL/TLS settings; a bad file or refused credentials are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from raftlog.security.acl import ScramMechanism
from raftlog.security.scram import make_credential
from tests.cli.conftest import invoke
from tests.client.fake_broker import FakeBroker

SASL_APIS = {
    "api_versions": (0, 3),
    "metadata": (0, 12),
    "sasl_handshake": (0, 1),
    "sasl_authenticate": (0, 2),
}


@pytest.fixture
async def sasl_broker(nursery: trio.Nursery) -> FakeBroker:
    broker = FakeBroker(
        api_versions=SASL_APIS,
        scram_credentials={
            ("admin", ScramMechanism.SCRAM_SHA_512): make_credential(
                ScramMechanism.SCRAM_SHA_512, "hunter2", iterations=4096
            )
        },
        topics={"events": [(0, 1, 0)]},
    )
    started: FakeBroker = await nursery.start(broker.serve)
    return started


def properties(tmp_path: Path, text: str) -> str:
    path = tmp_path / "client.properties"
    path.write_text(text)
    return str(path)


SCRAM_ADMIN = (
    "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=admin\n"
)


async def test_sasl_settings_from_the_file(sasl_broker: FakeBroker, tmp_path: Path) -> None:
    config = properties(
        tmp_path, SCRAM_ADMIN + "sasl.password=hunter2\nlinger.ms=5\nacks=all\n"
        f"bootstrap.servers=127.0.0.1:{sasl_broker.port}\n"
    )  # fmt: skip
    # bootstrap.servers comes from the file when --bootstrap-server is not given.
    r = await invoke(["topics", "list", "--command-config", config, "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)[0]["name"] == "events"
    assert r.stderr == f"warning: {config}: raftlog ignores acks, linger.ms\n"
    assert sasl_broker.principals == ["User:admin"]


async def test_refused_credentials(sasl_broker: FakeBroker, tmp_path: Path) -> None:
    config = properties(tmp_path, SCRAM_ADMIN + "sasl.password=wrong\n")
    bootstrap = f"127.0.0.1:{sasl_broker.port}"
    r = await invoke(
        ["topics", "list", "--command-config", config, "--bootstrap-server", bootstrap]
    )
    assert (r.exit_code, r.stdout) == (1, "")
    assert r.stderr == (
        f"error: authentication as 'admin' with SCRAM-SHA-512 at {bootstrap} failed: "
        "Authentication failed: invalid credentials\n"
    )


async def test_no_credentials_to_a_secured_listener(sasl_broker: FakeBroker) -> None:
    bootstrap = f"127.0.0.1:{sasl_broker.port}"
    r = await invoke(["topics", "list", "--bootstrap-server", bootstrap])
    assert r.exit_code == 1
    assert r.stderr == (
        f"error: the cluster at {bootstrap} closed the connection; if it is secured, pass "
        "--command-config with its security.protocol, sasl.* and ssl.* settings\n"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "client properties file {path} does not exist"),
        ("security.protocol=SASL_SSL\n", "{path}: security.protocol=SASL_SSL needs sasl.mechanism"),
        ("sasl.mechanism=GSSAPI\n", "{path}: sasl.mechanism GSSAPI is not supported by raftlog"),
        ("security.protocol=SSL\nssl.ca.location=/nonexistent/ca.pem\n",
         "{path}: ssl.ca.location /nonexistent/ca.pem is not a readable file"),
    ],
)  # fmt: skip
async def test_bad_files_are_usage_errors(tmp_path: Path, text: str | None, message: str) -> None:
    path = tmp_path / "client.properties"
    if text is not None:
        path.write_text(text)
    r = await invoke(["topics", "list", "--command-config", str(path)])
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr.startswith("error: Invalid value for '--command-config': ")
    assert message.format(path=path) in r.stderr
    assert r.stderr.count("\n") == 1
