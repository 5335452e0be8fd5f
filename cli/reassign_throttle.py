"""`raftlog topics reassign --throttle`: the replication throttle of a reassignment, set and
removed as kafka-reassign-partitions.sh does it.

--execute --throttle B  before the plan starts, on every partition that moves: the topic's
                        `leader.replication.throttled.replicas` lists its current replicas
                        (they send the copies) and `follower.replication.throttled.replicas`
                        the replicas it gains (they receive them); every broker holding or
                        gaining one of them gets `leader.replication.throttled.rate` and
                        `follower.replication.throttled.rate` = B bytes/s.
--verify                once every partition of the plan is complete, removes the throttled
                        replica lists of the plan's topics and the two rates from every broker
                        (only where set: a verify with no throttle to remove writes nothing).
--execute --wait        removes them the same way when the moves are done.

The brokers apply it (raftlog/replication/core/throttle.py): only replicas outside the ISR are
throttled, so producers and in-sync followers are not slowed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from raftlog.client import Admin, ConfigOp, ResourceType
from raftlog.client.admin_reassign import Plan, TopicPartition
from raftlog.replication.core.throttle import (
    FOLLOWER_THROTTLED_RATE,
    FOLLOWER_THROTTLED_REPLICAS,
    LEADER_THROTTLED_RATE,
    LEADER_THROTTLED_REPLICAS,
    UNTHROTTLED_RATE,
    format_throttled_replicas,
)

RATE_KEYS = (LEADER_THROTTLED_RATE, FOLLOWER_THROTTLED_RATE)
REPLICA_KEYS = (LEADER_THROTTLED_REPLICAS, FOLLOWER_THROTTLED_REPLICAS)
# --throttle's largest value: Kafka's default rate (Long.MAX_VALUE) means "no throttle".
MAX_THROTTLE_BYTES_PER_S = UNTHROTTLED_RATE - 1


@dataclass(frozen=True)
class ThrottlePlan:
    """The configs --execute --throttle sets."""

    # topic -> (leader.replication.throttled.replicas, follower.replication.throttled.replicas)
    topics: Mapping[str, tuple[str, str]]
    # The brokers whose two rates are set.
    brokers: tuple[int, ...]


def throttle_plan(current: Mapping[TopicPartition, Sequence[int]], plan: Plan) -> ThrottlePlan:
    """Which replicas and brokers a throttle covers: the partitions whose replicas change."""
    leaders: dict[str, set[tuple[int, int]]] = {}
    followers: dict[str, set[tuple[int, int]]] = {}
    brokers: set[int] = set()
    for (topic, partition), target in sorted(plan.items()):
        existing = tuple(current.get((topic, partition), ()))
        if target is None or set(target) == set(existing):
            continue  # a cancel, or nothing to copy (a reorder moves no data)
        leaders.setdefault(topic, set()).update((partition, b) for b in existing)
        followers.setdefault(topic, set()).update(
            (partition, b) for b in target if b not in existing
        )
        brokers.update(existing)
        brokers.update(target)
    topics = {
        topic: (
            format_throttled_replicas(leaders[topic]),
            format_throttled_replicas(followers.get(topic, ())),
        )
        for topic in sorted(leaders)
    }
    return ThrottlePlan(topics, tuple(sorted(brokers)))


async def set_throttles(admin: Admin, throttle: ThrottlePlan, rate_bytes_per_s: int) -> None:
    """Set the throttle's configs (topics first: a rate alone throttles nothing)."""
    for topic, (leader_list, follower_list) in throttle.topics.items():
        await admin.incremental_alter_configs(
            (ResourceType.TOPIC, topic),
            [
                (LEADER_THROTTLED_REPLICAS, ConfigOp.SET, leader_list),
                (FOLLOWER_THROTTLED_REPLICAS, ConfigOp.SET, follower_list),
            ],
        )
    rate = str(rate_bytes_per_s)
    for broker_id in throttle.brokers:
        await admin.incremental_alter_configs(
            (ResourceType.BROKER, str(broker_id)), [(key, ConfigOp.SET, rate) for key in RATE_KEYS]
        )


@dataclass(frozen=True)
class ClearedThrottles:
    topics: tuple[str, ...]
    brokers: tuple[int, ...]


async def clear_throttles(admin: Admin, topics: Iterable[str]) -> ClearedThrottles:
    """Remove the throttled replica lists of `topics` and the rates of every broker of the
    cluster, where they are set."""
    cleared_topics = []
    for topic in sorted(set(topics)):
        configs = (await admin.describe_configs([(ResourceType.TOPIC, topic)])).get(
            (ResourceType.TOPIC, topic), {}
        )
        set_keys = [key for key in REPLICA_KEYS if configs.get(key)]
        if set_keys:
            await admin.incremental_alter_configs(
                (ResourceType.TOPIC, topic), [(key, ConfigOp.DELETE, None) for key in set_keys]
            )
            cleared_topics.append(topic)
    cleared_brokers = []
    for broker_id in sorted((await admin.describe_cluster()).brokers):
        resource = (ResourceType.BROKER, str(broker_id))
        configs = (await admin.describe_configs([resource])).get(resource, {})
        set_keys = [
            key for key in RATE_KEYS if configs.get(key) not in (None, str(UNTHROTTLED_RATE))
        ]
        if set_keys:
            await admin.incremental_alter_configs(
                resource, [(key, ConfigOp.DELETE, None) for key in set_keys]
            )
            cleared_brokers.append(broker_id)
    return ClearedThrottles(tuple(cleared_topics), tuple(cleared_brokers))
