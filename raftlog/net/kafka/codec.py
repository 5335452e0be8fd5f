"""Kafka request/response coding on top of kio.

kio owns every byte of the protocol. This module only adds three things kio leaves to the
caller:

* peeking the api key and version of a frame, so dispatch can refuse a request before kio
  is asked to parse a version it does not model;
* `build()`, which turns plain nested dicts (keys are kio field names, values plain ints and
  strings) into the frozen dataclass of whichever API version the client speaks. Fields the
  version does not have are dropped, so one handler serves every version;
* `encode_response()`, which writes the response through a segment-collecting buffer, so a
  `RecordSet` (record bytes still on disk as file regions) is passed through by reference and
  can later be written with sendfile, never copied into the response.

`parse_request` also accepts what Kafka accepts and kio refuses: unknown tagged fields
(tagged_fields.py) and trailing bytes.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import struct
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import IO, Any, cast

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map
from kio.serial import entity_reader, entity_writer

from raftlog.errors import RemoteError
from raftlog.kio_private import field_shape
from raftlog.net.kafka.tagged_fields import strip_unknown_tags
from raftlog.storage.segment import FileRegion

_API_KEY_VERSION = struct.Struct(">hh")
_FRAME_SIZE = struct.Struct(">i")

log = logging.getLogger("raftlog.kafka")


class MalformedRequest(RemoteError):
    """A frame that kio cannot parse as the request it claims to be."""


# --------------------------------------------------------------------------- record sets
class RecordSet:
    """Record bytes of one fetched partition: in-memory chunks and file regions, in order.

    kio's bytes writers only call len() and buffer.write() on a records value, so passing a
    RecordSet in place of bytes lets the response be encoded without reading the file
    regions; `SegmentBuffer.write` recognises it and keeps it as a separate segment.
    """

    __slots__ = ("_length_bytes", "chunks")

    def __init__(self, chunks: Iterable[bytes | FileRegion]) -> None:
        self.chunks: tuple[bytes | FileRegion, ...] = tuple(c for c in chunks if _length(c))
        self._length_bytes = sum(_length(c) for c in self.chunks)

    def __len__(self) -> int:
        return self._length_bytes

    def to_bytes(self) -> bytes:
        """Materialise (tests and the non-sendfile fallback for small sets)."""
        out = bytearray()
        for chunk in self.chunks:
            out += chunk.read_bytes() if isinstance(chunk, FileRegion) else chunk
        return bytes(out)


def _length(chunk: bytes | FileRegion) -> int:
    return chunk.length_bytes if isinstance(chunk, FileRegion) else len(chunk)


Segment = bytes | FileRegion


class SegmentBuffer:
    """A kio `Writable` that collects bytes, keeping RecordSet file regions as references."""

    def __init__(self) -> None:
        self._segments: list[Segment] = []
        self._current = bytearray()

    def write(self, data: Any) -> int:
        if isinstance(data, RecordSet):
            for chunk in data.chunks:
                if isinstance(chunk, FileRegion):
                    self._flush()
                    self._segments.append(chunk)
                else:
                    self._current += chunk
            return len(data)
        self._current += data
        return len(data)

    def _flush(self) -> None:
        if self._current:
            self._segments.append(bytes(self._current))
            self._current = bytearray()

    def as_kio_writable(self) -> IO[bytes]:
        """This buffer typed as kio's writers declare their target. kio annotates it as
        `StreamWriter | IO[bytes]` but only ever calls `write()` on it (and hands records
        values straight to that `write()`, which is what keeps file regions by reference)."""
        return cast("IO[bytes]", self)

    def segments(self) -> list[Segment]:
        self._flush()
        return self._segments


def segments_length(segments: Sequence[Segment]) -> int:
    return sum(_length(s) for s in segments)


# --------------------------------------------------------------------------- schema lookup
def api_name(api_key: int) -> str:
    return api_key_map.get(api_key, f"unknown({api_key})")


# kio.index raises its KioIndexError (UnknownAPIKey, UnknownEntity) for what it does not model.
@cache
def request_class(api_key: int, version: int) -> type[Any]:
    """The kio request dataclass of one API version."""
    return load_request_schema(api_key, version)


@cache
def response_class(api_key: int, version: int) -> type[Any]:
    """The kio response dataclass of one API version."""
    return load_response_schema(api_key, version)


def peek_api(frame: bytes) -> tuple[int, int]:
    """(api_key, api_version) from the first four bytes every request header starts with."""
    if len(frame) < _API_KEY_VERSION.size:
        raise MalformedRequest(f"frame of {len(frame)} bytes is shorter than a request header")
    return _API_KEY_VERSION.unpack_from(frame, 0)


def parse_request(frame: bytes, api_key: int, version: int) -> tuple[Any, Any]:
    """Parse header and body with kio; MalformedRequest on anything kio rejects, except
    tagged fields kio does not model: Kafka skips those, and so does this."""
    cls = request_class(api_key, version)
    try:
        return _parse_request(frame, cls, version)
    except MalformedRequest as exc:
        if not cls.__flexible__:
            raise
        refused = exc
    try:
        stripped, dropped = strip_unknown_tags(frame, (cls.__header_schema__, cls))
    except Exception:
        stripped, dropped = frame, 0  # not the schema's shape at all: kio's error stands
    if not dropped:
        raise refused
    log.debug("%s v%d: ignoring %d unknown tagged field(s)", cls.__name__, version, dropped)
    return _parse_request(stripped, cls, version)


def _parse_request(frame: bytes, cls: type[Any], version: int) -> tuple[Any, Any]:
    try:
        header, header_size = entity_reader(cls.__header_schema__)(frame, 0)
        body, body_size = entity_reader(cls)(frame, header_size)
    except Exception as exc:
        raise MalformedRequest(f"cannot parse {cls.__name__} v{version}: {exc!r}") from exc
    trailing_bytes = len(frame) - header_size - body_size
    if trailing_bytes:
        # Kafka's own brokers parse the fields they know and ignore what follows; librdkafka
        # relies on that (its all-topics Metadata v12 request carries 3 extra bytes), so a
        # compatible broker must accept them too.
        log.debug("%s v%d: ignoring %d trailing bytes", cls.__name__, version, trailing_bytes)
    return header, body


def parse_header_only(frame: bytes) -> Any:
    """Header v1 (api key, version, correlation id, client id) is a prefix of every request
    header, so it can be read from a request whose version kio does not model."""
    from kio.schema.request_header.v1 import RequestHeader

    try:
        header, _ = entity_reader(RequestHeader)(frame, 0)
    except Exception as exc:
        raise MalformedRequest(f"cannot parse request header: {exc!r}") from exc
    return header


def encode_response(response: Any, correlation_id: int) -> list[Segment]:
    """Header + body as segments; bytes segments are coalesced, file regions kept apart."""
    header_cls = type(response).__header_schema__
    buffer = SegmentBuffer()
    entity_writer(header_cls)(buffer.as_kio_writable(), header_cls(correlation_id=correlation_id))
    entity_writer(type(response))(buffer.as_kio_writable(), response)
    return buffer.segments()


# --------------------------------------------------------------------------- building
def _convert(field: dataclasses.Field[Any], value: Any) -> Any:
    kafka_type = field.metadata.get("kafka_type")
    if kafka_type in ("timedelta_i32", "timedelta_i64") and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    if kafka_type == "datetime_i64" and isinstance(value, int):
        if value < 0:
            return None
        return datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)
    if kafka_type == "error_code" and isinstance(value, int):
        return ErrorCode(value)
    return value


def build(cls: type[Any], values: Mapping[str, Any]) -> Any:
    """Build kio entity `cls` from a dict; nested entities from nested dicts/lists of dicts.

    Keys the version does not have are ignored (older versions lack newer fields). A field
    the version requires and the dict lacks raises TypeError naming it.
    """
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if field.name not in values:
            continue
        value = values[field.name]
        shape = field_shape(field)
        entity = shape.entity
        if entity is not None and shape.is_array and value is not None:
            value = tuple(v if dataclasses.is_dataclass(v) else build(entity, v) for v in value)
        elif entity is not None and not shape.is_array and isinstance(value, Mapping):
            value = build(entity, value)
        elif shape.is_array and value is not None:
            value = tuple(value)
        else:
            value = _convert(field, value)
        kwargs[field.name] = value
    return cls(**kwargs)


def zero_response(cls: type[Any], error: ErrorCode) -> Any:
    """A response of `cls` with every required field zero/empty and every error_code `error`.

    Used when a handler fails unexpectedly: the client gets a well-formed response carrying
    UNKNOWN_SERVER_ERROR (at the top level where the API has one) instead of a dead
    connection.
    """
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        shape = field_shape(field)
        if field.name == "error_code":
            values[field.name] = error
        elif field.default is not dataclasses.MISSING:
            continue
        elif shape.is_array:
            values[field.name] = ()
        elif shape.entity is not None:
            values[field.name] = zero_response(shape.entity, error)
        else:
            values[field.name] = _zero_primitive(field)
    return cls(**values)


def _zero_primitive(field: dataclasses.Field[Any]) -> Any:
    kafka_type = field.metadata.get("kafka_type", "")
    if kafka_type in ("string",):
        return ""
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return None
    if kafka_type.startswith("timedelta"):
        return datetime.timedelta(0)
    if kafka_type.startswith("datetime"):
        return None
    if kafka_type == "float64":
        return 0.0
    return 0


def frame_header(segments: Sequence[Segment]) -> bytes:
    """The 4-byte size prefix of a response made of `segments`."""
    return _FRAME_SIZE.pack(segments_length(segments))
