"""One typed, declarative codec for internal messages and metadata records over MessagePack.

A message is a frozen dataclass. Its field annotations are its schema: the codec reads them
once per class and compiles an encoder and a checking decoder from them, so no message class
writes its own. Integer bounds and length limits are part of the annotation::

    offset: Annotated[int, Range(0, I64_MAX)]
    topics: Annotated[tuple[NewTopic, ...], MaxLen(10_000)]

A bare ``int`` is any signed 64-bit integer; a bare ``str``, ``bytes``, tuple or mapping is
bounded by the DEFAULT_MAX_* limits below. Decoding accepts nothing else: a wrong type, an
out-of-range integer, an unknown tag, a wrong arity, an oversize value or bytes that are not
MessagePack raise ``DecodeError``, naming the class and field. Values built by this process
are trusted: encoding does not check them again.

How a class sits on the wire is its ``__wire__`` layout:
- ``Array(header=("TAG",))``: ``[header..., field0, field1, ...]``; the header is the class's
  own constants and picks the class when several can arrive in one place (a union).
- ``Map(header=(("v", "VERSION"),))``: ``{"v": VERSION, "field": value, ...}`` in declaration
  order; a field with a default may be absent, and keys of no field are ignored (a newer peer
  may send more).
- ``NamedExt(code)``: extension ``code`` holding ``[class name, [field0, ...]]``.
A field annotated ``Annotated[Any, Opaque()]`` passes through as it is, for a later step to
decode with its own declaration.
UUIDs travel as extension UUID_EXT (16 bytes). An ``ErrorCode`` travels as extension
ERROR_CODE_EXT in a codec made with ``error_code_ext=True``, else as a plain integer.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import operator
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, Union

import msgpack

from raftlog.errors import ErrorCode, RemoteError

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_ITEMS",
    "DEFAULT_MAX_STR_CHARS",
    "ERROR_CODE_EXT",
    "I32_MAX",
    "I64_MAX",
    "I64_MIN",
    "UUID_EXT",
    "Array",
    "Codec",
    "DecodeError",
    "Epoch",
    "Int16",
    "Int32",
    "Map",
    "MaxLen",
    "Millis",
    "NamedExt",
    "NodeId",
    "Offset",
    "Opaque",
    "Port",
    "Range",
    "Size",
    "UnknownAs",
]

T = TypeVar("T")

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1
I32_MAX = 2**31 - 1
UUID_EXT = 1
ERROR_CODE_EXT = 2
# Limits of an unannotated value. The frame size (RpcLimits.max_frame_bytes) already bounds a
# message; these bound what one field may make a decoder build or hold.
DEFAULT_MAX_STR_CHARS = 1024 * 1024
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_ITEMS = 1024 * 1024


class DecodeError(RemoteError, ValueError):
    """Bytes or a wire value from a peer or a file are not a valid message.

    A remote error: the data came from outside this process (another node, a file on disk),
    so the caller drops it, refuses it or answers with an error, and never builds an object
    from it. It is a ValueError too, which is what a caller that checks any bad input
    catches.
    """


# ---------------------------------------------------------------- declarations
@dataclass(frozen=True, slots=True)
class Range:
    """An integer field's inclusive bounds."""

    min: int
    max: int


@dataclass(frozen=True, slots=True)
class MaxLen:
    """Most characters (str), bytes (bytes) or items (tuple, mapping) a field may hold."""

    count: int


# Integer kinds the message families share; -1 is the protocols' "none" or "unknown".
NodeId = Annotated[int, Range(-1, I32_MAX)]
Epoch = Annotated[int, Range(-1, I32_MAX)]
Offset = Annotated[int, Range(-1, I64_MAX)]
Size = Annotated[int, Range(0, I64_MAX)]  # bytes, counts, positions, sequence numbers
Millis = Annotated[int, Range(-1, I64_MAX)]  # timestamps and durations
Int16 = Annotated[int, Range(-(2**15), 2**15 - 1)]  # a Kafka error code on the wire
Int32 = Annotated[int, Range(-(2**31), I32_MAX)]  # what a Kafka client may send as INT32
Port = Annotated[int, Range(0, 65535)]


