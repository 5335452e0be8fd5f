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
decode with its own declaration. ``Added()`` marks a field appended to a positional layout
after it was pinned: omitted while it holds its default, its default when absent.
UUIDs travel as extension UUID_EXT (16 bytes). An ``ErrorCode`` travels as extension
ERROR_CODE_EXT in a codec made with ``error_code_ext=True``, else as a plain integer.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, Union

import msgpack

from raftlog.codec_checks import (
    ERROR_CODE_EXT,
    I64_MAX,
    I64_MIN,
    UUID_EXT,
    DecodeError,
    Decoder,
    array_decoder,
    bytes_decoder,
    decode_bool,
    decode_float,
    decode_none,
    decode_uuid,
    enum_decoder,
    ext_class_name,
    fixed_tuple_decoder,
    int_decoder,
    map_decoder,
    mapping_decoder,
    named_ext_decoder,
    opaque,
    show,
    str_decoder,
    tuple_decoder,
    unpack,
)
from raftlog.errors import ErrorCode

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_ITEMS",
    "DEFAULT_MAX_STR_CHARS",
    "EPOCH_MAX",
    "ERROR_CODE_EXT",
    "I32_MAX",
    "I32_MIN",
    "I64_MAX",
    "I64_MIN",
    "UUID_EXT",
    "Added",
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
    "unpack",
]

T = TypeVar("T")

I32_MIN = -(2**31)
I32_MAX = 2**31 - 1
# Limits of an unannotated value. The frame size (RpcLimits.max_frame_bytes) already bounds a
# message; these bound what one field may make a decoder build or hold.
DEFAULT_MAX_STR_CHARS = 1024 * 1024
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_ITEMS = 1024 * 1024


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


# The largest leader epoch any log can hold: a record batch stores it as its INT32
# partitionLeaderEpoch, and the metadata log keeps the Raft epoch there. The one bound for
# epochs on the wire (the Epoch kind below) and in the quorum-state file: a larger epoch is
# refused at decode, never stored.
EPOCH_MAX = I32_MAX

# Integer kinds the message families share; -1 is the protocols' "none" or "unknown".
NodeId = Annotated[int, Range(-1, I32_MAX)]
Epoch = Annotated[int, Range(-1, EPOCH_MAX)]
Offset = Annotated[int, Range(-1, I64_MAX)]
Size = Annotated[int, Range(0, I64_MAX)]  # bytes, counts, positions, sequence numbers
Millis = Annotated[int, Range(-1, I64_MAX)]  # timestamps and durations
Int16 = Annotated[int, Range(-(2**15), 2**15 - 1)]  # a Kafka error code on the wire
Int32 = Annotated[int, Range(I32_MIN, I32_MAX)]  # what a Kafka client may send as INT32
Port = Annotated[int, Range(0, 65535)]


@dataclass(frozen=True, slots=True)
class UnknownAs:
    """An enum field reads a value outside the enum as this member instead of refusing it."""

    member: enum.Enum


