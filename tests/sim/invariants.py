"""The metadata-quorum simulator's invariants, one named class each (after Kafka's
RaftEventSimulationTest): every one is checked after every step of the simulation.

A step is one event (a tick, a delivery, a flush) or one client or fault action. What the
nodes' drivers did during it is collected in `StepEffects`; an invariant judges those effects
and the cluster's state after the step, keeping whatever history it needs itself. A violation
goes through `Simulation.fail`, whose message starts with the seed that replays it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgpack

from raftlog.metadata.raft.membership import voters_of
from raftlog.metadata.raft.messages import Entry
from raftlog.metadata.raft.roles import Leader
from raftlog.metadata.raft.types import Snapshot
from raftlog.metadata.raft.voters import VoterSet, is_voters_record

if TYPE_CHECKING:
    from tests.sim.cluster import Node, Simulation


@dataclass
class StepEffects:
    """What the simulated drivers carried out during one step (in order per list)."""

    ticked: list[Node] = field(default_factory=list)
    truncated: list[tuple[Node, list[Entry]]] = field(default_factory=list)  # entries removed
    appended: list[tuple[Node, int, list[Entry]]] = field(default_factory=list)  # log end before
    installed: list[tuple[Node, int, Snapshot]] = field(default_factory=list)  # applied before
    applied: list[tuple[Node, int, Entry]] = field(default_factory=list)  # applied end before
    reads: list[tuple[Node, int, int | None]] = field(default_factory=list)  # must cover, answer


class Invariant:
    """A property of the cluster that must hold after every step."""

    def check(self, sim: Simulation, step: StepEffects) -> None:
        raise NotImplementedError

    def fail(self, sim: Simulation, what: str) -> None:
        sim.fail(f"{type(self).__name__}: {what}")


def live_nodes(sim: Simulation) -> list[Node]:
    return [node for node in sim.nodes.values() if node.core is not None]


class SingleLeaderPerEpoch(Invariant):
    """At most one node ever leads a given epoch."""

    def __init__(self) -> None:
        self.leader_of_epoch: dict[int, int] = {}

    def check(self, sim: Simulation, step: StepEffects) -> None:
        for node in live_nodes(sim):
            role = node.core.role if node.core is not None else None
            if isinstance(role, Leader):
                first = self.leader_of_epoch.setdefault(role.epoch, node.node_id)
                if first != node.node_id:
                    self.fail(sim, f"two leaders in epoch {role.epoch}: {first} and {node.node_id}")


class MonotonicHighWatermark(Invariant):
    """A node's high watermark never goes back within one incarnation (it is not persisted,
    so a restart starts over from the snapshot end)."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[int, int]] = {}  # node -> (incarnation, HW)

    def check(self, sim: Simulation, step: StepEffects) -> None:
        for node in live_nodes(sim):
            assert node.core is not None
            hw = node.core.high_watermark
            incarnation, last_hw = self.last.get(node.node_id, (node.incarnation, hw))
            if incarnation == node.incarnation and hw < last_hw:
                self.fail(sim, f"node {node.node_id} HW went back {last_hw} -> {hw}")
            self.last[node.node_id] = (node.incarnation, hw)


class AppliedCoversHighWatermark(Invariant):
    """Everything below a node's high watermark has reached its state machine."""

    def check(self, sim: Simulation, step: StepEffects) -> None:
        for node in live_nodes(sim):
            assert node.core is not None
            if node.sm_end < node.core.high_watermark:
                hw = node.core.high_watermark
                self.fail(sim, f"node {node.node_id} applied {node.sm_end} < HW {hw}")


class AppliesInOrder(Invariant):
    """A node applies offsets consecutively, each exactly once per incarnation."""

    def check(self, sim: Simulation, step: StepEffects) -> None:
        for node, applied_end, entry in step.applied:
            if entry.offset != applied_end:
                self.fail(
                    sim,
                    f"node {node.node_id} applies offset {entry.offset}, expected {applied_end}",
                )


class CommittedEntriesIdentical(Invariant):
    """Every entry any node applies equals the one committed at that offset, so committed
    logs are identical everywhere (the first node to apply an offset defines it)."""

    def check(self, sim: Simulation, step: StepEffects) -> None:
        for node, _, entry in step.applied:
            committed = sim.committed[entry.offset]
            if committed != entry:
                self.fail(sim, f"node {node.node_id} commits {entry} but {committed} was")


class CommittedPayloadsUnique(Invariant):
    """No client payload is committed at two offsets (the per-epoch no-op is exempt)."""

    def __init__(self) -> None:
        self.checked_end = 0
        self.offset_of: dict[bytes, int] = {}

    def check(self, sim: Simulation, step: StepEffects) -> None:
        no_op = sim.config.leader_change_payload
        for entry in sim.committed[self.checked_end :]:
            if is_voters_record(entry.data):
                continue  # a voter set may come back (remove a node, add it again)
            if entry.data != no_op and entry.data in self.offset_of:
                self.fail(sim, f"payload {entry.data!r} committed twice")
            self.offset_of[entry.data] = entry.offset
        self.checked_end = len(sim.committed)


