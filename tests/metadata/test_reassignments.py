"""Controller: partition reassignment (KIP-455), ElectLeaders, rack-aware placement, and the
reassignment state through records, the image and snapshots (sans-IO)."""

import uuid

import pytest

from raftlog.codec import DecodeError
from raftlog.errors import ErrorCode
from raftlog.metadata import records as r
from raftlog.metadata.controller import messages as m
from raftlog.metadata.controller.placement import placement, rack_alternated
from raftlog.metadata.image import MetadataImage
from raftlog.metadata.snapshot import decode_snapshot, encode_snapshot
from tests.metadata.test_controller import SESSION_MS, cluster, heartbeat
from tests.metadata.test_controller_elections import assign, expire


def move(c, *items, allow_rf_change=True):
    """items: (topic, partition, replicas or None); returns (results, records)."""
    req = m.AlterPartitionReassignments(
        tuple(m.PartitionReassignment(t, p, rs) for t, p, rs in items), allow_rf_change
    )
    result = c.handle(req, 0)
    c.image.check_invariants()
    return result.reply.results, result.records


def codes(results):
    return [res.error_code for res in results]


def isr_change(c, topic_id, index, new_isr):
    state = c.image.partition(topic_id, index)
    leader = c.image.brokers[state.leader]
    reply = c.handle(
        m.AlterPartition(
            state.leader,
            leader.epoch,
            topic_id,
            index,
            state.leader_epoch,
            state.partition_epoch,
            tuple(new_isr),
        ),
        0,
    ).reply
    c.image.check_invariants()
    return reply


# ------------------------------------------------------------------ plans
def test_a_move_adds_followers_then_completes_when_they_are_in_sync():
    c = cluster(5)
    t = assign(c, "t", {0: (1, 2)})
    results, _ = move(c, ("t", 0, (3, 4)))
    assert codes(results) == [ErrorCode.none]
    state = c.image.partition(t, 0)
    # Target first, then the leaving replicas; the ISR and leader stay.
    assert state.replicas == (3, 4, 1, 2)
    assert (state.adding_replicas, state.removing_replicas) == ((3, 4), (1, 2))
    assert (state.leader, state.isr, state.leader_epoch) == (1, (1, 2), 0)
    assert state.target_replicas == (3, 4) and state.original_replicas == (1, 2)
    # Broker 3 catches up: not done yet (4 is missing).
    reply = isr_change(c, t, 0, (1, 2, 3))
    assert reply.error_code == ErrorCode.none
    assert c.image.partition(t, 0).reassigning
    # Broker 4 too: the reply is the ISR change alone, the completion follows in the image.
    reply = isr_change(c, t, 0, (1, 2, 3, 4))
    assert reply.isr == (1, 2, 3, 4)
    state = c.image.partition(t, 0)
    assert state.replicas == (3, 4) and not state.reassigning
    # The leader was leaving: the first target replica in the ISR leads, a new epoch.
    assert (state.leader, state.isr, state.leader_epoch) == (3, (3, 4), 1)
    changes = c.image.partition(t, 0)
    assert 1 not in changes.replicas


def test_the_leader_stays_when_it_is_in_the_target():
    c = cluster(4)
    t = assign(c, "t", {0: (1, 2)})
    move(c, ("t", 0, (1, 3)))
    isr_change(c, t, 0, (1, 2, 3))
    state = c.image.partition(t, 0)
    assert (state.replicas, state.isr, state.leader, state.leader_epoch) == ((1, 3), (1, 3), 1, 0)


def test_a_pure_shrink_or_reorder_completes_at_once():
    c = cluster(3)
    t = assign(c, "t", {0: (1, 2, 3), 1: (1, 2)})
    results, _ = move(c, ("t", 0, (2, 3)), ("t", 1, (2, 1)))
    assert codes(results) == [ErrorCode.none] * 2
    p0, p1 = c.image.partition(t, 0), c.image.partition(t, 1)
    assert (p0.replicas, p0.isr, p0.leader, p0.reassigning) == ((2, 3), (2, 3), 2, False)
    assert (p1.replicas, p1.leader, p1.reassigning) == ((2, 1), 1, False)


