"""The checks the codec's compiled decoders are made of: one wire value at a time.

Each function takes what msgpack unpacked and returns the value it stands for, or raises
DecodeError naming what is wrong. raftlog.codec composes them from a class's annotations.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import uuid
from collections.abc import Callable
from typing import Any

import msgpack

from raftlog.errors import RemoteError

UUID_EXT = 1
ERROR_CODE_EXT = 2
_NUMBERS = (int, float)
I64_MIN = -(2**63)
I64_MAX = 2**63 - 1

Decoder = Callable[[Any], Any]


class DecodeError(RemoteError, ValueError):
    """Bytes or a wire value from a peer or a file are not a valid message.

    A remote error: the data came from outside this process (another node, a file on disk),
    so the caller drops it, refuses it or answers with an error, and never builds an object
    from it. It is a ValueError too, which is what a caller that checks any bad input
    catches.
    """


def unpack(data: bytes) -> Any:
    """MessagePack bytes to plain values; anything msgpack refuses is a DecodeError."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise DecodeError(f"not valid msgpack: {exc}") from None


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def build(cls: type, names: list[str], decoders: list[Decoder], values: Any) -> Any:
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


def opaque(wire: Any) -> Any:
    return wire


def decode_bool(wire: Any) -> bool:
    if type(wire) is not bool:
        raise DecodeError(f"expected a bool, got {show(wire)}")
    return wire


def int_decoder(low: int, high: int) -> Decoder:
    def decode(wire: Any) -> int:
        if type(wire) is not int:
            raise DecodeError(f"expected an int, got {show(wire)}")
        if not low <= wire <= high:
            raise DecodeError(f"{wire} is outside [{low}, {high}]")
        return wire

    return decode


def decode_float(wire: Any) -> float:
    # A float that holds a whole number may arrive as an int.
    if type(wire) not in _NUMBERS or not math.isfinite(wire):
        raise DecodeError(f"expected a finite number, got {show(wire)}")
    return float(wire)


def str_decoder(max_chars: int) -> Decoder:
    def decode(wire: Any) -> str:
        if type(wire) is not str:
            raise DecodeError(f"expected a str, got {show(wire)}")
        if len(wire) > max_chars:
            raise DecodeError(f"a str of {len(wire)} characters, over {max_chars}")
        return wire

    return decode


def bytes_decoder(max_bytes: int) -> Decoder:
    def decode(wire: Any) -> bytes:
        if type(wire) is not bytes:
            raise DecodeError(f"expected bytes, got {type(wire).__name__}")
        if len(wire) > max_bytes:
            raise DecodeError(f"{len(wire)} bytes, over {max_bytes}")
        return wire

    return decode


def decode_none(wire: Any) -> None:
    if wire is not None:
        raise DecodeError(f"expected nil, got {show(wire)}")


def decode_uuid(wire: Any) -> uuid.UUID:
    if not isinstance(wire, msgpack.ExtType) or wire.code != UUID_EXT or len(wire.data) != 16:
        raise DecodeError(f"expected a UUID (extension {UUID_EXT}, 16 bytes), got {show(wire)}")
    return uuid.UUID(bytes=wire.data)


def enum_decoder(cls: type[enum.IntEnum], fallback: Any, ext: bool) -> Decoder:
    read_int = int_decoder(I64_MIN, I64_MAX)

    def decode(wire: Any) -> Any:
        if ext:
            if not isinstance(wire, msgpack.ExtType) or wire.code != ERROR_CODE_EXT:
                raise DecodeError(f"expected extension {ERROR_CODE_EXT}, got {show(wire)}")
            wire = unpack(wire.data)
        value = read_int(wire)
        try:
            return cls(value)
        except ValueError:
            if fallback is None:
                raise DecodeError(f"{value} is not a {cls.__name__}") from None
            return fallback

    return decode


