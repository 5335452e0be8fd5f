"""Replica placement for new partitions and generated reassignment plans (pure functions).

Without racks: round-robin over the brokers (partition p led by brokers[(start + p) % n]),
followers shifted every n partitions so one leader's followers are spread too.

With racks (brokers registered with broker_rack), Kafka's rack-aware assignment: the brokers
are listed alternating over the racks (one broker of each rack in turn), leaders go
round-robin over that list, and each further replica is the next broker in it whose rack
holds no replica of the partition yet (once every rack holds one, any rack will do). So each
partition's replicas span min(RF, racks) racks and losing a rack loses at most the replicas
on it. A broker without a rack, in a cluster where others have one, counts as a rack of its
own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["n_racks", "place_replicas", "place_replicas_rack_aware", "placement", "rack_alternated"]


def place_replicas(
    brokers: Sequence[int], num_partitions: int, replication_factor: int, start: int
) -> list[tuple[int, ...]]:
    """Rack-unaware round-robin: partition p is led by brokers[(start + p) % n], and the
    follower offset shifts every n partitions so followers of one leader are spread too."""
    n = len(brokers)
    assignments = []
    shift = start % n
    for p in range(num_partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (start + p) % n
        replicas = [brokers[first]]
        for j in range(replication_factor - 1):
            replicas.append(brokers[(first + 1 + (shift + j) % (n - 1)) % n])
        assignments.append(tuple(replicas))
    return assignments


def rack_alternated(brokers: Sequence[int], racks: Mapping[int, str | None]) -> list[int]:
    """The brokers ordered one per rack in turn: racks sorted by name, brokers by id within
    a rack (e.g. a: 1, 2; b: 3; c: 4, 5 -> 1, 3, 4, 2, 5)."""
    by_rack: dict[str, list[int]] = {}
    for broker in sorted(brokers):
        by_rack.setdefault(_rack_key(broker, racks), []).append(broker)
    ordered = [by_rack[rack] for rack in sorted(by_rack)]
    out: list[int] = []
    for i in range(max(len(members) for members in ordered)):
        out.extend(members[i] for members in ordered if i < len(members))
    return out


def _rack_key(broker: int, racks: Mapping[int, str | None]) -> str:
    rack = racks.get(broker)
    # A broker without a rack is a rack of its own; the prefix keeps it from naming a real one.
    return f"\x00broker-{broker}" if rack is None else rack


def place_replicas_rack_aware(
    brokers: Sequence[int],
    racks: Mapping[int, str | None],
    num_partitions: int,
    replication_factor: int,
    start: int,
) -> list[tuple[int, ...]]:
    arranged = rack_alternated(brokers, racks)
    n = len(arranged)
    num_racks = len({_rack_key(b, racks) for b in arranged})
    assignments = []
    shift = start % n
    for p in range(num_partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (start + p) % n
        leader = arranged[first]
        replicas = [leader]
        racks_used = {_rack_key(leader, racks)}
        step = 0
        while len(replicas) < replication_factor:
            broker = arranged[(first + 1 + (shift + step) % (n - 1)) % n]
            step += 1
            rack = _rack_key(broker, racks)
            if broker in replicas:
                continue
            if rack in racks_used and len(racks_used) < num_racks and step < 2 * n:
                continue  # another rack still lacks a replica of this partition
            replicas.append(broker)
            racks_used.add(rack)
        assignments.append(tuple(replicas))
    return assignments


def placement(
    brokers: Sequence[int],
    racks: Mapping[int, str | None],
    num_partitions: int,
    replication_factor: int,
    start: int,
) -> list[tuple[int, ...]]:
    """Rack-aware when any of `brokers` has a rack, else as before racks existed. The caller
    checks 1 <= replication_factor <= len(brokers)."""
    if replication_factor == 1 or n_racks(brokers, racks) == 0:
        return place_replicas(sorted(brokers), num_partitions, replication_factor, start)
    return place_replicas_rack_aware(brokers, racks, num_partitions, replication_factor, start)


def n_racks(brokers: Sequence[int], racks: Mapping[int, str | None]) -> int:
    """How many distinct racks `brokers` registered (brokers without one not counted)."""
    return len({racks[b] for b in brokers if racks.get(b) is not None})
