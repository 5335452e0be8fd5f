"""A broker's side of the controller: requests routed to the active controller, registration,
heartbeats (which unfence it once caught up), its session lease, and controlled shutdown."""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable
from typing import Any

import trio

from raftlog.codec import DecodeError
from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode, KafkaError
from raftlog.metadata.controller import messages as cm
from raftlog.metadata.controller.liveness import BrokerReachability
from raftlog.metadata.raft.types import NotLeader
from raftlog.metadata.service import MetadataService, NotControllerError
from raftlog.net.rpc import PeerSet, RpcError

log = logging.getLogger("raftlog.broker")

CONTROLLER_RETRY_BACKOFF_MS = 50
CONTROLLER_RETRY_BACKOFF_MAX_MS = 500
# A shutdown heartbeat not answered this fast means no controller can act right now.
CONTROLLED_SHUTDOWN_HEARTBEAT_TIMEOUT_MS = 3000
# A controller we cannot connect to this fast is treated as gone; the next try re-reads who
# leads (a new election usually takes about one election timeout).
CONTROLLER_CONNECT_TIMEOUT_MS = 300
# Controller requests this node has in flight to a remote controller at once. They share one
# connection with this node's Raft messages, and the controller reads a connection's frames
# in order with a bounded number of requests in flight (RpcLimits.max_inflight_per_connection,
# 64): requests that wait for a metadata commit (AlterPartition for every partition this
# broker leads, after a failover) must never fill that window, or the Raft fetch that would
# commit them waits behind them until the controller resigns for want of a quorum.
MAX_CONTROLLER_REQUESTS_IN_FLIGHT = 16


class ControllerMovedError(NotControllerError):
    """A request in flight to one controller was abandoned: the quorum elected another."""


