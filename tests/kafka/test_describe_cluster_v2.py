"""DescribeCluster v1/v2: endpoint types (KIP-919) and fenced brokers (KIP-1073)."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from raftlog.net.kafka.apis import ApiKey
from raftlog.net.kafka.backend import BrokerInfo
from tests.kafka.conftest import Broker
from tests.kafka.test_lapsed_leader_backend import _backend
from tests.kafka.test_wire import req
from tests.kafka.wire import WireClient
from tests.metadata.test_controller import SESSION_MS, cluster, heartbeat


def _listing(broker: Broker) -> None:
    broker.backend.brokers = lambda: [BrokerInfo(1, "127.0.0.1", broker.port)]  # type: ignore[method-assign]
    broker.backend.registered_brokers = lambda: [  # type: ignore[attr-defined]
        BrokerInfo(1, "127.0.0.1", broker.port),
        BrokerInfo(2, "127.0.0.1", 9, "r2", fenced=True),
    ]


async def test_v2_lists_fenced_brokers_only_when_asked(broker: Broker) -> None:
    _listing(broker)
    client = await WireClient.connect(broker.port)
    plain = await client.request(
        req(ApiKey.DESCRIBE_CLUSTER, 2, endpoint_type=1, include_fenced_brokers=False)
    )
    assert plain.error_code == ErrorCode.none
    assert [(b.broker_id, b.is_fenced) for b in plain.brokers] == [(1, False)]
    every = await client.request(
        req(ApiKey.DESCRIBE_CLUSTER, 2, endpoint_type=1, include_fenced_brokers=True)
    )
    assert every.error_code == ErrorCode.none
    assert [(b.broker_id, b.rack, b.is_fenced) for b in every.brokers] == [
        (1, None, False),
        (2, "r2", True),
    ]


@pytest.mark.parametrize(
    ("endpoint_type", "error"),
    [
        (2, ErrorCode.mismatched_endpoint_type),
        (0, ErrorCode.unsupported_endpoint_type),
        (-7, ErrorCode.unsupported_endpoint_type),
    ],
)
async def test_other_endpoint_types_are_refused(broker: Broker, endpoint_type, error) -> None:
    client = await WireClient.connect(broker.port)
    response = await client.request(
        req(ApiKey.DESCRIBE_CLUSTER, 2, endpoint_type=endpoint_type, include_fenced_brokers=True)
    )
    assert response.error_code == error
    assert response.brokers == ()


def test_the_broker_backend_flags_fenced_registrations() -> None:
    """registered_brokers lists every registration with its fencing; brokers() leaves a
    fenced broker out once its grace listing is over."""
    backend, _lifecycle, _produced, _failed = _backend()
    controller = cluster(3)
    heartbeat(controller, 1, now_ms=SESSION_MS - 1)
    heartbeat(controller, 3, now_ms=SESSION_MS - 1)
    controller.tick(SESSION_MS + 1)
    assert controller.image.brokers[2].fenced
    backend.metadata.image = controller.image
    backend._note_fences(controller.image, None)
    assert [(b.node_id, b.fenced) for b in backend.registered_brokers()] == [
        (1, False),
        (2, True),
        (3, False),
    ]
    assert {b.node_id for b in backend.brokers()} == {1, 3}
    assert not any(b.fenced for b in backend.brokers())
