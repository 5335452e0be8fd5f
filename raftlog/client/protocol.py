"""Client-side Kafka protocol helpers on kio: the API table, headers, request building.

kio owns every byte. This module adds what a client needs around it:

* CLIENT_API_VERSIONS, the version range of each API this client can speak; the connection
  picks, per API, the highest version both it and the broker support;
* header choice: request header v2 for flexible request versions and v1 otherwise; response
  header v1 for flexible responses, except ApiVersions, whose response always uses header v0
  (so a client can read it before it knows what the broker speaks);
* `build()`, which turns plain nested dicts into the kio dataclass of a given version, dropping
  keys that version does not have, so admin code writes one dict for every version.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import io
from collections.abc import Mapping
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32, i32Timedelta, i64, i64Timedelta

from raftlog.errors import RemoteError
from raftlog.kio_private import FieldShape, field_shape

# API keys by name, from kio's own index (so a typo is a KeyError, not a wrong number).
API_KEYS: dict[str, int] = {name: key for key, name in api_key_map.items()}
API_VERSIONS_KEY = API_KEYS["api_versions"]

# What this client speaks: api name -> (min version, max version). Ranges stop at versions kio
# models and that need nothing the client does not implement (no topic ids in fetch).
CLIENT_API_VERSIONS: dict[str, tuple[int, int]] = {
    "produce": (3, 9),
    "fetch": (4, 12),
    "list_offsets": (1, 7),
    "metadata": (1, 12),
    "api_versions": (0, 3),
    "create_topics": (2, 7),
    "delete_topics": (1, 6),
    "create_partitions": (0, 3),
    "describe_configs": (1, 4),
    "alter_configs": (0, 2),
    "incremental_alter_configs": (0, 1),
    "describe_cluster": (0, 1),
    "describe_quorum": (0, 1),
    "describe_client_quotas": (0, 1),
    "alter_client_quotas": (0, 1),
    # v1: authentication bytes travel in SaslAuthenticate requests (KIP-152), never raw.
    "sasl_handshake": (1, 1),
    "sasl_authenticate": (0, 2),
    "describe_acls": (1, 3),
    "create_acls": (1, 3),
    "delete_acls": (1, 3),
    "describe_user_scram_credentials": (0, 0),
    "alter_user_scram_credentials": (0, 0),
}


class IsolationLevel(enum.IntEnum):
    """Fetch and ListOffsets isolation (KIP-98): read_committed reads only up to the last
    stable offset and leaves out aborted transactions' records."""

    READ_UNCOMMITTED = 0
    READ_COMMITTED = 1

    @classmethod
    def parse(cls, text: str) -> IsolationLevel:
        """Kafka's config spelling (isolation.level=read_committed); ValueError otherwise."""
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(
                f"isolation level must be read_uncommitted or read_committed, got {text!r}"
            ) from None

    @property
    def config_name(self) -> str:
        return self.name.lower()


class ProtocolError(RemoteError):
    """The broker sent something the client cannot make sense of."""


def api_name(api_key: int) -> str:
    return api_key_map[api_key]


def response_header_version(api_key: int, api_version: int) -> int:
    if api_key == API_VERSIONS_KEY:
        return 0
    return 1 if load_response_schema(api_key, api_version).__flexible__ else 0


def encode_request(payload: Any, correlation_id: int, client_id: str | None) -> bytes:
    """Header (v1 or v2, by the payload's flexibility) followed by the payload, unframed."""
    header_cls = RequestHeaderV2 if type(payload).__flexible__ else RequestHeaderV1
    header = header_cls(
        request_api_key=i16(type(payload).__api_key__),
        request_api_version=i16(type(payload).__version__),
        correlation_id=i32(correlation_id),
        client_id=client_id,
    )
    buffer = io.BytesIO()
    entity_writer(header_cls)(buffer, header)
    entity_writer(type(payload))(buffer, payload)
    return buffer.getvalue()


def peek_correlation_id(frame: bytes) -> int:
    if len(frame) < 4:
        raise ProtocolError(f"response frame of {len(frame)} bytes has no correlation id")
    return int.from_bytes(frame[:4], "big", signed=True)


# Responses whose wall-clock times (datetime_i64) may be -1, Kafka's "none", which kio's
# reader refuses as a negative timestamp: DescribeTransactions' transaction_start_time of an
# id with no open transaction. They are read as plain int64 milliseconds instead.
INT_TIMESTAMP_RESPONSES = frozenset({"describe_transactions"})


@cache
def response_schema(api_key: int, api_version: int) -> type:
    """kio's response class, or for INT_TIMESTAMP_RESPONSES its twin with int64 times."""
    cls: type = load_response_schema(api_key, api_version)
    if api_name(api_key) in INT_TIMESTAMP_RESPONSES:
        cls = _with_int_timestamps(cls)
    return cls