@dataclass(frozen=True, slots=True)
class Added:
    """``Annotated[T, Added()]``: a field added to a positional format (Array, NamedExt)
    after peers and files already held it. Added fields come last and have defaults; while
    they hold their defaults they are left off the wire, and absent on the wire they read
    as their defaults, so an older peer and a newer one read each other's values."""


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
        """A function written for this class, as dataclasses writes __init__: encoding is on
        every message's path, and generated code is as fast as a hand-written one."""
        layout = self._layout(cls)
        env: dict[str, Any] = {"ExtType": msgpack.ExtType, "packb": msgpack.packb}
        parts = []
        for index, (name, ftp) in enumerate(_fields(cls)):
            encoder = self.encoder(ftp)
            if encoder is None:
                parts.append(f"o.{name}")
            else:
                env[f"e{index}"] = encoder
                parts.append(f"(None if o.{name} is None else e{index}(o.{name}))")
        added = _added_count(cls)
        if added and not isinstance(layout, Map):
            return self._trailing_encoder(cls, layout, env, parts, added)
        if isinstance(layout, Array):
            env["header"] = [getattr(cls, attr) for attr in layout.header]
            expr = f"[*header, {', '.join(parts)}]" if layout.header else f"[{', '.join(parts)}]"
        elif isinstance(layout, Map):
            items = [f"{key!r}: {getattr(cls, attr)!r}" for key, attr in layout.header]
            items += [f"{name!r}: {part}" for (name, _), part in zip(_fields(cls), parts)]  # noqa: B905
            expr = "{" + ", ".join(items) + "}"
        else:
            values = f"[{cls.__name__!r}, [{', '.join(parts)}]]"
            expr = f"ExtType({layout.code}, packb({values}, use_bin_type=True))"
        exec(f"def encode(o):\n    return {expr}\n", env)
        encode: Encoder = env["encode"]
        return encode

    def _trailing_encoder(
        self, cls: type, layout: Layout, env: dict[str, Any], parts: list[str], added: int
    ) -> Encoder:
        """The generated encoder of a positional class with Added fields: the values, less
        the trailing Added fields that hold their defaults."""
        fields = dataclasses.fields(cls)
        names = [f.name for f in fields[-added:]]
        env["defaults"] = tuple(_default(f) for f in fields[-added:])
        fixed, tail = parts[:-added], parts[-added:]
        raw = ", ".join(f"o.{name}" for name in names)
        lines = [
            f"v = [{', '.join(fixed)}]",
            f"t = [{', '.join(tail)}]",
            f"r = ({raw},)",
            "n = len(t)",
            "while n and r[n - 1] == defaults[n - 1]:",
            "    n -= 1",
            "v += t[:n]",
        ]
        if isinstance(layout, Array):
            env["header"] = [getattr(cls, attr) for attr in layout.header]
            lines.append("return [*header, *v]")
        else:
            assert isinstance(layout, NamedExt)
            lines.append(
                f"return ExtType({layout.code}, packb([{cls.__name__!r}, v], use_bin_type=True))"
            )
        body = "\n".join(f"    {line}" for line in lines)
        exec(f"def encode(o):\n{body}\n", env)
        encode: Encoder = env["encode"]
        return encode

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
            return opaque
        if base is bool:
            return decode_bool
        if base is int:
            bounds = next((m for m in meta if isinstance(m, Range)), Range(I64_MIN, I64_MAX))
            return int_decoder(bounds.min, bounds.max)
        if base is float:
            return decode_float
        if base is str:
            return str_decoder(max_len or DEFAULT_MAX_STR_CHARS)
        if base is bytes:
            return bytes_decoder(max_len or DEFAULT_MAX_BYTES)
        if base is type(None):
            return decode_none
        if base is uuid.UUID:
            return decode_uuid
        if isinstance(base, type) and issubclass(base, enum.IntEnum):
            fallback = next((m.member for m in meta if isinstance(m, UnknownAs)), None)
            ext = base is ErrorCode and self.error_code_ext
            return enum_decoder(base, fallback, ext)
        if origin in (Union, types.UnionType):
            return self._union_decoder(typing.get_args(base))
        if origin is tuple:
            args = typing.get_args(base)
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple_decoder(self.decoder(args[0]), max_len or DEFAULT_MAX_ITEMS)
            return fixed_tuple_decoder([self.decoder(a) for a in args])
        if origin in (dict, Mapping):
            key_type, value_type = typing.get_args(base)
            return mapping_decoder(
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
        added = _added_count(cls)
        if isinstance(layout, Array):
            header = tuple(getattr(cls, attr) for attr in layout.header)
            return array_decoder(cls, header, names, decoders, optional_tail=added)
        if isinstance(layout, Map):
            header = tuple((key, getattr(cls, attr)) for key, attr in layout.header)
            return map_decoder(cls, header, names, decoders)
        return named_ext_decoder(cls, layout.code, names, decoders, optional_tail=added)

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
                        f"expected a list starting with {layout.header}, got {show(wire)}"
                    )
                key = tuple(wire[:width])
                dec = by_header.get(key) if all(type(k) is int for k in key) else None
                if dec is None:
                    raise DecodeError(f"unknown tag {show(key)}; expected one of {_names(structs)}")
                return dec(wire)

            return by_tag
        if isinstance(layout, NamedExt):
            by_name = {arm.__name__: dec for arm, dec in decoders.items()}
            code = layout.code

            def by_name_in_ext(wire: Any) -> Any:
                if wire is None and optional:
                    return None
                name = ext_class_name(wire, code)
                dec = by_name.get(name)
                if dec is None:
                    raise DecodeError(f"{show(name)} is not one of {_names(structs)}")
                return dec(wire)

            return by_name_in_ext
        raise TypeError(f"classes of layout {layout!r} cannot share a place on the wire")


# ---------------------------------------------------------------- helpers
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


def _added_count(cls: type) -> int:
    """How many trailing fields are Added; refuses an Added field before a plain one or one
    without a default (it could not be left off the wire)."""
    flags = [any(isinstance(m, Added) for m in _split_annotated(tp)[1]) for _, tp in _fields(cls)]
    count = 0
    while count < len(flags) and flags[len(flags) - 1 - count]:
        count += 1
    if any(flags[: len(flags) - count]):
        raise TypeError(f"{cls.__name__}: Added fields must come after every other field")
    for f in dataclasses.fields(cls)[len(flags) - count :]:
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: an Added field needs a default")
    return count


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[operator]


def _names(classes: Any) -> str:
    return ", ".join(c.__name__ for c in classes)
