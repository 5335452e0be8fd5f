"""Fencing a broker whose internal listener is unreachable (connects refused or timing out),
long before its session would expire, and never one that still heartbeats."""

import pytest
import trio
import trio.testing

from raftlog.config import ConfigError, NodeConfig
from raftlog.metadata import records as r
from raftlog.metadata.controller.controller import Controller
from raftlog.metadata.controller.liveness import REACHABILITY_POLL_MS, BrokerReachability
from raftlog.metadata.image import MetadataImage
from raftlog.net.rpc import _is_refusal
from tests.metadata.test_controller import (
    SESSION_MS,
    cluster,
    create,
    heartbeat,
    register_request,
    topic_ids,
)

FENCE_MS = 500
HEARTBEAT_MS = 500


def fenced_in(result) -> set[int]:
    return {rec.broker_id for rec in result.records if isinstance(rec, r.FenceBroker)}


def test_unreachable_broker_is_fenced_after_the_grace_and_loses_its_leadership():
    c = cluster(3, broker_unreachable_fence_ms=FENCE_MS, broker_heartbeat_interval_ms=HEARTBEAT_MS)
    topic = create(c, "t", partitions=1, rf=3)
    assert c.image.partition(topic.topic_id, 0).leader == 1
    c.broker_unreachable(1, since_ms=1000)
    assert fenced_in(c.tick(1000 + FENCE_MS - 1)) == set()
    result = c.tick(1000 + FENCE_MS)
    assert fenced_in(result) == {1}
    state = c.image.partition(topic.topic_id, 0)
    assert state.leader in (2, 3) and 1 not in state.isr and state.leader_epoch == 1
    # Far below the session timeout: the point of the signal.
    assert FENCE_MS < SESSION_MS


def test_a_heartbeat_after_the_connects_began_failing_keeps_the_broker():
    """An asymmetric cut (its heartbeats arrive, our connects do not) or a listener being
    re-bound is not a dead process: only the session timeout fences it then."""
    c = cluster(3, broker_unreachable_fence_ms=FENCE_MS, broker_heartbeat_interval_ms=HEARTBEAT_MS)
    c.broker_unreachable(2, since_ms=1000)
    heartbeat(c, 2, now_ms=1200)
    assert fenced_in(c.tick(5000)) == set()
    # Repeated reports (every failed retry) keep the start: the heartbeat still counts.
    c.broker_unreachable(2, since_ms=1000)
    assert fenced_in(c.tick(6000)) == set()
    # Silence long enough still fences by session.
    assert 2 in fenced_in(c.tick(1200 + SESSION_MS))


def test_a_heartbeat_before_the_connects_began_failing_does_not_save_it():
    c = cluster(3, broker_unreachable_fence_ms=FENCE_MS, broker_heartbeat_interval_ms=HEARTBEAT_MS)
    heartbeat(c, 3, now_ms=3000)
    c.broker_unreachable(3, since_ms=3000 + HEARTBEAT_MS)
    assert fenced_in(c.tick(3000 + HEARTBEAT_MS + FENCE_MS)) == {3}


def test_refusals_alone_wait_until_a_heartbeat_is_overdue():
    """A live broker whose listener only this controller cannot reach (a wrong advertised
    address) heartbeats on time: refusals do not fence it before a heartbeat is missed."""
    c = cluster(3, broker_unreachable_fence_ms=100, broker_heartbeat_interval_ms=HEARTBEAT_MS)
    heartbeat(c, 2, now_ms=3000)
    c.broker_unreachable(2, since_ms=3010)
    # Refused for 100 ms by 3110, but the next heartbeat is only due at 3500.
    assert c.next_deadline_ms(3110) == 3000 + HEARTBEAT_MS
    assert fenced_in(c.tick(3000 + HEARTBEAT_MS - 1)) == set()
    assert fenced_in(c.tick(3000 + HEARTBEAT_MS)) == {2}


def test_once_refusals_began_a_heartbeat_one_interval_late_is_the_missed_one():
    """No grace on top of the interval: the refusals already lasted the fence time."""
    c = cluster(3, broker_unreachable_fence_ms=FENCE_MS, broker_heartbeat_interval_ms=HEARTBEAT_MS)
    heartbeat(c, 2, now_ms=3000)
    c.broker_unreachable(2, since_ms=3400)
    assert c.next_deadline_ms(3400) == 3400 + FENCE_MS
    assert fenced_in(c.tick(3400 + FENCE_MS - 1)) == set()
    assert fenced_in(c.tick(3400 + FENCE_MS)) == {2}


