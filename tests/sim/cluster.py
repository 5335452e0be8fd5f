"""Deterministic, seeded, event-driven simulator of a metadata quorum of RaftCore nodes.

One process, one priority queue of events keyed by simulated milliseconds (no fixed 1 ms
ticks: a node is ticked exactly at its next_deadline_ms). Every Ready goes through the same
executor as in the trio driver (raftlog.metadata.raft.executor), with an in-memory
`SimulatedIO` as its target. Everything random comes from one random.Random(seed), so a
seed replays exactly. The network drops, delays, duplicates, reorders (random delays) and
partitions; disks have a flushed and an unflushed part and a crash loses the latter.

The invariants of tests/sim/invariants.py are checked after every step (see docs/raft.md,
"The simulator"): a violation raises SimulationError whose message starts with the seed.
"""

from __future__ import annotations

import heapq
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from raftlog.metadata.raft.core import RaftCore
from raftlog.metadata.raft.executor import execute_ready_sync
from raftlog.metadata.raft.membership import MembershipRefused
from raftlog.metadata.raft.messages import Entry, Message, Vote, VoteResponse, message_from_wire
from raftlog.metadata.raft.types import (
    NotLeader,
    QuorumState,
    RaftConfig,
    RoleChange,
    Snapshot,
    SnapshotRejected,
)
from raftlog.metadata.raft.voters import NO_DIRECTORY_ID, RAFT_LISTENER_NAME, Endpoint, Voter
from tests.sim.invariants import Invariant, StepEffects, all_invariants

# Short timeouts keep simulated time cheap; their ratios are the production ones.
SIM_RAFT_CONFIG = RaftConfig(
    election_timeout_ms=400,
    fetch_timeout_ms=1500,
    fetch_timeout_jitter_ms=375,  # the driver's quarter of fetch_timeout_ms
    election_backoff_max_ms=400,
    fetch_max_wait_ms=700,
    max_fetch_entries=20,
    snapshot_chunk_bytes=64,  # small, so that snapshot transfer takes several chunks
    request_timeout_ms=500,
)


class SimulationError(AssertionError):
    """An invariant broke; the message names the seed that replays it."""


def chain_hash(previous: int, entry: Entry) -> int:
    """Running digest of a committed prefix (the simulated state machine's whole state)."""
    return zlib.crc32(entry.data, zlib.crc32(entry.epoch.to_bytes(8, "little"), previous))


@dataclass
class Disk:
    """One node's durable storage: quorum state, snapshot, log with a flushed prefix."""

    quorum_state: QuorumState = field(default_factory=QuorumState)
    snapshot: Snapshot | None = None
    log_start: int = 0
    log: list[Entry] = field(default_factory=list)
    durable_end: int = 0  # entries below this offset survive a crash
    generation: int = 0  # bumped by truncation/crash: older in-flight flushes are void
    flush_pending: bool = False

    @property
    def log_end(self) -> int:
        return self.log_start + len(self.log)


@dataclass
class Node:
    node_id: int
    disk: Disk = field(default_factory=Disk)
    core: RaftCore | None = None
    incarnation: int = 0
    tick_at: int | None = None
    sm_end: int = 0  # state machine: applied below this offset
    sm_hash: int = 0
    stats: dict[str, int] = field(
        default_factory=lambda: {"truncations": 0, "snapshots_installed": 0, "restarts": 0}
    )


@dataclass
class NetworkConfig:
    min_delay_ms: int = 1
    max_delay_ms: int = 20
    drop_probability: float = 0.0
    duplicate_probability: float = 0.0
    vote_drop_probability: float = 0.0  # extra loss for (pre-)vote traffic: split elections
    flush_max_delay_ms: int = 10


