"""Which `__consumer_offsets` partition (and so which coordinator) owns a group.

Kafka computes `Utils.abs(groupId.hashCode()) % offsets.topic.num.partitions`. Stock clients
never compute this themselves (they ask FindCoordinator), but matching Kafka exactly keeps a
group on the same partition number as it would be on a Kafka cluster, which makes migrated
offsets topics and mixed tooling agree.
"""

from __future__ import annotations

from raftlog.codec import I32_MIN

_INT32_MIN = I32_MIN
_UINT32_MASK = 0xFFFFFFFF


def java_string_hashcode(text: str) -> int:
    """Java's `String.hashCode()`: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, int32.

    Java strings are UTF-16, so a character outside the Basic Multilingual Plane counts as two
    code units (a surrogate pair); encoding to UTF-16-BE reproduces exactly those units.
    """
    data = text.encode("utf-16-be", "surrogatepass")
    value = 0
    for i in range(0, len(data), 2):
        unit = (data[i] << 8) | data[i + 1]
        value = (value * 31 + unit) & _UINT32_MASK
    # Reinterpret the low 32 bits as a signed Java int.
    return value - (1 << 32) if value & 0x80000000 else value


def kafka_abs(value: int) -> int:
    """Kafka's `Utils.abs`: like Math.abs but maps Integer.MIN_VALUE to 0 (Math.abs would
    return a negative number there, and a negative partition)."""
    return 0 if value == _INT32_MIN else abs(value)


def partition_for_group(group_id: str, num_partitions: int) -> int:
    """The `__consumer_offsets` partition that stores `group_id`, as Kafka computes it."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    return kafka_abs(java_string_hashcode(group_id)) % num_partitions