@dataclass(frozen=True, slots=True)
class UnknownAs:
    """An enum field reads a value outside the enum as this member instead of refusing it."""

    member: enum.Enum


@dataclass(frozen=True, slots=True)
class Opaque:
    """``Annotated[Any, Opaque()]``: a value this layer passes through untouched, for a later
    step to decode with its own declaration (an RPC body, by the method it names)."""


@dataclass(frozen=True, slots=True)
class Array:
    """``[header..., fields...]``; header names class constants (e.g. "TAG")."""

    header: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Map:
    """``{field name: value}``; fields with defaults may be absent when decoding.

    header: (key, class constant) pairs written first, e.g. (("v", "VERSION"),); a value
    whose header differs is refused (a format version this node does not read).
    """

    header: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class NamedExt:
    """Extension ``code`` holding ``[class name, [fields...]]``."""

    code: int


Layout = Array | Map | NamedExt
Encoder = Callable[[Any], Any]
Decoder = Callable[[Any], Any]
_NUMBERS = (int, float)


# ---------------------------------------------------------------- the codec
class Codec:
    """Compiles and caches the encoder and decoder of each declared type.

    One codec per message family: families differ in how an ErrorCode travels, and a family
    may give every class without a ``__wire__`` of its own one layout.
    """

    def __init__(
        self, *, error_code_ext: bool = False, default_layout: Layout | None = None
    ) -> None:
        self.error_code_ext = error_code_ext
        self.default_layout = default_layout
        self._encoders: dict[Any, Encoder | None] = {}
        self._decoders: dict[Any, Decoder] = {}

    # -- values (what sits inside an RPC frame, already unpacked)
    def to_wire(self, value: Any, tp: Any = None) -> Any:
        """The plain msgpack value of `value` (of declared type `tp`, default its class)."""
        encoder = self.encoder(type(value) if tp is None else tp)
        return value if encoder is None else encoder(value)

    def from_wire(self, tp: type[T] | Any, wire: Any) -> T:
        """Check `wire` against `tp` and build the value; raises DecodeError."""
        try:
            result: T = self.decoder(tp)(wire)
        except RecursionError:
            raise DecodeError("the value is nested too deeply") from None
        return result

    # -- bytes
    def encode(self, value: Any, tp: Any = None) -> bytes:
        packed: bytes = msgpack.packb(self.to_wire(value, tp), use_bin_type=True)
        return packed

    def decode(self, tp: type[T] | Any, data: bytes, *, max_bytes: int | None = None) -> T:
        """Unpack and check one value; `max_bytes` refuses longer input before parsing."""
        if max_bytes is not None and len(data) > max_bytes:
            raise DecodeError(f"{len(data)} bytes exceed the limit of {max_bytes}")
        return self.from_wire(tp, unpack(data))

    # -- compilation
    def encoder(self, tp: Any) -> Encoder | None:
        """The encoder of a declared type; None when values go on the wire as they are."""
        try:
            return self._encoders[tp]
        except KeyError:
            pass

        def late(value: Any) -> Any:  # a recursive type refers to itself while compiling
            encoder = self._encoders[tp]
            return value if encoder is None else encoder(value)

        self._encoders[tp] = late
        encoder = self._compile_encoder(tp)
        self._encoders[tp] = encoder
        return encoder

    def decoder(self, tp: Any) -> Decoder:
        try:
            return self._decoders[tp]
        except KeyError:
            pass

        def late(wire: Any) -> Any:  # a recursive type refers to itself while compiling
            return self._decoders[tp](wire)

        self._decoders[tp] = late
        decoder = self._compile_decoder(tp)
        self._decoders[tp] = decoder
        return decoder

    def _layout(self, cls: type) -> Layout:
        layout = getattr(cls, "__wire__", self.default_layout)
        if not isinstance(layout, Array | Map | NamedExt):
            raise TypeError(f"{cls.__name__} declares no __wire__ layout")
        return layout

    def _compile_encoder(self, tp: Any) -> Encoder | None:
        base, meta = _split_annotated(tp)
        if any(isinstance(m, Opaque) for m in meta):
            return None
        origin = typing.get_origin(base)
        if base in (int, bool, float, str, bytes, type(None)):
            return None
        if base is uuid.UUID:
            return lambda v: msgpack.ExtType(UUID_EXT, v.bytes)
        if isinstance(base, type) and issubclass(base, enum.IntEnum):
            if base is ErrorCode and self.error_code_ext:
                return lambda v: msgpack.ExtType(ERROR_CODE_EXT, msgpack.packb(int(v)))
            return int
        if origin in (Union, types.UnionType):
            arms = [a for a in typing.get_args(base) if a is not type(None)]
            if len(arms) == 1:
                inner = self.encoder(arms[0])
                return None if inner is None else (lambda v: None if v is None else inner(v))
            return self._union_encoder(arms)
        if origin is tuple:
            args = typing.get_args(base)
            if len(args) == 2 and args[1] is Ellipsis:
                item = self.encoder(args[0])
                if item is None:
                    return list
                return lambda v: [item(x) for x in v]
            items = [self.encoder(a) for a in args]
            return lambda v: [x if enc is None else enc(x) for enc, x in zip(items, v, strict=True)]
        if origin in (dict, Mapping):
            value_enc = self.encoder(typing.get_args(base)[1])
            if value_enc is None:
                return dict
            return lambda v: {k: value_enc(x) for k, x in v.items()}
        if isinstance(base, type) and dataclasses.is_dataclass(base):
            return self._struct_encoder(base)
        raise TypeError(f"the codec cannot declare a field of type {tp!r}")

    def _struct_encoder(self, cls: type) -> Encoder:
        layout = self._layout(cls)
        fields = _fields(cls)
        names = [name for name, _ in fields]
        encoders = [self.encoder(ftp) for _, ftp in fields]
        plain = all(e is None for e in encoders)
        header = [getattr(cls, attr) for attr in layout.header] if isinstance(layout, Array) else []

        getter = operator.attrgetter(*names) if len(names) > 1 else None
        coded = [(name, enc) for name, enc in zip(names, encoders, strict=True)]

        def values(obj: Any) -> Any:
            if plain:
                return getter(obj) if getter is not None else [getattr(obj, n) for n in names]
            out = []
            for name, enc in coded:
                value = getattr(obj, name)
                out.append(value if enc is None or value is None else enc(value))
            return out

        if isinstance(layout, Array):
            return lambda obj: [*header, *values(obj)]
        if isinstance(layout, Map):
            constants = {key: getattr(cls, attr) for key, attr in layout.header}
            return lambda obj: {**constants, **dict(zip(names, values(obj), strict=True))}
        code, name = layout.code, cls.__name__
        return lambda obj: msgpack.ExtType(
            code, msgpack.packb([name, list(values(obj))], use_bin_type=True)
        )

    def _union_encoder(self, arms: list[Any]) -> Encoder:
        by_class = {arm: self.encoder(arm) for arm in arms}

        def encode(value: Any) -> Any:
            if value is None:
                return None
            if type(value) not in by_class:
                raise TypeError(f"{type(value).__name__} is not one of {_names(arms)}")
            enc = by_class[type(value)]
            return value if enc is None else enc(value)

        return encode

    def _compile_decoder(self, tp: Any) -> Decoder:
        base, meta = _split_annotated(tp)
        origin = typing.get_origin(base)
        max_len = next((m.count for m in meta if isinstance(m, MaxLen)), None)
        if any(isinstance(m, Opaque) for m in meta):
            return _opaque
        if base is bool:
            return _decode_bool
        if base is int:
            bounds = next((m for m in meta if isinstance(m, Range)), Range(I64_MIN, I64_MAX))
            return _int_decoder(bounds.min, bounds.max)
        if base is float:
            return _decode_float
        if base is str:
            return _str_decoder(max_len or DEFAULT_MAX_STR_CHARS)
        if base is bytes:
            return _bytes_decoder(max_len or DEFAULT_MAX_BYTES)
        if base is type(None):
            return _decode_none
        if base is uuid.UUID:
            return _decode_uuid
        if isinstance(base, type) and issubclass(base, enum.IntEnum):
            fallback = next((m.member for m in meta if isinstance(m, UnknownAs)), None)
            ext = base is ErrorCode and self.error_code_ext
            return _enum_decoder(base, fallback, ext)
        if origin in (Union, types.UnionType):
            return self._union_decoder(typing.get_args(base))
        if origin is tuple:
            args = typing.get_args(base)
            if len(args) == 2 and args[1] is Ellipsis:
                return _tuple_decoder(self.decoder(args[0]), max_len or DEFAULT_MAX_ITEMS)
            return _fixed_tuple_decoder([self.decoder(a) for a in args])
        if origin in (dict, Mapping):
            key_type, value_type = typing.get_args(base)
            return _mapping_decoder(
                self.decoder(key_type), self.decoder(value_type), max_len or DEFAULT_MAX_ITEMS
            )
        if isinstance(base, type) and dataclasses.is_dataclass(base):
            return self._struct_decoder(base)
        raise TypeError(f"the codec cannot declare a field of type {tp!r}")

    def _struct_decoder(self, cls: type) -> Decoder:
        layout = self._layout(cls)
        fields = _fields(cls)
        names = [name for name, _ in fields]
        decoders = [self.decoder(ftp) for _, ftp in fields]
        if isinstance(layout, Array):
            header = tuple(getattr(cls, attr) for attr in layout.header)
            return _array_decoder(cls, header, names, decoders)
        if isinstance(layout, Map):
            header = tuple((key, getattr(cls, attr)) for key, attr in layout.header)
            return _map_decoder(cls, header, names, decoders)
        return _named_ext_decoder(cls, layout.code, names, decoders)

    def _union_decoder(self, arms: tuple[Any, ...]) -> Decoder:
        optional = type(None) in arms
        structs = [a for a in arms if a is not type(None)]
        if len(structs) == 1:
            inner = self.decoder(structs[0])
            return lambda wire: None if wire is None else inner(wire)
        layouts = {type(self._layout(a)) for a in structs}
        if len(layouts) != 1 or not all(dataclasses.is_dataclass(a) for a in structs):
            raise TypeError(f"a union must be of classes of one layout, not {arms!r}")
        layout = self._layout(structs[0])
        decoders = {arm: self.decoder(arm) for arm in structs}
        if isinstance(layout, Array) and layout.header:
            width = len(layout.header)
            by_header = {
                tuple(getattr(arm, attr) for attr in layout.header): dec
                for arm, dec in decoders.items()
            }

            def by_tag(wire: Any) -> Any:
                if wire is None and optional:
                    return None
                if not isinstance(wire, list | tuple) or len(wire) < width:
                    raise DecodeError(
                        f"expected a list starting with {layout.header}, got {_show(wire)}"
                    )
                key = tuple(wire[:width])
                dec = by_header.get(key) if all(type(k) is int for k in key) else None
                if dec is None:
                    raise DecodeError(
                        f"unknown tag {_show(key)}; expected one of {_names(structs)}"
                    )
                return dec(wire)

            return by_tag
        if isinstance(layout, NamedExt):
            by_name = {arm.__name__: dec for arm, dec in decoders.items()}
            code = layout.code

            def by_name_in_ext(wire: Any) -> Any:
                if wire is None and optional:
                    return None
                name = _ext_class_name(wire, code)
                dec = by_name.get(name)
                if dec is None:
                    raise DecodeError(f"{_show(name)} is not one of {_names(structs)}")
                return dec(wire)

            return by_name_in_ext
        raise TypeError(f"classes of layout {layout!r} cannot share a place on the wire")