@cache
def _with_int_timestamps(cls: type) -> type:
    """A copy of the kio entity `cls` (nested entities too) whose datetime_i64 fields are
    int64: the same bytes on the wire, read without kio's sign check."""
    fields: list[tuple[str, Any, Any]] = []
    changed = False
    for f in dataclasses.fields(cls):
        shape = field_shape(f)
        kind: Any = f.type
        metadata: Mapping[str, Any] = f.metadata
        if f.metadata.get("kafka_type") == "datetime_i64" and shape.entity is None:
            kind, metadata, changed = i64, {**f.metadata, "kafka_type": "int64"}, True
        elif shape.entity is not None:
            nested = _with_int_timestamps(shape.entity)
            if nested is not shape.entity:
                changed = True
                kind = tuple[nested, ...] if shape.is_array else nested  # type: ignore[valid-type]
                if shape.nullable:
                    kind = kind | None
        options: dict[str, Any] = {"metadata": metadata}
        if f.default is not dataclasses.MISSING:
            options["default"] = f.default
        if f.default_factory is not dataclasses.MISSING:
            options["default_factory"] = f.default_factory
        fields.append((f.name, kind, dataclasses.field(**options)))
    if not changed:
        return cls
    dunders = ("__type__", "__version__", "__flexible__", "__api_key__", "__header_schema__")
    return dataclasses.make_dataclass(
        cls.__name__,
        fields,
        frozen=True,
        slots=True,
        kw_only=True,
        namespace={name: getattr(cls, name) for name in dunders if hasattr(cls, name)},
    )


def decode_response(frame: bytes, api_key: int, api_version: int) -> Any:
    """Parse a response frame (header included) as the response to (api_key, api_version)."""
    header_cls = (
        ResponseHeaderV1 if response_header_version(api_key, api_version) == 1 else ResponseHeaderV0
    )
    response_cls: Any = response_schema(api_key, api_version)
    try:
        _, header_bytes = entity_reader(header_cls)(frame, 0)
        response, body_bytes = entity_reader(response_cls)(frame, header_bytes)
    except Exception as exc:  # kio raises several types for truncated or bad input
        raise ProtocolError(
            f"cannot decode {api_name(api_key)} v{api_version} response: {exc}"
        ) from exc
    if header_bytes + body_bytes != len(frame):
        raise ProtocolError(
            f"{api_name(api_key)} v{api_version} response has "
            f"{len(frame) - header_bytes - body_bytes} trailing bytes"
        )
    return response


# --------------------------------------------------------------------------- building
@cache
def _fields(cls: type) -> tuple[tuple[dataclasses.Field[Any], FieldShape], ...]:
    return tuple((f, field_shape(f)) for f in dataclasses.fields(cls))


def _convert(f: dataclasses.Field[Any], shape: FieldShape, value: Any) -> Any:
    entity = shape.entity
    if entity is not None and shape.is_array:
        if value is None:
            return None
        return tuple(item if isinstance(item, entity) else build(entity, item) for item in value)
    if entity is not None:
        if value is None or isinstance(value, entity):
            return value
        return build(entity, value)
    kafka_type = f.metadata.get("kafka_type")
    if kafka_type in ("timedelta_i32", "timedelta_i64") and isinstance(value, int):
        delta = datetime.timedelta(milliseconds=value)
        return (
            i32Timedelta.parse(delta)
            if kafka_type == "timedelta_i32"
            else i64Timedelta.parse(delta)
        )
    if kafka_type == "error_code" and isinstance(value, int) and not isinstance(value, ErrorCode):
        return ErrorCode(value)
    if isinstance(value, list):
        return tuple(value)
    return value


def build(cls: type, values: Mapping[str, Any]) -> Any:
    """Make a kio entity of `cls` from a plain dict; keys the version lacks are dropped.

    Missing fields take the schema default, then () for arrays, None for nullable fields and
    False for booleans; anything else missing raises, naming the field.
    """
    kwargs: dict[str, Any] = {}
    for f, shape in _fields(cls):
        if f.name in values:
            kwargs[f.name] = _convert(f, shape, values[f.name])
        elif f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        elif shape.is_array:
            kwargs[f.name] = ()
        elif _nullable(f):
            kwargs[f.name] = None
        elif f.metadata.get("kafka_type") == "bool":
            # Kafka's booleans (include_*, validate_only, ...) all mean "off" when false.
            kwargs[f.name] = False
        else:
            version = getattr(cls, "__version__", "?")
            raise ValueError(f"{cls.__name__} v{version} needs field {f.name!r}")
    return cls(**kwargs)


def _nullable(f: dataclasses.Field[Any]) -> bool:
    return "None" in repr(f.type)


def build_request(api: str, version: int, values: Mapping[str, Any]) -> Any:
    return build(load_request_schema(API_KEYS[api], version), values)


def throttle_time_ms(response: Any) -> int:
    """The response's throttle time in ms (0 if the version has no such field)."""
    value: Any = getattr(response, "throttle_time", None)
    if value is None:
        value = getattr(response, "throttle_time_ms", 0)
    if isinstance(value, datetime.timedelta):
        return int(value / datetime.timedelta(milliseconds=1))
    return int(value or 0)


def error_of(value: Any) -> ErrorCode:
    """An ErrorCode from a response field that kio may give as ErrorCode or int."""
    return value if isinstance(value, ErrorCode) else ErrorCode(int(value))
