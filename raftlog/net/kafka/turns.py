"""Produce requests of one connection reach their appends in the order they were sent.

Kafka processes a connection's requests one at a time, so an idempotent or transactional
producer with several requests in flight has them appended in sequence order. raftlog
answers a connection's requests concurrently (acks=all waits overlap), and trio runs tasks
started together in either order; a request that awaits before its append (its partition's
producer state loading, a transaction verification at the coordinator) would let the next
one pass it. The next request would then be refused OUT_OF_ORDER_SEQUENCE_NUMBER, which a
transactional producer takes as fatal.

So the connection's reader hands each Produce a Turn in arrival order; the handler waits for
its turn before it starts, and ends it once every partition of the request has appended (or
failed) — before the acks=all wait, which still overlaps with later requests.
"""

from __future__ import annotations

import trio


class Turns:
    """Tickets in arrival order; a ticket's turn comes when every earlier one is done."""

    def __init__(self) -> None:
        self._issued = 0
        self._front = 0  # the oldest ticket not done
        self._done: set[int] = set()
        self._advanced = trio.Event()

    def take(self) -> Turn:
        """The next ticket; call in arrival order (the connection's reader)."""
        turn = Turn(self, self._issued)
        self._issued += 1
        return turn

    def _finish(self, ticket: int) -> None:
        self._done.add(ticket)
        moved = False
        while self._front in self._done:
            self._done.discard(self._front)
            self._front += 1
            moved = True
        if moved:
            self._advanced.set()
            self._advanced = trio.Event()


class Turn:
    __slots__ = ("_finished", "_ticket", "_turns")

    def __init__(self, turns: Turns, ticket: int) -> None:
        self._turns = turns
        self._ticket = ticket
        self._finished = False

    async def wait(self) -> None:
        """Return once every earlier ticket is done."""
        while self._turns._front < self._ticket:
            await self._turns._advanced.wait()

    def done(self) -> None:
        """End this turn (idempotent): the next ticket may go."""
        if not self._finished:
            self._finished = True
            self._turns._finish(self._ticket)
