"""Controller: CreateTopics, DeleteTopics, CreatePartitions."""

from collections import Counter

import pytest

from raftlog.errors import ErrorCode
from raftlog.metadata import records as r
from raftlog.metadata.controller import messages as m
from raftlog.metadata.controller.topics import MAX_TOPIC_NAME_CHARS, place_replicas
from tests.metadata.test_controller import cluster, create, heartbeat


def test_create_topic_writes_topic_partitions_and_configs():
    c = cluster(3)
    result = c.handle(
        m.CreateTopics((m.NewTopic("orders", 3, 2, configs={"retention.ms": "1000"}),)), 0
    )
    (res,) = result.reply.results
    assert res.error_code == ErrorCode.none
    assert (res.num_partitions, res.replication_factor) == (3, 2)
    kinds = [type(rec).__name__ for rec in result.records]
    assert kinds == ["Topic", "Partition", "Partition", "Partition", "Config"]
    topic = c.image.topic("orders")
    assert topic.topic_id == res.topic_id
    for state in topic.partitions.values():
        assert len(state.replicas) == 2 and state.isr == state.replicas
        assert state.leader == state.replicas[0] and state.leader_epoch == 0
    assert c.image.topic_config("orders", "retention.ms") == 1000


def test_defaults_come_from_the_node_config():
    c = cluster(3, num_partitions=4, default_replication_factor=2)
    res = c.handle(m.CreateTopics((m.NewTopic("d"),)), 0).reply.results[0]
    assert (res.num_partitions, res.replication_factor) == (4, 2)


def test_round_robin_placement_spreads_leaders_and_replicas():
    c = cluster(3)
    create(c, "p", partitions=6, rf=3)
    states = c.image.topic("p").partitions
    leaders = Counter(s.leader for s in states.values())
    assert leaders == {1: 2, 2: 2, 3: 2}
    for s in states.values():
        assert sorted(s.replicas) == [1, 2, 3]
    # Single-partition topics rotate their leader.
    c2 = cluster(3)
    firsts = [
        c2.image.topic(name).partitions[0].leader
        for name in ("a", "b", "c")
        if create(c2, name, 1, 1).error_code == ErrorCode.none
    ]
    assert sorted(firsts) == [1, 2, 3]


def test_place_replicas_shifts_followers_every_round():
    assignments = place_replicas([1, 2, 3, 4], 8, 2, start=0)
    assert [a[0] for a in assignments] == [1, 2, 3, 4, 1, 2, 3, 4]
    assert assignments[:4] == [(1, 2), (2, 3), (3, 4), (4, 1)]
    assert assignments[4:] == [(1, 3), (2, 4), (3, 1), (4, 2)]


def test_placement_skips_fenced_brokers():
    c = cluster(3)
    heartbeat(c, 2, want_fence=True)
    create(c, "f", partitions=4, rf=2)
    for state in c.image.topic("f").partitions.values():
        assert 2 not in state.replicas


