"""Server-side assignors of the consumer group protocol (KIP-848): `uniform` and `range`.

An assignor is a pure function from the group's subscriptions, the subscribed topics'
partition counts and the current target assignment to the next target assignment. The
coordinator calls it when the group epoch moves past the assignment epoch; reconciliation
(consumer_group.py) then walks each member towards its target.

- uniform (Kafka's default): every partition of a subscribed topic goes to exactly one
  member subscribed to its topic, the counts differ by at most one where subscriptions allow,
  and a partition stays with its current owner whenever balance permits (fewer revocations).
- range: per topic, the subscribed members in member-id order get contiguous ranges, the
  first `partitions % members` one extra (Kafka's RangeAssignor; co-partitioned topics land
  together).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

TopicPartition = tuple[str, int]
Assignment = dict[str, frozenset[TopicPartition]]
Assignor = Callable[
    [Mapping[str, frozenset[str]], Mapping[str, int], Mapping[str, frozenset[TopicPartition]]],
    Assignment,
]

UNIFORM = "uniform"
RANGE = "range"
DEFAULT_ASSIGNOR = UNIFORM


def uniform_assign(
    subscriptions: Mapping[str, frozenset[str]],
    partition_counts: Mapping[str, int],
    current: Mapping[str, frozenset[TopicPartition]],
) -> Assignment:
    """Balanced and sticky: keep current owners up to a fair share, give the rest to the
    least loaded eligible member, then move partitions while some member has two more than
    an eligible peer."""
    members = sorted(subscriptions)
    if not members:
        return {}
    wanted = sorted(
        (topic, p)
        for topic in {t for subs in subscriptions.values() for t in subs}
        if topic in partition_counts
        for p in range(partition_counts[topic])
    )
    eligible: dict[TopicPartition, list[str]] = {
        tp: [m for m in members if tp[0] in subscriptions[m]] for tp in wanted
    }
    owned: dict[str, set[TopicPartition]] = {m: set() for m in members}
    taken: set[TopicPartition] = set()
    # A fair share per member, for members with identical subscriptions (the common case):
    # keeping more than that would only be undone by the balancing moves below.
    share = -(-len(wanted) // len(members))
    for member in members:
        for tp in sorted(current.get(member, frozenset())):
            eligible_here = tp in eligible and member in eligible[tp]
            if eligible_here and tp not in taken and len(owned[member]) < share:
                owned[member].add(tp)
                taken.add(tp)
    for tp in wanted:
        if tp in taken or not eligible[tp]:
            continue
        target = min(eligible[tp], key=lambda m: (len(owned[m]), m))
        owned[target].add(tp)
        taken.add(tp)
    _balance(owned, eligible)
    return {m: frozenset(owned[m]) for m in members}


def _balance(
    owned: dict[str, set[TopicPartition]], eligible: dict[TopicPartition, list[str]]
) -> None:
    # Each move lowers the sum of squared counts, so the loop ends; the bound is a safety net.
    for _ in range(len(eligible) * max(1, len(owned))):
        moved = False
        for donor in sorted(owned, key=lambda m: (-len(owned[m]), m)):
            for tp in sorted(owned[donor]):
                receiver = min(eligible[tp], key=lambda m: (len(owned[m]), m))
                if len(owned[receiver]) + 1 < len(owned[donor]):
                    owned[donor].discard(tp)
                    owned[receiver].add(tp)
                    moved = True
                    break
            if moved:
                break
        if not moved:
            return


def range_assign(
    subscriptions: Mapping[str, frozenset[str]],
    partition_counts: Mapping[str, int],
    current: Mapping[str, frozenset[TopicPartition]],
) -> Assignment:
    """Contiguous ranges per topic, in member-id order (the current assignment is ignored)."""
    owned: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    topics = sorted({t for subs in subscriptions.values() for t in subs})
    for topic in topics:
        count = partition_counts.get(topic)
        if count is None:
            continue
        subscribers = sorted(m for m, subs in subscriptions.items() if topic in subs)
        per_member, extra = divmod(count, len(subscribers))
        start = 0
        for i, member in enumerate(subscribers):
            size = per_member + (1 if i < extra else 0)
            owned[member].update((topic, p) for p in range(start, start + size))
            start += size
    return {m: frozenset(ps) for m, ps in owned.items()}


ASSIGNORS: Mapping[str, Assignor] = {UNIFORM: uniform_assign, RANGE: range_assign}
