"""A node that takes over as controller because the previous metadata leader fell silent
(its Raft fetches went unanswered for longer than a broker session) hands the new controller
that silence, so the old leader is fenced at once instead of after a fresh session; one that
heartbeats the new controller, or was heard from recently, keeps its place."""

import logging
from types import SimpleNamespace
from typing import Any

import trio

from raftlog.config import NodeConfig
from raftlog.metadata import records as r
from raftlog.metadata.controller.controller import Controller
from raftlog.metadata.controller.liveness import BrokerReachability
from raftlog.metadata.raft.roles import Leader
from raftlog.metadata.raft.types import LeaderContact
from tests.metadata.test_broker_liveness_fencing import FakePeers
from tests.metadata.test_controller import cluster, heartbeat, topic_ids

SESSION_MS = 1500
FETCH_TIMEOUT_MS = 2000
NODE_ID = 2
OLD_LEADER = 1


def fenced_in(result) -> set[int]:
    return {rec.broker_id for rec in result.records if isinstance(rec, r.FenceBroker)}


class Core:
    """What BrokerReachability reads of the Raft core: its role, the last leader it heard
    from, and the epoch of the log entry before the leader's epoch start."""

    def __init__(self) -> None:
        self.role: Any = None
        self.leader_contact: LeaderContact | None = None
        self.log_epochs: dict[int, int] = {}

    def epoch_before(self, offset: int) -> int | None:
        return self.log_epochs.get(offset)


class Metadata:
    """The surface BrokerReachability reads: the active controller and the Raft core."""

    def __init__(self) -> None:
        self.controller: Controller | None = None
        self.quorum = SimpleNamespace(core=Core())
        self.woken = 0
        self.listeners: list[Any] = []

    def wake_controller(self) -> None:
        self.woken += 1

    def add_controller_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def activate(self, controller: Controller) -> None:
        """What MetadataService does when a controller becomes active on this node."""
        self.controller = controller
        for listener in self.listeners:
            listener()

    def follow(self, leader_id: int, heard_ms: int) -> None:
        self.quorum.core.leader_contact = LeaderContact(leader_id, 1, heard_ms)

    def lead(self, *, epoch_before_mine: int = 1) -> None:
        """Elected in epoch 3 (epoch 2 was a split vote, nobody led it); its log's last entry
        before its own epoch is of `epoch_before_mine`."""
        self.quorum.core.role = Leader(3, 10)
        self.quorum.core.log_epochs = {10: epoch_before_mine}


def _config() -> NodeConfig:
    return NodeConfig.from_dict(
        {
            "node_id": NODE_ID,
            "broker_session_timeout_ms": SESSION_MS,
            "fetch_timeout_ms": FETCH_TIMEOUT_MS,
            "controller_quorum_voters": "1@127.0.0.1:1,2@127.0.0.1:2,3@127.0.0.1:3",
        }
    )


def _now_ms() -> int:
    return int(trio.current_time() * 1000)


async def _take_over(
    silent_ms: int,
    *,
    heartbeats: bool = False,
    epoch_before_mine: int = 1,
    metadata: Metadata | None = None,
) -> set[int]:
    """This node followed OLD_LEADER, last heard from it `silent_ms` before it becomes the
    active controller; what does the new controller's first tick fence?"""
    metadata = metadata or Metadata()
    reachability = BrokerReachability(NODE_ID, FakePeers(), metadata, _config())  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(reachability.run)
        await trio.sleep(10)
        heard_ms = _now_ms()
        metadata.follow(OLD_LEADER, heard_ms)
        await trio.sleep(max(0, heard_ms + silent_ms - _now_ms()) / 1000)
        metadata.lead(epoch_before_mine=epoch_before_mine)
        old = cluster(3, broker_session_timeout_ms=SESSION_MS)
        controller = Controller(
            old.image, old.config, now_ms=_now_ms(), topic_id_source=topic_ids()
        )
        controller.become_leader(_now_ms())
        if heartbeats:
            heartbeat(controller, OLD_LEADER, now_ms=_now_ms())
        metadata.activate(controller)
        # Fed at the takeover itself, not at the next poll: no time passes before the tick.
        fenced = fenced_in(controller.tick(_now_ms()))
        nursery.cancel_scope.cancel()
    return fenced


async def test_a_leader_silent_for_a_session_is_fenced_at_the_takeover(autojump_clock):
    assert await _take_over(FETCH_TIMEOUT_MS + 300) == {OLD_LEADER}


async def test_a_leader_heard_from_within_a_session_gets_the_grace(autojump_clock):
    """A leadership handover (EndQuorumEpoch) or a short stall: no evidence."""
    assert await _take_over(SESSION_MS - 200) == set()


async def test_a_silent_leader_that_heartbeats_the_new_controller_stays(autojump_clock):
    assert await _take_over(FETCH_TIMEOUT_MS + 300, heartbeats=True) == set()


async def test_the_fence_says_it_was_the_silence_and_wakes_the_controller(autojump_clock, caplog):
    metadata = Metadata()
    with caplog.at_level(logging.WARNING, logger="raftlog.metadata"):
        assert await _take_over(FETCH_TIMEOUT_MS + 300, metadata=metadata) == {OLD_LEADER}
    (line,) = [rec.getMessage() for rec in caplog.records if "fenced" in rec.getMessage()]
    assert "previous metadata leader" in line and "refused" not in line
    assert metadata.woken >= 1  # fed: the controller ticks now, not at its next tick


async def test_a_leader_of_an_older_epoch_is_old_news(autojump_clock):
    """A leader came between (its epoch-start entry is in this node's log): the contact is
    about a broker that may have been heartbeating that leader all along."""
    assert await _take_over(FETCH_TIMEOUT_MS + 300, epoch_before_mine=2) == set()


async def test_without_a_config_only_refusals_count(autojump_clock):
    metadata = Metadata()
    reachability = BrokerReachability(NODE_ID, FakePeers(), metadata)  # type: ignore[arg-type]
    metadata.follow(OLD_LEADER, 0)
    metadata.lead()
    old = cluster(3, broker_session_timeout_ms=SESSION_MS)
    reachability._took_over(Controller(old.image, old.config, now_ms=10**6))
    assert reachability.observations() == {}
