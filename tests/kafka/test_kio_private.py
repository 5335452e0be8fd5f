"""Pins the kio internals raftlog relies on (raftlog/kio_private.py).

kio has no public API for these; if an upgrade moves or changes them, these tests fail by
name, before the codec misbuilds a response or misreads a request.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

from kio.schema.describe_configs.v4.request import DescribeConfigsRequest, DescribeConfigsResource
from kio.schema.fetch.v15.request import FetchRequest, ReplicaState
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.request_header.v2 import RequestHeader
from kio.serial import entity_writer

from raftlog.kio_private import FieldShape, field_shape, primitive_field_reader


def field(cls: type[Any], name: str) -> dataclasses.Field[Any]:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def test_field_shape_tells_entities_arrays_and_nullability_apart() -> None:
    cases = {
        (MetadataRequest, "topics"): FieldShape(MetadataRequestTopic, True, True),
        (MetadataRequest, "allow_auto_topic_creation"): FieldShape(None, False, False),
        (MetadataRequestTopic, "name"): FieldShape(None, False, True),
        (DescribeConfigsRequest, "resources"): FieldShape(DescribeConfigsResource, True, False),
        (DescribeConfigsResource, "configuration_keys"): FieldShape(None, True, True),
        (FetchRequest, "replica_state"): FieldShape(ReplicaState, False, False),
    }
    for (cls, name), expected in cases.items():
        assert field_shape(field(cls, name)) == expected, (cls.__name__, name)


def _encoded(entity: Any) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def test_primitive_field_reader_reads_like_the_entity_reader() -> None:
    # The flexible request header keeps client_id as a legacy (int16-length) string: the
    # one special case kio applies by the class name, and the reason we ask kio for it.
    header = RequestHeader(
        request_api_key=3, request_api_version=12, correlation_id=9, client_id="abc"
    )
    data = _encoded(header)
    offset = 8  # api key, version (int16 each), correlation id (int32)
    reader = primitive_field_reader(RequestHeader, field(RequestHeader, "client_id"), tagged=False)
    assert reader(data, offset) == ("abc", 2 + 3)

    # An ordinary flexible string is compact (uvarint length + 1).
    topic = MetadataRequestTopic(topic_id=None, name="events")
    data = _encoded(topic)
    reader = primitive_field_reader(
        MetadataRequestTopic, field(MetadataRequestTopic, "name"), tagged=False
    )
    assert reader(data, 16) == ("events", 1 + 6)

    # A primitive array comes back as one reader for the whole array.
    resource = DescribeConfigsResource(
        resource_type=2, resource_name="t", configuration_keys=("a", "bc")
    )
    data = _encoded(resource)
    reader = primitive_field_reader(
        DescribeConfigsResource,
        field(DescribeConfigsResource, "configuration_keys"),
        tagged=False,
    )
    assert reader(data, 1 + 2) == (("a", "bc"), 1 + 2 + 3)