def test_next_deadline_is_the_earliest_session_expiry_or_due_fence():
    c = cluster(3, broker_unreachable_fence_ms=FENCE_MS, broker_heartbeat_interval_ms=HEARTBEAT_MS)
    # cluster() heard every broker at 0: the sessions expire together.
    assert c.next_deadline_ms(0) == SESSION_MS
    heartbeat(c, 1, now_ms=100)
    heartbeat(c, 2, now_ms=100)
    heartbeat(c, 3, now_ms=200)
    assert c.next_deadline_ms(200) == 100 + SESSION_MS
    c.broker_unreachable(3, since_ms=300)
    assert c.next_deadline_ms(300) == max(300 + FENCE_MS, 200 + HEARTBEAT_MS)
    assert fenced_in(c.tick(c.next_deadline_ms(300))) == {3}
    # Fenced: it no longer has a deadline; a heartbeat only moves one later.
    assert c.next_deadline_ms(800) == 100 + SESSION_MS
    heartbeat(c, 1, now_ms=900)
    heartbeat(c, 2, now_ms=900)
    assert c.next_deadline_ms(900) == 900 + SESSION_MS


def test_a_silent_previous_leader_is_fenced_with_its_own_reason(caplog):
    c = cluster(3, broker_unreachable_fence_ms=FENCE_MS, broker_heartbeat_interval_ms=HEARTBEAT_MS)
    new = Controller(c.image, c.config, now_ms=5000, topic_id_source=topic_ids())
    new.broker_silent(1, since_ms=5000 - SESSION_MS)
    assert new.next_deadline_ms(5000) <= 5000
    with caplog.at_level("WARNING", logger="raftlog.metadata"):
        assert fenced_in(new.tick(5000)) == {1}
    (line,) = [rec.getMessage() for rec in caplog.records]
    assert "previous metadata leader" in line and "refused" not in line


def test_a_withdrawn_silence_fences_nothing():
    c = cluster(3, broker_unreachable_fence_ms=FENCE_MS, broker_heartbeat_interval_ms=HEARTBEAT_MS)
    new = Controller(c.image, c.config, now_ms=5000, topic_id_source=topic_ids())
    new.broker_silent(1, since_ms=5000 - SESSION_MS)
    new.broker_silent(1, None)
    assert fenced_in(new.tick(5000)) == set()


def test_a_successful_connect_withdraws_the_suspicion():
    c = cluster(3, broker_unreachable_fence_ms=FENCE_MS, broker_heartbeat_interval_ms=HEARTBEAT_MS)
    c.broker_unreachable(2, since_ms=1000)
    c.broker_reachable(2)
    assert fenced_in(c.tick(1000 + FENCE_MS * 4)) == set()


def test_registration_of_a_restarted_broker_counts_as_word_from_it():
    c = cluster(3, broker_unreachable_fence_ms=FENCE_MS, broker_heartbeat_interval_ms=HEARTBEAT_MS)
    c.broker_unreachable(1, since_ms=1000)
    c.tick(1000 + FENCE_MS)
    assert c.image.brokers[1].fenced
    # The new incarnation registers (accepted at once: the old one is fenced) and catches up.
    reply = c.handle(register_request(1, generation=1), 2000).reply
    assert reply.broker_epoch == 2
    assert not heartbeat(c, 1, now_ms=2000).is_fenced
    assert fenced_in(c.tick(4000)) == set()


def test_new_controller_fences_a_broker_that_was_unreachable_before_it_took_over():
    """The grace session a new controller gives every broker does not hide a broker that
    this node already saw die (e.g. the old controller, killed with the partition's leader)."""
    old = cluster(
        3, broker_unreachable_fence_ms=FENCE_MS, broker_heartbeat_interval_ms=HEARTBEAT_MS
    )
    new = Controller(old.image, old.config, now_ms=3000, topic_id_source=topic_ids())
    new.broker_unreachable(1, since_ms=2400)
    assert fenced_in(new.tick(3000)) == {1}
    assert fenced_in(new.tick(3000)) == set()  # once


def test_fence_ms_at_or_above_the_session_leaves_fencing_to_the_session():
    c = cluster(3, broker_unreachable_fence_ms=SESSION_MS * 2)
    c.broker_unreachable(1, since_ms=0)
    assert fenced_in(c.tick(SESSION_MS - 1)) == set()
    assert fenced_in(c.tick(SESSION_MS)) == {1, 2, 3}


