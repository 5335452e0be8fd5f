"""Controller: leader elections on fencing/unfencing, unclean election, preferred leaders,
AlterPartition."""

import pytest

from raftlog.errors import ErrorCode
from raftlog.metadata import records as r
from raftlog.metadata.controller import messages as m
from tests.metadata.test_controller import SESSION_MS, cluster, create, heartbeat


def assign(c, name, replicas_by_partition, **configs):
    result = c.handle(
        m.CreateTopics((m.NewTopic(name, assignments=replicas_by_partition, configs=configs),)), 0
    )
    res = result.reply.results[0]
    assert res.error_code == ErrorCode.none, res
    return res.topic_id


def expire(c, *silent, now_ms=SESSION_MS):
    """Every broker except `silent` heartbeats just in time; then the clock reaches now_ms."""
    for broker_id, reg in c.image.brokers.items():
        if broker_id not in silent and not reg.fenced:
            heartbeat(c, broker_id, now_ms=now_ms - 1)
    return c.tick(now_ms)


def test_fencing_the_leader_elects_the_next_isr_member_and_bumps_the_epoch():
    c = cluster(3)
    t = assign(c, "t", {0: (1, 2, 3), 1: (2, 1, 3), 2: (2, 3)})
    result = expire(c, 1)
    p0, p1, p2 = (c.image.partition(t, i) for i in range(3))
    assert (p0.leader, p0.isr, p0.leader_epoch, p0.partition_epoch) == (2, (2, 3), 1, 1)
    # Broker 1 was a follower of partition 1: it leaves the ISR, the leader epoch stays.
    assert (p1.leader, p1.isr, p1.leader_epoch, p1.partition_epoch) == (2, (2, 3), 0, 1)
    assert p2.partition_epoch == 0  # untouched
    assert result.records[0] == r.FenceBroker(1, 1)
    assert r.PartitionChange(t, 0, leader=2, isr=(2, 3)) in result.records


def test_last_isr_member_stays_in_the_isr_and_the_partition_goes_offline():
    c = cluster(3)
    t = assign(c, "t", {0: (1, 2)})
    expire(c, 2)
    assert c.image.partition(t, 0).isr == (1,)
    expire(c, 1, now_ms=2 * SESSION_MS)
    state = c.image.partition(t, 0)
    assert (state.leader, state.isr, state.leader_epoch) == (-1, (1,), 1)
    c.image.check_invariants()


def test_unfencing_the_last_isr_member_brings_the_partition_back():
    c = cluster(3)
    t = assign(c, "t", {0: (1, 2)})
    expire(c, 2)
    expire(c, 1, now_ms=2 * SESSION_MS)
    # Broker 2 comes back first, but it is not in the ISR: the partition stays offline.
    heartbeat(c, 2, now_ms=2 * SESSION_MS + 1)
    assert c.image.partition(t, 0).leader == -1
    heartbeat(c, 1, now_ms=2 * SESSION_MS + 2)
    state = c.image.partition(t, 0)
    assert (state.leader, state.isr, state.leader_epoch) == (1, (1,), 2)


@pytest.mark.parametrize("where", ["topic", "cluster", "node"])
def test_unclean_election_only_when_enabled(where):
    node_flag = where == "node"
    c = cluster(3, unclean_leader_election=node_flag)
    configs = {"unclean.leader.election.enable": "true"} if where == "topic" else {}
    t = assign(c, "t", {0: (1, 2)}, **configs)
    clean = assign(c, "clean", {0: (1, 2)})
    if where == "cluster":
        c.handle(
            m.AlterConfigs(
                (m.AlterConfigsResource("cluster", "", {"unclean.leader.election.enable": "true"}),)
            ),
            0,
        )
    expire(c, 2)
    expire(c, 1, now_ms=2 * SESSION_MS)
    heartbeat(c, 2, now_ms=2 * SESSION_MS + 1)  # only broker 2 (out of the ISR) is alive
    state = c.image.partition(t, 0)
    assert (state.leader, state.isr) == (2, (2,))
    other = c.image.partition(clean, 0)
    expected = 2 if where in ("node", "cluster") else -1
    assert other.leader == expected


def test_topic_config_can_forbid_unclean_election_the_cluster_allows():
    c = cluster(3, unclean_leader_election=True)
    t = assign(c, "t", {0: (1, 2)}, **{"unclean.leader.election.enable": "false"})
    expire(c, 2)
    expire(c, 1, now_ms=2 * SESSION_MS)
    heartbeat(c, 2, now_ms=2 * SESSION_MS + 1)
    assert c.image.partition(t, 0).leader == -1


def test_periodic_pass_elects_offline_partitions_after_unclean_is_switched_on():
    c = cluster(3)
    t = assign(c, "t", {0: (1, 2)})
    expire(c, 2)
    expire(c, 1, now_ms=2 * SESSION_MS)
    heartbeat(c, 2, now_ms=2 * SESSION_MS + 1)
    assert c.image.partition(t, 0).leader == -1
    c.handle(
        m.IncrementalAlterConfigs(
            (
                m.IncrementalAlterConfigsResource(
                    "topic", "t", (m.ConfigOp("unclean.leader.election.enable", "set", "true"),)
                ),
            )
        ),
        0,
    )
    heartbeat(c, 2, now_ms=c.preferred_leader_check_interval_ms)
    c.tick(c.preferred_leader_check_interval_ms)
    assert c.image.partition(t, 0).leader == 2


