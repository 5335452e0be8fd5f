"""Controller: broker registration, heartbeats, fencing, controlled shutdown, producer ids,
failover. Helpers here are shared by the other test_controller_*.py files."""

import dataclasses
import uuid

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode
from raftlog.metadata import records as r
from raftlog.metadata.controller import messages as m
from raftlog.metadata.controller.controller import PRODUCER_ID_BLOCK_SIZE, Controller
from raftlog.metadata.image import MetadataImage

SESSION_MS = 9000


def incarnation(broker_id: int, generation: int = 0) -> uuid.UUID:
    return uuid.UUID(int=broker_id * 1000 + generation + 1)


def topic_ids():
    counter = iter(range(1000, 10**6))
    return lambda: uuid.UUID(int=next(counter))


def register_request(broker_id: int, generation: int = 0) -> m.RegisterBroker:
    return m.RegisterBroker(
        broker_id, incarnation(broker_id, generation), "127.0.0.1", 9090 + broker_id, "127.0.0.1",
        19090 + broker_id, rack=None, cluster_id="cid",
    )  # fmt: skip


def cluster(brokers: int = 3, **config) -> Controller:
    """A controller with `brokers` registered, unfenced brokers (ids 1..n), all committed."""
    config.setdefault("broker_session_timeout_ms", SESSION_MS)
    controller = Controller(
        MetadataImage.empty("cid"), NodeConfig(**config), now_ms=0, topic_id_source=topic_ids()
    )
    for broker_id in range(1, brokers + 1):
        join(controller, broker_id)
    return controller


def join(controller: Controller, broker_id: int, now_ms: int = 0, generation: int = 0) -> int:
    reply = controller.handle(register_request(broker_id, generation), now_ms).reply
    assert reply.error_code == ErrorCode.none, reply
    beat = heartbeat(controller, broker_id, now_ms)
    assert not beat.is_fenced, beat
    return reply.broker_epoch


def heartbeat(
    controller: Controller, broker_id: int, now_ms: int = 0, **kw
) -> m.BrokerHeartbeatReply:
    epoch = controller.image.brokers[broker_id].epoch
    kw.setdefault("current_metadata_offset", controller.committed_offset)
    return controller.handle(m.BrokerHeartbeat(broker_id, epoch, **kw), now_ms).reply


def create(controller: Controller, name: str, partitions: int = 1, rf: int = 3, **kw):
    result = controller.handle(m.CreateTopics((m.NewTopic(name, partitions, rf, **kw),)), 0)
    return result.reply.results[0]


# ------------------------------------------------------------------ registration
def test_register_starts_fenced_and_unfences_once_caught_up():
    c = cluster(0)
    result = c.handle(register_request(1), 0)
    assert result.reply == m.RegisterBrokerReply(broker_epoch=1)
    assert isinstance(result.records[0], r.RegisterBroker)
    assert c.image.brokers[1].fenced
    c.committed(50)
    behind = heartbeat(c, 1, current_metadata_offset=40)
    assert (behind.is_caught_up, behind.is_fenced) == (False, True)
    assert c.image.brokers[1].fenced
    result = c.handle(m.BrokerHeartbeat(1, 1, 50), 0)
    assert result.reply == m.BrokerHeartbeatReply(is_caught_up=True, is_fenced=False)
    assert result.records == (r.UnfenceBroker(1, 1),)
    assert not c.image.brokers[1].fenced


def test_heartbeat_without_changes_writes_nothing():
    c = cluster(1)
    result = c.handle(m.BrokerHeartbeat(1, 1, 0), 5)
    assert result.records == () and result.reply.error_code == ErrorCode.none
    assert c.last_contact_ms(1) == 5


def test_fenced_broker_asking_to_stay_fenced_is_not_unfenced():
    c = cluster(0)
    c.handle(register_request(1), 0)
    reply = heartbeat(c, 1, want_fence=True)
    assert reply.is_fenced and c.image.brokers[1].fenced


def test_heartbeat_errors():
    c = cluster(1)
    assert heartbeat_raw(c, 7, 1).error_code == ErrorCode.broker_id_not_registered
    stale = heartbeat_raw(c, 1, 99)
    assert stale.error_code == ErrorCode.stale_broker_epoch
    # Issue 13: the refusal does not tell a forger the current epoch (1).
    assert not any(ch.isdigit() for ch in stale.error_message)


def heartbeat_raw(c: Controller, broker_id: int, epoch: int) -> m.BrokerHeartbeatReply:
    result = c.handle(m.BrokerHeartbeat(broker_id, epoch, 0), 0)
    assert result.records == ()
    return result.reply


def test_duplicate_registration_while_the_old_session_lives():
    c = cluster(1)
    dup = c.handle(register_request(1, generation=1), 1000)
    assert dup.reply.error_code == ErrorCode.duplicate_broker_registration and not dup.records
    # Same incarnation (a retried registration) is fine and gets a new epoch.
    again = c.handle(register_request(1), 1000)
    assert again.reply.broker_epoch == 2
    # Once the session expired the new incarnation may take over.
    c2 = cluster(1)
    c2.tick(SESSION_MS)
    assert c2.handle(register_request(1, generation=1), SESSION_MS).reply.broker_epoch == 2