# ---------------------------------------------------------------- helpers
def unpack(data: bytes) -> Any:
    """MessagePack bytes to plain values; anything msgpack refuses is a DecodeError."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise DecodeError(f"not valid msgpack: {exc}") from None


def _split_annotated(tp: Any) -> tuple[Any, tuple[Any, ...]]:
    if typing.get_origin(tp) is Annotated:
        return tp.__origin__, tuple(tp.__metadata__)
    return tp, ()


_FIELDS: dict[type, list[tuple[str, Any]]] = {}


def _fields(cls: type) -> list[tuple[str, Any]]:
    fields = _FIELDS.get(cls)
    if fields is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        fields = _FIELDS[cls] = [(f.name, hints[f.name]) for f in dataclasses.fields(cls)]
    return fields


def _names(classes: Any) -> str:
    return ", ".join(c.__name__ for c in classes)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _build(cls: type, names: list[str], decoders: list[Decoder], values: Any) -> Any:
    """cls(*decoded values); a bad value's error names its field (found again only then)."""
    try:
        return cls(*[dec(x) for dec, x in zip(decoders, values)])  # noqa: B905 (arity checked)
    except DecodeError:
        for name, dec, x in zip(names, decoders, values):  # noqa: B905
            try:
                dec(x)
            except DecodeError as exc:
                raise DecodeError(f"{cls.__name__}.{name} has an invalid value: {exc}") from None
        raise