def test_preferred_leader_rebalancing():
    c = cluster(3)
    t = assign(c, "t", {0: (1, 2, 3), 1: (2, 3, 1)})
    expire(c, 1)
    assert c.image.partition(t, 0).leader == 2
    heartbeat(c, 1, now_ms=SESSION_MS + 1)  # back, but not yet in the ISR
    assert c.rebalance_preferred_leaders().records == ()
    leader = c.image.partition(t, 0)
    reply = c.handle(
        m.AlterPartition(2, 1, t, 0, leader.leader_epoch, leader.partition_epoch, (2, 3, 1)), 0
    ).reply
    assert reply.error_code == ErrorCode.none
    result = c.rebalance_preferred_leaders()
    assert result.records == (r.PartitionChange(t, 0, leader=1),)
    state = c.image.partition(t, 0)
    assert state.leader == 1 and state.leader_epoch == leader.leader_epoch + 1
    assert c.image.partition(t, 1).leader == 2


def test_preferred_leader_rebalancing_runs_from_tick_on_its_interval():
    c = cluster(3)
    t = assign(c, "t", {0: (1, 2)})
    c.image, _ = c.image.apply([r.PartitionChange(t, 0, leader=2)], 5)
    interval = c.preferred_leader_check_interval_ms
    for broker_id in (1, 2, 3):
        heartbeat(c, broker_id, now_ms=interval - 1)
    assert c.tick(interval - 1).records == ()
    assert c.tick(interval).records == (r.PartitionChange(t, 0, leader=1),)


# ------------------------------------------------------------------ AlterPartition
def alter(c, t, *, broker=1, epoch=1, leader_epoch=0, partition_epoch=0, isr=(1, 2)):
    return c.handle(m.AlterPartition(broker, epoch, t, 0, leader_epoch, partition_epoch, isr), 0)


def test_alter_partition_shrinks_and_expands_the_isr():
    c = cluster(3)
    t = assign(c, "t", {0: (1, 2, 3)})
    shrink = alter(c, t, isr=(1, 2))
    assert shrink.records == (r.PartitionChange(t, 0, isr=(1, 2)),)
    assert shrink.reply == m.AlterPartitionReply(
        leader=1, leader_epoch=0, isr=(1, 2), partition_epoch=1
    )
    expand = alter(c, t, partition_epoch=1, isr=(1, 2, 3))
    assert expand.reply.partition_epoch == 2 and expand.reply.isr == (1, 2, 3)
    same = alter(c, t, partition_epoch=2, isr=(1, 2, 3))
    assert same.records == () and same.reply.partition_epoch == 2


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"broker": 9}, ErrorCode.broker_id_not_registered),
        ({"epoch": 7}, ErrorCode.stale_broker_epoch),
        ({"leader_epoch": 1}, ErrorCode.fenced_leader_epoch),
        ({"broker": 2}, ErrorCode.invalid_request),
        ({"partition_epoch": 3}, ErrorCode.invalid_update_version),
        ({"isr": (2, 3)}, ErrorCode.invalid_request),
        ({"isr": (1, 1)}, ErrorCode.invalid_request),
        ({"isr": (1, 4)}, ErrorCode.invalid_request),
        ({"isr": (1, 3)}, ErrorCode.ineligible_replica),
    ],
)
def test_alter_partition_errors(kwargs, code):
    c = cluster(4)
    t = assign(c, "t", {0: (1, 2, 3)})
    heartbeat(c, 3, want_fence=True)  # 3 leaves the ISR and may not rejoin while fenced
    state = c.image.partition(t, 0)
    kwargs.setdefault("partition_epoch", state.partition_epoch)
    result = alter(c, t, **kwargs)
    assert result.reply.error_code == code, result.reply
    assert result.records == ()


def test_alter_partition_unknown_topic_and_partition():
    c = cluster(2)
    t = assign(c, "t", {0: (1, 2)})
    import uuid

    unknown = alter(c, uuid.UUID(int=5))
    assert unknown.reply.error_code == ErrorCode.unknown_topic_id
    bad = c.handle(m.AlterPartition(1, 1, t, 3, 0, 0, (1,)), 0)
    assert bad.reply.error_code == ErrorCode.unknown_topic_or_partition


def test_alter_partition_from_a_deposed_leader_is_fenced():
    c = cluster(3)
    t = assign(c, "t", {0: (1, 2, 3)})
    expire(c, 1)  # broker 1 loses leadership, leader epoch becomes 1
    heartbeat(c, 1, now_ms=SESSION_MS + 1)
    stale = alter(c, t, isr=(1,))
    assert stale.reply.error_code == ErrorCode.fenced_leader_epoch


def test_shutting_down_broker_cannot_rejoin_the_isr():
    c = cluster(3)
    t = assign(c, "t", {0: (1, 2, 3)})
    heartbeat(c, 3, want_shutdown=True)
    state = c.image.partition(t, 0)
    assert state.isr == (1, 2)
    result = alter(c, t, partition_epoch=state.partition_epoch, isr=(1, 2, 3))
    assert result.reply.error_code == ErrorCode.ineligible_replica


def test_create_topic_after_fencing_uses_the_remaining_brokers():
    c = cluster(3)
    expire(c, 3)
    res = create(c, "late", 3, 2)
    assert res.error_code == ErrorCode.none
    for state in c.image.topic("late").partitions.values():
        assert 3 not in state.replicas
    assert create(c, "toobig", 1, 3).error_code == ErrorCode.invalid_replication_factor