@pytest.mark.parametrize(
    ("topic", "code", "message"),
    [
        (m.NewTopic("x", 1, 4), ErrorCode.invalid_replication_factor, "larger than the 3"),
        (m.NewTopic("x", 1, 0), ErrorCode.invalid_replication_factor, "must be 1..32"),
        (m.NewTopic("x", 0, 1), ErrorCode.invalid_partitions, "must be 1..100000"),
        (m.NewTopic("x", 100_001, 1), ErrorCode.invalid_partitions, "got 100001"),
        (m.NewTopic("", 1, 1), ErrorCode.invalid_topic_exception, "not allowed"),
        (m.NewTopic("..", 1, 1), ErrorCode.invalid_topic_exception, "not allowed"),
        (m.NewTopic("a b", 1, 1), ErrorCode.invalid_topic_exception, "may only contain"),
        (m.NewTopic("é", 1, 1), ErrorCode.invalid_topic_exception, "may only contain"),
        (
            m.NewTopic("x" * (MAX_TOPIC_NAME_CHARS + 1), 1, 1),
            ErrorCode.invalid_topic_exception,
            "the limit is 249",
        ),
        (
            m.NewTopic("x", 1, 1, configs={"retention.ms": "soon"}),
            ErrorCode.invalid_config,
            "'soon' is not an integer",
        ),
        (
            m.NewTopic("x", 1, 1, configs={"retention.mss": "1"}),
            ErrorCode.invalid_config,
            "unknown config key 'retention.mss'",
        ),
        (
            m.NewTopic("x", 1, 1, configs={"cleanup.policy": "shred"}),
            ErrorCode.invalid_config,
            "must be a list of",
        ),
        (
            m.NewTopic("x", 1, 1, configs={"min.insync.replicas": "0"}),
            ErrorCode.invalid_config,
            "outside 1..",
        ),
        (
            m.NewTopic("x", 1, 1, configs={"segment.bytes": "60"}),
            ErrorCode.invalid_config,
            "outside 61..",
        ),
        (
            m.NewTopic("x", 1, 1, configs={"unclean.leader.election.enable": "yes"}),
            ErrorCode.invalid_config,
            "not true or false",
        ),
        (
            m.NewTopic("x", 2, -1, assignments={0: (1,), 1: (2,)}),
            ErrorCode.invalid_request,
            "must be -1",
        ),
        (
            m.NewTopic("x", assignments={0: (1,), 2: (2,)}),
            ErrorCode.invalid_replica_assignment,
            "must be 0..n-1",
        ),
        (
            m.NewTopic("x", assignments={0: (1, 1)}),
            ErrorCode.invalid_replica_assignment,
            "distinct and non-empty",
        ),
        (
            m.NewTopic("x", assignments={0: (1, 9)}),
            ErrorCode.invalid_replica_assignment,
            "brokers [9] are not registered",
        ),
    ],
)
def test_create_topic_errors(topic, code, message):
    c = cluster(3)
    result = c.handle(m.CreateTopics((topic,)), 0)
    (res,) = result.reply.results
    assert res.error_code == code and message in res.error_message, res
    assert result.records == () and not c.image.topics_by_id


def test_existing_and_colliding_names():
    c = cluster(3)
    create(c, "my.topic", 1, 1)
    again = create(c, "my.topic", 1, 1)
    assert again.error_code == ErrorCode.topic_already_exists
    clash = create(c, "my_topic", 1, 1)
    assert clash.error_code == ErrorCode.invalid_topic_exception and "collides" in (
        clash.error_message
    )


def test_one_bad_topic_does_not_fail_the_others_and_duplicates_fail_both():
    c = cluster(3)
    reply = c.handle(
        m.CreateTopics((m.NewTopic("ok", 1, 1), m.NewTopic("bad", 1, 9), m.NewTopic("ok2", 1, 1))),
        0,
    ).reply
    assert [x.error_code for x in reply.results] == [
        ErrorCode.none,
        ErrorCode.invalid_replication_factor,
        ErrorCode.none,
    ]
    dup = c.handle(m.CreateTopics((m.NewTopic("d", 1, 1), m.NewTopic("d", 1, 1))), 0).reply
    assert [x.error_code for x in dup.results] == [ErrorCode.invalid_request] * 2


def test_validate_only_writes_nothing():
    c = cluster(3)
    result = c.handle(m.CreateTopics((m.NewTopic("v", 2, 2),), validate_only=True), 0)
    assert result.records == () and c.image.topic("v") is None
    assert result.reply.results[0].error_code == ErrorCode.none
    assert result.reply.results[0].num_partitions == 2


