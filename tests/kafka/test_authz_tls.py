"""The authorizer with a TLS client certificate's principal: the certificate's mapped name
("CN=alice" -> User:alice) is whom ACLs name; a client without a certificate is
User:ANONYMOUS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from raftlog.errors import ErrorCode
from raftlog.metadata.controller.messages import NewTopic
from raftlog.security import tls
from raftlog.security.acl import AclOperation, ResourceType
from raftlog.security.authorizer import Authorizer
from tests.kafka.test_authz import acl, produce, produce_codes
from tests.kafka.wire import WireClient
from tests.net.test_tls import TlsBroker, start_tls_broker


async def _client(broker: TlsBroker, *, with_certificate: bool) -> WireClient:
    context = tls.client_context(
        cafile=broker.ca,
        certfile=broker.client.cert if with_certificate else None,
        keyfile=broker.client.key if with_certificate else None,
    )
    stream = trio.SSLStream(
        await trio.open_tcp_stream("127.0.0.1", broker.port), context, server_hostname="127.0.0.1"
    )
    return WireClient(stream)  # type: ignore[arg-type]  # any trio stream frames the same


async def test_certificate_principal_is_what_acls_name(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    broker = await start_tls_broker(nursery, tmp_path)
    backend: Any = broker.backend
    await backend.create_topics([NewTopic("orders", 1, 1), NewTopic("secret", 1, 1)], 5000, False)
    backend.authorizer = Authorizer(
        [
            acl(ResourceType.TOPIC, "orders", AclOperation.WRITE),
            acl(ResourceType.TOPIC, "secret", AclOperation.WRITE, principal="User:ANONYMOUS"),
        ]
    )
    with trio.fail_after(10):
        alice = await _client(broker, with_certificate=True)
        got = produce_codes(await alice.request(produce("orders", "secret")))
        assert got == {"orders": ErrorCode.none, "secret": ErrorCode.topic_authorization_failed}
        anonymous = await _client(broker, with_certificate=False)
        got = produce_codes(await anonymous.request(produce("orders", "secret")))
        assert got == {"orders": ErrorCode.topic_authorization_failed, "secret": ErrorCode.none}
    broker.backend.close()
