"""Skip tagged fields this broker does not know, as Kafka does (KIP-482).

In a flexible version every struct ends with a tagged-field section: a count, then for each
field its tag, its size and its bytes. Tags exist so a newer client can add fields without a
new version; Kafka's generated readers skip any tag they do not know by its size. kio's
reader refuses an unknown tag instead (KeyError), which would close the client's connection.

`strip_unknown_tags` walks a frame along the entities' schema, with kio's own readers
measuring every primitive field, and returns a copy without the unknown tags (each section's
count rewritten) that kio then parses as usual. kio still decodes every value; this module
only finds section boundaries. The codec calls it only after kio refused a frame, so the
common path costs nothing.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from functools import cache
from typing import Any

from kio.serial.readers import (
    read_compact_array_length,
    read_int8,
    read_legacy_array_length,
    read_unsigned_varint,
)
from kio.serial.writers import write_unsigned_varint
from kio.static.primitive import uvarint
from kio.static.protocol import Entity

from raftlog.kio_private import field_shape, primitive_field_reader

_NULL_ENTITY_MARKER = -1  # KIP-893 nullable struct: int8 -1 (null) or 1, then the struct


@dataclasses.dataclass(frozen=True, slots=True)
class _Layout:
    fields: tuple[dataclasses.Field[Any], ...]  # in wire order
    tagged: dict[int, dataclasses.Field[Any]]  # tag -> field


@cache
def _layout(cls: type[Entity]) -> _Layout:
    plain, tagged = [], {}
    for field in dataclasses.fields(cls):
        tag = field.metadata.get("tag")
        if tag is None:
            plain.append(field)
        else:
            tagged[int(tag)] = field
    return _Layout(tuple(plain), tagged)


class _Stripper:
    def __init__(self, frame: bytes) -> None:
        self.frame = memoryview(frame)
        self.dropped = 0

    def _need(self, offset: int, size_bytes: int) -> None:
        if size_bytes < 0 or offset + size_bytes > len(self.frame):
            raise ValueError(
                f"{size_bytes} bytes at offset {offset} run past the {len(self.frame)}-byte frame"
            )

    def entity(self, cls: type[Entity], offset: int, out: io.BytesIO) -> int:
        """Copy one struct of `cls` at `offset` into `out`; returns the offset after it."""
        layout = _layout(cls)
        for field in layout.fields:
            offset = self.field(cls, field, offset, out, tagged=False)
        if not cls.__flexible__:
            return offset
        count, size = read_unsigned_varint(self.frame, offset)
        offset += size
        kept = io.BytesIO()
        kept_count = 0
        for _ in range(count):
            tag, size = read_unsigned_varint(self.frame, offset)
            offset += size
            length, size = read_unsigned_varint(self.frame, offset)
            offset += size
            self._need(offset, length)
            known = layout.tagged.get(tag)
            if known is None:
                self.dropped += 1
            else:
                # A known tag may itself be a struct with unknown tags inside: walk it, and
                # write it back with its (possibly smaller) size.
                value = io.BytesIO()
                end = self.field(cls, known, offset, value, tagged=True)
                if end != offset + length:
                    raise ValueError(f"tagged field {tag} is {length} bytes, read {end - offset}")
                write_unsigned_varint(kept, uvarint(tag))
                write_unsigned_varint(kept, uvarint(len(value.getbuffer())))
                kept.write(value.getbuffer())
                kept_count += 1
            offset += length
        write_unsigned_varint(out, uvarint(kept_count))
        out.write(kept.getbuffer())
        return offset

    def field(
        self,
        cls: type[Entity],
        field: dataclasses.Field[Any],
        offset: int,
        out: io.BytesIO,
        *,
        tagged: bool,
    ) -> int:
        shape = field_shape(field)
        if shape.entity is None:
            _, size = primitive_field_reader(cls, field, tagged=tagged)(self.frame, offset)
            return self._copy(offset, size, out)
        if shape.is_array:
            if cls.__flexible__:
                count, size = read_compact_array_length(self.frame, offset)
            else:
                count, size = read_legacy_array_length(self.frame, offset)
            offset = self._copy(offset, size, out)
            # Every struct takes at least one byte, so a count beyond the frame is a lie.
            items = max(count or 0, 0)
            self._need(offset, items)
            for _ in range(items):
                offset = self.entity(shape.entity, offset, out)
            return offset
        # kio never treats a tagged struct as nullable: absence is its null.
        if shape.nullable and not tagged:
            marker, size = read_int8(self.frame, offset)
            offset = self._copy(offset, size, out)
            if marker == _NULL_ENTITY_MARKER:
                return offset
        return self.entity(shape.entity, offset, out)

    def _copy(self, offset: int, size_bytes: int, out: io.BytesIO) -> int:
        self._need(offset, size_bytes)
        out.write(self.frame[offset : offset + size_bytes])
        return offset + size_bytes


def strip_unknown_tags(frame: bytes, entity_classes: Sequence[type[Entity]]) -> tuple[bytes, int]:
    """`frame` (the entities in `entity_classes`, one after the other, e.g. request header
    and body) without the tagged fields their schemas do not know, and how many were dropped.
    Bytes after the last entity are kept as they are. Raises (ValueError, or whatever kio's
    readers raise) when the frame does not follow the schema."""
    stripper = _Stripper(frame)
    out = io.BytesIO()
    offset = 0
    for cls in entity_classes:
        offset = stripper.entity(cls, offset, out)
    out.write(stripper.frame[offset:])
    return out.getvalue(), stripper.dropped