def _opaque(wire: Any) -> Any:
    return wire


def _decode_bool(wire: Any) -> bool:
    if type(wire) is not bool:
        raise DecodeError(f"expected a bool, got {_show(wire)}")
    return wire


def _int_decoder(low: int, high: int) -> Decoder:
    def decode(wire: Any) -> int:
        if type(wire) is not int:
            raise DecodeError(f"expected an int, got {_show(wire)}")
        if not low <= wire <= high:
            raise DecodeError(f"{wire} is outside [{low}, {high}]")
        return wire

    return decode


def _decode_float(wire: Any) -> float:
    # A float that holds a whole number may arrive as an int.
    if type(wire) not in _NUMBERS or not math.isfinite(wire):
        raise DecodeError(f"expected a finite number, got {_show(wire)}")
    return float(wire)


def _str_decoder(max_chars: int) -> Decoder:
    def decode(wire: Any) -> str:
        if type(wire) is not str:
            raise DecodeError(f"expected a str, got {_show(wire)}")
        if len(wire) > max_chars:
            raise DecodeError(f"a str of {len(wire)} characters, over {max_chars}")
        return wire

    return decode


def _bytes_decoder(max_bytes: int) -> Decoder:
    def decode(wire: Any) -> bytes:
        if type(wire) is not bytes:
            raise DecodeError(f"expected bytes, got {type(wire).__name__}")
        if len(wire) > max_bytes:
            raise DecodeError(f"{len(wire)} bytes, over {max_bytes}")
        return wire

    return decode


