"""UnregisterBroker: the record, the image, snapshots and the controller's request."""

import pytest

from raftlog.errors import ErrorCode
from raftlog.metadata import records as r
from raftlog.metadata.controller import messages as m
from raftlog.metadata.controller.controller import Controller
from raftlog.metadata.image import MetadataApplyError, MetadataImage
from raftlog.metadata.snapshot import decode_snapshot, encode_snapshot, image_records
from tests.metadata.test_controller import (
    SESSION_MS,
    cluster,
    create,
    heartbeat,
    join,
    register_request,
)
from tests.metadata.test_image import T1, base_image


# ------------------------------------------------------------------ image
def test_replaying_it_drops_the_registration_and_keeps_the_replicas():
    image, _ = base_image().apply([r.FenceBroker(3, 1)], offset=10)
    after, delta = image.apply([r.UnregisterBroker(3, 1)], offset=11)
    assert 3 not in after.brokers and set(after.brokers) == {1, 2}
    assert delta.changed_brokers == {3: (image.brokers[3], None)}
    # Kafka's offline replicas: the partition still names broker 3.
    assert after.partition(T1, 0).replicas == (1, 2, 3)
    after.check_invariants()


def test_an_unknown_broker_or_a_stale_epoch_does_not_apply():
    with pytest.raises(MetadataApplyError, match="broker 9 is not registered"):
        base_image().apply([r.UnregisterBroker(9, 1)], offset=10)
    with pytest.raises(MetadataApplyError, match="registered with epoch 1"):
        base_image().apply([r.UnregisterBroker(3, 4)], offset=10)


def test_registered_and_unregistered_in_one_batch_reports_no_change():
    image = base_image()
    after, delta = image.apply(
        [
            r.RegisterBroker(7, image.brokers[1].incarnation_id, 1, "h", 1, "h", 2),
            r.UnregisterBroker(7, 1),
        ],
        offset=10,
    )
    assert 7 not in after.brokers and delta.changed_brokers == {}


def test_the_snapshot_of_an_image_without_the_broker_round_trips():
    image, _ = base_image().apply([r.FenceBroker(3, 1), r.UnregisterBroker(3, 1)], offset=10)
    restored = decode_snapshot(encode_snapshot(image))
    assert restored == image and 3 not in restored.brokers
    # The removed registration's epoch survives, so the next one of id 3 continues from it.
    assert restored.unregistered_broker_epochs == {3: 1}
    assert restored.partition(T1, 0).replicas == (1, 2, 3)
    rebuilt, _ = MetadataImage.empty(image.cluster_id).apply(image_records(image), offset=10)
    assert 3 not in rebuilt.brokers and rebuilt.unregistered_broker_epochs == {3: 1}
    restored.check_invariants()
    # Registered again: the image forgets the old epoch, and so does the next snapshot.
    again, _ = image.apply(
        [r.RegisterBroker(3, image.brokers[1].incarnation_id, 2, "h", 1, "h", 2)], offset=11
    )
    assert again.unregistered_broker_epochs == {}
    assert decode_snapshot(encode_snapshot(again)) == again


def test_the_record_round_trips():
    record = r.UnregisterBroker(4, 12)
    assert r.decode_record(r.encode_record(record)) == record
    assert r.decode_entry(r.encode_entry([record])) == [record]


def test_the_controller_messages_round_trip():
    for message in (m.UnregisterBroker(4), m.UnregisterBrokerReply()):
        wire = m.CODEC.encode(message, m.ControllerRequest | m.ControllerReply)
        assert m.CODEC.decode(m.ControllerRequest | m.ControllerReply, wire) == message
    refusal = m.UnregisterBrokerReply(ErrorCode.broker_id_not_registered, "no")
    wire = m.CODEC.encode(refusal, m.ControllerReply)
    assert m.CODEC.decode(m.ControllerReply, wire) == refusal


# ------------------------------------------------------------------ controller
def test_unregistering_an_unknown_broker_is_broker_id_not_registered():
    c = cluster(3)
    result = c.handle(m.UnregisterBroker(9), 0)
    assert result.records == ()
    assert result.reply.error_code == ErrorCode.broker_id_not_registered
    assert "9" in result.reply.error_message