def test_fence_ms_is_range_checked():
    with pytest.raises(ConfigError):
        NodeConfig.from_dict({"broker_unreachable_fence_ms": -1})


# ------------------------------------------------------------------ the driver
class FakePeer:
    def __init__(self) -> None:
        self.connected = False
        self.last_connect_refused = True


class FakePeers:
    """PeerSet's surface that BrokerReachability uses."""

    def __init__(self) -> None:
        self.listeners: list = []
        self.clients: dict[int, FakePeer] = {}
        self.made: list[tuple[int, str, int]] = []

    def add_unreachable_listener(self, listener) -> None:
        self.listeners.append(listener)

    def get(self, node_id: int):
        return self.clients.get(node_id)

    def peer(self, node_id: int, host: str, port: int) -> FakePeer:
        self.made.append((node_id, host, port))
        return self.clients.setdefault(node_id, FakePeer())

    def fail(self, node_id: int, *, refused: bool = True) -> None:
        self.clients.setdefault(node_id, FakePeer()).last_connect_refused = refused
        for listener in self.listeners:
            listener(node_id)


class Holder:
    def __init__(self) -> None:
        self.controller: Controller | None = None
        self.quorum = None
        self.woken = 0
        self.listeners: list = []

    def wake_controller(self) -> None:
        self.woken += 1

    def add_controller_listener(self, listener) -> None:
        self.listeners.append(listener)


async def driver_feeds_observations_to_whichever_controller_is_active() -> None:
    peers = FakePeers()
    holder = Holder()
    reachability = BrokerReachability(1, peers, holder)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(reachability.run)
        await trio.sleep(1)  # the brokers last heartbeated at 0 (cluster())
        # Not the controller yet: the observation is kept, nothing fed.
        start_ms = int(trio.current_time() * 1000)
        peers.fail(3)
        peers.fail(1)  # this node itself: never a suspect
        # A timed-out connect is no evidence (a loaded broker's accept queue, a slow net).
        peers.fail(2, refused=False)
        assert reachability.unreachable_since_ms() == {3: start_ms}
        # It becomes the active controller: the whole observation is handed over, with
        # its original start, and a connection is opened to every other unfenced broker.
        controller = cluster(
            4, broker_unreachable_fence_ms=FENCE_MS, broker_heartbeat_interval_ms=HEARTBEAT_MS
        )
        holder.controller = controller
        await trio.sleep(REACHABILITY_POLL_MS / 1000 * 1.5)
        # 2 and 3 already have clients (the Raft driver's, here the failures'): only 4 is new.
        assert [node_id for node_id, _, _ in peers.made] == [4]
        assert controller._unreachable_for_ms(3, start_ms + 10) == 10
        assert holder.woken == 1  # fed something new: the controller ticks at once
        # The broker listens again: the suspicion is withdrawn from the controller too.
        peers.clients[3].connected = True
        await trio.sleep(REACHABILITY_POLL_MS / 1000 * 1.5)
        assert reachability.unreachable_since_ms() == {}
        assert controller._unreachable_for_ms(3, start_ms + 10_000) == -1
        nursery.cancel_scope.cancel()


def test_driver_feeds_observations_to_whichever_controller_is_active():
    trio.run(
        driver_feeds_observations_to_whichever_controller_is_active,
        clock=trio.testing.MockClock(autojump_threshold=0),
    )


def test_empty_image_controller_has_no_suspects():
    c = Controller(MetadataImage.empty("cid"), NodeConfig(), now_ms=0)
    c.broker_unreachable(9, since_ms=0)  # not a registered broker: nothing to fence
    assert c.tick(10**6).records == ()


# ------------------------------------------------------------------ what counts as refused
def test_only_refused_connects_count():
    refused = OSError("all attempts to connect failed")
    refused.__cause__ = ExceptionGroup("x", [ConnectionRefusedError(), ConnectionRefusedError()])
    assert _is_refusal(refused)
    mixed = OSError("all attempts to connect failed")
    mixed.__cause__ = ExceptionGroup("x", [ConnectionRefusedError(), OSError(113, "no route")])
    assert not _is_refusal(mixed)
    assert not _is_refusal(OSError(113, "No route to host"))
    assert not _is_refusal(TimeoutError())


async def refused_by_a_closed_port() -> bool:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connects are refused
        try:
            await trio.open_tcp_stream("127.0.0.1", port)
        except OSError as exc:
            return _is_refusal(exc)
    return False


def test_a_real_refusal_is_recognised():
    assert trio.run(refused_by_a_closed_port)
