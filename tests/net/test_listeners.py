"""Per-listener endpoints: what a broker registers, what the image keeps, and what Metadata
and DescribeCluster answer on each listener (Kafka answers with the endpoints of the listener
the request came in on)."""

from __future__ import annotations

import functools
import uuid
from pathlib import Path

import msgpack
import trio
from kio.schema.describe_cluster.v1.request import DescribeClusterRequest
from kio.schema.metadata.v12.request import MetadataRequest

from raftlog.config import NodeConfig
from raftlog.metadata import records as r
from raftlog.metadata.controller import messages as cm
from raftlog.metadata.image import BrokerRegistration
from raftlog.net.kafka.context import RequestContext
from raftlog.net.kafka.server import ListenerSecurity, serve
from tests.kafka.memory_backend import MemoryBackend
from tests.kafka.wire import WireClient

LISTENERS = (("PLAINTEXT", "kafka1", 9092, "PLAINTEXT"), ("SSL", "kafka1.example", 9093, "SSL"))


def test_register_broker_without_listeners_keeps_its_pinned_bytes() -> None:
    incarnation = uuid.uuid4()
    old = r.RegisterBroker(1, incarnation, 5, "h", 9092, "h", 19092)
    wire = msgpack.unpackb(r.encode_record(old))
    assert len(wire) == 2 + 8  # type id, version and the eight fields it always had
    new = r.RegisterBroker(1, incarnation, 5, "h", 9092, "h", 19092, None, LISTENERS)
    assert r.decode_record(r.encode_record(new)) == new
    assert r.decode_record(r.encode_record(old)).listeners == ()


def test_the_registration_message_carries_the_listeners() -> None:
    message = cm.RegisterBroker(2, uuid.uuid4(), "h", 9092, "h", 19092, None, "c", LISTENERS)
    encoded = cm.CODEC.encode(message, cm.ControllerRequest)
    assert cm.CODEC.decode(cm.ControllerRequest, encoded) == message


def test_the_image_exposes_each_listener_endpoint() -> None:
    registration = BrokerRegistration(
        1, uuid.uuid4(), 5, ("kafka1", 9092), ("kafka1", 19092), None, listeners=LISTENERS
    )
    assert registration.listener_endpoint("SSL") == ("kafka1.example", 9093)
    assert registration.listener_endpoint("SASL_SSL") is None
    assert BrokerRegistration(1, uuid.uuid4(), 5, ("h", 1), ("h", 2), None).listeners == ()


def test_request_context_answers_per_listener() -> None:
    class Connection:
        listener = "SSL"

    def lookup(listener: str, broker_id: int) -> tuple[str, int] | None:
        return {("SSL", 1): ("kafka1.example", 9093)}.get((listener, broker_id))

    def context(endpoints):  # type: ignore[no-untyped-def]
        return RequestContext(
            backend=None,  # type: ignore[arg-type]
            config=None,  # type: ignore[arg-type]
            quotas=None,  # type: ignore[arg-type]
            connection=Connection(),  # type: ignore[arg-type]
            api_key=3,
            api_version=12,
            correlation_id=1,
            client_id="t",
            endpoints=endpoints,
        )

    assert context(None).advertised(1, "kafka1", 9092) == ("kafka1", 9092)
    assert context(lookup).advertised(1, "kafka1", 9092) == ("kafka1.example", 9093)
    # A broker without that listener: its default endpoint.
    assert context(lookup).advertised(2, "kafka2", 9092) == ("kafka2", 9092)


async def test_metadata_and_describe_cluster_answer_with_the_listeners_endpoints(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    backend = MemoryBackend(tmp_path)
    ports: dict[str, int] = {}

    def endpoints(listener: str, broker_id: int) -> tuple[str, int] | None:
        port = ports.get(listener)
        return ("127.0.0.1", port) if broker_id == 1 and port is not None else None

    for name in ("PLAINTEXT", "EXTERNAL"):
        bound = await nursery.start(
            functools.partial(
                serve,
                backend,
                "127.0.0.1",
                0,
                NodeConfig(),
                security=ListenerSecurity(name=name),
                endpoints=endpoints,
            )
        )
        ports[name] = bound[0].socket.getsockname()[1]
    backend.port = ports["PLAINTEXT"]
    for name, port in ports.items():
        client = await WireClient.connect(port)
        metadata = await client.request(
            MetadataRequest(
                topics=None,
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
        )
        assert [(b.node_id, b.port) for b in metadata.brokers] == [(1, port)], name
        cluster = await client.request(
            DescribeClusterRequest(include_cluster_authorized_operations=False)
        )
        assert [(b.broker_id, b.port) for b in cluster.brokers] == [(1, port)], name
    backend.close()
