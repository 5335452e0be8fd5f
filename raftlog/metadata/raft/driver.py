"""The trio driver of the metadata quorum: RaftCore + the metadata log store + RPC.

The core decides; this module only feeds it inputs (RPC casts, ticks, flushes) and is the
`ReadyTarget` that `execute_ready` carries each Ready out on, in the order the contract
demands (docs/raft.md): quorum state fsynced before any message that reflects it, then
truncate, append, install snapshot, send, apply. A dedicated task fsyncs appended entries
through the shared group-commit flusher and then tells the core `flushed(...)`; a
follower's next Fetch, which acknowledges, waits for that.

Snapshots are decoded into a MetadataImage before they are trusted: a snapshot downloaded from
the leader is vetted by the core (through `snapshot_check`) before anything of it is made
durable, and at start-up the log store passes over a snapshot file that does not decode. The
image that vetting built is handed to the MetadataService, so a snapshot is decoded once.
"""

from __future__ import annotations

import logging
import math
import random
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import cast

import trio

from raftlog.clock import wall_clock_ms
from raftlog.codec import DecodeError
from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode
from raftlog.metadata.image import MetadataImage
from raftlog.metadata.raft.core import RaftCore
from raftlog.metadata.raft.executor import execute_ready
from raftlog.metadata.raft.log_store import MetadataLogStore
from raftlog.metadata.raft.membership import MembershipRefused
from raftlog.metadata.raft.messages import (
    CODEC,
    AnyMessage,
    BeginQuorumEpoch,
    EndQuorumEpoch,
    Entry,
    Fetch,
    FetchSnapshot,
    Message,
    RaftCast,
    Vote,
)
from raftlog.metadata.raft.types import (
    NotLeader,
    ProtocolViolation,
    QuorumState,
    RaftConfig,
    RoleChange,
    Snapshot,
    SnapshotRejected,
)
from raftlog.metadata.raft.voters import Voter, VoterSet
from raftlog.metadata.snapshot import SnapshotCorruptError, decode_snapshot
from raftlog.metrics.instruments import RaftMetrics
from raftlog.net.rpc import PeerSet
from raftlog.storage.flusher import Flusher

log = logging.getLogger("raftlog.quorum")

# Non-voters (broker-only nodes) whose reply address this node keeps. A frame names its own
# sender id, so the table (and the connections and per-replica leader state behind it) is
# bounded; a cluster has far fewer brokers than this.
MAX_OBSERVER_COUNT = 1024
# A voter's fetch deadline is fetch_timeout_ms less up to this fraction of it (drawn anew at
# every answer from the leader): RaftConfig.fetch_timeout_jitter_ms. Kafka has no such key.
FETCH_TIMEOUT_JITTER_DIVISOR = 4


def fetch_timeout_jitter_ms(config: NodeConfig) -> int:
    """A quarter of fetch_timeout_ms: voters cut off from their leader at one moment time out
    hundreds of ms apart (far more than a pre-vote's round trip), so the first election is
    won, and at the earlier deadline: a voter grants a pre-vote once its leader has been
    silent for fetch_timeout_ms less this (still three long polls with the defaults).

    Never so much that a voter could time out before broker_session_timeout_ms: a new
    controller hands over the previous metadata leader's silence (controller/liveness.py) on
    the ground that electing it took at least fetch_timeout_ms less this of silence (at the
    new leader, whose own deadline it was, and at every voter that granted it), which must
    therefore cover the session that the cut-off leader's own broker lease still had to run."""
    quarter_ms = config.fetch_timeout_ms // FETCH_TIMEOUT_JITTER_DIVISOR
    return max(0, min(quarter_ms, config.fetch_timeout_ms - config.broker_session_timeout_ms))


# Refused raft messages are logged at most once per this interval (the rest are counted).
REFUSAL_LOG_INTERVAL_S = 10.0
# Messages a node that is not a voter may send: an observer fetches, it never votes or leads.
OBSERVER_MESSAGES = (Fetch, FetchSnapshot)