def test_the_same_plan_twice_writes_nothing_the_second_time():
    c = cluster(4)
    assign(c, "t", {0: (1, 2)})
    move(c, ("t", 0, (3, 4)))
    results, records = move(c, ("t", 0, (3, 4)))
    assert codes(results) == [ErrorCode.none] and records == ()


def test_cancel_returns_to_the_original_replicas():
    c = cluster(4)
    t = assign(c, "t", {0: (1, 2)})
    move(c, ("t", 0, (3, 4)))
    isr_change(c, t, 0, (1, 2, 3))
    results, _ = move(c, ("t", 0, None))
    assert codes(results) == [ErrorCode.none]
    state = c.image.partition(t, 0)
    assert (state.replicas, state.isr, state.leader, state.reassigning) == (
        (1, 2),
        (1, 2),
        1,
        False,
    )
    # Nothing to cancel any more.
    results, records = move(c, ("t", 0, None))
    assert codes(results) == [ErrorCode.no_reassignment_in_progress] and records == ()


def test_a_new_target_replaces_the_running_one():
    c = cluster(5)
    t = assign(c, "t", {0: (1, 2)})
    move(c, ("t", 0, (3, 4)))
    move(c, ("t", 0, (1, 5)))
    state = c.image.partition(t, 0)
    # 3 and 4 joined for the old plan and now leave; 2 leaves; 5 joins.
    assert state.target_replicas == (1, 5)
    assert set(state.removing_replicas) == {2, 3, 4} and state.adding_replicas == (5,)


def test_replication_factor_change_refused_when_not_allowed():
    c = cluster(4)
    assign(c, "t", {0: (1, 2)})
    results, records = move(c, ("t", 0, (1, 2, 3)), allow_rf_change=False)
    assert codes(results) == [ErrorCode.invalid_replication_factor] and records == ()


# ------------------------------------------------------------------ hostile plans
@pytest.mark.parametrize(
    ("item", "code"),
    [
        (("t", 0, ()), ErrorCode.invalid_replica_assignment),
        (("t", 0, (1, 1)), ErrorCode.invalid_replica_assignment),
        (("t", 0, (1, 99)), ErrorCode.invalid_replica_assignment),
        (("t", 0, (1, -5)), ErrorCode.invalid_replica_assignment),
        (("t", 0, tuple(range(1, 40))), ErrorCode.invalid_replica_assignment),
        (("t", 7, (1, 2)), ErrorCode.unknown_topic_or_partition),
        (("t", -1, (1, 2)), ErrorCode.unknown_topic_or_partition),
        (("t", 2**31 - 1, (1, 2)), ErrorCode.unknown_topic_or_partition),
        (("ghost", 0, (1, 2)), ErrorCode.unknown_topic_or_partition),
    ],
)
def test_bad_plans_are_refused_with_kafkas_codes(item, code):
    c = cluster(3)
    assign(c, "t", {0: (1, 2)})
    before = c.image
    results, records = move(c, item)
    assert codes(results) == [code] and records == ()
    assert results[0].error_message
    assert c.image.partition(before.topic_ids_by_name["t"], 0) == before.topic("t").partitions[0]


def test_fenced_target_broker_is_refused_and_one_bad_item_fails_alone():
    c = cluster(4)
    assign(c, "t", {0: (1, 2), 1: (1, 2)})
    expire(c, 4)
    results, _ = move(c, ("t", 0, (3, 4)), ("t", 1, (3, 2)), ("t", 1, (2, 3)))
    assert codes(results) == [
        ErrorCode.invalid_replica_assignment,
        ErrorCode.none,
        ErrorCode.invalid_request,  # the same partition twice in one request
    ]
    assert "fenced" in results[0].error_message


