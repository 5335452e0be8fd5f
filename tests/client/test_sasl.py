"""The client's SASL exchange (SaslHandshake v1 + SaslAuthenticate) against a fake broker
whose server side is raftlog.security.sasl's own mechanisms."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from raftlog_cli.errors import leaf_exception

from raftlog.client import open_cluster
from raftlog.client.auth import AuthenticationFailed
from raftlog.client.connection import ConnectionClosed, open_connection
from raftlog.client.properties import ClientSecurity, SecurityProtocol
from raftlog.security.acl import ScramMechanism
from raftlog.security.scram import make_credential
from tests.client.fake_broker import FakeBroker

SASL_APIS = {
    "api_versions": (0, 3),
    "metadata": (0, 12),
    "sasl_handshake": (0, 1),
    "sasl_authenticate": (0, 2),
}


def sasl(mechanism: str, user: str = "alice", password: str = "wonderland") -> ClientSecurity:
    return ClientSecurity(
        protocol=SecurityProtocol.SASL_PLAINTEXT,
        sasl_mechanism=mechanism,
        sasl_username=user,
        sasl_password=password,
    )


async def start(nursery: trio.Nursery, **kwargs: Any) -> FakeBroker:
    credentials = {
        ("alice", m): make_credential(m, "wonderland")
        for m in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)
    }
    kwargs.setdefault("api_versions", SASL_APIS)
    broker = FakeBroker(scram_credentials=credentials, **kwargs)
    started: FakeBroker = await nursery.start(broker.serve)
    return started


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_authenticates_then_serves_requests(nursery: trio.Nursery, mechanism: str) -> None:
    broker = await start(nursery)
    async with open_connection(broker.host, broker.port, security=sasl(mechanism)) as conn:
        response = await conn.call("metadata", {"topics": None})
        assert response.brokers[0].port == broker.port
        assert conn.session_renew_at is None
    assert broker.principals == ["User:alice"]
    # librdkafka's order: ApiVersions, SaslHandshake, SaslAuthenticate..., then the rest.
    apis = [r.api for r in broker.requests]
    rounds = 1 if mechanism == "PLAIN" else 2
    assert apis == [
        "ApiVersionsRequest",
        "SaslHandshakeRequest",
        *["SaslAuthenticateRequest"] * rounds,
        "MetadataRequest",
    ]
    assert broker.requests[1].version == 1


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
async def test_wrong_password_is_a_clear_error(nursery: trio.Nursery, mechanism: str) -> None:
    broker = await start(nursery)
    with pytest.raises(AuthenticationFailed) as caught:
        async with open_connection(
            broker.host, broker.port, security=sasl(mechanism, password="guess")
        ):
            pass
    assert str(caught.value) == (
        f"authentication as 'alice' with {mechanism} at 127.0.0.1:{broker.port} failed: "
        "Authentication failed: invalid credentials"
    )
    assert broker.principals == []


async def test_unknown_user_fails_like_a_wrong_password(nursery: trio.Nursery) -> None:
    broker = await start(nursery)
    with pytest.raises(AuthenticationFailed, match="invalid credentials"):
        async with open_connection(
            broker.host, broker.port, security=sasl("SCRAM-SHA-256", user="mallory")
        ):
            pass


async def test_mechanism_not_enabled(nursery: trio.Nursery) -> None:
    broker = await start(nursery, sasl_enabled_mechanisms=("SCRAM-SHA-512",))
    with pytest.raises(AuthenticationFailed) as caught:
        async with open_connection(broker.host, broker.port, security=sasl("PLAIN")):
            pass
    assert "does not enable SASL mechanism PLAIN (enabled: SCRAM-SHA-512)" in str(caught.value)


async def test_listener_without_sasl(nursery: trio.Nursery) -> None:
    broker = await start(nursery, api_versions={"api_versions": (0, 3), "metadata": (0, 12)})
    with pytest.raises(AuthenticationFailed, match="offers no SaslHandshake v1"):
        async with open_connection(broker.host, broker.port, security=sasl("PLAIN")):
            pass


async def test_a_server_that_cannot_prove_the_password_is_refused(nursery: trio.Nursery) -> None:
    """SCRAM is mutual: a server holding another credential for alice cannot fake the
    final signature, and the client refuses it even though the server said yes."""
    broker = await start(nursery)
    real = broker.scram_credentials
    assert real is not None
    impostor = make_credential(ScramMechanism.SCRAM_SHA_256, "other")
    good = real[("alice", ScramMechanism.SCRAM_SHA_256)]

    async def forged(request: Any) -> dict[str, Any]:
        # Answer the client-final with a made-up server signature.
        reply = await broker._on_sasl_authenticate(request)
        if bytes(request.body.auth_bytes).startswith(b"c="):
            return {**reply, "auth_bytes": b"v=" + b"QUJD" * 11}
        return reply

    broker.handlers["sasl_authenticate"] = forged
    assert impostor != good
    with pytest.raises(AuthenticationFailed, match="server signature does not match"):
        async with open_connection(broker.host, broker.port, security=sasl("SCRAM-SHA-256")):
            pass


async def test_requests_before_authentication_are_cut_off(nursery: trio.Nursery) -> None:
    """The fake broker behaves like Kafka: a client that skips SASL is hung up on."""
    broker = await start(nursery)
    async with open_cluster(f"127.0.0.1:{broker.port}", security=sasl("SCRAM-SHA-512")) as c:
        assert set(c.brokers) == {1}
    with pytest.raises(BaseException) as caught:
        async with open_cluster(f"127.0.0.1:{broker.port}"):
            pass
    assert isinstance(leaf_exception(caught.value), ConnectionClosed)


async def test_session_lifetime_renews_the_connection(nursery: trio.Nursery) -> None:
    """KIP-368: a session that runs out is replaced by a fresh, authenticated connection."""
    broker = await start(nursery, sasl_session_lifetime_ms=60_000)
    async with open_cluster(f"127.0.0.1:{broker.port}", security=sasl("PLAIN")) as cluster:
        first = await cluster.any_broker()
        assert first.session_renew_at is not None
        first.session_renew_at = trio.current_time()  # as if 85% of the lifetime had passed
        second = await cluster.any_broker()
        assert second is not first and first.closed and not second.closed
    assert broker.principals == ["User:alice", "User:alice"]