def refusal_reason(
    message: Message, sender_id: int, voters: Collection[int], epoch: int | None = None
) -> str | None:
    """Why a message from sender_id (the connection's node id) must not reach the core, or
    None. The ids a message names for its own sender must be that node. `voters` are the
    nodes this one knows as voters (bootstrap, snapshot and every VotersRecord in its log);
    `epoch` is this node's: an observer's fetch never moves it (the core would take any
    higher epoch it sees, and a forged one near the top would end elections for good)."""
    if sender_id not in voters:
        if not isinstance(message, OBSERVER_MESSAGES):
            return "the sender is not a voter"
        if epoch is not None and message.epoch > epoch:
            return "an observer's fetch names an epoch ahead of this node's"
    if isinstance(message, Vote):
        named = message.candidate_id
    elif isinstance(message, BeginQuorumEpoch | EndQuorumEpoch):
        named = message.leader_id
    elif isinstance(message, Fetch | FetchSnapshot):
        named = message.replica_id
    else:
        return None
    return None if named == sender_id else "it speaks for another node"


@dataclass
class _CommitWaiter:
    epoch: int
    done: trio.Event
    committed: bool = False


class QuorumDriver:
    """Runs one node's RaftCore against the store, the flusher and the internal RPC."""

    def __init__(
        self,
        config: NodeConfig,
        store: MetadataLogStore,
        flusher: Flusher,
        peers: PeerSet,
        *,
        on_commit: Callable[[list[Entry], int], None],
        on_snapshot: Callable[[Snapshot], None],
        on_role_change: Callable[[RoleChange], None],
        rng: random.Random | None = None,
        snapshot_decoder: Callable[[bytes], MetadataImage] = decode_snapshot,
        metrics: RaftMetrics | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.flusher = flusher
        self.peers = peers
        # The static controller_quorum_voters: the bootstrap voter set (until the log holds a
        # VotersRecord) and where a new node that is not a voter yet finds the leader.
        self.bootstrap_addresses = config.voters
        self._on_commit = on_commit
        self._on_snapshot = on_snapshot
        self._on_role_change = on_role_change
        self.metrics = metrics if metrics is not None else RaftMetrics.detached()
        self._observers: dict[int, tuple[str, int]] = {}
        self._internal_address = config.advertised_internal_address
        raft_config = RaftConfig(
            election_timeout_ms=config.election_timeout_ms,
            fetch_timeout_ms=config.fetch_timeout_ms,
            fetch_timeout_jitter_ms=fetch_timeout_jitter_ms(config),
            election_backoff_max_ms=config.election_backoff_max_ms,
            fetch_max_wait_ms=min(config.raft_fetch_max_wait_ms, config.fetch_timeout_ms // 2),
            request_timeout_ms=config.fetch_timeout_ms,
        )
        self._snapshot_decoder = snapshot_decoder
        # The image that vetting a snapshot built, until the MetadataService takes it.
        self._decoded: tuple[Snapshot, MetadataImage] | None = None
        snapshot, entries = store.recover(
            self._check_snapshot,
            node_id=config.node_id,
            is_voter=config.node_id in self.bootstrap_addresses,
        )
        self.core = RaftCore(
            node_id=config.node_id,
            voters=VoterSet.from_addresses(self.bootstrap_addresses),
            config=raft_config,
            persisted=store.load_quorum_state(),
            entries=entries,
            snapshot=snapshot,
            rng=rng or random.Random(),
            now_ms=self.now_ms(),
            snapshot_check=self._check_snapshot,
            directory_id=store.load_or_create_directory_id(),
        )
        self.high_watermark = self.core.high_watermark
        self._wake = trio.Event()
        self._flush_wanted = trio.Event()
        self._commit_waiters: dict[int, _CommitWaiter] = {}
        self._reads: dict[object, tuple[trio.Event, list[int | None]]] = {}
        self._refusal_log_at_s = -math.inf
        self._refusals_unlogged = 0
        peers.add_unreachable_listener(self._peer_unreachable)
        log.info(
            "metadata log loaded: start %d, end %d, snapshot %s, quorum state %s",
            store.log.log_start_offset,
            store.log.log_end_offset,
            snapshot.end_offset if snapshot else None,
            self.core.role,
        )

    @staticmethod
    def now_ms() -> int:
        return int(trio.current_time() * 1000)

    # ---------------------------------------------------------------- snapshot vetting
    def _check_snapshot(self, snapshot: Snapshot) -> str | None:
        """SnapshotCheck: decode the image now, before the snapshot is made durable or the
        log is touched; None if it can be applied, else why not."""
        try:
            image = self._snapshot_decoder(snapshot.data)
        except SnapshotCorruptError as exc:
            return exc.message
        if image.last_applied_offset >= snapshot.end_offset:
            return (
                f"its image is at offset {image.last_applied_offset}, beyond the snapshot's "
                f"end offset {snapshot.end_offset}"
            )
        self._decoded = (snapshot, image)
        return None

    def decoded_snapshot(self, snapshot: Snapshot) -> MetadataImage:
        """The image of a snapshot the core accepted, decoded once when it was vetted."""
        decoded, self._decoded = self._decoded, None
        if decoded is not None and (decoded[0] is snapshot or decoded[0] == snapshot):
            return decoded[1]
        return self._snapshot_decoder(snapshot.data)

    # ---------------------------------------------------------------- inputs
    def receive(self, sender_id: int, body: list) -> None:
        """RPC cast "raft": a RaftCast, [message wire, reply host, reply port].

        sender_id is the node id the connection is bound to (net/rpc.py) and the from_id the
        core sees; no field of the message can change it. A message from a node that is not
        a voter is refused here unless it is an observer's Fetch or FetchSnapshot, and so is
        one naming another node as its candidate, leader or replica: neither reaches the
        core, so a forged vote never moves this node's epoch."""
        try:
            received: RaftCast = CODEC.from_wire(RaftCast, body)
        except DecodeError as exc:
            log.warning("dropping malformed raft message from node %s: %s", sender_id, exc)
            return
        message = received.message
        # The leader this node follows is heard even when this node's log does not name it a
        # voter yet (a voter added by AddRaftVoter after this log's last VotersRecord): its
        # fetch answers are how that record arrives. Only a known voter's word (a fetch
        # answer or a vote naming it) makes a node the leader followed.
        heard = self.core.known_voter_ids()
        leader = self.core.leader_id
        if leader is not None and leader not in heard:
            heard = heard | {leader}
        refusal = refusal_reason(message, sender_id, heard, self.core.epoch)
        if refusal is not None:
            self._log_refusal(message, sender_id, refusal)
            return
        reply_address = (received.reply_host, received.reply_port)
        if sender_id not in self.core.voters:
            if sender_id not in self._observers and len(self._observers) >= MAX_OBSERVER_COUNT:
                log.warning(
                    "dropping raft message from node %s: already %d observers",
                    sender_id,
                    len(self._observers),
                )
                return
            self._observers[sender_id] = reply_address
        try:
            self.core.receive(now_ms=self.now_ms(), from_id=sender_id, message=message)
        except ProtocolViolation as exc:
            # A peer sending what no correct node sends must not take this node down.
            log.error(
                "ignoring raft message from node %s that breaks the protocol: %s", sender_id, exc
            )
            return
        self._wake.set()

    def _log_refusal(self, message: Message, sender_id: int, reason: str) -> None:
        # A flood of forged casts must not become a flood of log lines: one line per
        # interval, with the count of those left out.
        now_s = trio.current_time()
        if now_s < self._refusal_log_at_s:
            self._refusals_unlogged += 1
            return
        log.warning(
            "refusing raft %s from node %s: %s (%d more refused since the last such line)",
            type(message).__name__,
            sender_id,
            reason,
            self._refusals_unlogged,
        )
        self._refusals_unlogged = 0
        self._refusal_log_at_s = now_s + REFUSAL_LOG_INTERVAL_S

    def _peer_unreachable(self, peer_id: int) -> None:
        """A connect to peer_id was refused; if it is our leader, elect without waiting out
        the fetch timeout (a kill -9'd leader otherwise costs the whole fetch_timeout_ms)."""
        if peer_id != self.config.node_id and peer_id == self.core.leader_id:
            self.core.leader_unreachable(now_ms=self.now_ms(), leader_id=peer_id)
            self._wake.set()

    def propose(self, payload: bytes) -> tuple[int, int]:
        """Append one entry as leader; returns (offset, epoch). Raises NotLeader."""
        now_ms = self.now_ms()
        (offset,) = self.core.propose(now_ms=now_ms, payloads=[payload])
        self.metrics.proposed(offset, now_ms)
        self._wake.set()
        return offset, self.core.epoch

    async def wait_committed(self, offset: int, epoch: int) -> bool:
        """True once (offset, epoch) is committed; False if that entry was truncated away."""
        if self.high_watermark > offset:
            return True  # already delivered through on_commit (epoch checked by the caller)
        waiter = self._commit_waiters.setdefault(offset, _CommitWaiter(epoch, trio.Event()))
        if waiter.epoch != epoch:
            return False
        await waiter.done.wait()
        return waiter.committed

    async def read_index(self) -> int:
        """A linearizable read point: the leader's commit offset after confirming leadership."""
        token = object()
        done = trio.Event()
        slot: list[int | None] = [None]
        self._reads[token] = (done, slot)
        try:
            self.core.read_index(now_ms=self.now_ms(), token=token)
            self._wake.set()
            await done.wait()
        finally:
            self._reads.pop(token, None)
        if slot[0] is None:
            raise NotLeader(self.core.leader_id, self.core.epoch)
        return slot[0]

    # ---------------------------------------------------------------- membership (KIP-853)
    async def change_voters(self, change: Callable[[int], int], *, timeout_ms: int) -> None:
        """Run one voter change on the core (`change(now_ms)` appends the VotersRecord and
        returns its offset) and wait until it commits. Raises NotLeader, MembershipRefused
        (its Kafka code), or MembershipRefused(REQUEST_TIMED_OUT) when it has not committed
        within timeout_ms (it may still commit later, as in Kafka)."""
        offset = change(self.now_ms())
        epoch = self.core.epoch
        self._wake.set()
        with trio.move_on_after(max(timeout_ms, 0) / 1000):
            if await self.wait_committed(offset, epoch):
                log.info("metadata quorum: voters now %s", sorted(self.core.voters))
                return
            raise NotLeader(self.core.leader_id, self.core.epoch)
        raise MembershipRefused(
            ErrorCode.request_timed_out,
            f"the voter change at offset {offset} did not commit within {timeout_ms} ms",
        )

    async def add_voter(self, voter: Voter, *, timeout_ms: int) -> None:
        await self.change_voters(
            lambda now_ms: self.core.add_voter(now_ms=now_ms, voter=voter), timeout_ms=timeout_ms
        )

    async def remove_voter(
        self, voter_id: int, directory_id: uuid.UUID, *, timeout_ms: int
    ) -> None:
        await self.change_voters(
            lambda now_ms: self.core.remove_voter(
                now_ms=now_ms, voter_id=voter_id, directory_id=directory_id
            ),
            timeout_ms=timeout_ms,
        )

    async def update_voter(self, voter: Voter, *, timeout_ms: int) -> None:
        await self.change_voters(
            lambda now_ms: self.core.update_voter(now_ms=now_ms, voter=voter),
            timeout_ms=timeout_ms,
        )

    def snapshot_written(self, end_offset: int, epoch: int, data: bytes) -> Snapshot | None:
        """Tell the core; the Snapshot it now holds (with its voter set, KIP-853) to persist,
        or None when it already holds a newer one (installed from the leader meanwhile)."""
        self.core.snapshot_written(end_offset=end_offset, epoch=epoch, data=data)
        snapshot = self.core.snapshot
        return snapshot if snapshot is not None and snapshot.end_offset == end_offset else None

    def resign(self) -> bool:
        """Hand leadership over (EndQuorumEpoch); True if this node was the leader."""
        leading = self.core.role.name == "leader"
        self.core.resign(now_ms=self.now_ms())
        self._wake.set()
        return leading

    # ---------------------------------------------------------------- loop
    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # Connect to every other voter at once rather than on the first message: a cast to a
        # peer that is not connected yet is dropped, and the first pre-vote after a failover
        # (from a node that only ever talked to the old leader) must not be lost that way.
        for voter_id, address in self._voter_addresses().items():
            if voter_id != self.config.node_id:
                self.peers.peer(voter_id, *address)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._flush_loop)
            task_status.started()
            while True:
                await self._process_ready()
                deadline_s = self.core.next_deadline_ms() / 1000
                with trio.move_on_at(deadline_s):
                    await self._wake.wait()
                self._wake = trio.Event()
                self.core.tick(now_ms=self.now_ms())

    async def _flush_loop(self) -> None:
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted = trio.Event()
            started_s = trio.current_time()
            await self.flusher.flush(self.store.log, self.store.log.log_end_offset)
            self.metrics.log_flush.observe(trio.current_time() - started_s)
            # Report what storage says is durable: a truncation during the fsync lowers it.
            self.core.flushed(offset=self.store.log.flushed_offset)
            self._wake.set()

    async def _process_ready(self) -> None:
        await execute_ready(self.core.take_ready(), self)

    # ---------------------------------------------------------------- ReadyTarget
    # Called by execute_ready only, one method per step of the Ready contract.
    async def persist_quorum_state(self, state: QuorumState) -> None:
        await trio.to_thread.run_sync(self.store.save_quorum_state, state)

    def truncate(self, offset: int) -> None:
        self.store.truncate_to(offset)
        self._fail_waiters_from(offset)

    def append(self, entries: list[Entry]) -> None:
        # Storage time is wall-clock ms (segment.ms, record timestamps), as in Kafka.
        self.store.append(entries, wall_clock_ms())
        self._flush_wanted.set()

    async def install_snapshot(self, snapshot: Snapshot) -> None:
        # Only the snapshot file goes to a worker thread. The log itself is changed here,
        # on the event loop, like every other change to it: a flusher round or the
        # compaction after a local snapshot must never run against a log that a thread
        # is emptying at the same time.
        await trio.to_thread.run_sync(self.store.save_snapshot, snapshot)
        self.store.start_after_snapshot(snapshot)
        self._fail_waiters_from(0, below=snapshot.end_offset)
        self._on_snapshot(snapshot)

    def _voter_addresses(self) -> dict[int, tuple[str, int]]:
        """Raft addresses of the voters: the latest voter set's endpoints; the static config
        for a voter the set gives none (a bootstrap voter described by id alone)."""
        return {**self.bootstrap_addresses, **self.core.voter_set.addresses()}

    def address_of(self, node_id: int) -> tuple[str, int] | None:
        """Where this node reaches node_id's internal listener, if it knows."""
        return (
            self.core.voter_set.addresses().get(node_id)
            or self.bootstrap_addresses.get(node_id)
            or self._observers.get(node_id)
        )

    def send(self, to_id: int, message: Message) -> None:
        address = self.address_of(to_id)
        if address is None:
            return
        host, port = self._internal_address
        wire = CODEC.to_wire(RaftCast(cast(AnyMessage, message), host, port))
        self.peers.peer(to_id, *address).cast("raft", wire)

    def apply(self, committed: list[Entry], high_watermark: int) -> None:
        if committed:
            self.metrics.committed(committed, self.now_ms())
            self._on_commit(committed, high_watermark)
            for entry in committed:
                waiter = self._commit_waiters.pop(entry.offset, None)
                if waiter is not None:
                    waiter.committed = waiter.epoch == entry.epoch
                    waiter.done.set()
        self.high_watermark = high_watermark

    def answer_read(self, token: object, offset: int | None) -> None:
        pending = self._reads.get(token)
        if pending is not None:
            pending[1][0] = offset
            pending[0].set()

    def role_changed(self, change: RoleChange) -> None:
        log.info(
            "metadata quorum: %s in epoch %d, leader %s",
            change.role,
            change.epoch,
            change.leader_id,
        )
        self.metrics.role_changed(change.leader_id)
        self._on_role_change(change)

    def snapshot_refused(self, refused: SnapshotRejected) -> None:
        log.error(
            "node %d: refused metadata snapshot (end offset %d, epoch %d) from leader %s: %s; "
            "kept the metadata log (start %d, end %d) and the applied state, next snapshot "
            "download in %d ms at the earliest",
            self.config.node_id,
            refused.end_offset,
            refused.epoch,
            refused.leader_id,
            refused.reason,
            self.store.log.log_start_offset,
            self.store.log.log_end_offset,
            refused.retry_in_ms,
        )

    def _fail_waiters_from(self, offset: int, *, below: int | None = None) -> None:
        for waiter_offset in list(self._commit_waiters):
            if waiter_offset >= offset and (below is None or waiter_offset < below):
                waiter = self._commit_waiters.pop(waiter_offset)
                waiter.done.set()

    def close(self) -> None:
        for waiter in self._commit_waiters.values():
            waiter.done.set()
        self._commit_waiters.clear()
        self.store.close()
