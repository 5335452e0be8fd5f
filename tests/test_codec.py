"""raftlog.codec against hostile input: every wrong value is one DecodeError, never a crash."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import msgpack
import pytest

from raftlog.codec import (
    DEFAULT_MAX_ITEMS,
    I32_MAX,
    I64_MAX,
    Added,
    Array,
    Codec,
    DecodeError,
    Map,
    MaxLen,
    NamedExt,
    Opaque,
    Range,
    UnknownAs,
)
from raftlog.errors import ErrorCode, RaftlogError

Offset = Annotated[int, Range(0, I64_MAX)]
Epoch = Annotated[int, Range(-1, I32_MAX)]


@dataclass(frozen=True)
class Pair:
    __wire__: ClassVar = Array()
    epoch: Epoch
    end_offset: Offset


@dataclass(frozen=True)
class Ping:
    __wire__: ClassVar = Array(header=("TAG",))
    TAG: ClassVar[int] = 1
    seq: Offset
    pair: Pair | None = None


@dataclass(frozen=True)
class Pong:
    __wire__: ClassVar = Array(header=("TAG",))
    TAG: ClassVar[int] = 2
    ok: bool
    name: Annotated[str, MaxLen(8)]
    blob: Annotated[bytes, MaxLen(4)]
    ids: Annotated[tuple[int, ...], MaxLen(3)] = ()
    ratio: float | None = None
    topic_id: uuid.UUID | None = None


@dataclass(frozen=True)
class Keyed:
    __wire__: ClassVar = Map()
    name: str
    error: Annotated[ErrorCode, UnknownAs(ErrorCode.unknown_server_error)]
    hw: int = -1
    configs: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Named:
    __wire__: ClassVar = NamedExt(3)
    error_code: ErrorCode
    children: tuple[Named, ...] = ()


Message = Ping | Pong
codec = Codec()
ext_codec = Codec(error_code_ext=True)


def test_decode_error_is_a_raftlog_error():
    assert issubclass(DecodeError, RaftlogError)


@pytest.mark.parametrize(
    ("value", "tp"),
    [
        (Ping(5), Message),
        (Ping(I64_MAX, Pair(-1, 0)), Message),
        (Pong(True, "12345678", b"abcd", (1, 2, 3), 2.5, uuid.UUID(int=7)), Message),
        (Pong(False, "", b""), Message),
        (Keyed("t", ErrorCode.none, 4, {"a": "b"}), Keyed),
    ],
)
def test_round_trip(value: Any, tp: Any):
    assert codec.decode(tp, codec.encode(value, tp)) == value
    assert codec.from_wire(tp, codec.to_wire(value, tp)) == value


def test_named_ext_round_trip_and_error_code_extension():
    value = Named(ErrorCode.not_controller, (Named(ErrorCode.none),))
    data = ext_codec.encode(value)
    assert msgpack.unpackb(data).code == 3
    assert ext_codec.decode(Named, data) == value


def test_layouts_on_the_wire():
    assert codec.to_wire(Ping(5, Pair(2, 9))) == [1, 5, [2, 9]]
    assert codec.to_wire(Keyed("t", ErrorCode.none)) == {
        "name": "t",
        "error": 0,
        "hw": -1,
        "configs": None,
    }


def _bad(tp: Any, wire: Any, match: str, c: Codec = codec) -> None:
    with pytest.raises(DecodeError, match=match):
        c.from_wire(tp, wire)


@pytest.mark.parametrize(
    ("wire", "match"),
    [
        ([1, -5, None], r"Ping.seq .* -5 is outside"),  # negative offset
        ([1, 2**63, None], r"outside"),  # above int64
        ([1, 5, [-2, 0]], r"Ping.pair .*Pair.epoch .* -2 is outside"),  # negative epoch
        ([1, 5, [2**31, 0]], r"outside"),  # epoch above int32
        ([1, "5", None], r"expected an int"),
        ([1, True, None], r"expected an int"),  # a bool is not an int
        ([1, 5.0, None], r"expected an int"),
        ([1, None, None], r"expected an int"),
        ([1, 5, [1]], r"Pair has 2 items"),  # truncated nested
        ([1, 5, [1, 2, 3]], r"Pair has 2 items"),  # extra nested field
        ([1, 5, None, 7], r"Ping has 3 items"),  # extra field
        ([1], r"Ping has 3 items"),  # truncated
        ([9, 5, None], r"unknown tag \(9,\)"),  # unknown tag
        (["1", 5, None], r"unknown tag"),
        ([True, 5, None], r"unknown tag"),  # True == 1 but is no tag
        ([], r"expected a list"),
        ({"seq": 5}, r"expected a list"),
        (b"\x01\x05", r"expected a list"),
        ([2, "yes", "n", b"", [], None, None], r"Pong.ok .*expected a bool"),
        ([2, True, "n" * 9, b"", [], None, None], r"Pong.name .*9 characters, over 8"),
        ([2, True, "n", b"12345", [], None, None], r"Pong.blob .*5 bytes, over 4"),
        ([2, True, "n", "blob", (), None, None], r"Pong.blob .*expected bytes"),
        ([2, True, "n", b"", [1, 2, 3, 4], None, None], r"Pong.ids .*4 items, over 3"),
        ([2, True, "n", b"", [1, "2"], None, None], r"Pong.ids .*expected an int"),
        ([2, True, "n", b"", 5, None, None], r"Pong.ids .*expected a list"),
        ([2, True, "n", b"", [], float("nan"), None], r"Pong.ratio .*finite"),
        ([2, True, "n", b"", [], float("inf"), None], r"Pong.ratio .*finite"),
        ([2, True, "n", b"", [], "1.0", None], r"Pong.ratio"),
        ([2, True, "n", b"", [], None, b"x" * 16], r"Pong.topic_id .*UUID"),
        ([2, True, "n", b"", [], None, msgpack.ExtType(1, b"x")], r"UUID"),
        ([2, True, "n", b"", [], None, msgpack.ExtType(9, b"x" * 16)], r"UUID"),
    ],
)
def test_hostile_arrays_are_refused(wire: Any, match: str):
    _bad(Message, wire, match)


def test_float_field_reads_a_whole_number_sent_as_int():
    value = codec.from_wire(Message, [2, True, "n", b"", [], 3, None])
    assert value.ratio == 3.0 and type(value.ratio) is float


@pytest.mark.parametrize(
    ("wire", "match"),
    [
        ([], r"expected a map"),
        ({"error": 0}, r"'name' is missing"),
        ({"name": 1, "error": 0}, r"Keyed.name .*expected a str"),
        ({"name": "t", "error": "0"}, r"Keyed.error .*expected an int"),
        ({"name": "t", "error": 0, "hw": None}, r"Keyed.hw"),
        ({"name": "t", "error": 0, "configs": {"a": 1}}, r"Keyed.configs .*expected a str"),
        ({"name": "t", "error": 0, "configs": {1: "a"}}, r"Keyed.configs .*expected a str"),
        ({"name": "t", "error": 0, "configs": ["a"]}, r"Keyed.configs .*expected a map"),
    ],
)
def test_hostile_maps_are_refused(wire: Any, match: str):
    _bad(Keyed, wire, match)


def test_map_defaults_unknown_keys_and_unknown_enum_values():
    value = codec.from_wire(Keyed, {"name": "t", "error": 32000, "newer": [1]})
    assert value == Keyed("t", ErrorCode.unknown_server_error)


def test_oversize_collections_are_refused_by_default():
    _bad(
        Keyed,
        {"name": "t", "error": 0, "configs": {str(i): "" for i in range(DEFAULT_MAX_ITEMS + 1)}},
        "over",
    )


def _ext(name: Any, values: Any, code: int = 3) -> msgpack.ExtType:
    return msgpack.ExtType(code, msgpack.packb([name, values], use_bin_type=True))


@pytest.mark.parametrize(
    ("wire", "match"),
    [
        (_ext("Other", [msgpack.ExtType(2, b"\x00"), []]), r"expected a Named"),
        (_ext("Named", [msgpack.ExtType(2, b"\x00")]), r"Named has 2 fields"),
        (_ext("Named", [0, []]), r"Named.error_code .*extension 2"),
        (_ext("Named", [msgpack.ExtType(2, b"\xcd\x7f\xff"), []]), r"32767 is not a ErrorCode"),
        (_ext("Named", [msgpack.ExtType(2, b"\xc1"), []]), r"not valid msgpack"),
        (_ext("Named", [msgpack.ExtType(2, b"\x00"), [5]]), r"Named.children .*extension 3"),
        (_ext("Named", [msgpack.ExtType(2, b"\x00"), []], code=4), r"expected extension 3"),
        (msgpack.ExtType(3, b"\x92"), r"not valid msgpack"),  # truncated inside the extension
        (msgpack.ExtType(3, msgpack.packb({"a": 1})), r"must hold"),
        ([3, "Named"], r"expected extension 3"),
    ],
)
def test_hostile_named_extensions_are_refused(wire: Any, match: str):
    _bad(Named, wire, match, ext_codec)


def test_deep_nesting_is_refused_without_a_crash():
    inner: Any = _ext("Named", [msgpack.ExtType(2, b"\x00"), []])
    for depth in range(1000):
        inner = _ext("Named", [msgpack.ExtType(2, b"\x00"), [inner]])
        if depth == 20:
            assert ext_codec.from_wire(Named, inner).error_code == ErrorCode.none
    with pytest.raises(DecodeError, match="nested too deeply"):
        ext_codec.from_wire(Named, inner)
    deep = b"\x91" * 100_000 + b"\x00"  # a list in a list ... 100,000 deep
    with pytest.raises(DecodeError):
        codec.decode(Message, deep)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never-used byte
        codec.encode(Ping(5, Pair(1, 2)))[:-1],  # truncated
        codec.encode(Ping(5)) + b"\x00",  # trailing bytes
        b"\xdd\xff\xff\xff\xff",  # a list claiming 4 billion items
        b"\xc6\xff\xff\xff\xff",  # bytes claiming 4 GiB
    ],
)
def test_bad_bytes_are_refused(data: bytes):
    with pytest.raises(DecodeError):
        codec.decode(Message, data)


def test_size_limit_is_checked_before_parsing():
    with pytest.raises(DecodeError, match="exceed the limit of 3"):
        codec.decode(Message, b"\x00" * 4, max_bytes=3)


def test_undeclarable_types_are_refused_at_compile_time():
    @dataclass(frozen=True)
    class Loose:
        __wire__: ClassVar = Array()
        anything: Any

    with pytest.raises(TypeError):
        Codec().decoder(Loose)

    @dataclass(frozen=True)
    class NoLayout:
        x: int

    with pytest.raises(TypeError, match="no __wire__"):
        Codec().decoder(NoLayout)


def test_encoding_a_class_outside_the_union_is_a_local_error():
    with pytest.raises(TypeError):
        codec.to_wire(Keyed("t", ErrorCode.none), Message)


@dataclass(frozen=True)
class Versioned:
    __wire__: ClassVar = Map(header=(("v", "VERSION"),))
    VERSION: ClassVar[int] = 2
    name: str


@dataclass(frozen=True)
class Envelope:
    __wire__: ClassVar = Array()
    method: Annotated[str, MaxLen(8)]
    body: Annotated[Any, Opaque()]


def test_map_header_is_written_first_and_checked():
    assert codec.to_wire(Versioned("a")) == {"v": 2, "name": "a"}
    assert list(codec.to_wire(Versioned("a"))) == ["v", "name"]
    assert codec.from_wire(Versioned, {"v": 2, "name": "a"}) == Versioned("a")
    for wire in ({"name": "a"}, {"v": 1, "name": "a"}, {"v": True, "name": "a"}):
        _bad(Versioned, wire, "unsupported version")


def test_opaque_fields_pass_through_for_a_later_declaration():
    body = {"anything": [1, b"x", None]}
    assert codec.to_wire(Envelope("m", body)) == ["m", body]
    assert codec.from_wire(Envelope, ["m", body]) == Envelope("m", body)
    _bad(Envelope, ["m" * 9, None], "Envelope.method")


# ---------------------------------------------------------------- fields added to a pinned format
@dataclass(frozen=True, slots=True)
class PinnedV1:
    __wire__: ClassVar = Array(header=("TAG",))
    TAG: ClassVar[str] = "p"
    a: int
    b: int = 0


@dataclass(frozen=True, slots=True)
class PinnedV2:
    __wire__: ClassVar = Array(header=("TAG",))
    TAG: ClassVar[str] = "p"
    a: int
    b: int = 0
    c: Annotated[tuple[int, ...], MaxLen(3), Added()] = ()
    d: Annotated[int, Added()] = -1


@dataclass(frozen=True, slots=True)
class ExtV2:
    __wire__: ClassVar = NamedExt(7)
    a: int
    more: Annotated[tuple[int, ...], Added()] = ()


def test_added_fields_at_their_defaults_leave_the_pinned_bytes_alone() -> None:
    codec = Codec()
    assert codec.encode(PinnedV2(1)) == codec.encode(PinnedV1(1))
    assert codec.encode(PinnedV2(1, 2)) == codec.encode(PinnedV1(1, 2))
    assert codec.decode(PinnedV2, codec.encode(PinnedV1(1, 2))) == PinnedV2(1, 2)
    # A trailing default is dropped, one before a set field is not.
    assert msgpack.unpackb(codec.encode(PinnedV2(1, 0, (5,)))) == ["p", 1, 0, [5]]
    assert msgpack.unpackb(codec.encode(PinnedV2(1, 0, (), 9))) == ["p", 1, 0, [], 9]
    for value in (PinnedV2(1, 0, (5,)), PinnedV2(1, 0, (), 9), PinnedV2(3, 4, (1, 2), 7)):
        assert codec.decode(PinnedV2, codec.encode(value)) == value
    # An older reader still refuses what it cannot hold; a newer one, more than it declares.
    with pytest.raises(DecodeError):
        codec.decode(PinnedV1, codec.encode(PinnedV2(1, 0, (5,))))
    with pytest.raises(DecodeError):
        codec.decode(PinnedV2, msgpack.packb(["p", 1, 0, [], 9, 10]))
    with pytest.raises(DecodeError):
        codec.decode(PinnedV2, msgpack.packb(["p"]))
    with pytest.raises(DecodeError, match=r"PinnedV2\.c"):
        codec.decode(PinnedV2, msgpack.packb(["p", 1, 0, [1, 2, 3, 4]]))


def test_added_fields_in_a_named_extension() -> None:
    codec = Codec()

    def fields(data: bytes) -> Any:
        return msgpack.unpackb(msgpack.unpackb(data).data)

    assert fields(codec.encode(ExtV2(1))) == ["ExtV2", [1]]
    assert fields(codec.encode(ExtV2(1, (2,)))) == ["ExtV2", [1, [2]]]
    older = msgpack.packb(msgpack.ExtType(7, msgpack.packb(["ExtV2", [4]])))
    assert codec.decode(ExtV2, older) == ExtV2(4)
    assert codec.decode(ExtV2, codec.encode(ExtV2(4, (1,)))) == ExtV2(4, (1,))


def test_an_added_field_must_come_last_and_have_a_default() -> None:
    @dataclass(frozen=True, slots=True)
    class AddedFirst:
        __wire__: ClassVar = Array()
        a: Annotated[int, Added()] = 0
        b: int = 0

    @dataclass(frozen=True, slots=True)
    class NoDefault:
        __wire__: ClassVar = Array()
        a: Annotated[int, Added()]

    for cls in (AddedFirst, NoDefault):
        with pytest.raises(TypeError):
            Codec().encode(cls(0))
