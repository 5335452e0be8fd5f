"""A broker cut off from the controller stops acting as a leader before the controller can
replace it (SessionLease), and comes back only once the controller unfences it."""

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode
from raftlog.metadata.controller import messages as cm
from raftlog.metadata.controller.broker_lifecycle import BrokerLifecycle, SessionLease
from raftlog.metadata.raft.types import NotLeader
from tests.waiting import wait_until

SESSION_MS = 1000
HEARTBEAT_MS = 100


# ---------------------------------------------------------------------- the sans-IO lease
def test_a_lease_never_answered_does_not_lapse():
    lease = SessionLease(SESSION_MS)
    assert not lease.check(10**9) and not lease.lapsed and lease.expires_at_ms is None


def test_the_lease_runs_from_the_send_time_of_the_last_answered_heartbeat():
    lease = SessionLease(SESSION_MS)
    lease.answered(100, is_fenced=False)
    # Answered late (a slow round trip): the session still counts from the send.
    assert lease.expires_at_ms == 100 + SESSION_MS
    assert not lease.check(100 + SESSION_MS - 1)
    assert lease.check(100 + SESSION_MS) and lease.lapsed and lease.lapses == 1
    assert not lease.check(100 + SESSION_MS + 5)  # one lapse, reported once


def test_an_older_heartbeat_answered_last_does_not_shorten_the_lease():
    lease = SessionLease(SESSION_MS)
    lease.answered(500, is_fenced=False)
    lease.answered(200, is_fenced=False)
    assert lease.expires_at_ms == 500 + SESSION_MS


def test_a_lapsed_lease_comes_back_only_with_an_unfenced_answer():
    lease = SessionLease(SESSION_MS)
    lease.answered(0, is_fenced=False)
    assert lease.check(SESSION_MS)
    # The controller fenced it meanwhile: still not leading, though heartbeats flow again.
    assert not lease.answered(SESSION_MS + 50, is_fenced=True)
    assert lease.lapsed and lease.expires_at_ms is None
    assert lease.answered(SESSION_MS + 150, is_fenced=False)
    assert not lease.lapsed and lease.expires_at_ms == 2 * SESSION_MS + 150


def test_a_lease_that_ran_out_while_the_heartbeat_was_in_flight_lapsed():
    """check(now) before answered(): the broker could not know the answer would come."""
    lease = SessionLease(SESSION_MS)
    lease.answered(0, is_fenced=False)
    # Heartbeat sent at 900, answered (fenced: the controller replaced us) at 1500.
    assert lease.check(1500)
    assert not lease.answered(900, is_fenced=True)
    assert lease.lapsed


def test_a_session_must_be_positive():
    with pytest.raises(ValueError):
        SessionLease(0)


@settings(max_examples=300, deadline=None)
@given(
    session_ms=st.integers(50, 5000),
    beats=st.lists(
        st.tuples(
            st.integers(1, 2000),  # gap since the previous send
            st.one_of(st.none(), st.integers(0, 3000)),  # to the controller (None: lost)
            st.one_of(st.none(), st.integers(0, 3000)),  # back to the broker (None: lost)
        ),
        min_size=1,
        max_size=40,
    ),
)
def test_the_broker_stops_leading_no_later_than_the_controller_can_fence_it(session_ms, beats):
    """Whatever the network delays or drops, at every moment the controller could fence the
    broker (its session counted from the last heartbeat it received), the broker's own lease
    has already lapsed: there is never a moment with two leaders both answering produces
    for the same reason of not knowing."""
    lease = SessionLease(session_ms)
    sent_ms = 0
    events = []  # (time, kind, sent_ms)
    for gap_ms, there_ms, back_ms in beats:
        sent_ms += gap_ms
        if there_ms is None:
            continue
        events.append((sent_ms + there_ms, "received", sent_ms))
        if back_ms is not None:
            events.append((sent_ms + there_ms + back_ms, "answered", sent_ms))
    events.sort()
    last_received_ms = None
    answered_once = False  # before any answer the broker was never told it may lead
    checkpoints = sorted({t for t, _, _ in events} | {t + session_ms for t, _, _ in events})
    pending = list(events)
    for now_ms in checkpoints:
        while pending and pending[0][0] <= now_ms:
            at_ms, kind, beat_sent_ms = pending.pop(0)
            if kind == "received":
                last_received_ms = max(last_received_ms or 0, at_ms)
            else:
                lease.check(at_ms)
                lease.answered(beat_sent_ms, is_fenced=False)
                answered_once = True
        lease.check(now_ms)
        controller_may_fence = (
            last_received_ms is not None and now_ms - last_received_ms >= session_ms
        )
        if controller_may_fence and answered_once:
            assert lease.lapsed, (now_ms, last_received_ms, lease.expires_at_ms)