class ControllerClient:
    """Sends controller requests to whichever voter is the active controller, retrying.

    A request in flight to a remote controller is abandoned as soon as the local metadata
    quorum learns of another leader (`leader_changed`) and sent again to that one: a paused
    or partitioned old controller keeps its connection open, so waiting for the reply or
    the request's timeout would keep heartbeats from the new controller for a whole broker
    session and get live brokers fenced.
    """

    def __init__(self, config: NodeConfig, peers: PeerSet, metadata: MetadataService) -> None:
        self.config = config
        self.peers = peers
        self.metadata = metadata
        # Cancel scope of each request in flight to a remote controller -> that node's id.
        self._inflight: dict[trio.CancelScope, int] = {}
        self._slots = trio.Semaphore(MAX_CONTROLLER_REQUESTS_IN_FLIGHT)
        self.abandoned_requests = 0

    def leader_changed(self, leader_id: int | None) -> None:
        """The metadata quorum's leader is now `leader_id` (None: not known yet).

        Requests in flight to any other node are abandoned and re-sent. An unknown leader
        abandons nothing: the old one may still answer, and the next known leader decides.
        """
        if leader_id is None:
            return
        for scope, target_id in self._inflight.items():
            if target_id != leader_id:
                scope.cancel()

    async def call(self, request: Any, *, timeout_ms: int | None = None) -> Any:
        """The reply from the active controller, or KafkaError(REQUEST_TIMED_OUT)."""
        timeout_ms = timeout_ms or self.config.request_timeout_ms
        backoff_ms = CONTROLLER_RETRY_BACKOFF_MS
        with trio.move_on_after(timeout_ms / 1000):
            while True:
                try:
                    return await self._call_once(request, timeout_ms)
                except ControllerMovedError as exc:
                    # The new leader is known: send there at once, no backoff.
                    log.info("controller request %s re-sent: %s", type(request).__name__, exc)
                    continue
                except (NotControllerError, RpcError) as exc:
                    log.debug("controller request %s retried: %s", type(request).__name__, exc)
                await trio.sleep(backoff_ms / 1000)
                backoff_ms = min(backoff_ms * 2, CONTROLLER_RETRY_BACKOFF_MAX_MS)
        raise KafkaError(
            ErrorCode.request_timed_out,
            f"no active controller answered {type(request).__name__} within {timeout_ms} ms",
        )

    async def _call_once(self, request: Any, timeout_ms: int) -> Any:
        quorum = self.metadata.quorum
        leader = quorum.core.leader_id if quorum is not None else None
        if leader is None:
            raise NotControllerError(None)
        if leader == self.config.node_id:
            return await self.metadata.handle(request)
        # The voter set's endpoints first (they fall back to the config's): a voter added or
        # moved later (KIP-853 AddRaftVoter) may be the one elected.
        address = quorum.address_of(leader) if quorum is not None else None
        if address is None:
            address = self.config.voters.get(leader)
        if address is None:
            raise NotControllerError(leader)
        answer = await self._call_remote(leader, address, request, timeout_ms)
        try:
            status, body = answer
            reply = cm.CODEC.decode(cm.ControllerReply, body) if status == "ok" else None
        except (TypeError, ValueError, DecodeError) as exc:
            # A controller of another version (or a bug) fails this request with a Kafka
            # error, which every caller handles; anything else would end the caller's task.
            raise KafkaError(
                ErrorCode.unknown_server_error, f"malformed controller reply: {exc}"
            ) from None
        if status == "not_controller":
            raise NotControllerError(body)
        if status != "ok":
            raise KafkaError(ErrorCode.unknown_server_error, f"controller answered {status}")
        return reply

    async def _call_remote(
        self, leader: int, address: tuple[str, int], request: Any, timeout_ms: int
    ) -> Any:
        """The raw answer of `leader`; raises ControllerMovedError if another node is
        elected while the request is in flight."""
        scope = trio.CancelScope()
        self._inflight[scope] = leader
        try:
            with scope:
                async with self._slots:
                    return await self.peers.peer(leader, *address).call(
                        "controller",
                        cm.CODEC.encode(request, cm.ControllerRequest),
                        timeout_s=timeout_ms / 1000,
                        connect_timeout_s=CONTROLLER_CONNECT_TIMEOUT_MS / 1000,
                    )
        finally:
            del self._inflight[scope]
        # Only leader_changed cancels this scope, and only for another leader.
        self.abandoned_requests += 1
        quorum = self.metadata.quorum
        raise ControllerMovedError(quorum.core.leader_id if quorum is not None else None)

    async def serve(self, sender_id: int, body: bytes) -> list[Any]:
        """The internal RPC method "controller" on this node, for the node the connection
        speaks for (sender_id)."""
        request: Any = cm.CODEC.decode(cm.ControllerRequest, body)
        try:
            reply = await self.metadata.handle(request, sender_id=sender_id)
        except NotControllerError as exc:
            return ["not_controller", exc.leader_id]
        return ["ok", cm.CODEC.encode(reply, cm.ControllerReply)]


