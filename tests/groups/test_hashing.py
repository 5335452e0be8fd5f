import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlog.groups.hashing import java_string_hashcode, kafka_abs, partition_for_group


def by_definition(text: str) -> int:
    """Java's documented formula, s[0]*31^(n-1) + ... + s[n-1], done in big ints then
    wrapped to int32 once at the end."""
    units = text.encode("utf-16-be", "surrogatepass")
    codes = [int.from_bytes(units[i : i + 2], "big") for i in range(0, len(units), 2)]
    n = len(codes)
    total = sum(c * 31 ** (n - 1 - i) for i, c in enumerate(codes)) % 2**32
    return total - 2**32 if total >= 2**31 else total


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("ab", 97 * 31 + 98),  # 3105
        ("Aa", 2112),  # the classic collision pair...
        ("BB", 2112),  # ...65*31+97 == 66*31+66
        ("hello", 99162322),
        ("polygenelubricants", -(2**31)),  # hashes to Integer.MIN_VALUE
        ("\U0001f600", 0xD83D * 31 + 0xDE00),  # one emoji = two UTF-16 code units
    ],
)
def test_known_java_hashcodes(text: str, expected: int) -> None:
    assert java_string_hashcode(text) == expected


@given(st.text())
def test_matches_the_definition(text: str) -> None:
    value = java_string_hashcode(text)
    assert value == by_definition(text)
    assert -(2**31) <= value < 2**31


def test_partition_uses_kafka_abs() -> None:
    assert kafka_abs(-(2**31)) == 0  # Math.abs would stay negative here
    assert kafka_abs(-5) == 5
    assert partition_for_group("polygenelubricants", 50) == 0
    assert partition_for_group("hello", 50) == 99162322 % 50
    assert partition_for_group("BB", 7) == 2112 % 7


@given(st.text(), st.integers(1, 1000))
def test_partition_in_range(group_id: str, partitions: int) -> None:
    assert 0 <= partition_for_group(group_id, partitions) < partitions