def test_register_with_another_cluster_id_is_refused():
    c = cluster(0)
    req = m.RegisterBroker(1, incarnation(1), "h", 1, "h", 2, cluster_id="other")
    reply = c.handle(req, 0).reply
    assert reply.error_code == ErrorCode.inconsistent_cluster_id


def test_reregistration_gives_up_leaderships_and_isr_places():
    c = cluster(3)
    topic = create(c, "t", partitions=1, rf=3)
    assert c.image.partition(topic.topic_id, 0).leader == 1
    reply = c.handle(register_request(1), 10)  # the same process registers again
    assert reply.reply.broker_epoch == 2
    state = c.image.partition(topic.topic_id, 0)
    assert state.leader == 2 and 1 not in state.isr and state.leader_epoch == 1


# ------------------------------------------------------------------ session timeout
def test_silent_broker_is_fenced_after_the_session_timeout():
    c = cluster(3)
    heartbeat(c, 2, now_ms=SESSION_MS - 1)
    heartbeat(c, 3, now_ms=SESSION_MS - 1)
    assert c.tick(SESSION_MS - 1).records == ()
    result = c.tick(SESSION_MS)
    assert result.records == (r.FenceBroker(1, 1),)
    assert c.image.brokers[1].fenced and not c.image.brokers[2].fenced
    assert c.tick(SESSION_MS + 1).records == ()  # fenced once, not again


def test_fenced_broker_comes_back_by_heartbeating():
    c = cluster(2)
    c.tick(SESSION_MS)
    assert c.image.brokers[1].fenced
    reply = heartbeat(c, 1, now_ms=SESSION_MS + 1)
    assert not reply.is_fenced and not c.image.brokers[1].fenced


# ------------------------------------------------------------------ controlled shutdown
def test_controlled_shutdown_moves_leadership_then_lets_the_broker_go():
    c = cluster(3)
    topic = create(c, "t", partitions=3, rf=3)
    led = c.image.partitions_led_by(1)
    assert led
    first = c.handle(m.BrokerHeartbeat(1, 1, c.committed_offset, want_shutdown=True), 1)
    assert first.reply == m.BrokerHeartbeatReply(is_caught_up=True, is_fenced=False)
    assert first.records[0] == r.BrokerShutdownBegin(1, 1)
    assert c.image.brokers[1].in_controlled_shutdown
    assert c.image.partitions_led_by(1) == []
    for _, _, state in c.image.iter_partitions():
        assert 1 not in state.isr
    # The broker has not seen the leadership moves yet: keep it running.
    c.committed(100)
    waiting = heartbeat(c, 1, current_metadata_offset=99, want_shutdown=True)
    assert not waiting.should_shutdown and not waiting.is_fenced
    done = c.handle(m.BrokerHeartbeat(1, 1, 100, want_shutdown=True), 2)
    assert done.reply == m.BrokerHeartbeatReply(
        is_caught_up=True, is_fenced=True, should_shutdown=True
    )
    assert done.records[0] == r.FenceBroker(1, 1)
    assert c.image.brokers[1].fenced
    # It is never elected while shutting down, even by preferred-leader rebalancing.
    assert c.rebalance_preferred_leaders().records == ()
    assert all(s.leader != 1 for _, _, s in c.image.iter_partitions())
    assert topic.error_code == ErrorCode.none


def test_controlled_shutdown_of_the_only_replica_takes_its_partition_offline_at_the_end():
    c = cluster(2)
    topic = create(c, "solo", partitions=1, rf=1)
    owner = c.image.partition(topic.topic_id, 0).leader
    heartbeat(c, owner, want_shutdown=True)
    assert c.image.partition(topic.topic_id, 0).leader == owner  # nobody else can lead
    heartbeat(c, owner, want_shutdown=True)
    state = c.image.partition(topic.topic_id, 0)
    assert state.leader == -1 and state.isr == (owner,)


def test_fenced_broker_may_shut_down_at_once():
    c = cluster(0)
    c.handle(register_request(1), 0)
    reply = heartbeat(c, 1, want_shutdown=True)
    assert reply.should_shutdown and reply.is_fenced


def test_want_fence_fences_an_unfenced_broker():
    c = cluster(2)
    reply = heartbeat(c, 2, want_fence=True)
    assert reply.is_fenced and c.image.brokers[2].fenced


