"""Transcript tests of the sans-IO Raft core (after etcd's raft testdata/): each file under
testdata/ drives a few RaftCores by hand and shows every message and every state change.
`pytest --rewrite` writes the actual output back.

Every Ready goes through the driver's executor (execute_ready) with an in-memory target that
prints what it is asked to do, in the contract's order:

    N: persist epoch=E voted-for=V leader=L     the quorum state made durable
    N: truncate to O / N: append O@E:data ...  the log changes (entries stay unflushed)
    N: install snapshot end=O epoch=E           a snapshot replaced the log
    N->M Message field=value ...                a message sent (queued until `deliver`)
    N: apply O..O hw=H                          committed entries reached the state machine
    N: read answered at O / N: becomes ROLE ... a read answered, a role change

Commands (one global clock, in ms; messages wait in flight until delivered):
    cluster voters=3                   start nodes 1..3 with empty logs at t=0
    tick node=N                        move the clock to N's next deadline and tick N
    deliver [from=N] [to=M]            deliver the messages in flight now (the receiver's
                                       reaction is indented under each one)
    drop [from=N] [to=M]               lose the messages in flight
    flush [node=N]                     make every appended entry durable (core.flushed)
    stabilize                          flush and deliver until nothing is in flight
    run ms=T                           let T ms pass: tick each node at its deadline, and
                                       stabilize after each tick (an instant network)
    propose node=N [data=x]            a client write at N
    snapshot node=N                    N snapshots everything it applied
    partition 1 2,3 / heal             messages between groups are lost when sent
    status                             each node's role, epoch, log (epochs), HW, flushed
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest

from raftlog.metadata.raft.core import RaftCore
from raftlog.metadata.raft.executor import execute_ready_sync
from raftlog.metadata.raft.messages import Entry, Message
from raftlog.metadata.raft.roles import Follower, Leader
from raftlog.metadata.raft.types import (
    QuorumState,
    RaftConfig,
    RoleChange,
    Snapshot,
    SnapshotRejected,
)
from tests.datadriven import Command, run_transcript

TESTDATA = Path(__file__).parent / "testdata"

CONFIG = RaftConfig(
    election_timeout_ms=100,
    fetch_timeout_ms=300,
    election_backoff_max_ms=100,
    fetch_max_wait_ms=50,
    request_timeout_ms=200,
    snapshot_chunk_bytes=16,  # small, so that a snapshot travels in several chunks
)
NO_OP = CONFIG.leader_change_payload
MAX_STABILIZE_ROUNDS = 100
MAX_RUN_TICKS = 1000


def _entry(entry: Entry) -> str:
    data = "noop" if entry.data == NO_OP else entry.data.decode()
    return f"{entry.offset}@{entry.epoch}:{data}"


def _value(value: Any) -> str:
    if isinstance(value, Entry):
        return _entry(value)
    if isinstance(value, bytes):
        return f"{len(value)}B"
    if isinstance(value, tuple):
        return "[" + " ".join(_value(v) for v in value) + "]"
    if dataclasses.is_dataclass(value):
        fields = dataclasses.fields(value)
        return "{" + " ".join(f"{f.name}={_value(getattr(value, f.name))}" for f in fields) + "}"
    return str(value)


def format_message(message: Message) -> str:
    """`Name field=value ...`, leaving out fields that hold their default."""
    parts = [type(message).__name__]
    for f in dataclasses.fields(message):  # type: ignore[arg-type]
        value = getattr(message, f.name)
        if f.default is not dataclasses.MISSING and value == f.default:
            continue
        parts.append(f"{f.name}={_value(value)}")
    return " ".join(parts)


class TranscriptNode:
    """One node's in-memory disk and state machine; the ReadyTarget that prints each step."""

    def __init__(self, cluster: Cluster, node_id: int, voters: frozenset[int]) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.core = RaftCore(
            node_id=node_id,
            voters=voters,
            config=CONFIG,
            persisted=QuorumState(),
            rng=random.Random(node_id),
            now_ms=cluster.now_ms,
        )
        self.log_start = 0
        self.log: list[Entry] = []
        self.flushed = 0
        self.applied = 0
        self.out: list[str] = []

    def drive(self) -> list[str]:
        """Execute the core's Ready; the lines it printed."""
        self.out = []
        execute_ready_sync(self.core.take_ready(), self)
        return self.out

    def say(self, line: str) -> None:
        self.out.append(f"{self.node_id}: {line}")

    # ReadyTarget
    async def persist_quorum_state(self, state: QuorumState) -> None:
        self.say(
            f"persist epoch={state.epoch} voted-for={state.voted_for} leader={state.leader_id}"
        )

    def truncate(self, offset: int) -> None:
        del self.log[offset - self.log_start :]
        self.flushed = min(self.flushed, offset)
        self.say(f"truncate to {offset}")

    def append(self, entries: list[Entry]) -> None:
        self.log.extend(entries)
        self.say("append " + " ".join(_entry(e) for e in entries))

    def snapshot_refused(self, refused: SnapshotRejected) -> None:
        self.say(f"refused snapshot end={refused.end_offset}: {refused.reason}")

    async def install_snapshot(self, snapshot: Snapshot) -> None:
        self.log_start = self.flushed = self.applied = snapshot.end_offset
        self.log = []
        self.say(f"install snapshot end={snapshot.end_offset} epoch={snapshot.epoch}")

    def send(self, to_id: int, message: Message) -> None:
        line = f"{self.node_id}->{to_id} {format_message(message)}"
        if self.cluster.cut(self.node_id, to_id):
            line += " (lost: partitioned)"
        else:
            self.cluster.in_flight.append((self.node_id, to_id, message))
        self.out.append(line)

    def apply(self, committed: list[Entry], high_watermark: int) -> None:
        if committed:
            self.applied = committed[-1].offset + 1
            first, last = committed[0].offset, committed[-1].offset
            self.say(f"apply {first}..{last} hw={high_watermark}")

    def answer_read(self, token: object, offset: int | None) -> None:
        self.say(f"read answered at {offset}")

    def role_changed(self, change: RoleChange) -> None:
        self.say(f"becomes {change.role} in epoch {change.epoch}, leader {change.leader_id}")

    def status(self) -> str:
        core = self.core
        role = core.role
        voted = role.quorum_state(self.node_id).voted_for
        epochs = " ".join(str(e.epoch) for e in self.log)
        start = f"{self.log_start}:" if self.log_start else ""
        extra = ""
        if isinstance(role, Follower | Leader):
            extra = f" leader={core.leader_id}"
        return (
            f"{self.node_id}: {role.name} epoch={role.epoch}{extra} voted-for={voted} "
            f"log={start}[{epochs}] hw={core.high_watermark} flushed={self.flushed}"
        )