class SessionLease:
    """Whether this broker may still act as a partition leader, from its heartbeats alone
    (sans-IO: the caller passes the clock).

    The controller fences a broker broker_session_timeout_ms after the last heartbeat it
    received, and then elects new leaders for its partitions. A broker cut off from the
    controller does not see that happen, so on its own it would go on answering produces
    as a leader nobody follows (clients never look elsewhere). The broker therefore counts
    the same session from its side: from the moment it SENT the last heartbeat that a
    controller answered. That moment is never later than the controller's receipt, so the
    lease lapses no later than the controller can fence, whatever the network did between.

    A lapsed lease comes back only with an answer that says the broker is unfenced: the
    controller unfences a broker only once its metadata has caught up, so by then its image
    names the partitions' current leaders and it rejoins as a follower where it was replaced.

    Before the first answered heartbeat there is nothing to lapse (a starting broker is not
    serving yet, and a new controller's grace sessions cover it).
    """

    def __init__(self, session_timeout_ms: int) -> None:
        if session_timeout_ms <= 0:
            raise ValueError(f"session_timeout_ms must be positive, not {session_timeout_ms}")
        self.session_timeout_ms = session_timeout_ms
        self._expires_at_ms: int | None = None
        self._lapsed = False
        self.lapses = 0

    @property
    def expires_at_ms(self) -> int | None:
        """When the lease lapses without another answer (None: not started, or lapsed)."""
        return None if self._lapsed else self._expires_at_ms

    def answered(self, sent_ms: int, *, is_fenced: bool) -> bool:
        """A controller answered the heartbeat sent at `sent_ms`; True if this restores a
        lapsed lease."""
        expires_ms = sent_ms + self.session_timeout_ms
        if self._expires_at_ms is None or expires_ms > self._expires_at_ms:
            self._expires_at_ms = expires_ms
        if self._lapsed and not is_fenced:
            self._lapsed = False
            return True
        return False

    def check(self, now_ms: int) -> bool:
        """True the first time the lease is seen lapsed at `now_ms`. Call it before
        `answered` with the time of the answer: a lease that ran out while the heartbeat
        was in flight lapsed then, and needs an unfenced answer to come back."""
        if self._lapsed or self._expires_at_ms is None or now_ms < self._expires_at_ms:
            return False
        self._lapsed = True
        self.lapses += 1
        return True

    @property
    def lapsed(self) -> bool:
        """The broker must not act as a leader (as of the last `check`)."""
        return self._lapsed