class Simulation:
    """A cluster of voters (+ observers) with a seeded network, disks and clients."""

    def __init__(
        self,
        seed: int,
        voters: int = 3,
        observers: int = 1,
        config: RaftConfig | None = None,
        network: NetworkConfig | None = None,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now_ms = 0
        self.config = config or SIM_RAFT_CONFIG
        self.network = network or NetworkConfig()
        self.voter_ids = frozenset(range(1, voters + 1))
        all_ids = range(1, voters + observers + 1)
        self.nodes: dict[int, Node] = {i: Node(i) for i in all_ids}
        self.blocked: set[tuple[int, int]] = set()
        self._queue: list[tuple[int, int, str, Any]] = []
        self._seq = 0
        # global truth
        self.committed: list[Entry] = []
        self.committed_hash: list[int] = [0]  # committed_hash[o] = digest of offsets < o
        self.payload_offset: dict[bytes, int] = {}
        self.pending_writes: dict[tuple[int, int, int], bytes] = {}  # (node, inc, off) -> data
        self.acked: dict[bytes, int] = {}
        self.proposed = 0
        self.pending_reads: dict[object, int] = {}  # token -> offset the answer must reach
        self.invariants: list[Invariant] = all_invariants()
        self.step = StepEffects()
        self.reads_answered = 0
        self.voter_changes: dict[str, int] = {"add": 0, "remove": 0, "refused": 0}
        self._read_tokens = 0
        self.messages_delivered = 0
        self.events = 0
        for node in self.nodes.values():
            self._start(node)
        self._end_step()

    # ------------------------------------------------------------------ failures

    def fail(self, what: str) -> None:
        raise SimulationError(
            f"seed={self.seed} (replay: RAFTLOG_SIM_SEED={self.seed}) t={self.now_ms}ms: {what}"
        )

    # ------------------------------------------------------------------ events

    def _end_step(self) -> None:
        """Check every invariant against what the step did, then start the next step."""
        step, self.step = self.step, StepEffects()
        for invariant in self.invariants:
            invariant.check(self, step)

    def schedule(self, at_ms: int, kind: str, payload: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at_ms, self._seq, kind, payload))

    def run_until(self, until_ms: int, stop: Callable[[], bool] | None = None) -> bool:
        """Process events up to until_ms (or until stop() is true); returns stop's verdict."""
        queue = self._queue
        while queue and queue[0][0] <= until_ms:
            at_ms, _, kind, payload = heapq.heappop(queue)
            self.now_ms = at_ms
            self.events += 1
            self._HANDLERS[kind](self, payload)
            self._end_step()
            if stop is not None and stop():
                return True
        self.now_ms = max(self.now_ms, until_ms)
        return stop() if stop is not None else False

    def _on_tick(self, payload: tuple[int, int]) -> None:
        node = self.nodes[payload[0]]
        if node.core is None or node.incarnation != payload[1] or node.tick_at != self.now_ms:
            return
        node.tick_at = None
        node.core.tick(now_ms=self.now_ms)
        self._drive(node)
        self.step.ticked.append(node)

    def _on_deliver(self, payload: tuple[int, int, bytes]) -> None:
        src, dst, data = payload
        node = self.nodes[dst]
        if node.core is None or (src, dst) in self.blocked:
            return
        message = message_from_wire(msgpack.unpackb(data))
        self.messages_delivered += 1
        node.core.receive(now_ms=self.now_ms, from_id=src, message=message)
        self._drive(node)

    def _on_flush(self, payload: tuple[int, int, int, int]) -> None:
        node_id, incarnation, generation, target = payload
        node = self.nodes[node_id]
        disk = node.disk
        if node.core is None or node.incarnation != incarnation:
            return
        if disk.generation != generation:
            return
        disk.flush_pending = False
        # An fsync covers what was written before it started, not what came after.
        disk.durable_end = max(disk.durable_end, min(target, disk.log_end))
        node.core.flushed(offset=disk.durable_end)
        self._maybe_schedule_flush(node)
        self._drive(node)

    def _maybe_schedule_flush(self, node: Node) -> None:
        disk = node.disk
        if disk.flush_pending or disk.durable_end >= disk.log_end:
            return
        disk.flush_pending = True
        delay_ms = self.rng.randint(0, self.network.flush_max_delay_ms)
        token = (node.node_id, node.incarnation, disk.generation, disk.log_end)
        self.schedule(self.now_ms + delay_ms, "flush", token)

    # ------------------------------------------------------------------ the driver

    def _drive(self, node: Node) -> None:
        """Execute the node's Ready (the driver's executor), then schedule its next tick."""
        core = node.core
        assert core is not None
        execute_ready_sync(core.take_ready(), SimulatedIO(self, node))
        deadline = max(core.next_deadline_ms(), self.now_ms)
        if node.tick_at is None or deadline < node.tick_at:
            node.tick_at = deadline
            self.schedule(deadline, "tick", (node.node_id, node.incarnation))

    def _send(self, src: int, dst: int, message: Message) -> None:
        net = self.network
        if (src, dst) in self.blocked or self.rng.random() < net.drop_probability:
            return
        if (
            net.vote_drop_probability
            and isinstance(message, Vote | VoteResponse)
            and self.rng.random() < net.vote_drop_probability
        ):
            return
        data = msgpack.packb(message.to_wire())
        copies = 2 if self.rng.random() < net.duplicate_probability else 1
        for _ in range(copies):
            delay_ms = self.rng.randint(net.min_delay_ms, net.max_delay_ms)
            self.schedule(self.now_ms + delay_ms, "deliver", (src, dst, data))

    # ------------------------------------------------------------------ faults and clients

    def _start(self, node: Node) -> None:
        disk = node.disk
        node.incarnation += 1
        node.tick_at = None
        node.core = RaftCore(
            node_id=node.node_id,
            voters=self.voter_ids,
            config=self.config,
            persisted=disk.quorum_state,
            entries=list(disk.log),
            snapshot=disk.snapshot,
            rng=random.Random(self.rng.getrandbits(64)),
            now_ms=self.now_ms,
        )
        if disk.snapshot is not None:
            node.sm_end, node.sm_hash = msgpack.unpackb(disk.snapshot.data)
        else:
            node.sm_end, node.sm_hash = 0, 0
        self._drive(node)

    def crash(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.core is None:
            return
        disk = node.disk
        del disk.log[max(disk.durable_end - disk.log_start, 0) :]
        disk.generation += 1
        disk.flush_pending = False
        node.core = None
        node.tick_at = None
        self._end_step()

    def restart(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.core is None:
            node.stats["restarts"] += 1
            self._start(node)
            self._end_step()

    def partition(self, groups: list[set[int]]) -> None:
        self.blocked = {(a, b) for g in groups for h in groups if g is not h for a in g for b in h}

    def isolate(self, node_id: int) -> None:
        rest = set(self.nodes) - {node_id}
        self.partition([{node_id}, rest])

    def heal(self) -> None:
        self.blocked = set()

    def propose(self, node_id: int, count: int = 1) -> list[int]:
        node = self.nodes[node_id]
        if node.core is None:
            return []
        payloads = []
        for _ in range(count):
            self.proposed += 1
            payloads.append(b"w%d" % self.proposed)
        try:
            offsets = node.core.propose(now_ms=self.now_ms, payloads=payloads)
        except NotLeader:
            return []
        for offset, data in zip(offsets, payloads, strict=True):
            self.pending_writes[(node_id, node.incarnation, offset)] = data
        self._drive(node)
        self._end_step()
        return offsets

    def take_snapshot(self, node_id: int, end_offset: int | None = None) -> bool:
        node = self.nodes[node_id]
        core = node.core
        if core is None or node.sm_end <= core.log_start:
            return False
        if end_offset is None:
            end_offset = self.rng.randint(core.log_start + 1, node.sm_end)
        end_offset = min(end_offset, node.sm_end)
        if end_offset <= core.log_start:
            return False
        epoch = self.committed[end_offset - 1].epoch
        data = msgpack.packb([end_offset, self.committed_hash[end_offset]])
        core.snapshot_written(end_offset=end_offset, epoch=epoch, data=data)
        disk = node.disk
        disk.snapshot = core.snapshot  # with the voter set in force at its end (KIP-853)
        cut = end_offset - disk.log_start
        if cut > 0:
            del disk.log[:cut]
            disk.log_start = end_offset
        disk.durable_end = max(disk.durable_end, end_offset)
        self._drive(node)
        self._end_step()
        return True

    def change_voters(
        self, node_id: int, *, add: int | None = None, remove: int | None = None
    ) -> bool:
        """Ask node_id (normally the leader) to add or remove one voter; True if it appended
        the change (which commits, or is truncated away, like any entry)."""
        node = self.nodes[node_id]
        core = node.core
        if core is None:
            return False
        try:
            if add is not None:
                # The simulator addresses nodes by id; the endpoint only has to exist.
                endpoint = Endpoint(RAFT_LISTENER_NAME, f"node{add}", 9000 + add)
                core.add_voter(now_ms=self.now_ms, voter=Voter(add, NO_DIRECTORY_ID, (endpoint,)))
            elif remove is not None:
                core.remove_voter(now_ms=self.now_ms, voter_id=remove)
            else:
                return False
        except (NotLeader, MembershipRefused):
            self.voter_changes["refused"] += 1
            return False
        self.voter_changes["add" if add is not None else "remove"] += 1
        self._drive(node)
        self._end_step()
        return True

    def resign(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.core is not None:
            node.core.resign(now_ms=self.now_ms)
            self._drive(node)
            self._end_step()

    def read(self, node_id: int) -> bool:
        """A linearizable read at node_id; its answer must cover every write acked before."""
        core = self.nodes[node_id].core
        if core is None:
            return False
        self._read_tokens += 1
        token = self._read_tokens
        try:
            core.read_index(now_ms=self.now_ms, token=token)
        except NotLeader:
            return False
        self.pending_reads[token] = max(self.acked.values(), default=-1) + 1
        self._drive(self.nodes[node_id])
        self._end_step()
        return True

    # ------------------------------------------------------------------ observation

    def leaders(self) -> list[int]:
        return [
            n.node_id
            for n in self.nodes.values()
            if n.core is not None and n.core.role.name == "leader"
        ]

    def core(self, node_id: int) -> RaftCore:
        core = self.nodes[node_id].core
        assert core is not None, f"node {node_id} is down"
        return core

    _HANDLERS: dict[str, Callable[[Simulation, Any], None]] = {
        "tick": _on_tick,
        "deliver": _on_deliver,
        "flush": _on_flush,
    }


class SimulatedIO:
    """The ReadyTarget of one simulated node: its in-memory disk, the simulated network and
    its state machine (a running digest of the committed prefix). What it does is recorded
    in the simulation's StepEffects for the invariants; the global truth (the committed log
    and its digests, acknowledged writes) is kept up to date here."""

    def __init__(self, sim: Simulation, node: Node) -> None:
        self.sim = sim
        self.node = node

    async def persist_quorum_state(self, state: QuorumState) -> None:
        self.node.disk.quorum_state = state  # durable at once: nothing is sent before it

    def truncate(self, offset: int) -> None:
        node, disk = self.node, self.node.disk
        node.stats["truncations"] += 1
        cut = max(offset - disk.log_start, 0)
        self.sim.step.truncated.append((node, disk.log[cut:]))
        del disk.log[cut:]
        disk.durable_end = min(disk.durable_end, disk.log_end)
        disk.generation += 1
        disk.flush_pending = False

    def append(self, entries: list[Entry]) -> None:
        disk = self.node.disk
        self.sim.step.appended.append((self.node, disk.log_end, entries))
        disk.log.extend(entries)
        self.sim._maybe_schedule_flush(self.node)

    def snapshot_refused(self, refused: SnapshotRejected) -> None:
        pass  # the simulator's snapshots are always accepted (no SnapshotCheck)

    async def install_snapshot(self, snapshot: Snapshot) -> None:
        node, disk = self.node, self.node.disk
        self.sim.step.installed.append((node, node.sm_end, snapshot))
        end, digest = msgpack.unpackb(snapshot.data)
        disk.snapshot = snapshot
        disk.log = []
        disk.log_start = end
        disk.durable_end = end
        disk.generation += 1
        disk.flush_pending = False
        node.sm_end, node.sm_hash = end, digest
        node.stats["snapshots_installed"] += 1

    def send(self, to_id: int, message: Message) -> None:
        self.sim._send(self.node.node_id, to_id, message)

    def apply(self, committed: list[Entry], high_watermark: int) -> None:
        sim, node = self.sim, self.node
        for entry in committed:
            sim.step.applied.append((node, node.sm_end, entry))
            o = entry.offset
            if o >= len(sim.committed):  # the first node to apply an offset defines it
                sim.committed.append(entry)
                sim.committed_hash.append(chain_hash(sim.committed_hash[-1], entry))
                sim.payload_offset[entry.data] = o
            node.sm_end = o + 1
            node.sm_hash = chain_hash(node.sm_hash, entry)
            written = sim.pending_writes.pop((node.node_id, node.incarnation, o), None)
            if written is not None and written == entry.data:
                sim.acked[written] = o

    def answer_read(self, token: object, offset: int | None) -> None:
        must_cover = self.sim.pending_reads.pop(token)  # type: ignore[call-overload]
        if offset is not None:
            self.sim.reads_answered += 1
        self.sim.step.reads.append((self.node, must_cover, offset))

    def role_changed(self, change: RoleChange) -> None:
        pass  # SingleLeaderPerEpoch looks at the roles after every step