class NoCommittedEntryTruncated(Invariant):
    """No node truncates a committed entry from its log (a crash may lose an unflushed one:
    the majority that committed it still has it)."""

    def check(self, sim: Simulation, step: StepEffects) -> None:
        committed = sim.committed
        for node, removed in step.truncated:
            for entry in removed:
                if entry.offset < len(committed) and committed[entry.offset] == entry:
                    self.fail(sim, f"node {node.node_id} truncates committed entry {entry}")


class AppendsExtendTheLog(Invariant):
    """Entries are appended exactly at the log end."""

    def check(self, sim: Simulation, step: StepEffects) -> None:
        for node, log_end, entries in step.appended:
            if entries[0].offset != log_end:
                self.fail(sim, f"node {node.node_id} appends {entries[0]} at {log_end}")


class SnapshotsHoldCommittedPrefix(Invariant):
    """An installed snapshot holds exactly the committed prefix it claims, and never takes
    a node's state machine back."""

    def check(self, sim: Simulation, step: StepEffects) -> None:
        for node, applied_end, snapshot in step.installed:
            end, digest = msgpack.unpackb(snapshot.data)
            if end != snapshot.end_offset or end > len(sim.committed):
                self.fail(
                    sim, f"node {node.node_id} installs a snapshot of uncommitted data {snapshot}"
                )
            if digest != sim.committed_hash[end]:
                self.fail(sim, f"node {node.node_id} installs a snapshot that differs from the log")
            if end < applied_end:
                self.fail(sim, f"node {node.node_id} snapshot {end} behind applied {applied_end}")


class ReadsLinearizable(Invariant):
    """A read answers with an offset covering every write acknowledged before the read was
    issued, and never beyond what is committed."""

    def check(self, sim: Simulation, step: StepEffects) -> None:
        for node, must_cover, offset in step.reads:
            if offset is None:
                continue  # leadership lost: the client retries elsewhere
            if offset < must_cover:
                self.fail(
                    sim,
                    f"node {node.node_id} read at {offset} misses writes acked below {must_cover}",
                )
            if offset > len(sim.committed):
                self.fail(sim, f"node {node.node_id} read at {offset} beyond anything committed")


class DeadlinesAdvance(Invariant):
    """A tick moves a node's next deadline into the future: the driver never busy-loops."""

    def check(self, sim: Simulation, step: StepEffects) -> None:
        for node in step.ticked:
            if node.core is not None and node.core.next_deadline_ms() <= sim.now_ms:
                self.fail(
                    sim,
                    f"node {node.node_id} deadline did not advance after tick: {node.core.role}",
                )


class VoterSetAgreed(Invariant):
    """KIP-853: every node's voter set for its committed prefix is the one the committed log
    says (the bootstrap set, then each committed VotersRecord); a leader is a voter unless the
    change removing it is still uncommitted; and no log holds more than one voter change past
    what is committed (one change at a time)."""

    def __init__(self) -> None:
        self.checked_end = 0
        self.changes: list[tuple[int, VoterSet]] = []  # committed VotersRecords by offset

    def truth_at(self, sim: Simulation, end_offset: int) -> VoterSet:
        voters = VoterSet.of_ids(sim.voter_ids)
        for offset, record in self.changes:
            if offset < end_offset:
                voters = record
        return voters

    def check(self, sim: Simulation, step: StepEffects) -> None:
        for entry in sim.committed[self.checked_end :]:
            record = voters_of(entry)
            if record is not None:
                self.changes.append((entry.offset, record))
        self.checked_end = len(sim.committed)
        committed = sim.committed
        for node in live_nodes(sim):
            core = node.core
            assert core is not None
            hw = core.high_watermark
            if core.voters_at(hw).ids != self.truth_at(sim, hw).ids:
                self.fail(
                    sim,
                    f"node {node.node_id} has voters {sorted(core.voters_at(hw).ids)} at its "
                    f"HW {hw}, the committed log says {sorted(self.truth_at(sim, hw).ids)}",
                )
            leading = isinstance(core.role, Leader)
            if leading and not core.is_voter and not core.voter_change_pending:
                self.fail(sim, f"node {node.node_id} leads without being a voter")
            pending = [
                e.offset
                for e in core.entries()
                if is_voters_record(e.data)
                and (e.offset >= len(committed) or committed[e.offset] != e)
            ]
            if len(pending) > 1:
                self.fail(sim, f"node {node.node_id} holds uncommitted voter changes at {pending}")


def all_invariants() -> list[Invariant]:
    """Fresh instances, in checking order: AppliesInOrder comes before the checks that
    index the committed log by the offsets applied."""
    return [
        SingleLeaderPerEpoch(),
        MonotonicHighWatermark(),
        AppliedCoversHighWatermark(),
        AppliesInOrder(),
        CommittedEntriesIdentical(),
        CommittedPayloadsUnique(),
        NoCommittedEntryTruncated(),
        AppendsExtendTheLog(),
        SnapshotsHoldCommittedPrefix(),
        ReadsLinearizable(),
        DeadlinesAdvance(),
        VoterSetAgreed(),
    ]
