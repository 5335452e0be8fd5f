"""Deterministic, seeded, event-driven simulator of a metadata quorum of RaftCore nodes.

One process, one priority queue of events keyed by simulated milliseconds (no fixed 1 ms
ticks: a node is ticked exactly at its next_deadline_ms). The simulated driver executes every
Ready in the contract's order. Everything random comes from one random.Random(seed), so a
seed replays exactly. The network drops, delays, duplicates, reorders (random delays) and
partitions; disks have a flushed and an unflushed part and a crash loses the latter.

Invariants are checked while events are processed (see docs/raft.md, "The simulator"):
a violation raises SimulationError whose message starts with the seed.
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
from raftlog.metadata.raft.messages import Entry, Message, Vote, VoteResponse, message_from_wire
from raftlog.metadata.raft.types import NotLeader, QuorumState, RaftConfig, Snapshot

# Short timeouts keep simulated time cheap; their ratios are the production ones.
SIM_RAFT_CONFIG = RaftConfig(
    election_timeout_ms=400,
    fetch_timeout_ms=1500,
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
    last_hw: int = 0
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
        self.leader_of_epoch: dict[int, int] = {}
        self.pending_writes: dict[tuple[int, int, int], bytes] = {}  # (node, inc, off) -> data
        self.acked: dict[bytes, int] = {}
        self.proposed = 0
        self.pending_reads: dict[object, int] = {}  # token -> offset the answer must reach
        self.reads_answered = 0
        self._read_tokens = 0
        self.messages_delivered = 0
        self.events = 0
        for node in self.nodes.values():
            self._start(node)

    # ------------------------------------------------------------------ failures

    def fail(self, what: str) -> None:
        raise SimulationError(
            f"seed={self.seed} (replay: RAFTLOG_SIM_SEED={self.seed}) t={self.now_ms}ms: {what}"
        )

    # ------------------------------------------------------------------ events

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
            if stop is not None and stop():
                return True
        self.now_ms = max(self.now_ms, until_ms)
        return stop() if stop is not None else False

    def _on_tick(self, payload: tuple[int, int]) -> None:
        node = self.nodes[payload[0]]
        if node.core is None or node.incarnation != payload[1] or node.tick_at != self.now_ms:
            return
        node.tick_at = None
        node.core.tick(self.now_ms)
        self._drive(node)
        if node.core.next_deadline_ms() <= self.now_ms:
            self.fail(f"node {node.node_id} deadline did not advance after tick: {node.core.role}")

    def _on_deliver(self, payload: tuple[int, int, bytes]) -> None:
        src, dst, data = payload
        node = self.nodes[dst]
        if node.core is None or (src, dst) in self.blocked:
            return
        message = message_from_wire(msgpack.unpackb(data))
        self.messages_delivered += 1
        node.core.receive(self.now_ms, src, message)
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
        node.core.flushed(disk.durable_end)
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
        """Execute the node's Ready in the contract's order, checking invariants on the way."""
        core = node.core
        assert core is not None
        disk = node.disk
        ready = core.take_ready()
        if ready.quorum_state is not None:
            disk.quorum_state = ready.quorum_state  # fsynced before anything is sent
        if ready.truncate_to is not None:
            self._disk_truncate(node, ready.truncate_to)
        if ready.entries:
            if ready.entries[0].offset != disk.log_end:
                self.fail(f"node {node.node_id} appends {ready.entries[0]} at {disk.log_end}")
            disk.log.extend(ready.entries)
            self._maybe_schedule_flush(node)
        if ready.snapshot is not None:
            self._install_snapshot(node, ready.snapshot)
        for to_id, message in ready.messages:
            self._send(node.node_id, to_id, message)
        for entry in ready.committed:
            self._apply(node, entry)
        if ready.high_watermark < node.last_hw:
            self.fail(f"node {node.node_id} HW went back {node.last_hw} -> {ready.high_watermark}")
        node.last_hw = ready.high_watermark
        if node.sm_end < ready.high_watermark:
            self.fail(f"node {node.node_id} applied {node.sm_end} < HW {ready.high_watermark}")
        for token, offset in ready.reads:
            self._check_read(node, token, offset)
        change = ready.role_change
        if change is not None and change.role == "leader":
            first = self.leader_of_epoch.setdefault(change.epoch, node.node_id)
            if first != node.node_id:
                self.fail(f"two leaders in epoch {change.epoch}: {first} and {node.node_id}")
        deadline = max(core.next_deadline_ms(), self.now_ms)
        if node.tick_at is None or deadline < node.tick_at:
            node.tick_at = deadline
            self.schedule(deadline, "tick", (node.node_id, node.incarnation))

    def _disk_truncate(self, node: Node, offset: int) -> None:
        disk = node.disk
        node.stats["truncations"] += 1
        cut = max(offset - disk.log_start, 0)
        for entry in disk.log[cut:]:
            o = entry.offset
            if o < len(self.committed) and self.committed[o] == entry:
                self.fail(f"node {node.node_id} truncates committed entry {entry}")
        del disk.log[cut:]
        disk.durable_end = min(disk.durable_end, disk.log_end)
        disk.generation += 1
        disk.flush_pending = False

    def _install_snapshot(self, node: Node, snapshot: Snapshot) -> None:
        end, digest = msgpack.unpackb(snapshot.data)
        if end != snapshot.end_offset or end > len(self.committed):
            self.fail(f"node {node.node_id} installs a snapshot of uncommitted data {snapshot}")
        if digest != self.committed_hash[end]:
            self.fail(f"node {node.node_id} installs a snapshot that differs from the log")
        if end < node.sm_end:
            self.fail(f"node {node.node_id} snapshot {end} behind applied {node.sm_end}")
        disk = node.disk
        disk.snapshot = snapshot
        disk.log = []
        disk.log_start = end
        disk.durable_end = end
        disk.generation += 1
        disk.flush_pending = False
        node.sm_end, node.sm_hash = end, digest
        node.stats["snapshots_installed"] += 1

    def _apply(self, node: Node, entry: Entry) -> None:
        o = entry.offset
        if o != node.sm_end:
            self.fail(f"node {node.node_id} applies offset {o}, expected {node.sm_end}")
        if o < len(self.committed):
            if self.committed[o] != entry:
                self.fail(f"node {node.node_id} commits {entry} but {self.committed[o]} was")
        else:
            if (
                entry.data in self.payload_offset
                and entry.data != self.config.leader_change_payload
            ):
                self.fail(f"payload {entry.data!r} committed twice")
            self.committed.append(entry)
            self.committed_hash.append(chain_hash(self.committed_hash[-1], entry))
            self.payload_offset[entry.data] = o
        node.sm_end = o + 1
        node.sm_hash = chain_hash(node.sm_hash, entry)
        written = self.pending_writes.pop((node.node_id, node.incarnation, o), None)
        if written is not None and written == entry.data:
            self.acked[written] = o

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
            node.node_id,
            self.voter_ids,
            self.config,
            disk.quorum_state,
            list(disk.log),
            disk.snapshot,
            rng=random.Random(self.rng.getrandbits(64)),
            now_ms=self.now_ms,
        )
        if disk.snapshot is not None:
            node.sm_end, node.sm_hash = msgpack.unpackb(disk.snapshot.data)
        else:
            node.sm_end, node.sm_hash = 0, 0
        node.last_hw = node.sm_end
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

    def restart(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.core is None:
            node.stats["restarts"] += 1
            self._start(node)

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
            offsets = node.core.propose(self.now_ms, payloads)
        except NotLeader:
            return []
        for offset, data in zip(offsets, payloads, strict=True):
            self.pending_writes[(node_id, node.incarnation, offset)] = data
        self._drive(node)
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
        core.snapshot_written(end_offset, epoch, data)
        disk = node.disk
        disk.snapshot = Snapshot(end_offset, epoch, data)
        cut = end_offset - disk.log_start
        if cut > 0:
            del disk.log[:cut]
            disk.log_start = end_offset
        disk.durable_end = max(disk.durable_end, end_offset)
        self._drive(node)
        return True

    def resign(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.core is not None:
            node.core.resign(self.now_ms)
            self._drive(node)

    def read(self, node_id: int) -> bool:
        """A linearizable read at node_id; its answer must cover every write acked before."""
        core = self.nodes[node_id].core
        if core is None:
            return False
        self._read_tokens += 1
        token = self._read_tokens
        try:
            core.read_index(self.now_ms, token)
        except NotLeader:
            return False
        self.pending_reads[token] = max(self.acked.values(), default=-1) + 1
        self._drive(self.nodes[node_id])
        return True

    def _check_read(self, node: Node, token: object, offset: int | None) -> None:
        must_cover = self.pending_reads.pop(token)  # type: ignore[call-overload]
        if offset is None:
            return  # leadership lost: the client retries elsewhere
        self.reads_answered += 1
        if offset < must_cover:
            self.fail(
                f"node {node.node_id} read at {offset} misses writes acked below {must_cover}"
            )
        if offset > len(self.committed):
            self.fail(f"node {node.node_id} read at {offset} beyond anything committed")

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
