"""The only place raftlog (server, client and tests) reaches into kio's private modules.

kio 0.6.5's public surface (`kio.serial.entity_reader`/`entity_writer`, `kio.index`,
`kio.serial.readers`) encodes and decodes whole entities, but two things the server's codec
and the client's request builder need are only in `kio.serial._introspect` and
`kio.serial._parse`: the shape of a schema field (nested entity? array? nullable?) and the
reader of one primitive field. Rather than copy kio's rules
(its type-hint conventions, the request header's legacy `client_id`), each use sits behind one
small function here, and tests/kafka/test_kio_private.py pins exactly what we rely on, so a
kio upgrade that moves or changes them fails there by name instead of in a client's request.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.serial import _introspect, _parse
from kio.serial.readers import Reader
from kio.static.protocol import Entity


@dataclass(frozen=True, slots=True)
class FieldShape:
    """How a kio schema field is laid out on the wire, as far as the codec cares."""

    entity: type[Entity] | None  # the nested entity class; None for a primitive field
    is_array: bool
    nullable: bool  # `X | None` (for an array: the array itself may be null)


@cache
def field_shape(field: dataclasses.Field[Any]) -> FieldShape:
    """Shape of one field of a kio entity (kio's `classify_field` and `is_optional`)."""
    kind = _introspect.classify_field(field)
    entity = (
        kind.type_
        if isinstance(kind, _introspect.EntityField | _introspect.EntityTupleField)
        else None
    )
    return FieldShape(entity, kind.is_array, _introspect.is_optional(field))


@cache
def primitive_field_reader(
    entity_cls: type[Entity], field: dataclasses.Field[Any], *, tagged: bool
) -> Reader[Any]:
    """kio's own reader of a primitive (or primitive array) field of `entity_cls`.

    `entity_reader` builds the same readers internally; the request-header flag is how kio
    itself recognises the header whose `client_id` keeps the legacy string encoding.
    """
    is_request_header = entity_cls.__name__ == "RequestHeader"
    return _parse.get_field_reader(entity_cls, field, is_request_header, tagged)