def _decode_none(wire: Any) -> None:
    if wire is not None:
        raise DecodeError(f"expected nil, got {_show(wire)}")


def _decode_uuid(wire: Any) -> uuid.UUID:
    if not isinstance(wire, msgpack.ExtType) or wire.code != UUID_EXT or len(wire.data) != 16:
        raise DecodeError(f"expected a UUID (extension {UUID_EXT}, 16 bytes), got {_show(wire)}")
    return uuid.UUID(bytes=wire.data)


def _enum_decoder(cls: type[enum.IntEnum], fallback: Any, ext: bool) -> Decoder:
    read_int = _int_decoder(I64_MIN, I64_MAX)

    def decode(wire: Any) -> Any:
        if ext:
            if not isinstance(wire, msgpack.ExtType) or wire.code != ERROR_CODE_EXT:
                raise DecodeError(f"expected extension {ERROR_CODE_EXT}, got {_show(wire)}")
            wire = unpack(wire.data)
        value = read_int(wire)
        try:
            return cls(value)
        except ValueError:
            if fallback is None:
                raise DecodeError(f"{value} is not a {cls.__name__}") from None
            return fallback

    return decode


def _tuple_decoder(item: Decoder, max_items: int) -> Decoder:
    def decode(wire: Any) -> tuple[Any, ...]:
        if not isinstance(wire, list | tuple):
            raise DecodeError(f"expected a list, got {_show(wire)}")
        if len(wire) > max_items:
            raise DecodeError(f"a list of {len(wire)} items, over {max_items}")
        return tuple(item(x) for x in wire)

    return decode