def tuple_decoder(item: Decoder, max_items: int) -> Decoder:
    def decode(wire: Any) -> tuple[Any, ...]:
        if not isinstance(wire, list | tuple):
            raise DecodeError(f"expected a list, got {show(wire)}")
        if len(wire) > max_items:
            raise DecodeError(f"a list of {len(wire)} items, over {max_items}")
        return tuple(item(x) for x in wire)

    return decode


def fixed_tuple_decoder(items: list[Decoder]) -> Decoder:
    def decode(wire: Any) -> tuple[Any, ...]:
        if not isinstance(wire, list | tuple) or len(wire) != len(items):
            raise DecodeError(f"expected a list of {len(items)} items, got {show(wire)}")
        return tuple(dec(x) for dec, x in zip(items, wire, strict=True))

    return decode


def mapping_decoder(key: Decoder, value: Decoder, max_items: int) -> Decoder:
    def decode(wire: Any) -> dict[Any, Any]:
        if not isinstance(wire, dict):
            raise DecodeError(f"expected a map, got {show(wire)}")
        if len(wire) > max_items:
            raise DecodeError(f"a map of {len(wire)} items, over {max_items}")
        return {key(k): value(v) for k, v in wire.items()}

    return decode


def array_decoder(
    cls: type,
    header: tuple[Any, ...],
    names: list[str],
    decoders: list[Decoder],
    *,
    optional_tail: int = 0,
) -> Decoder:
    """optional_tail: how many trailing fields may be absent (Added fields, read as their
    defaults)."""
    width = len(header)
    arity = width + len(decoders)
    what = cls.__name__

    def decode(wire: Any) -> Any:
        if not isinstance(wire, list | tuple):
            raise DecodeError(f"{what}: expected a list, got {show(wire)}")
        if not arity - optional_tail <= len(wire) <= arity:
            raise DecodeError(f"{what} has {arity} items on the wire, got {len(wire)}")
        if width and tuple(wire[:width]) != header:
            raise DecodeError(f"{what}: header {show(tuple(wire[:width]))} != {header}")
        return build(cls, names, decoders, wire[width:] if width else wire)

    return decode


def map_decoder(
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
            raise DecodeError(f"{what}: expected a map, got {show(wire)}")
        for key, constant in header:
            found = wire.get(key)
            if type(found) is not type(constant) or found != constant:
                raise DecodeError(
                    f"{what}: unsupported version {show(found)} in {key!r}; "
                    f"this node reads {constant!r}"
                )
        try:  # the common case: every field is there and valid
            return cls(*[dec(wire[name]) for name, dec in pairs])
        except (KeyError, DecodeError):
            pass
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


def ext_class_name(wire: Any, code: int) -> Any:
    if not isinstance(wire, msgpack.ExtType) or wire.code != code:
        raise DecodeError(f"expected extension {code}, got {show(wire)}")
    inner = unpack(wire.data)
    if not isinstance(inner, list) or len(inner) != 2 or not isinstance(inner[1], list):
        raise DecodeError(f"extension {code} must hold [name, [fields]], got {show(inner)}")
    return inner[0]


def named_ext_decoder(
    cls: type, code: int, names: list[str], decoders: list[Decoder], *, optional_tail: int = 0
) -> Decoder:
    """optional_tail: as for array_decoder."""
    what = cls.__name__
    arity = len(decoders)

    def decode(wire: Any) -> Any:
        if not isinstance(wire, msgpack.ExtType) or wire.code != code:
            raise DecodeError(f"{what}: expected extension {code}, got {show(wire)}")
        inner = unpack(wire.data)
        if not isinstance(inner, list) or len(inner) != 2 or not isinstance(inner[1], list):
            raise DecodeError(f"{what}: extension {code} must hold [name, [fields]]")
        name, values = inner
        if name != what:
            raise DecodeError(f"expected a {what}, got {show(name)}")
        if not arity - optional_tail <= len(values) <= arity:
            raise DecodeError(f"{what} has {arity} fields, the wire value {len(values)}")
        return build(cls, names, decoders, values)

    return decode
