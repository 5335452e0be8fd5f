"""What this node's internal connections say about brokers, fed to the active controller.

A broker that is `kill -9`'d stops heartbeating, but the controller would only notice when
its session expires (broker_session_timeout_ms): the whole time, producers wait on a leader
that is gone. Its process being gone is visible much sooner: the connection
this node keeps to its internal listener breaks and every reconnect is refused (PeerSet's
unreachable signal, which the Raft driver already uses to elect sooner). This driver keeps
such a connection to every registered broker while this node is the active controller, and
tells the controller since when each broker's listener has refused it; the controller's
tick fences it after broker_unreachable_fence_ms unless the broker heartbeats meanwhile
(Controller.broker_unreachable).

Only refusals count. A connect that times out says nothing certain: a broker too loaded to
accept (its accept queue full) or a slow network look the same, and those are left to the
session timeout. A slow broker's kernel still completes connections, so load alone never
makes one look refused.

The observations outlive a change of controller: a node that was a follower when the broker
died hands its new controller the time the connects began failing, so a killed broker that
also led the metadata quorum is fenced without waiting for fresh failures.

One silence counts as well, and only at a change of controller: a node that takes over
because it stopped hearing from the previous metadata leader (its Raft fetches went
unanswered) hands the new controller the time it last heard from it (the Raft core's
leader_contact), when that is a whole broker session ago (Controller.broker_silent). The
new controller would otherwise give that broker a fresh session although a majority has not
heard from it for longer than one (a leader cut off the network kept leading its partitions
that much longer); it still keeps it if the broker heartbeats the new controller.

Whatever it feeds may make a fence due at once, so it wakes the controller's tick loop
(MetadataService.wake_controller) instead of leaving the fence to the next scheduled tick.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import trio

from raftlog.config import NodeConfig
from raftlog.metadata.controller.controller import Controller
from raftlog.metadata.raft.roles import Leader
from raftlog.net.rpc import PeerSet

# How often reconnects are noticed and a new active controller is looked for (refusals are
# fed at once, as they happen); well under broker_unreachable_fence_ms's default.
REACHABILITY_POLL_MS = 100


class ActiveController(Protocol):
    """Where the active controller lives (MetadataService, a layer above this one)."""

    @property
    def controller(self) -> Controller | None: ...

    @property
    def quorum(self) -> Any: ...

    def wake_controller(self) -> None:
        """Run the controller's tick now: what it was just told may make a fence due."""

    def add_controller_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener` as soon as a controller becomes active on this node."""


class BrokerReachability:
    """Run `await nursery.start(reachability.run)` on every node; it only acts while the
    node is the active controller, but it listens all the time."""

    def __init__(
        self,
        node_id: int,
        peers: PeerSet,
        metadata: ActiveController,
        config: NodeConfig | None = None,
    ) -> None:
        self.node_id = node_id
        self.peers = peers
        self.metadata = metadata
        # Without a config (a caller that predates it) the silence of a metadata leader is
        # not watched, only refusals.
        self.config = config
        # peer id -> since when every connect to it failed (none succeeded since).
        self._unreachable_since_ms: dict[int, int] = {}
        # broker id -> since when a majority has not heard from it: the previous metadata
        # leader, as this node saw it when it took over as controller.
        self._silent_since_ms: dict[int, int] = {}
        # What the active controller was last told (refusals, silences): a change wakes it.
        self._fed: Controller | None = None
        self._fed_refused: dict[int, int] = {}
        self._fed_silent: dict[int, int] = {}
        peers.add_unreachable_listener(self._peer_unreachable)
        # A new controller gets what this node knows at its takeover, not at the next poll.
        metadata.add_controller_listener(self._feed)

    def _now_ms(self) -> int:
        return int(trio.current_time() * 1000)

    def _peer_unreachable(self, peer_id: int) -> None:
        client = self.peers.get(peer_id)
        if peer_id == self.node_id or client is None or not client.last_connect_refused:
            return
        self._unreachable_since_ms.setdefault(peer_id, self._now_ms())
        self._feed()

    def unreachable_since_ms(self) -> dict[int, int]:
        """The current observations (peer id -> since when), for logs and tests."""
        return dict(self._unreachable_since_ms)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(REACHABILITY_POLL_MS / 1000)
            for peer_id in list(self._unreachable_since_ms):
                client = self.peers.get(peer_id)
                if client is not None and client.connected:
                    del self._unreachable_since_ms[peer_id]
            self._watch_brokers()
            self._feed()

    def _watch_brokers(self) -> None:
        """While this node is the active controller, keep a connection to every registered,
        unfenced broker (voters already have one: the Raft driver's), so a broker's death
        shows as refused reconnects."""
        controller = self.metadata.controller
        if controller is None:
            return
        for broker_id, reg in controller.image.brokers.items():
            if broker_id == self.node_id or reg.fenced or self.peers.get(broker_id) is not None:
                continue
            # Never replaces an existing client (the Raft driver's may name another address
            # for the same node): a new one is only made where there is none.
            self.peers.peer(broker_id, *reg.internal_endpoint)

    def _took_over(self, controller: Controller) -> None:
        """This node just became the active controller: the previous metadata leader counts
        as silent since this node last heard from it, if that is a whole session ago."""
        self._silent_since_ms = {}
        quorum = self.metadata.quorum
        core = None if quorum is None else quorum.core
        contact = None if core is None else core.leader_contact
        if self.config is None or core is None or contact is None:
            return
        role = core.role
        # Only the leader this node's log last heard of: if any leader came between (its
        # epoch-start entry is in this log), the contact is older news about a broker that
        # may well be alive and heartbeating.
        if not isinstance(role, Leader) or core.epoch_before(role.epoch_start_offset) != (
            contact.epoch
        ):
            return
        registration = controller.image.brokers.get(contact.leader_id)
        if contact.leader_id == self.node_id or registration is None or registration.fenced:
            return
        silent_ms = self._now_ms() - contact.heard_ms
        if silent_ms >= self.config.broker_session_timeout_ms:
            self._silent_since_ms[contact.leader_id] = contact.heard_ms

    def observations(self) -> dict[int, int]:
        """What the active controller is told: broker id -> since when it has been
        unreachable (refused connects, or the previous metadata leader's silence)."""
        merged = dict(self._silent_since_ms)
        for peer_id, since_ms in self._unreachable_since_ms.items():
            merged[peer_id] = min(since_ms, merged.get(peer_id, since_ms))
        return merged

    def _feed(self) -> None:
        controller = self.metadata.controller
        if controller is None:
            self._fed, self._fed_refused, self._fed_silent = None, {}, {}
            self._silent_since_ms = {}
            return
        if controller is not self._fed:
            self._fed, self._fed_refused, self._fed_silent = controller, {}, {}
            self._took_over(controller)
        refused, silent = self._unreachable_since_ms, self._silent_since_ms
        for peer_id in self._fed_refused.keys() - refused.keys():
            controller.broker_reachable(peer_id)
        for peer_id, since_ms in refused.items():
            controller.broker_unreachable(peer_id, since_ms)
        for peer_id in self._fed_silent.keys() - silent.keys():
            controller.broker_silent(peer_id, None)
        for peer_id, since_ms in silent.items():
            controller.broker_silent(peer_id, since_ms)
        if (refused, silent) != (self._fed_refused, self._fed_silent):
            self._fed_refused, self._fed_silent = dict(refused), dict(silent)
            self.metadata.wake_controller()
