import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.metadata import records as r
from raftlog.metadata.image import MetadataApplyError, MetadataImage, PartitionState, diff_images

T1 = uuid.UUID(int=101)
T2 = uuid.UUID(int=102)


def register(broker_id: int, epoch: int = 1) -> r.RegisterBroker:
    return r.RegisterBroker(
        broker_id, uuid.UUID(int=broker_id + 1000), epoch, "h", 9000 + broker_id, "h", 19000
    )


def base_image() -> MetadataImage:
    records = [
        register(1),
        register(2),
        register(3),
        r.UnfenceBroker(1, 1),
        r.UnfenceBroker(2, 1),
        r.Topic("a", T1),
        r.Partition(T1, 0, (1, 2, 3), (1, 2, 3), 1),
        r.Partition(T1, 1, (2, 3, 1), (2, 3, 1), 2),
        r.Topic("b", T2),
        r.Partition(T2, 0, (3, 1), (3, 1), 3),
    ]
    image, _ = MetadataImage.empty("cluster-x").apply(records, offset=9, epoch=1)
    return image


def test_apply_builds_brokers_topics_and_offsets():
    image = base_image()
    assert image.cluster_id == "cluster-x"
    assert image.last_applied_offset == 9 and image.last_applied_epoch == 1
    assert image.unfenced_brokers() == [1, 2]
    assert image.brokers[3].fenced and image.brokers[1].client_endpoint == ("h", 9001)
    assert image.topic("a").topic_id == T1
    assert image.topics_by_name["b"].partitions[0] == PartitionState((3, 1), (3, 1), 3)
    assert image.partition(T1, 1).leader == 2
    assert image.partition(T1, 7) is None and image.partition(uuid.UUID(int=5), 0) is None
    assert image.partitions_led_by(2) == [("a", 1)]
    image.check_invariants()


def test_apply_is_copy_on_write_and_old_images_stay_valid():
    old = base_image()
    new, _ = old.apply([r.PartitionChange(T1, 0, isr=(1, 2))], offset=10)
    assert old.partition(T1, 0).isr == (1, 2, 3)
    assert new.partition(T1, 0).isr == (1, 2)
    # Untouched maps are shared, not copied.
    assert new.topics_by_id[T2] is old.topics_by_id[T2]
    assert new.brokers is old.brokers
    with pytest.raises(TypeError):
        new.brokers[9] = None  # type: ignore[index]


def test_partition_change_bumps_epochs_as_kafka_does():
    image = base_image()
    isr_only, _ = image.apply([r.PartitionChange(T1, 0, isr=(1, 2))], 10)
    assert isr_only.partition(T1, 0) == PartitionState((1, 2, 3), (1, 2), 1, 0, 1)
    leader, _ = isr_only.apply([r.PartitionChange(T1, 0, leader=2, isr=(2,))], 11)
    assert leader.partition(T1, 0) == PartitionState((1, 2, 3), (2,), 2, 1, 2)
    same_leader, _ = leader.apply([r.PartitionChange(T1, 0, leader=2)], 12)
    assert same_leader.partition(T1, 0).leader_epoch == 1
    replicas, _ = same_leader.apply([r.PartitionChange(T1, 0, replicas=(2, 1))], 13)
    assert replicas.partition(T1, 0) == PartitionState((2, 1), (2,), 2, 1, 4)


def test_delta_reports_created_deleted_and_changed_partitions():
    image = base_image()
    t3 = uuid.UUID(int=103)
    new, delta = image.apply(
        [
            r.Topic("c", t3),
            r.Partition(t3, 0, (1,), (1,), 1),
            r.RemoveTopic(T2),
            r.PartitionChange(T1, 1, leader=3, isr=(3,)),
        ],
        10,
    )
    assert set(delta.created_topics) == {t3}
    assert delta.created_topics[t3].partitions[0].leader == 1
    assert set(delta.deleted_topics) == {T2}
    assert delta.deleted_topics[T2].name == "b"
    assert delta.changed_partitions[(t3, 0)] == (None, PartitionState((1,), (1,), 1))
    assert delta.changed_partitions[(T2, 0)] == (image.partition(T2, 0), None)
    old_state, new_state = delta.changed_partitions[(T1, 1)]
    assert old_state.leader == 2 and new_state.leader == 3 and new_state.leader_epoch == 1
    assert (T1, 0) not in delta.changed_partitions
    assert new.topic("b") is None and new.topic("c").topic_id == t3
    new.check_invariants()