# ------------------------------------------------------------------ producer ids
def test_producer_id_blocks_are_disjoint_and_fenced_by_broker_epoch():
    c = cluster(2)
    a = c.handle(m.AllocateProducerIds(1, 1), 0)
    b = c.handle(m.AllocateProducerIds(2, 1), 0)
    assert (a.reply.producer_id_start, a.reply.producer_id_len) == (0, PRODUCER_ID_BLOCK_SIZE)
    assert b.reply.producer_id_start == PRODUCER_ID_BLOCK_SIZE
    assert b.records == (r.ProducerIds(2, 1, 2 * PRODUCER_ID_BLOCK_SIZE),)
    assert c.handle(m.AllocateProducerIds(1, 5), 0).error_code == ErrorCode.stale_broker_epoch
    assert c.handle(m.AllocateProducerIds(9, 1), 0).error_code == (
        ErrorCode.broker_id_not_registered
    )


def test_producer_ids_exhausted():
    c = cluster(1)
    c.image, _ = c.image.apply([r.ProducerIds(1, 1, 2**63 - 10)], 5)
    assert c.handle(m.AllocateProducerIds(1, 1), 0).error_code == ErrorCode.unknown_server_error


# ------------------------------------------------------------------ failover and replay
def committed_image(c: Controller) -> MetadataImage:
    return c.image


def test_new_controller_gives_every_broker_a_fresh_session():
    c = cluster(3)
    image = committed_image(c)
    successor = Controller.from_image(image, c.config, now_ms=50_000)
    assert successor.tick(50_000 + SESSION_MS - 1).records == ()
    assert len(successor.tick(50_000 + SESSION_MS).records) == 3


def test_standby_replays_records_and_takes_over_warm():
    leader = cluster(0)
    standby = Controller(MetadataImage.empty("cid"), leader.config, now_ms=0)
    offset = 0
    for broker_id in (1, 2):
        for request in (register_request(broker_id), m.BrokerHeartbeat(broker_id, 1, 0)):
            result = leader.handle(request, 100)
            offset += len(result.records)
            standby.replay(result.records, offset, now_ms=100 * broker_id)
    assert standby.image == leader.image.apply([], offset)[0]
    assert standby.committed_offset == offset
    assert standby.last_contact_ms(2) == 200
    standby.become_leader(now_ms=1000)
    assert standby.last_contact_ms(1) == 1000
    assert standby.tick(1000 + SESSION_MS).records == (r.FenceBroker(1, 1), r.FenceBroker(2, 1))


def test_unknown_request_type_is_a_programming_error():
    import pytest

    with pytest.raises(TypeError, match="does not handle"):
        cluster(0).handle(object(), 0)


def test_new_incarnation_after_a_full_restart_is_not_refused_for_a_dead_session() -> None:
    # A new controller grants every known broker a grace session; that grace must not make a
    # crashed incarnation look alive to the restarted process registering again.
    import uuid as _uuid

    from raftlog.config import NodeConfig as _NodeConfig
    from raftlog.errors import ErrorCode as _ErrorCode
    from raftlog.metadata.controller.controller import Controller as _Controller
    from raftlog.metadata.controller.messages import BrokerHeartbeat as _Heartbeat
    from raftlog.metadata.controller.messages import RegisterBroker as _Register
    from raftlog.metadata.image import MetadataImage as _Image

    config = _NodeConfig()
    first = _Controller(_Image.empty("c"), config, 0)
    old = first.handle(_Register(1, _uuid.uuid4(), "h", 1, "h", 2), 0)
    image, _ = _Image.empty("c").apply(old.records, 0)
    caught_up = first.handle(_Heartbeat(1, old.reply.broker_epoch, 10**6), 0)
    image, _ = image.apply(caught_up.records, 1)
    assert not image.brokers[1].fenced

    # Full restart: a fresh controller, and broker 1 comes back as a new process at once.
    after = _Controller(image, config, 100)
    fresh = after.handle(_Register(1, _uuid.uuid4(), "h", 1, "h", 2), 100)
    assert fresh.reply.error_code == _ErrorCode.none, fresh.reply
    # But a live incarnation that heartbeats to this controller still wins.
    live = after.handle(_Heartbeat(1, fresh.reply.broker_epoch, 10**6), 101)
    assert live.reply.error_code == _ErrorCode.none
    again = after.handle(_Register(1, _uuid.uuid4(), "h", 1, "h", 2), 102)
    assert again.reply.error_code == _ErrorCode.duplicate_broker_registration


def test_a_brokers_listeners_reach_the_image_and_its_snapshot():
    from raftlog.metadata.snapshot import decode_snapshot, encode_snapshot

    controller = Controller(
        MetadataImage.empty("cid"), NodeConfig(), now_ms=0, topic_id_source=topic_ids()
    )
    listeners = (("PLAINTEXT", "127.0.0.1", 9092, "PLAINTEXT"), ("SECURE", "h", 9093, "SASL_SSL"))
    request = dataclasses.replace(register_request(1), listeners=listeners)
    assert controller.handle(request, 0).reply.error_code == ErrorCode.none
    assert controller.image.brokers[1].listeners == listeners
    assert decode_snapshot(encode_snapshot(controller.image)).brokers[1].listeners == listeners
