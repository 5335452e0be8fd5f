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
"""

from __future__ import annotations

from typing import Protocol

import trio

from raftlog.metadata.controller.controller import Controller
from raftlog.net.rpc import PeerSet

# How often the observations are handed to the active controller and reconnects noticed;
# well under broker_unreachable_fence_ms's default, and the controller ticks every 250 ms.
REACHABILITY_POLL_MS = 100


class ActiveController(Protocol):
    """Where the active controller lives (MetadataService, a layer above this one)."""

    @property
    def controller(self) -> Controller | None: ...


class BrokerReachability:
    """Run `await nursery.start(reachability.run)` on every node; it only acts while the
    node is the active controller, but it listens all the time."""

    def __init__(self, node_id: int, peers: PeerSet, metadata: ActiveController) -> None:
        self.node_id = node_id
        self.peers = peers
        self.metadata = metadata
        # peer id -> since when every connect to it failed (none succeeded since).
        self._unreachable_since_ms: dict[int, int] = {}
        self._fed: Controller | None = None
        self._fed_ids: set[int] = set()
        peers.add_unreachable_listener(self._peer_unreachable)

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

    def _feed(self) -> None:
        controller = self.metadata.controller
        if controller is None:
            self._fed, self._fed_ids = None, set()
            return
        if controller is not self._fed:
            self._fed, self._fed_ids = controller, set()
        for peer_id in self._fed_ids - self._unreachable_since_ms.keys():
            controller.broker_reachable(peer_id)
        for peer_id, since_ms in self._unreachable_since_ms.items():
            controller.broker_unreachable(peer_id, since_ms)
        self._fed_ids = set(self._unreachable_since_ms)