class BrokerLifecycle:
    """Registration and heartbeats; `unfenced` is set while the controller lets us serve;
    `lease_lapsed()` is true while heartbeats have gone unanswered for the session."""

    def __init__(
        self, config: NodeConfig, client: ControllerClient, metadata: MetadataService
    ) -> None:
        self.config = config
        self.client = client
        self.metadata = metadata
        self.incarnation_id = uuid.uuid4()
        self.broker_epoch = -1
        self.fenced = True
        self.unfenced = trio.Event()
        self._shutting_down = False
        self._wake = trio.Event()
        self.shutdown_done = trio.Event()
        # The replicas this broker must not lead (replication's unsafe_partitions), sent in
        # every heartbeat so the controller keeps them out of ISRs and elections.
        self.unsafe_partitions: Callable[[], tuple[tuple[uuid.UUID, int], ...]] = tuple
        self.shutdown_confirmed = False
        self._heartbeat_scope: trio.CancelScope | None = None
        # Runs with the heartbeats: what this node's connections say about other brokers,
        # for the controller when this node is it.
        self.reachability: BrokerReachability | None = None
        self.lease = SessionLease(config.broker_session_timeout_ms)
        # The slowest heartbeat round trip so far, confirmation included (ms).
        self.max_heartbeat_round_trip_ms = 0
        # Called (no await) when the lease lapses and when it comes back: the Kafka backend
        # fails the produces parked on this broker's partitions, so clients look elsewhere.
        self.lease_listeners: list[Callable[[bool], None]] = []
        self._lease_changed = trio.Event()

    @staticmethod
    def _now_ms() -> int:
        return int(trio.current_time() * 1000)

    def lease_lapsed(self) -> bool:
        """This broker's heartbeats have gone unanswered for broker_session_timeout_ms: it
        must not act as a partition leader (the controller may have replaced it)."""
        if self.lease.check(self._now_ms()):
            self._lease_event(lapsed=True)
        return self.lease.lapsed

    def _lease_event(self, *, lapsed: bool) -> None:
        if lapsed:
            log.warning(
                "broker %d: no heartbeat answered for broker_session_timeout_ms (%d ms); not "
                "acting as a partition leader until a controller answers and unfences it",
                self.config.node_id,
                self.lease.session_timeout_ms,
            )
        else:
            log.info("broker %d: heartbeats answered again; leading resumes", self.config.node_id)
        for listener in self.lease_listeners:
            listener(lapsed)

    async def _watch_lease(
        self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Notices the lapse when it happens, not at the next produce: produces already
        parked on this broker's partitions must be answered then."""
        task_status.started()
        while True:
            expires_ms = self.lease.expires_at_ms
            changed = self._lease_changed
            if expires_ms is None:
                await changed.wait()
                continue
            with trio.move_on_at(expires_ms / 1000):
                await changed.wait()
            self.lease_lapsed()

    async def _answered_by_quorum(self, local_controller: bool) -> bool:
        """Whether an answered heartbeat proves this broker reaches the controller quorum.
        A remote controller's answer does. This node's own controller answers whether or
        not the other voters still follow it (a cut-off controller leads on until its
        check-quorum), so its answer counts only once a majority confirms its leadership."""
        if not local_controller:
            return True
        quorum = self.metadata.quorum
        if quorum is None:
            return False
        with trio.move_on_after(self.config.broker_session_timeout_ms / 1000):
            try:
                await quorum.read_index()
            except NotLeader as exc:  # leadership lost before a majority answered
                log.debug("heartbeat not confirmed by the metadata quorum: %s", exc)
                return False
            return True
        return False

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.reachability = BrokerReachability(
            self.config.node_id, self.client.peers, self.metadata, self.config
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(self.reachability.run)
            await nursery.start(self._watch_lease)
            await nursery.start(self._heartbeats)
            task_status.started()

    async def _heartbeats(
        self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        interval_s = self.config.broker_heartbeat_interval_ms / 1000
        while True:
            if self.broker_epoch < 0:
                await self._register()
            shutting_down = self._shutting_down
            timeout_ms = (
                CONTROLLED_SHUTDOWN_HEARTBEAT_TIMEOUT_MS
                if shutting_down
                else self.config.broker_session_timeout_ms
            )
            # A shutdown request cancels a regular heartbeat still in flight, so the shutdown
            # heartbeat goes out at once instead of after the session timeout.
            self._heartbeat_scope = trio.CancelScope()
            reply = None
            sent_ms = self._now_ms()
            quorum = self.metadata.quorum
            local_controller = quorum is not None and quorum.core.leader_id == self.config.node_id
            try:
                with self._heartbeat_scope:
                    reply = await self.client.call(self._heartbeat(), timeout_ms=timeout_ms)
            except KafkaError as exc:
                if shutting_down:
                    # No controller can act (e.g. the whole cluster is stopping and the quorum
                    # is gone): waiting longer moves nothing, so stop unconfirmed.
                    log.warning("controlled shutdown: no controller answered (%s)", exc)
                    self.shutdown_confirmed = False
                    self.shutdown_done.set()
                    await trio.sleep(math.inf)
                log.warning("heartbeat failed: %s", exc)
                await trio.sleep(interval_s)
                continue
            if reply is None:
                continue  # cancelled by controlled_shutdown: send the shutdown heartbeat
            if reply.error_code in (
                ErrorCode.stale_broker_epoch,
                ErrorCode.broker_id_not_registered,
            ):
                log.warning(
                    "controller does not know broker epoch %d (%s): re-registering",
                    self.broker_epoch,
                    reply.error_code.name,
                )
                self.broker_epoch = -1
                continue
            self._apply(reply)
            if reply.error_code == ErrorCode.none and await self._answered_by_quorum(
                local_controller
            ):
                self._note_round_trip(self._now_ms() - sent_ms)
                self._renew_lease(sent_ms, is_fenced=reply.is_fenced)
            if self._shutting_down and reply.should_shutdown:
                self.shutdown_confirmed = True
                self.shutdown_done.set()
                await trio.sleep(math.inf)
            # While catching up, beat faster so unfencing follows the metadata quickly.
            # The interval runs from the send, not the answer: a slow round trip must not
            # also delay the next heartbeat, or two slow ones in a row cost the session.
            wait_s = interval_s if not self.fenced else min(interval_s, 0.1)
            with trio.move_on_at(sent_ms / 1000 + wait_s):
                await self._wake.wait()
            self._wake = trio.Event()

    def _note_round_trip(self, round_trip_ms: int) -> None:
        """A heartbeat answered this long after it was sent: the margin left before a lapse
        is broker_session_timeout_ms minus this and the interval, so a slow one is logged."""
        self.max_heartbeat_round_trip_ms = max(self.max_heartbeat_round_trip_ms, round_trip_ms)
        if round_trip_ms * 4 >= self.config.broker_session_timeout_ms:
            log.info(
                "slow heartbeat: answered %d ms after it was sent (broker_session_timeout_ms %d)",
                round_trip_ms,
                self.config.broker_session_timeout_ms,
            )

    def _renew_lease(self, sent_ms: int, *, is_fenced: bool) -> None:
        self.lease_lapsed()  # a lapse while the heartbeat was in flight counts
        if self.lease.answered(sent_ms, is_fenced=is_fenced):
            self._lease_event(lapsed=False)
        changed, self._lease_changed = self._lease_changed, trio.Event()
        changed.set()

    def _heartbeat(self) -> cm.BrokerHeartbeat:
        return cm.BrokerHeartbeat(
            self.config.node_id,
            self.broker_epoch,
            self.metadata.applied_offset + 1,
            want_shutdown=self._shutting_down,
            unsafe_partitions=self.unsafe_partitions(),
        )

    def _apply(self, reply: cm.BrokerHeartbeatReply) -> None:
        if reply.error_code != ErrorCode.none:
            log.warning("heartbeat answered %s: %s", reply.error_code.name, reply.error_message)
            return
        if reply.is_fenced != self.fenced:
            log.info(
                "broker %d is now %s",
                self.config.node_id,
                "fenced" if reply.is_fenced else "unfenced",
            )
        self.fenced = reply.is_fenced
        if not self.fenced:
            self.unfenced.set()
        elif self.unfenced.is_set():
            self.unfenced = trio.Event()

    async def _register(self) -> None:
        advertised = self.config.advertised_client_listeners
        # The first listener is the default endpoint: what a node that does not read the
        # listener list (an older version) tells every client.
        client_host, client_port = advertised[0].host, advertised[0].port
        internal_host, internal_port = self.config.advertised_internal_address
        # One PLAINTEXT listener is what an empty list means: leave it off the wire.
        listeners = (
            tuple((b.name, b.host, b.port, b.security_protocol) for b in advertised)
            if self.config.listeners.strip()
            else ()
        )
        request = cm.RegisterBroker(
            self.config.node_id,
            self.incarnation_id,
            client_host,
            client_port,
            internal_host,
            internal_port,
            self.config.broker_rack or None,
            self.metadata.cluster_id or None,
            listeners,
        )
        interval_s = self.config.broker_heartbeat_interval_ms / 1000
        while True:
            try:
                reply = await self.client.call(request)
            except KafkaError as exc:
                # Pace the retry: some failures (a malformed or unknown answer) come at once.
                log.info("registration not answered yet: %s", exc)
                await trio.sleep(interval_s)
                continue
            if reply.error_code == ErrorCode.none:
                self.broker_epoch = reply.broker_epoch
                log.info(
                    "registered as broker %d with epoch %d", self.config.node_id, self.broker_epoch
                )
                return
            log.warning("registration refused: %s %s", reply.error_code.name, reply.error_message)
            await trio.sleep(interval_s)

    async def controlled_shutdown(self, timeout_s: float) -> bool:
        """Ask the controller to move leadership away; True once it says we may stop."""
        self._shutting_down = True
        self._wake.set()
        if self._heartbeat_scope is not None:
            self._heartbeat_scope.cancel()
        with trio.move_on_after(timeout_s):
            await self.shutdown_done.wait()
        return self.shutdown_confirmed
