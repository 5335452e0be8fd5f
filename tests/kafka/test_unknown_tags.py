"""Unknown tagged fields (KIP-482) are skipped, as Kafka skips them, instead of closing the
connection the way kio's reader alone would (it raises on a tag it does not model)."""

from __future__ import annotations

import datetime
import io
import struct
import uuid
from typing import Any

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.fetch.v12.request import FetchRequest as FetchRequestV12
from kio.schema.fetch.v15.request import FetchRequest as FetchRequestV15
from kio.schema.fetch.v15.request import ReplicaState
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.request_header.v2 import RequestHeader
from kio.serial import entity_writer
from kio.serial.writers import write_unsigned_varint
from kio.static.primitive import uvarint

from raftlog.net.kafka.apis import ApiKey
from raftlog.net.kafka.codec import MalformedRequest, parse_request
from raftlog.net.kafka.tagged_fields import strip_unknown_tags
from tests.kafka.conftest import Broker
from tests.kafka.wire import WireClient

# Tags and sizes above 127 take more than one varint byte.
FUTURE_TAG = 1000
FUTURE_VALUE = bytes(range(200))
WAIT = datetime.timedelta(milliseconds=500)


def encode(entity: Any) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def varint(value: int) -> bytes:
    buffer = io.BytesIO()
    write_unsigned_varint(buffer, uvarint(value))
    return buffer.getvalue()


def with_tags(encoded: bytes, *tags: tuple[int, bytes]) -> bytes:
    """`encoded` (a flexible struct written with no tagged fields) with `tags` as its
    tagged-field section: count, then tag, size and bytes of each."""
    assert encoded[-1:] == b"\x00", "expected an empty tagged-field section at the end"
    section = b"".join(varint(tag) + varint(len(value)) + value for tag, value in tags)
    return encoded[:-1] + varint(len(tags)) + section


def header(body: Any, correlation_id: int = 7) -> RequestHeader:
    return RequestHeader(
        request_api_key=type(body).__api_key__,
        request_api_version=type(body).__version__,
        correlation_id=correlation_id,
        client_id="future-client",
    )


def metadata_request() -> MetadataRequest:
    topic = MetadataRequestTopic(topic_id=None, name="events")
    return MetadataRequest(
        topics=(topic,), allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )


def metadata_with_unknown_tag_in_topic() -> bytes:
    """Metadata v12 body whose nested topic struct carries an unknown tag."""
    body = metadata_request()
    plain = encode(body)
    topic = encode(body.topics[0])
    # The body is: compact array length 2 (one item), the topic struct, then the rest.
    assert plain[1 : 1 + len(topic)] == topic
    tagged_topic = with_tags(topic, (FUTURE_TAG, FUTURE_VALUE))
    return plain[:1] + tagged_topic + plain[1 + len(topic) :]


API_VERSIONS = ApiVersionsRequest(client_software_name="future", client_software_version="9")


@pytest.mark.parametrize(
    ("body", "frame"),
    [
        pytest.param(
            API_VERSIONS,
            with_tags(encode(header(API_VERSIONS)), (FUTURE_TAG, FUTURE_VALUE))
            + encode(API_VERSIONS),
            id="api-versions-v3-header",
        ),
        pytest.param(
            API_VERSIONS,
            encode(header(API_VERSIONS))
            + with_tags(encode(API_VERSIONS), (5, b"x"), (FUTURE_TAG, FUTURE_VALUE)),
            id="api-versions-v3-body",
        ),
        pytest.param(
            metadata_request(),
            encode(header(metadata_request())) + metadata_with_unknown_tag_in_topic(),
            id="metadata-v12-nested-topic",
        ),
    ],
)
def test_parse_request_skips_unknown_tags(body: Any, frame: bytes) -> None:
    api_key, version = type(body).__api_key__, type(body).__version__
    assert parse_request(frame, api_key, version) == (header(body), body)