def test_hostile_requests_are_refused_at_decode():
    too_many = m.AlterPartitionReassignments(
        (m.PartitionReassignment("t", 0, (1,)),) * (m.MAX_PARTITIONS_PER_REQUEST + 1)
    )
    data = m.CODEC.encode(too_many, m.ControllerRequest)
    with pytest.raises(DecodeError):
        m.CODEC.decode(m.ControllerRequest, data)
    # An election type Kafka does not have.
    with pytest.raises(DecodeError):
        m.CODEC.decode(m.ControllerRequest, m.CODEC.encode(m.ElectLeaders(7), m.ControllerRequest))


def test_unknown_topic_id_in_a_record_is_refused_by_the_image():
    c = cluster(3)
    with pytest.raises(Exception, match="unknown topic id"):
        c.image.apply([r.PartitionChange(uuid.uuid4(), 0, adding_replicas=(1,))], 5)


# ------------------------------------------------------------------ failures during a move
def test_unclean_election_never_picks_a_joining_replica():
    c = cluster(4, unclean_leader_election=True)
    t = assign(c, "t", {0: (1, 2)})
    move(c, ("t", 0, (3, 4)))
    expire(c, 1, 2)
    state = c.image.partition(t, 0)
    # 3 and 4 are alive but never were in sync: offline rather than an empty leader.
    assert state.leader == -1


def test_a_completion_waits_for_an_eligible_target_leader():
    c = cluster(3)
    t = assign(c, "t", {0: (1, 2)})
    move(c, ("t", 0, (2, 3)))
    isr_change(c, t, 0, (1, 2, 3))
    state = c.image.partition(t, 0)
    assert state.replicas == (2, 3) and state.leader == 2


# ------------------------------------------------------------------ ElectLeaders
def elect(c, election_type, partitions=None):
    result = c.handle(m.ElectLeaders(election_type, partitions), 0)
    c.image.check_invariants()
    return {(res.topic, res.partition): res.error_code for res in result.reply.results}


def test_preferred_election():
    c = cluster(3)
    t = assign(c, "t", {0: (1, 2), 1: (2, 3), 2: (3, 1)})
    expire(c, 1)
    heartbeat(c, 1, now_ms=SESSION_MS + 1)  # back, but out of the ISRs
    assert c.image.partition(t, 0).leader == 2
    got = elect(c, m.ELECTION_PREFERRED, (("t", 0), ("t", 1), ("t", 9)))
    assert got == {
        ("t", 0): ErrorCode.preferred_leader_not_available,  # 1 is not in the ISR
        ("t", 1): ErrorCode.election_not_needed,
        ("t", 9): ErrorCode.unknown_topic_or_partition,
    }
    state = c.image.partition(t, 0)
    isr_change(c, t, 0, (2, 1))
    assert elect(c, m.ELECTION_PREFERRED, (("t", 0),)) == {("t", 0): ErrorCode.none}
    state = c.image.partition(t, 0)
    assert (state.leader, state.leader_epoch) == (1, 2)
    # Every partition: only those that needed one are named.
    assert elect(c, m.ELECTION_PREFERRED) == {}


def test_unclean_election_only_when_no_isr_member_is_alive():
    c = cluster(3)
    t = assign(c, "t", {0: (1, 2)})
    assert elect(c, m.ELECTION_UNCLEAN, (("t", 0),)) == {("t", 0): ErrorCode.election_not_needed}
    expire(c, 2)
    expire(c, 1, now_ms=2 * SESSION_MS)
    assert c.image.partition(t, 0).leader == -1  # unclean election is off by default
    heartbeat(c, 2, now_ms=2 * SESSION_MS + 1)
    assert elect(c, m.ELECTION_UNCLEAN, (("t", 0),)) == {("t", 0): ErrorCode.none}
    state = c.image.partition(t, 0)
    assert (state.leader, state.isr) == (2, (2,))