def test_local_changes_tell_a_broker_what_to_lead_follow_and_drop():
    image = base_image()
    _, delta = image.apply(
        [
            r.PartitionChange(T1, 0, leader=2, isr=(2, 3)),
            r.PartitionChange(T1, 1, replicas=(2, 3), isr=(2, 3)),
            r.RemoveTopic(T2),
        ],
        10,
    )
    two = delta.local_changes(2)
    assert set(two.leaders) == {(T1, 0), (T1, 1)} and not two.followers and not two.deleted
    one = delta.local_changes(1)
    assert set(one.followers) == {(T1, 0)}
    assert one.deleted == {(T1, 1), (T2, 0)}


def test_broker_changes_are_in_the_delta():
    image = base_image()
    new, delta = image.apply([r.FenceBroker(1, 1), r.BrokerShutdownBegin(2, 1)], 10)
    assert set(delta.changed_brokers) == {1, 2}
    old_reg, new_reg = delta.changed_brokers[1]
    assert not old_reg.fenced and new_reg.fenced
    assert new.brokers[2].in_controlled_shutdown and not new.brokers[2].eligible_leader
    again, _ = new.apply([register(2, epoch=2)], 11)
    assert again.brokers[2].epoch == 2 and again.brokers[2].fenced
    assert not again.brokers[2].in_controlled_shutdown


def test_configs_are_stored_typed_and_dropped_with_the_topic():
    image = base_image()
    new, delta = image.apply(
        [
            r.Config("topic", "a", "retention.ms", "1000"),
            r.Config("topic", "a", "cleanup.policy", "compact,delete"),
            r.Config("topic", "a", "x.custom", "raw"),
            r.Config("cluster", "", "unclean.leader.election.enable", "true"),
        ],
        10,
    )
    assert delta.changed_configs == {("topic", "a"), ("cluster", "")}
    assert new.topic_config("a", "retention.ms") == 1000
    assert new.topic_config("a", "cleanup.policy") == ["compact", "delete"]
    assert new.topic_config("a", "x.custom") == "raw"
    assert new.topic_config("a", "segment.bytes", 42) == 42
    assert new.topic_config("b", "retention.ms", -1) == -1
    assert new.cluster_config("unclean.leader.election.enable") == "true"
    deleted, _ = new.apply([r.Config("topic", "a", "retention.ms", None)], 11)
    assert deleted.topic_config("a", "retention.ms") is None
    removed, delta = new.apply([r.RemoveTopic(T1)], 12)
    assert ("topic", "a") not in removed.configs and ("topic", "a") in delta.changed_configs
    recreated, _ = removed.apply([r.Topic("a", uuid.UUID(int=7))], 13)
    assert recreated.topic_config("a", "retention.ms") is None


def test_quotas_set_and_remove_and_empty_entities_disappear():
    image = base_image()
    user = (("user", "alice"),)
    new, delta = image.apply(
        [
            r.ClientQuota(user, "producer_byte_rate", 1024.0),
            r.ClientQuota((("client-id", None),), "request_percentage", 50.0),
        ],
        10,
    )
    assert new.client_quotas[user] == {"producer_byte_rate": 1024.0}
    assert delta.changed_quotas == {user, (("client-id", None),)}
    gone, _ = new.apply([r.ClientQuota(user, "producer_byte_rate", None)], 11)
    assert user not in gone.client_quotas


def test_producer_ids_leader_change_and_features():
    image = base_image()
    new, delta = image.apply(
        [
            r.ProducerIds(1, 1, 1000),
            r.LeaderChange(epoch=4, leader_id=2),
            r.FeatureLevel("metadata.version", 1),
        ],
        10,
    )
    assert new.next_producer_id == 1000 and delta.producer_ids_changed
    assert (new.controller_id, new.controller_epoch) == (2, 4) and delta.controller_changed
    assert new.last_applied_epoch == 4
    assert new.features == {"metadata.version": 1} and delta.features_changed
    with pytest.raises(MetadataApplyError, match="move next id back"):
        new.apply([r.ProducerIds(1, 1, 10)], 11)