def test_an_unfenced_broker_is_fenced_first_then_unregistered():
    c = cluster(3)
    topic = create(c, "t", partitions=1, rf=3)
    assert c.image.partition(topic.topic_id, 0).leader == 1
    result = c.handle(m.UnregisterBroker(1), 100)
    assert result.reply == m.UnregisterBrokerReply()
    kinds = [type(rec) for rec in result.records]
    # What a session expiry writes (FenceBroker, the partition leaving it), then the removal.
    assert kinds[0] is r.FenceBroker and kinds[-1] is r.UnregisterBroker
    assert r.PartitionChange in kinds
    assert result.records[-1] == r.UnregisterBroker(1, 1)
    state = c.image.partition(topic.topic_id, 0)
    assert state.leader in (2, 3) and 1 not in state.isr and 1 in state.replicas
    assert 1 not in c.image.brokers
    c.image.check_invariants()
    # A follower replaying the committed records reaches the same image.
    follower = cluster(3)
    create(follower, "t", partitions=1, rf=3)
    follower.replay(result.records, 50, 100)
    assert follower.image.brokers == c.image.brokers
    # Again: it is gone.
    again = c.handle(m.UnregisterBroker(1), 200)
    assert again.reply.error_code == ErrorCode.broker_id_not_registered and not again.records


def test_a_fenced_broker_is_unregistered_with_one_record():
    c = cluster(3)
    for broker_id in (2, 3):
        heartbeat(c, broker_id, SESSION_MS - 1)
    fenced = c.tick(SESSION_MS)  # broker 1's session expired
    assert r.FenceBroker(1, 1) in fenced.records and c.image.brokers[1].fenced
    result = c.handle(m.UnregisterBroker(1), SESSION_MS)
    assert result.records == (r.UnregisterBroker(1, 1),)
    assert set(c.image.brokers) == {2, 3}


def test_its_leaderships_and_new_topics_go_to_the_remaining_brokers():
    c = cluster(3)
    c.handle(m.UnregisterBroker(3), 0)
    # Placement and elections only consider registered brokers; the tick has no one to fence.
    placed = create(c, "after", partitions=4, rf=2)
    assert placed.error_code == ErrorCode.none
    for index in range(4):
        assert 3 not in c.image.partition(placed.topic_id, index).replicas
    for broker_id in (1, 2):
        heartbeat(c, broker_id, SESSION_MS)
    assert c.tick(SESSION_MS + 1).records == ()
    too_many = create(c, "rf3", partitions=1, rf=3)
    assert too_many.error_code == ErrorCode.invalid_replication_factor


def test_a_broker_still_running_registers_again_on_its_next_heartbeat():
    # Documented: the operator stops the broker first; a live one comes back.
    c = cluster(3)
    epoch = c.image.brokers[2].epoch
    c.handle(m.UnregisterBroker(2), 0)
    beat = c.handle(m.BrokerHeartbeat(2, epoch, c.committed_offset), 10).reply
    assert beat.error_code == ErrorCode.broker_id_not_registered
    # Its new epoch continues from the removed one: a stale request of that one stays fenced.
    assert join(c, 2, now_ms=20) == epoch + 1
    stale = c.handle(m.BrokerHeartbeat(2, epoch, c.committed_offset), 30).reply
    assert stale.error_code == ErrorCode.stale_broker_epoch
    assert not c.image.brokers[2].fenced


def test_a_new_controller_from_the_image_and_a_standby_forget_the_broker():
    c = cluster(3)
    result = c.handle(m.UnregisterBroker(3), 0)
    standby = cluster(3)
    standby.replay(result.records, 40, 0)
    assert standby.last_contact_ms(3) is None
    fresh = Controller.from_image(standby.image, standby.config, now_ms=0)
    assert fresh.last_contact_ms(3) is None
    assert fresh.tick(SESSION_MS * 2).records  # brokers 1 and 2 expire; 3 is not there
    assert 3 not in fresh.image.brokers
    assert fresh.image.unregistered_broker_epochs == {3: 1}
    assert fresh.handle(register_request(3), 0).reply.broker_epoch == 2
    assert fresh.image.unregistered_broker_epochs == {}