def test_known_tags_next_to_unknown_ones_are_kept() -> None:
    body = FetchRequestV12(max_wait=WAIT, min_bytes=1, topics=(), forgotten_topics_data=())
    cluster_id = b"\x08cluster"  # compact string: length + 1, then the bytes
    frame = encode(header(body)) + with_tags(
        encode(body), (0, cluster_id), (FUTURE_TAG, FUTURE_VALUE)
    )
    _, parsed = parse_request(frame, ApiKey.FETCH, 12)
    assert parsed.cluster_id == "cluster"


def test_unknown_tag_inside_a_known_tagged_struct_is_dropped() -> None:
    """Fetch v15's replica_state is a tagged struct: its own unknown tags go, its size shrinks."""
    body = FetchRequestV15(max_wait=WAIT, min_bytes=1, topics=(), forgotten_topics_data=())
    state = with_tags(encode(ReplicaState(replica_id=3, replica_epoch=7)), (9, b"zz"))
    frame = encode(header(body)) + with_tags(encode(body), (1, state))
    stripped, dropped = strip_unknown_tags(frame, (RequestHeader, FetchRequestV15))
    assert dropped == 1
    _, parsed = parse_request(stripped, ApiKey.FETCH, 15)
    assert parsed.replica_state == ReplicaState(replica_id=3, replica_epoch=7)


@pytest.mark.parametrize(
    "section",
    [
        pytest.param(varint(1) + varint(FUTURE_TAG) + varint(50) + b"short", id="size-past-end"),
        pytest.param(varint(3) + varint(FUTURE_TAG) + varint(0), id="count-past-end"),
    ],
)
def test_a_tag_that_runs_past_the_frame_is_still_malformed(section: bytes) -> None:
    frame = encode(header(API_VERSIONS)) + encode(API_VERSIONS)[:-1] + section
    with pytest.raises(MalformedRequest):
        parse_request(frame, ApiKey.API_VERSIONS, 3)


def test_frames_that_are_not_tagged_field_problems_keep_kio_error() -> None:
    frame = encode(header(metadata_request())) + b"\x05\xff"  # 4 topics, then nothing
    with pytest.raises(MalformedRequest, match="MetadataRequest v12"):
        parse_request(frame, ApiKey.METADATA, 12)


async def test_server_answers_requests_with_unknown_tags(broker: Broker) -> None:
    """A raw socket sends ApiVersions v3 and Metadata v12 carrying unknown tags in the
    header, the body and a nested struct: each is answered, on the same connection."""
    client = await WireClient.connect(broker.port)
    frames = [
        (
            ApiKey.API_VERSIONS,
            3,
            with_tags(encode(header(API_VERSIONS, 1)), (FUTURE_TAG, FUTURE_VALUE))
            + with_tags(encode(API_VERSIONS), (FUTURE_TAG + 1, b"")),
        ),
        (
            ApiKey.METADATA,
            12,
            with_tags(encode(header(metadata_request(), 2)), (FUTURE_TAG, b"h"))
            + metadata_with_unknown_tag_in_topic(),
        ),
    ]
    for correlation_id, (api_key, version, frame) in enumerate(frames, start=1):
        await client.send_raw(struct.pack(">i", len(frame)) + frame)
        got_id, response = await client.receive(api_key, version)
        assert got_id == correlation_id
        if api_key == ApiKey.API_VERSIONS:
            assert {k.api_key for k in response.api_keys} >= {ApiKey.METADATA}
        else:
            assert [t.name for t in response.topics] == ["events"]
    await client.aclose()


def test_uuid_topic_ids_survive_the_walk() -> None:
    """A fixed-size field (uuid) in a nested struct is measured by kio, not guessed."""
    topic = MetadataRequestTopic(topic_id=uuid.uuid4(), name=None)
    body = MetadataRequest(
        topics=(topic,), allow_auto_topic_creation=True, include_topic_authorized_operations=True
    )
    plain = encode(body)
    topic_bytes = encode(topic)
    frame = (
        encode(header(body))
        + plain[:1]
        + with_tags(topic_bytes, (FUTURE_TAG, FUTURE_VALUE))
        + plain[1 + len(topic_bytes) :]
    )
    assert parse_request(frame, ApiKey.METADATA, 12) == (header(body), body)