def test_empty_apply_gives_an_empty_delta_but_advances_the_offset():
    image = base_image()
    new, delta = image.apply([], 20)
    assert delta.empty and new.last_applied_offset == 20


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (r.FenceBroker(9, 1), "broker 9 is not registered"),
        (r.Partition(uuid.UUID(int=9), 0, (1,), (1,), 1), "unknown topic id"),
        (r.PartitionChange(T1, 9, leader=1), "unknown partition"),
        (r.RemoveTopic(uuid.UUID(int=9)), "unknown topic id"),
        (r.Topic("a", uuid.UUID(int=9)), "already exists"),
    ],
)
def test_records_that_do_not_fit_raise_apply_errors(record, message):
    with pytest.raises(MetadataApplyError, match=message):
        base_image().apply([record], 10)


def test_check_invariants_catches_a_leader_outside_the_isr():
    image, _ = base_image().apply([r.PartitionChange(T1, 0, leader=3, isr=(1, 2))], 10)
    with pytest.raises(AssertionError, match="leader not in ISR"):
        image.check_invariants()


def test_delta_compares_with_the_state_before_the_batch():
    image = base_image()
    _, delta = image.apply(
        [r.PartitionChange(T1, 0, isr=(1, 2)), r.PartitionChange(T1, 0, isr=(1, 2, 3))], 10
    )
    old, new = delta.changed_partitions[(T1, 0)]
    assert old.partition_epoch == 0 and new.partition_epoch == 2 and new.isr == old.isr


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=12))
def test_one_batch_equals_record_by_record(choices):
    options = [
        r.PartitionChange(T1, 0, isr=(1, 2)),
        r.PartitionChange(T1, 1, leader=3),
        r.Config("topic", "a", "retention.ms", "7"),
        r.ClientQuota((("user", "u"),), "request_percentage", 1.0),
        r.FenceBroker(2, 1),
        r.UnfenceBroker(3, 1),
    ]
    records = [options[i] for i in choices]
    batched, _ = base_image().apply(records, 30)
    stepwise = base_image()
    for offset, record in enumerate(records):
        stepwise, _ = stepwise.apply([record], 30 - len(records) + 1 + offset)
    assert batched == stepwise


def test_diff_images_describes_a_jump_with_its_deletions():
    """A snapshot loaded over a running image: the diff must name what the skipped log
    deleted, created and changed, so each broker drops, creates and moves replicas."""
    old = base_image()
    t3 = uuid.UUID(int=103)
    new, _ = old.apply(
        [
            r.RemoveTopic(T2),
            r.Topic("c", t3),
            r.Partition(t3, 0, (1, 2), (1, 2), 1),
            r.PartitionChange(T1, 1, leader=3, isr=(3, 1)),
            r.FenceBroker(2, 1),
            r.Config("topic", "a", "retention.ms", "7"),
            r.ClientQuota((("user", "u"),), "request_percentage", 1.0),
        ],
        20,
    )
    diff = diff_images(old, new)
    assert set(diff.created_topics) == {t3} and set(diff.deleted_topics) == {T2}
    assert diff.changed_partitions == {
        (T2, 0): (old.partition(T2, 0), None),
        (t3, 0): (None, new.partition(t3, 0)),
        (T1, 1): (old.partition(T1, 1), new.partition(T1, 1)),
    }
    assert set(diff.changed_brokers) == {2}
    assert len(diff.changed_configs) == 1 and len(diff.changed_quotas) == 1
    assert not diff.producer_ids_changed and not diff.features_changed
    # Broker 3 replicated b-0, which the jump deleted: it is told to drop it.
    assert diff.local_changes(3).deleted == {(T2, 0)}
    assert diff_images(new, new).empty


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=12))
def test_diff_images_agrees_with_the_applied_delta(choices):
    options = [
        r.PartitionChange(T1, 0, isr=(1, 2)),
        r.PartitionChange(T1, 1, leader=3),
        r.Config("topic", "a", "retention.ms", "7"),
        r.ClientQuota((("user", "u"),), "request_percentage", 1.0),
        r.FenceBroker(2, 1),
        r.UnfenceBroker(3, 1),
        r.RemoveTopic(T2),
    ]
    old = base_image()
    records = [options[i] for i in dict.fromkeys(choices)]  # a topic is removed only once
    new, delta = old.apply(records, 30)
    diff = diff_images(old, new)
    # The applied delta may also name entries that changed and changed back; the diff names
    # exactly those whose state differs, with the same before and after.
    for key, change in diff.changed_partitions.items():
        assert delta.changed_partitions[key] == change
    for key, (before, after) in delta.changed_partitions.items():
        assert key in diff.changed_partitions or before == after
    assert set(diff.deleted_topics) == set(delta.deleted_topics)
    for broker_id, change in diff.changed_brokers.items():
        assert delta.changed_brokers[broker_id] == change