# ---------------------------------------------------------------------- the driver
class _Controller:
    """ControllerClient stand-in: answers while `reachable`, hangs (a cut network) else."""

    def __init__(self) -> None:
        self.reachable = True
        self.fenced = False
        self.reachable_again = trio.Event()
        self.peers = None

    async def call(self, request, *, timeout_ms=None):
        while not self.reachable:
            await self.reachable_again.wait()
        if isinstance(request, cm.RegisterBroker):
            return cm.RegisterBrokerReply(broker_epoch=7)
        return cm.BrokerHeartbeatReply(is_caught_up=True, is_fenced=self.fenced)


class _Quorum:
    def __init__(self, leader_id: int) -> None:
        self.core = type("Core", (), {"leader_id": leader_id})()
        self.confirm = True

    async def read_index(self) -> int:
        if not self.confirm:
            raise NotLeader(None, 1)
        return 0


class _Metadata:
    def __init__(self, leader_id: int) -> None:
        self.quorum = _Quorum(leader_id)
        self.applied_offset = 0
        self.cluster_id = "c"


def _lifecycle(leader_id: int = 2) -> tuple[BrokerLifecycle, _Controller, _Metadata]:
    config = NodeConfig.from_dict(
        {
            "node_id": 1,
            "broker_session_timeout_ms": SESSION_MS,
            "broker_heartbeat_interval_ms": HEARTBEAT_MS,
        }
    )
    controller, metadata = _Controller(), _Metadata(leader_id)
    lifecycle = BrokerLifecycle(config, controller, metadata)  # type: ignore[arg-type]
    return lifecycle, controller, metadata


async def _start(nursery: trio.Nursery, lifecycle: BrokerLifecycle) -> None:
    await nursery.start(lifecycle._watch_lease)
    await nursery.start(lifecycle._heartbeats)


async def test_a_cut_off_broker_lapses_on_time_and_rejoins_once_unfenced(autojump_clock):
    lifecycle, controller, _ = _lifecycle()
    changes: list[tuple[bool, float]] = []
    lifecycle.lease_listeners.append(lambda lapsed: changes.append((lapsed, trio.current_time())))
    async with trio.open_nursery() as nursery:
        await _start(nursery, lifecycle)
        await wait_until("unfenced", lambda: not lifecycle.fenced)
        assert not lifecycle.lease_lapsed()
        controller.reachable = False
        cut_s = trio.current_time()
        # The listener fires by itself (parked produces are answered then), no produce
        # needed to notice.
        await wait_until("lapsed", lambda: bool(changes))
        assert changes[0][0] is True
        lapsed_after_s = changes[0][1] - cut_s
        assert SESSION_MS - HEARTBEAT_MS <= lapsed_after_s * 1000 <= SESSION_MS + 1
        assert lifecycle.lease_lapsed()
        # Healed, but the controller fenced us meanwhile: heartbeats flow, no leading yet.
        controller.fenced = True
        controller.reachable = True
        controller.reachable_again.set()
        await wait_until("fenced answer", lambda: lifecycle.fenced)
        assert lifecycle.lease_lapsed() and len(changes) == 1
        controller.fenced = False
        await wait_until("restored", lambda: not lifecycle.lease_lapsed())
        assert changes[-1][0] is False
        nursery.cancel_scope.cancel()


async def test_an_own_controller_renews_the_lease_only_when_a_majority_confirms(autojump_clock):
    """A cut-off node that is the active controller answers its own heartbeats until its
    check-quorum fires; those answers are no evidence that it reaches the quorum."""
    lifecycle, _, metadata = _lifecycle(leader_id=1)
    async with trio.open_nursery() as nursery:
        await _start(nursery, lifecycle)
        await wait_until("unfenced", lambda: not lifecycle.fenced)
        metadata.quorum.confirm = False
        cut_s = trio.current_time()
        await wait_until("lapsed", lifecycle.lease_lapsed)
        assert (trio.current_time() - cut_s) * 1000 <= SESSION_MS + 1
        metadata.quorum.confirm = True
        await wait_until("restored", lambda: not lifecycle.lease_lapsed())
        nursery.cancel_scope.cancel()


async def test_heartbeat_refusals_do_not_renew_the_lease(autojump_clock):
    lifecycle, controller, _ = _lifecycle()

    async def refusing(request, *, timeout_ms=None):
        if isinstance(request, cm.RegisterBroker):
            return cm.RegisterBrokerReply(broker_epoch=7)
        return cm.BrokerHeartbeatReply(error_code=ErrorCode.unknown_server_error)

    async with trio.open_nursery() as nursery:
        await _start(nursery, lifecycle)
        await wait_until("unfenced", lambda: not lifecycle.fenced)
        controller.call = refusing  # type: ignore[method-assign]
        await wait_until("lapsed", lifecycle.lease_lapsed)
        nursery.cancel_scope.cancel()