def test_unclean_election_never_picks_an_unsafe_replica():
    c = cluster(3)
    t = assign(c, "t", {0: (1, 2)})
    expire(c, 2)
    expire(c, 1, now_ms=2 * SESSION_MS)
    heartbeat(c, 2, now_ms=2 * SESSION_MS + 1, unsafe_partitions=((t, 0),))
    got = elect(c, m.ELECTION_UNCLEAN, (("t", 0),))
    assert got == {("t", 0): ErrorCode.eligible_leaders_not_available}
    assert c.image.partition(t, 0).leader == -1


# ------------------------------------------------------------------ records, image, snapshot
def test_the_reassignment_state_survives_a_snapshot_and_replays_from_records():
    c = cluster(4)
    t = assign(c, "t", {0: (1, 2)})
    move(c, ("t", 0, (3, 4)))
    image = c.image
    again = decode_snapshot(encode_snapshot(image))
    assert again.partition(t, 0) == image.partition(t, 0)
    assert again.partition(t, 0).adding_replicas == (3, 4)
    for rec in (
        r.Partition(t, 0, (3, 1), (1,), 1, 0, 0, (3,), ()),
        r.PartitionChange(t, 0, replicas=(3, 1), adding_replicas=(3,), removing_replicas=()),
    ):
        assert r.decode_record(r.encode_record(rec)) == rec


def test_records_written_before_reassignments_still_decode():
    t = uuid.UUID(int=7)
    # The encodings of a version-0 Partition and PartitionChange without the added fields.
    old_partition = r.CODEC.encode(r.Partition(t, 0, (1, 2), (1, 2), 1), r.AnyRecord)
    old_change = r.CODEC.encode(r.PartitionChange(t, 0, leader=2), r.AnyRecord)
    assert r.decode_record(old_partition).adding_replicas == ()
    assert r.decode_record(old_change).adding_replicas is None
    image, _ = MetadataImage.empty("c").apply(
        [r.Topic("t", t), r.decode_record(old_partition), r.decode_record(old_change)], 3
    )
    assert image.partition(t, 0).leader == 2 and not image.partition(t, 0).reassigning


# ------------------------------------------------------------------ racks
def test_rack_alternated_order():
    racks = {1: "a", 2: "a", 3: "b", 4: "c", 5: "c"}
    assert rack_alternated([5, 4, 3, 2, 1], racks) == [1, 3, 4, 2, 5]


def test_rack_aware_placement_spreads_every_partition_over_racks():
    racks = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}
    for rf in (2, 3):
        assignments = placement(list(racks), racks, 30, rf, 0)
        for replicas in assignments:
            assert len(set(replicas)) == rf
            assert len({racks[b] for b in replicas}) == rf
        leaders = [a[0] for a in assignments]
        assert all(leaders.count(b) == 5 for b in racks)  # leaders spread evenly


def test_without_racks_placement_is_unchanged():
    from raftlog.metadata.controller.topics import place_replicas

    assert placement([1, 2, 3, 4], {}, 8, 2, 3) == place_replicas([1, 2, 3, 4], 8, 2, 3)


def test_new_topics_spread_over_registered_racks():
    c = cluster(0)
    for broker_id, rack in ((1, "a"), (2, "a"), (3, "b"), (4, "b")):
        req = m.RegisterBroker(
            broker_id, uuid.UUID(int=broker_id), "h", 9000 + broker_id, "h", 19000 + broker_id,
            rack=rack, cluster_id="cid",
        )  # fmt: skip
        assert c.handle(req, 0).reply.error_code == ErrorCode.none
        heartbeat(c, broker_id)
    res = c.handle(m.CreateTopics((m.NewTopic("t", 8, 2),)), 0).reply.results[0]
    assert res.error_code == ErrorCode.none
    racks = {1: "a", 2: "a", 3: "b", 4: "b"}
    for state in c.image.topic("t").partitions.values():
        assert {racks[b] for b in state.replicas} == {"a", "b"}
