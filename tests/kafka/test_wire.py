"""The server on loopback, driven with raw kio-encoded requests."""

from __future__ import annotations

import dataclasses
import struct

import pytest
import trio
from kio.schema.errors import ErrorCode

from raftlog.net.kafka.apis import REASSIGNMENT_APIS, VERSION_TABLE, ApiKey
from raftlog.net.kafka.codec import request_class, zero_response
from raftlog.net.kafka.handlers_util import to_ms
from tests.kafka.conftest import TEST_MAX_FRAME_BYTES, Broker
from tests.kafka.wire import WireClient, raw_header


def req(api_key: int, version: int, **values):
    """A request of that version: given fields, the rest zero/empty (codec.zero_response
    fills any kio entity)."""
    cls = request_class(api_key, version)
    base = zero_response(cls, ErrorCode.none)
    known = {f.name for f in dataclasses.fields(cls)}
    return dataclasses.replace(base, **{k: v for k, v in values.items() if k in known})


async def test_api_versions_lists_the_table(broker: Broker) -> None:
    client = await WireClient.connect(broker.port)
    response = await client.request(
        req(ApiKey.API_VERSIONS, 3, client_software_name="t", client_software_version="1")
    )
    assert response.error_code == ErrorCode.none
    got = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert got == {key: (lo, hi) for key, (lo, hi, _) in VERSION_TABLE.items()}


async def test_too_new_api_versions_gets_v0_unsupported(broker: Broker) -> None:
    client = await WireClient.connect(broker.port)
    # ApiVersions v4 is modelled by kio but not advertised: the v0 answer carries the table.
    await client.send(
        req(ApiKey.API_VERSIONS, 4, client_software_name="t", client_software_version="1")
    )
    correlation_id, response = await client.receive(ApiKey.API_VERSIONS, 0)
    assert correlation_id == 1
    assert response.error_code == ErrorCode.unsupported_version
    assert {k.api_key for k in response.api_keys} == set(VERSION_TABLE)
    # An unknown version number (kio has no model) too.
    await client.send_raw(struct.pack(">i", 12) + raw_header(18, 99, 7, "cl"))
    correlation_id, response = await client.receive(ApiKey.API_VERSIONS, 0)
    assert (correlation_id, response.error_code) == (7, ErrorCode.unsupported_version)


async def _assert_still_serving(broker: Broker) -> None:
    other = await WireClient.connect(broker.port)
    response = await other.request(req(ApiKey.METADATA, 1, topics=None))
    assert response.brokers[0].port == broker.port
    await other.aclose()


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(raw_header(11, 5, 1), id="unknown-api-JoinGroup"),
        pytest.param(raw_header(4242, 0, 1), id="api-key-unknown-to-kafka"),
        pytest.param(raw_header(3, 13, 1), id="unsupported-metadata-version"),
        pytest.param(b"\xff" * 40, id="garbage"),
        pytest.param(b"\x00", id="shorter-than-header"),
        pytest.param(raw_header(0, 9, 1) + b"\x01\x02", id="truncated-produce-body"),
    ],
)
async def test_bad_requests_close_only_their_connection(broker: Broker, payload: bytes) -> None:
    client = await WireClient.connect(broker.port)
    await client.send_raw(struct.pack(">i", len(payload)) + payload)
    assert await client.is_closed_by_peer()
    await _assert_still_serving(broker)


async def test_oversized_and_negative_frames_close_the_connection(broker: Broker) -> None:
    for size in (TEST_MAX_FRAME_BYTES + 1, 2**31 - 1, -5):
        client = await WireClient.connect(broker.port)
        await client.send_raw(struct.pack(">i", size) + b"\x00" * 16)
        assert await client.is_closed_by_peer()
    await _assert_still_serving(broker)


async def test_frame_cut_off_mid_way_is_dropped(broker: Broker) -> None:
    client = await WireClient.connect(broker.port)
    await client.send_raw(struct.pack(">i", 500) + b"\x00" * 10)
    await client.aclose()
    await _assert_still_serving(broker)