def _fixed_tuple_decoder(items: list[Decoder]) -> Decoder:
    def decode(wire: Any) -> tuple[Any, ...]:
        if not isinstance(wire, list | tuple) or len(wire) != len(items):
            raise DecodeError(f"expected a list of {len(items)} items, got {_show(wire)}")
        return tuple(dec(x) for dec, x in zip(items, wire, strict=True))

    return decode


def _mapping_decoder(key: Decoder, value: Decoder, max_items: int) -> Decoder:
    def decode(wire: Any) -> dict[Any, Any]:
        if not isinstance(wire, dict):
            raise DecodeError(f"expected a map, got {_show(wire)}")
        if len(wire) > max_items:
            raise DecodeError(f"a map of {len(wire)} items, over {max_items}")
        return {key(k): value(v) for k, v in wire.items()}

    return decode


def _array_decoder(
    cls: type, header: tuple[Any, ...], names: list[str], decoders: list[Decoder]
) -> Decoder:
    width = len(header)
    arity = width + len(decoders)
    what = cls.__name__

    def decode(wire: Any) -> Any:
        if not isinstance(wire, list | tuple):
            raise DecodeError(f"{what}: expected a list, got {_show(wire)}")
        if len(wire) != arity:
            raise DecodeError(f"{what} has {arity} items on the wire, got {len(wire)}")
        if width and tuple(wire[:width]) != header:
            raise DecodeError(f"{what}: header {_show(tuple(wire[:width]))} != {header}")
        return _build(cls, names, decoders, wire[width:] if width else wire)

    return decode


def _map_decoder(
    cls: type, header: tuple[tuple[str, Any], ...], names: list[str], decoders: list[Decoder]
) -> Decoder:
    what = cls.__name__
    required = {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    pairs = list(zip(names, decoders, strict=True))

    def decode(wire: Any) -> Any:
        if not isinstance(wire, dict):
            raise DecodeError(f"{what}: expected a map, got {_show(wire)}")
        for key, constant in header:
            found = wire.get(key)
            if type(found) is not type(constant) or found != constant:
                raise DecodeError(
                    f"{what}: unsupported version {_show(found)} in {key!r}; "
                    f"this node reads {constant!r}"
                )
        kwargs = {}
        for name, dec in pairs:
            if name in wire:
                try:
                    kwargs[name] = dec(wire[name])
                except DecodeError as exc:
                    raise DecodeError(f"{what}.{name} has an invalid value: {exc}") from None
            elif name in required:
                raise DecodeError(f"{what}: the field {name!r} is missing")
        return cls(**kwargs)

    return decode


def _ext_class_name(wire: Any, code: int) -> Any:
    if not isinstance(wire, msgpack.ExtType) or wire.code != code:
        raise DecodeError(f"expected extension {code}, got {_show(wire)}")
    inner = unpack(wire.data)
    if not isinstance(inner, list) or len(inner) != 2 or not isinstance(inner[1], list):
        raise DecodeError(f"extension {code} must hold [name, [fields]], got {_show(inner)}")
    return inner[0]


def _named_ext_decoder(cls: type, code: int, names: list[str], decoders: list[Decoder]) -> Decoder:
    what = cls.__name__

    def decode(wire: Any) -> Any:
        if not isinstance(wire, msgpack.ExtType) or wire.code != code:
            raise DecodeError(f"{what}: expected extension {code}, got {_show(wire)}")
        inner = unpack(wire.data)
        if not isinstance(inner, list) or len(inner) != 2 or not isinstance(inner[1], list):
            raise DecodeError(f"{what}: extension {code} must hold [name, [fields]]")
        name, values = inner
        if name != what:
            raise DecodeError(f"expected a {what}, got {_show(name)}")
        if len(values) != len(decoders):
            raise DecodeError(f"{what} has {len(decoders)} fields, the wire value {len(values)}")
        return _build(cls, names, decoders, values)

    return decode
