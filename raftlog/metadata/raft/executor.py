"""The one executor of a Raft core's `Ready`, shared by the trio driver and the simulator.

`execute_ready` walks a Ready in the order the contract fixes (docs/raft.md, "The Ready
contract"): persist the quorum state, truncate, append, install (or report a refused)
snapshot, send, apply, then answer reads and report the role change. What each step does to
disk, network and state machine is the `ReadyTarget`'s business: the trio driver writes
files and casts RPCs, the simulator changes its in-memory disks and queues messages.

The two steps that make something durable are coroutines, so a real target can wait for an
fsync off the event loop while the order still holds. An in-memory target never suspends
in them; `execute_ready_sync` runs the same coroutine to its end without an event loop.
No trio here, no I/O: this module stays as sans-IO as the core.
"""

from __future__ import annotations

from typing import Protocol

from raftlog.metadata.raft.messages import Entry, Message
from raftlog.metadata.raft.types import (
    QuorumState,
    Ready,
    RoleChange,
    Snapshot,
    SnapshotRejected,
)

__all__ = ["ReadyTarget", "execute_ready", "execute_ready_sync"]


class ReadyTarget(Protocol):
    """Where a Ready's effects land; one method per step of the contract, called in order."""

    async def persist_quorum_state(self, state: QuorumState) -> None:
        """Make the epoch / vote / leader durable: every later step may reflect it."""

    def truncate(self, offset: int) -> None:
        """Remove every entry at or above offset."""

    def append(self, entries: list[Entry]) -> None:
        """Write entries after the log end and start a flush (reported as core.flushed)."""

    def snapshot_refused(self, refused: SnapshotRejected) -> None:
        """A downloaded snapshot failed its check; the core kept its log: only report it."""

    async def install_snapshot(self, snapshot: Snapshot) -> None:
        """Make the snapshot durable; it replaces the whole log."""

    def send(self, to_id: int, message: Message) -> None:
        """Send one message (best effort: the core resends what matters)."""

    def apply(self, committed: list[Entry], high_watermark: int) -> None:
        """Hand committed entries (possibly none) to the state machine, in offset order;
        high_watermark is the core's HW once they are applied."""

    def answer_read(self, token: object, offset: int | None) -> None:
        """A read_index() call is answered: the read point, or None (leadership lost)."""

    def role_changed(self, change: RoleChange) -> None:
        """The role, epoch or known leader changed."""


async def execute_ready(ready: Ready, target: ReadyTarget) -> None:
    """Carry out one Ready on target, in the contract's order."""
    if ready.quorum_state is not None:
        await target.persist_quorum_state(ready.quorum_state)
    if ready.truncate_to is not None:
        target.truncate(ready.truncate_to)
    if ready.entries:
        target.append(ready.entries)
    if ready.snapshot_rejected is not None:
        target.snapshot_refused(ready.snapshot_rejected)
    if ready.snapshot is not None:
        await target.install_snapshot(ready.snapshot)
    for to_id, message in ready.messages:
        target.send(to_id, message)
    target.apply(ready.committed, ready.high_watermark)
    for token, offset in ready.reads:
        target.answer_read(token, offset)
    if ready.role_change is not None:
        target.role_changed(ready.role_change)


def execute_ready_sync(ready: Ready, target: ReadyTarget) -> None:
    """execute_ready for a target whose coroutine methods never suspend (in memory)."""
    coroutine = execute_ready(ready, target)
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise RuntimeError("a ReadyTarget suspended outside an event loop: use execute_ready")