async def test_responses_keep_request_order(broker: Broker) -> None:
    """DescribeConfigs is held inside the backend while a later Metadata finishes first;
    the Metadata response must still come second."""
    broker.backend.gates["slow"] = gate = trio.Event()
    client = await WireClient.connect(broker.port)
    metadata_ran = trio.Event()
    original_topics = broker.backend.topics

    def topics(names):
        metadata_ran.set()
        return original_topics(names)

    broker.backend.topics = topics
    first = await client.send(
        req(ApiKey.DESCRIBE_CONFIGS, 4, resources=(_describe_resource("slow"),))
    )
    second = await client.send(req(ApiKey.METADATA, 12, topics=None))
    with trio.fail_after(5):
        await metadata_ran.wait()  # the later Metadata handler has run
    with trio.move_on_after(0.2):
        data = await client.stream.receive_some(1)
        pytest.fail(f"a response overtook the held one: {data!r}")
    gate.set()
    got_first, _ = await client.receive(ApiKey.DESCRIBE_CONFIGS, 4)
    got_second, _ = await client.receive(ApiKey.METADATA, 12)
    assert (got_first, got_second) == (first, second)


def _describe_resource(name: str):
    from kio.schema.describe_configs.v4.request import DescribeConfigsResource

    return DescribeConfigsResource(resource_type=2, resource_name=name, configuration_keys=None)


async def test_handler_crash_answers_unknown_server_error(broker: Broker, caplog) -> None:
    def boom():
        raise RuntimeError("injected")

    broker.backend.brokers = boom
    client = await WireClient.connect(broker.port)
    response = await client.request(req(ApiKey.DESCRIBE_CLUSTER, 1))
    assert response.error_code == ErrorCode.unknown_server_error
    assert "injected" in caplog.text
    # Same connection keeps working.
    response = await client.request(
        req(ApiKey.API_VERSIONS, 3, client_software_name="t", client_software_version="1")
    )
    assert response.error_code == ErrorCode.none


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(k, v) for k, (lo, hi, _) in sorted(VERSION_TABLE.items()) for v in range(lo, hi + 1)],
)
async def test_every_advertised_version_answers(broker: Broker, api_key: int, version: int):
    """A minimal request of every advertised API/version gets a well-formed answer."""
    values = {}
    if api_key == ApiKey.PRODUCE:
        values["acks"] = 1  # acks=0 has no response
    if api_key == ApiKey.INIT_PRODUCER_ID:
        values["transactional_id"] = None
        values["producer_id"] = -1
    if api_key == ApiKey.METADATA and version >= 1:
        values["topics"] = None
    client = await WireClient.connect(broker.port)
    response = await client.request(req(api_key, version, **values))
    assert to_ms(getattr(response, "throttle_time", 0)) == 0
    error = getattr(response, "error_code", ErrorCode.none)
    if api_key in REASSIGNMENT_APIS and error == ErrorCode.unknown_server_error:
        # The in-memory backend has no controller to move partitions (the real path:
        # tests/kafka/test_reassign_handlers.py); the answer is well formed all the same.
        message = getattr(response, "error_message", None)
        assert message in (None, "this node does not move partitions"), response
        return
    if api_key == ApiKey.UNREGISTER_BROKER:
        # No controller behind the in-memory backend either (the real path:
        # tests/kafka/test_unregister_broker_handler.py).
        assert error == ErrorCode.unknown_server_error, response
        return
    assert error == ErrorCode.none, response


FUZZ_SEED = 20240611
FUZZ_CASES = 60


async def test_random_bodies_never_break_the_server(broker: Broker) -> None:
    """Valid headers of advertised APIs followed by random bodies: the server answers or
    closes that connection, and always keeps serving. Replays exactly from FUZZ_SEED."""
    import random

    rng = random.Random(FUZZ_SEED)
    table = sorted((k, lo, hi) for k, (lo, hi, _) in VERSION_TABLE.items())
    for case in range(FUZZ_CASES):
        api_key, lo, hi = rng.choice(table)
        version = rng.randint(lo, hi)
        body = rng.randbytes(rng.randint(0, 64))
        payload = raw_header(api_key, version, case) + body
        client = await WireClient.connect(broker.port)
        await client.send_raw(struct.pack(">i", len(payload)) + payload)
        with trio.fail_after(5):
            try:
                await client.stream.receive_some(65536)  # a response, or b"" when closed
            except trio.BrokenResourceError:
                pass
        await client.aclose()
        print(f"seed={FUZZ_SEED} case={case} api={api_key} v{version} ok")
    await _assert_still_serving(broker)