class Cluster:
    """The harness: nodes, one clock, the messages in flight and the partition."""

    def __init__(self) -> None:
        self.now_ms = 0
        self.nodes: dict[int, TranscriptNode] = {}
        self.in_flight: list[tuple[int, int, Message]] = []
        self.groups: list[set[int]] = []

    def cut(self, src: int, dst: int) -> bool:
        return any(src in g and dst not in g for g in self.groups)

    def handle(self, command: Command) -> str:
        return "\n".join(getattr(self, "_" + command.name)(command))

    def _cluster(self, command: Command) -> list[str]:
        voters = frozenset(range(1, command.int_arg("voters") + 1))
        self.nodes = {i: TranscriptNode(self, i, voters) for i in sorted(voters)}
        lines: list[str] = []
        for node in self.nodes.values():
            lines += node.drive()
        return lines + self._status(command)

    def _tick(self, command: Command) -> list[str]:
        node = self.nodes[command.int_arg("node")]
        self.now_ms = max(self.now_ms, node.core.next_deadline_ms())
        node.core.tick(now_ms=self.now_ms)
        return [f"t={self.now_ms}ms", *node.drive()]

    def _matching(self, command: Command) -> list[tuple[int, int, Message]]:
        src, dst = command.int_arg("from", 0), command.int_arg("to", 0)
        return [m for m in self.in_flight if src in (0, m[0]) and dst in (0, m[1])]

    def _deliver(self, command: Command) -> list[str]:
        lines: list[str] = []
        for src, dst, message in self._matching(command):
            self.in_flight.remove((src, dst, message))
            lines.append(f"{src}->{dst} {format_message(message)}")
            if self.cut(src, dst):
                lines[-1] += " (lost: partitioned)"
                continue
            node = self.nodes[dst]
            node.core.receive(now_ms=self.now_ms, from_id=src, message=message)
            lines += ["  " + line for line in node.drive()]
        return lines

    def _drop(self, command: Command) -> list[str]:
        dropped = self._matching(command)
        for m in dropped:
            self.in_flight.remove(m)
        return [f"{src}->{dst} {format_message(m)} (dropped)" for src, dst, m in dropped]

    def _flush(self, command: Command) -> list[str]:
        node_id = command.int_arg("node", 0)
        lines: list[str] = []
        for node in self.nodes.values():
            end = node.log_start + len(node.log)
            if node_id in (0, node.node_id) and node.flushed < end:
                node.flushed = end
                lines.append(f"{node.node_id}: flushed to {end}")
                node.core.flushed(offset=end)
                lines += node.drive()
        return lines

    def _stabilize(self, command: Command) -> list[str]:
        everything = Command("all")
        lines: list[str] = []
        for _ in range(MAX_STABILIZE_ROUNDS):
            round_lines = self._flush(everything) + self._deliver(everything)
            if not round_lines:
                return lines
            lines += round_lines
        raise AssertionError(f"line {command.line_number}: not stable after many rounds")

    def _run(self, command: Command) -> list[str]:
        end_ms = self.now_ms + command.int_arg("ms")
        lines = self._stabilize(command)
        for _ in range(MAX_RUN_TICKS):
            due_ms = min(node.core.next_deadline_ms() for node in self.nodes.values())
            if due_ms > end_ms:
                self.now_ms = end_ms
                return lines
            self.now_ms = max(self.now_ms, due_ms)
            lines.append(f"t={self.now_ms}ms")
            for node in self.nodes.values():
                if node.core.next_deadline_ms() <= self.now_ms:
                    node.core.tick(now_ms=self.now_ms)
                    lines += node.drive()
            lines += self._stabilize(command)
        raise AssertionError(f"line {command.line_number}: more than {MAX_RUN_TICKS} ticks")

    def _propose(self, command: Command) -> list[str]:
        node = self.nodes[command.int_arg("node")]
        data = command.args.get("data", "x").encode()
        offsets = node.core.propose(now_ms=self.now_ms, payloads=[data])
        return [f"{node.node_id}: proposed at {offsets[0]}", *node.drive()]

    def _snapshot(self, command: Command) -> list[str]:
        node = self.nodes[command.int_arg("node")]
        end = node.applied
        epoch = node.log[end - 1 - node.log_start].epoch
        data = b"the state of offsets 0 to %d" % (end - 1)
        node.core.snapshot_written(end_offset=end, epoch=epoch, data=data)
        del node.log[: end - node.log_start]
        node.log_start = end
        return [f"{node.node_id}: snapshot end={end} epoch={epoch}", *node.drive()]

    def _partition(self, command: Command) -> list[str]:
        self.groups = [{int(i) for i in word.split(",")} for word in command.words]
        return []

    def _heal(self, command: Command) -> list[str]:
        self.groups = []
        return []

    def _status(self, command: Command) -> list[str]:
        return [node.status() for node in self.nodes.values()]


@pytest.mark.parametrize("path", sorted(TESTDATA.glob("*.txt")), ids=lambda p: p.stem)
def test_raft_transcript(path: Path, rewrite: bool) -> None:
    run_transcript(path, Cluster().handle, rewrite=rewrite)