def test_explicit_assignments():
    c = cluster(3)
    heartbeat(c, 3, want_fence=True)
    res = c.handle(
        m.CreateTopics((m.NewTopic("e", assignments={0: (3, 1), 1: (2, 3)}),)), 0
    ).reply.results[0]
    assert res.error_code == ErrorCode.none
    p0, p1 = c.image.topic("e").partitions[0], c.image.topic("e").partitions[1]
    # The fenced broker is a replica but neither leader nor in the ISR.
    assert (p0.leader, p0.isr) == (1, (1,))
    assert (p1.leader, p1.isr) == (2, (2,))
    all_fenced = c.handle(m.CreateTopics((m.NewTopic("f", assignments={0: (3,)}),)), 0)
    assert all_fenced.reply.results[0].error_code == ErrorCode.invalid_replica_assignment


def test_delete_topics_by_name_and_id():
    c = cluster(3)
    a = create(c, "a", 2, 1)
    b = create(c, "b", 1, 1)
    c.handle(m.CreateTopics((m.NewTopic("a2", 1, 1, configs={"retention.ms": "5"}),)), 0)
    result = c.handle(m.DeleteTopics(names=("a", "nope"), topic_ids=(b.topic_id,)), 0)
    assert result.records == (r.RemoveTopic(a.topic_id), r.RemoveTopic(b.topic_id))
    codes = [(x.name, x.error_code) for x in result.reply.results]
    assert codes == [
        ("a", ErrorCode.none),
        ("nope", ErrorCode.unknown_topic_or_partition),
        ("b", ErrorCode.none),
    ]
    assert c.image.topic("a") is None and c.image.topic("b") is None
    missing = c.handle(m.DeleteTopics(topic_ids=(a.topic_id,)), 0).reply.results[0]
    assert missing.error_code == ErrorCode.unknown_topic_id
    # A re-created topic gets a new id and no leftover configs.
    c.handle(m.DeleteTopics(names=("a2",)), 0)
    again = create(c, "a2", 1, 1)
    assert c.image.topic_config("a2", "retention.ms") is None and again.topic_id != b.topic_id


def test_create_partitions():
    c = cluster(3)
    create(c, "g", 2, 2)
    result = c.handle(m.CreatePartitions((m.NewPartitions("g", 5),)), 0)
    assert result.reply.results[0].error_code == ErrorCode.none
    parts = c.image.topic("g").partitions
    assert sorted(parts) == [0, 1, 2, 3, 4]
    assert all(len(s.replicas) == 2 for s in parts.values())
    assert [rec.partition for rec in result.records] == [2, 3, 4]
    explicit = c.handle(m.CreatePartitions((m.NewPartitions("g", 6, ((3, 1),)),)), 0)
    assert explicit.reply.results[0].error_code == ErrorCode.none
    assert c.image.topic("g").partitions[5].replicas == (3, 1)


@pytest.mark.parametrize(
    ("item", "code"),
    [
        (m.NewPartitions("nope", 3), ErrorCode.unknown_topic_or_partition),
        (m.NewPartitions("g", 2), ErrorCode.invalid_partitions),
        (m.NewPartitions("g", 1), ErrorCode.invalid_partitions),
        (m.NewPartitions("g", 100_001), ErrorCode.invalid_partitions),
        (m.NewPartitions("g", 4, ((1, 2),)), ErrorCode.invalid_replica_assignment),
        (m.NewPartitions("g", 3, ((1, 7),)), ErrorCode.invalid_replica_assignment),
    ],
)
def test_create_partitions_errors(item, code):
    c = cluster(3)
    create(c, "g", 2, 2)
    result = c.handle(m.CreatePartitions((item,)), 0)
    assert result.reply.results[0].error_code == code and result.records == ()


def test_create_partitions_needs_enough_live_brokers_and_honours_validate_only():
    c = cluster(3)
    create(c, "g", 1, 3)
    heartbeat(c, 3, want_fence=True)
    short = c.handle(m.CreatePartitions((m.NewPartitions("g", 2),)), 0).reply.results[0]
    assert short.error_code == ErrorCode.invalid_replication_factor
    dry = c.handle(m.CreatePartitions((m.NewPartitions("g", 2, ((1, 2, 3),)),), True), 0)
    assert dry.records == () and dry.reply.results[0].error_code == ErrorCode.none
    assert len(c.image.topic("g").partitions) == 1
