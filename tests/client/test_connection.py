"""BrokerConnection against a minimal kio-speaking trio broker."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2

from raftlog.client.connection import (
    ConnectionClosed,
    ConnectionLimits,
    RequestTimeout,
    UnsupportedVersion,
    open_connection,
)
from raftlog.client.protocol import build_request, throttle_time_ms
from tests.client.fake_broker import HANG_UP, FakeBroker, Request


async def start(nursery: trio.Nursery, **kwargs: Any) -> FakeBroker:
    return await nursery.start(FakeBroker(**kwargs).serve)


async def test_negotiates_the_highest_common_versions(nursery: trio.Nursery) -> None:
    broker = await start(nursery, api_versions={"api_versions": (0, 3), "metadata": (0, 8)})
    async with open_connection(broker.host, broker.port, client_id="t") as conn:
        assert conn.versions == {"api_versions": 3, "metadata": 8}
        with pytest.raises(UnsupportedVersion, match="create_topics"):
            conn.version("create_topics")
        response = await conn.call("metadata", {"topics": None})
        assert response.brokers[0].port == broker.port
    # Metadata v8 is not flexible: request header v1; ApiVersions v3 is: header v2.
    assert isinstance(broker.requests[0].header, RequestHeaderV2)
    assert broker.requests[1].api == "MetadataRequest" and broker.requests[1].version == 8
    assert isinstance(broker.requests[1].header, RequestHeaderV1)
    assert broker.requests[1].header.client_id == "t"


async def test_flexible_versions_use_header_v2(nursery: trio.Nursery) -> None:
    broker = await start(nursery)
    broker.topics["t"] = [(0, 1, 5)]
    async with open_connection(broker.host, broker.port) as conn:
        assert conn.version("metadata") == 12
        response = await conn.call("metadata", {"topics": [{"name": "t", "topic_id": None}]})
    assert isinstance(broker.requests[1].header, RequestHeaderV2)
    assert response.topics[0].partitions[0].leader_epoch == 5
    assert throttle_time_ms(response) == 0


async def test_api_versions_falls_back_when_the_broker_is_older(nursery: trio.Nursery) -> None:
    broker = await start(nursery, api_versions={"api_versions": (0, 2), "metadata": (0, 7)})
    async with open_connection(broker.host, broker.port) as conn:
        assert conn.versions == {"api_versions": 2, "metadata": 7}
    assert [r.version for r in broker.requests[:2]] == [3, 2]


async def test_pipelined_requests_are_matched_by_correlation_id(nursery: trio.Nursery) -> None:
    broker = await start(nursery)
    release = {name: trio.Event() for name in ("a", "b", "c", "d")}
    in_flight = 0
    max_in_flight = 0
    three_in_flight = trio.Event()

    async def on_metadata(request: Request) -> dict[str, Any]:
        nonlocal in_flight, max_in_flight
        in_flight += 1
        max_in_flight = max(max_in_flight, in_flight)
        if in_flight == 3:
            three_in_flight.set()
        name = request.body.topics[0].name
        await release[name].wait()
        in_flight -= 1
        return {"throttle_time": 0, "brokers": [], "topics": [_topic(name)]}

    broker.handlers["metadata"] = on_metadata
    results: dict[str, str] = {}
    limits = ConnectionLimits(max_in_flight_requests=3)
    async with open_connection(broker.host, broker.port, limits=limits) as conn:

        async def ask(name: str) -> None:
            response = await conn.call("metadata", {"topics": [{"name": name}]})
            results[name] = response.topics[0].name

        async with trio.open_nursery() as inner:
            for name in release:
                inner.start_soon(ask, name)
            with trio.fail_after(5):
                await three_in_flight.wait()
            # Release in reverse order: answers arrive out of order.
            for name in ("c", "b", "a", "d"):
                release[name].set()
    assert results == {name: name for name in release}
    assert max_in_flight == 3  # the fourth waited for a free in-flight slot


async def test_timeout_closes_the_connection(nursery: trio.Nursery) -> None:
    broker = await start(nursery)

    async def never(request: Request) -> None:
        await trio.sleep_forever()

    broker.handlers["metadata"] = never
    limits = ConnectionLimits(request_timeout_ms=100)
    async with open_connection(broker.host, broker.port, limits=limits) as conn:
        with pytest.raises(RequestTimeout, match="100 ms"):
            await conn.call("metadata", {"topics": None})
        assert conn.closed
        with pytest.raises(ConnectionClosed):
            await conn.call("metadata", {"topics": None})


async def test_broker_hangup_fails_waiting_requests(nursery: trio.Nursery) -> None:
    broker = await start(nursery)

    async def hang_up(request: Request) -> dict[str, Any]:
        return HANG_UP

    broker.handlers["metadata"] = hang_up
    async with open_connection(broker.host, broker.port) as conn:
        with pytest.raises(ConnectionClosed):
            await conn.call("metadata", {"topics": None})
        assert conn.closed


async def test_oversized_response_frame_closes_the_connection(nursery: trio.Nursery) -> None:
    broker = await start(nursery)
    broker.topics.update({f"topic-{i:04d}": [(0, 1, 0)] for i in range(200)})
    limits = ConnectionLimits(max_frame_bytes=1024)
    async with open_connection(broker.host, broker.port, limits=limits) as conn:
        with pytest.raises(ConnectionClosed, match="exceeds limit"):
            await conn.call("metadata", {"topics": None})


async def test_request_larger_than_the_frame_limit_is_refused(nursery: trio.Nursery) -> None:
    broker = await start(nursery)
    limits = ConnectionLimits(max_frame_bytes=1024)
    async with open_connection(broker.host, broker.port, limits=limits) as conn:
        big = build_request("metadata", 12, {"topics": [{"name": "x" * 2000}]})
        with pytest.raises(ValueError, match="max_frame_bytes"):
            await conn.request(big)
        assert not conn.closed  # nothing was sent; the connection is still usable
        await conn.call("metadata", {"topics": None})


async def test_clean_close_and_cancelled_callers(nursery: trio.Nursery) -> None:
    broker = await start(nursery)
    gate = trio.Event()

    async def slow(request: Request) -> dict[str, Any]:
        await gate.wait()
        return {"throttle_time": 0, "brokers": [], "topics": []}

    broker.handlers["metadata"] = slow
    async with open_connection(broker.host, broker.port) as conn:
        with trio.move_on_after(0.05):
            await conn.call("metadata", {"topics": None})  # abandoned by its caller
        gate.set()
        # The abandoned answer is read and dropped; the next request still works.
        response = await conn.call("metadata", {"topics": None})
        assert response.topics == ()
    assert conn.closed
    with pytest.raises(ConnectionClosed):
        await conn.call("metadata", {"topics": None})


def _topic(name: str) -> dict[str, Any]:
    return {"error_code": 0, "name": name, "topic_id": None, "partitions": []}
