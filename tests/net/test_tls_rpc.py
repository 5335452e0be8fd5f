"""Internal RPC over mutual TLS, in-process on loopback: a connection speaks for the node its
certificate names, a peer without a cluster certificate is refused at the handshake, and a
node dialling a peer refuses one whose certificate names another node."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import pytest
import trio

from raftlog.net.rpc import (
    KIND_REQUEST,
    PeerSet,
    RpcError,
    RpcLimits,
    _encode,
    identify_by_certificate,
    serve_rpc,
)
from raftlog.security import tls
from tests.net.test_rpc import _read_answers
from tests.net.test_tls_certs import PemFiles, issue, write_ca

FAST = RpcLimits(connect_timeout_s=1.0, reconnect_backoff_max_s=0.2)


def _server_context(files: PemFiles):
    return tls.server_context(
        certfile=files.cert, keyfile=files.key, cafile=files.ca, client_auth="required"
    )


def _client_context(files: PemFiles):
    return tls.client_context(
        cafile=files.ca, certfile=files.cert, keyfile=files.key, check_hostname=False
    )


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, PemFiles]:
    ca, ca_path = write_ca(tmp_path)
    files = {name: issue(tmp_path, ca, ca_path, name) for name in ("node-1", "node-2", "node-3")}
    files["alice"] = issue(tmp_path, ca, ca_path, "alice")  # from the CA, but names no node
    rogue_ca, _ = write_ca(tmp_path / "rogue", "rogue")
    # "node-2" signed by another CA, held by a process that trusts the cluster's CA.
    files["rogue-node-2"] = issue(tmp_path / "rogue", rogue_ca, ca_path, "node-2")
    return files


async def _serve(nursery: trio.Nursery, files: PemFiles, seen: list[int]) -> int:
    async def handler(sender_id: int, method: str, body: object) -> object:
        seen.append(sender_id)
        return sender_id

    listeners = await nursery.start(
        functools.partial(
            serve_rpc,
            handler,
            "127.0.0.1",
            0,
            limits=FAST,
            ssl_context=_server_context(files),
            identify=identify_by_certificate,
        )
    )
    return int(listeners[0].socket.getsockname()[1])


async def test_a_node_certificate_binds_the_connection_to_its_node(
    pki: dict[str, PemFiles],
) -> None:
    seen: list[int] = []
    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, pki["node-1"], seen)
        peers = PeerSet(2, FAST, ssl_context=_client_context(pki["node-2"]))
        await nursery.start(peers.run)
        assert await peers.peer(1, "127.0.0.1", port).call("x", None) == 2
        assert seen == [2]
        nursery.cancel_scope.cancel()


async def test_a_connection_claiming_another_node_is_closed(
    pki: dict[str, PemFiles], caplog: pytest.LogCaptureFixture
) -> None:
    """A valid node-3 certificate, then a frame (a replica fetch) that says it is node 2."""
    caplog.set_level(logging.INFO, "raftlog.rpc")
    seen: list[int] = []
    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, pki["node-1"], seen)
        raw = await trio.open_tcp_stream("127.0.0.1", port)
        stream = trio.SSLStream(raw, _client_context(pki["node-3"]))
        await stream.send_all(_encode(KIND_REQUEST, 1, 2, "replica.fetch", {"replica_id": 2}))
        assert await _read_answers(stream) == []
        assert seen == []
        assert "it speaks for node 3, a replica.fetch names node 2" in caplog.text
        nursery.cancel_scope.cancel()


async def test_peers_without_a_node_certificate_are_refused(
    pki: dict[str, PemFiles], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "raftlog.rpc")
    seen: list[int] = []
    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, pki["node-1"], seen)
        # No certificate at all: the handshake fails (client_auth required).
        raw = await trio.open_tcp_stream("127.0.0.1", port)
        anonymous = trio.SSLStream(raw, tls.client_context(cafile=pki["node-1"].ca))
        await anonymous.send_all(_encode(KIND_REQUEST, 1, 2, "x", None))
        assert await _read_answers(anonymous) == []
        # A certificate from the cluster CA that names no node.
        raw = await trio.open_tcp_stream("127.0.0.1", port)
        user = trio.SSLStream(raw, _client_context(pki["alice"]))
        await user.send_all(_encode(KIND_REQUEST, 1, 2, "x", None))
        assert await _read_answers(user) == []
        # "node-2" signed by another CA.
        raw = await trio.open_tcp_stream("127.0.0.1", port)
        rogue = trio.SSLStream(raw, _client_context(pki["rogue-node-2"]))
        await rogue.send_all(_encode(KIND_REQUEST, 1, 2, "x", None))
        assert await _read_answers(rogue) == []
        assert seen == []
        text = caplog.text
        assert text.count("internal listener: TLS handshake with") == 2
        assert "certificate (CN=alice) names no node" in text
        assert "Traceback" not in text
        nursery.cancel_scope.cancel()


async def test_a_node_refuses_a_peer_whose_certificate_names_another_node(
    pki: dict[str, PemFiles], caplog: pytest.LogCaptureFixture
) -> None:
    """Node 2 dials what its config says is node 1; the certificate there says node-3."""
    seen: list[int] = []
    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, pki["node-3"], seen)
        peers = PeerSet(2, FAST, ssl_context=_client_context(pki["node-2"]))
        await nursery.start(peers.run)
        with pytest.raises(RpcError, match="not reachable"):
            await peers.peer(1, "127.0.0.1", port).call("x", None, timeout_s=2)
        assert "its certificate names node 3, not node 1" in caplog.text
        assert seen == []
        nursery.cancel_scope.cancel()
