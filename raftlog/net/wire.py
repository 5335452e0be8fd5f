"""msgpack encoding of the project's plain dataclasses for the internal RPC.

Controller requests and replies are frozen dataclasses holding ints, strings, bytes, UUIDs,
ErrorCodes, tuples, mappings and other such dataclasses. This codec carries them over the
internal listener without pickle: only classes registered here can be rebuilt, by name, from
their field values, so a peer can never make this node instantiate an arbitrary type.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

import msgpack

from raftlog.errors import ErrorCode, RaftlogError

_EXT_UUID = 1
_EXT_ERROR_CODE = 2
_EXT_DATACLASS = 3


class WireDecodeError(RaftlogError):
    """A frame named an unregistered type or had the wrong shape."""


class WireRegistry:
    """The dataclasses one RPC method family may carry."""

    def __init__(self, classes: Iterable[type] = ()) -> None:
        self._by_name: dict[str, type] = {}
        for cls in classes:
            self.register(cls)

    def register(self, cls: type) -> None:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls.__name__} is not a dataclass")
        self._by_name[cls.__name__] = cls

    def register_module(self, module: ModuleType) -> None:
        """Register every dataclass defined in a module (not the ones it imports)."""
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and dataclasses.is_dataclass(value)
                and value.__module__ == module.__name__
            ):
                self.register(value)

    def encode(self, value: Any) -> bytes:
        return msgpack.packb(self._prepare(value), default=self._default, use_bin_type=True)

    def _prepare(self, value: Any) -> Any:
        # msgpack packs int subclasses (ErrorCode is an IntEnum) as plain ints without asking
        # `default`, so typed values are turned into extensions before packing.
        if isinstance(value, ErrorCode):
            return msgpack.ExtType(_EXT_ERROR_CODE, msgpack.packb(int(value)))
        if isinstance(value, list | tuple):
            return [self._prepare(item) for item in value]
        if isinstance(value, Mapping):
            return {k: self._prepare(v) for k, v in value.items()}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return self._default(value)
        return value

    def decode(self, data: bytes) -> Any:
        try:
            return msgpack.unpackb(
                data, ext_hook=self._ext_hook, use_list=False, raw=False, strict_map_key=False
            )
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise WireDecodeError(f"undecodable frame body: {exc}") from None

    def _default(self, obj: Any) -> Any:
        if isinstance(obj, uuid.UUID):
            return msgpack.ExtType(_EXT_UUID, obj.bytes)
        if isinstance(obj, enum.Enum):
            return obj.value
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            name = type(obj).__name__
            if self._by_name.get(name) is not type(obj):
                raise TypeError(f"{name} is not registered for the wire")
            values = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
            return msgpack.ExtType(_EXT_DATACLASS, self.encode([name, values]))
        if isinstance(obj, Mapping):
            return dict(obj)
        if isinstance(obj, set | frozenset):
            return sorted(obj)
        raise TypeError(f"cannot put {type(obj).__name__} on the wire")

    def _ext_hook(self, code: int, data: bytes) -> Any:
        if code == _EXT_UUID:
            return uuid.UUID(bytes=data)
        if code == _EXT_ERROR_CODE:
            return ErrorCode(msgpack.unpackb(data))
        if code == _EXT_DATACLASS:
            name, values = self.decode(data)
            cls = self._by_name.get(name)
            if cls is None:
                raise WireDecodeError(f"type {name!r} is not registered for the wire")
            fields = [f.name for f in dataclasses.fields(cls) if f.init]
            if len(values) != len(fields):
                raise WireDecodeError(f"{name} has {len(fields)} fields, frame has {len(values)}")
            return cls(**dict(zip(fields, values, strict=True)))
        raise WireDecodeError(f"unknown msgpack extension {code}")
