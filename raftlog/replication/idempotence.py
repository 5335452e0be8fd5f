"""Idempotent-producer state of each hosted replica, as the trio driver keeps it.

producer_table.py is the sans-IO table and producer_state.py its blocking snapshot files
and replay; this module decides when they run. The rules (docs/formats.md, "Producer state"):
- the table is built off the event loop (`rebuild` in a worker thread) when the replica is
  opened, and rebuilt after a truncation whenever it cannot be cut back in memory;
- while it is loading the replica's log must not change under the worker thread: leader
  produces wait for `ready`, the fetcher does not fetch the partition, cleanup skips it;
- snapshots are taken when the active segment rolls, periodically, and at shutdown: the
  payload is built on the loop (a consistent view of the table), the file is written in a
  worker thread. One `lock` per replica orders snapshot writes and reloads on disk, so a
  reload that deletes snapshots above a truncation point always runs after (never during)
  a write that could recreate one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import trio

from raftlog.replication.producer_state import (
    CompletedTxn,
    ProducerStateConfig,
    ProducerStateTable,
    after_log_truncation,
    delete_snapshots_above,
    rebuild,
    snapshot_payload,
    write_payload,
)
from raftlog.storage import PartitionLog
from raftlog.storage.txn_index import AbortedTxn

log = logging.getLogger("raftlog.replication")

# Every replica whose table moved since its last snapshot gets one this often, so a restart
# replays at most this much of the log's batch headers even when segments rarely roll.
PRODUCER_SNAPSHOT_INTERVAL_MS = 60_000


# Kafka's top producer epoch; a marker at it can never be followed by a newer one.
_TOP_PRODUCER_EPOCH = 2**15 - 1


@dataclass(eq=False)
class VerificationGuard:
    """Compared by identity: a marker replaces a producer's guard with none."""

    holders: int = 0
    # The newest epoch of a marker for the producer that landed while the guard was held
    # (-1: none).
    max_marker_epoch: int = -1


class VerificationGuards:
    """KIP-890's verification guards of one leader replica (Kafka's VerificationGuard).

    A transactional batch that would open a transaction is appended only after the
    coordinator confirmed the partition is in the producer's ongoing transaction, an answer
    that takes an await. A COMMIT/ABORT marker for the producer that lands during that await
    ends the transaction the answer was about: without a guard the batch would then open a
    new transaction that no coordinator will ever end (a hanging transaction, holding back
    the LSO). So each verification holds the producer's guard, a marker drops it, and the
    append goes ahead only if the guard it started with still stands. Concurrent batches of
    one producer share a guard; it lives only while some verification holds it, so the
    table is bounded by the produce requests in flight.

    KIP-890 part 2 (a Produce v12+ batch the coordinator adds to the transaction): every end
    of a TV2 transaction bumps the epoch, and its markers carry the bumped one. The
    coordinator adds a partition only after the producer's previous transaction completed,
    so a marker of that transaction, at the batch's own epoch, may land while the add is
    awaited and ends nothing the batch belongs to (`stands_after_add`); a marker of a newer
    epoch, or at the top epoch (where a TV2 end moves to a new producer id without a bump),
    ended the batch's own transaction and voids the add as it voids a verification.
    """

    def __init__(self) -> None:
        self._guards: dict[int, VerificationGuard] = {}
        # Guards a marker dropped while verifications still held them: later markers of the
        # producer must reach them too. Bounded like _guards (removed at the last finish).
        self._dropped: dict[int, list[VerificationGuard]] = {}

    def start(self, producer_id: int) -> VerificationGuard:
        guard = self._guards.get(producer_id)
        if guard is None:
            guard = self._guards[producer_id] = VerificationGuard()
        guard.holders += 1
        return guard

    def holds(self, producer_id: int, guard: VerificationGuard) -> bool:
        return self._guards.get(producer_id) is guard

    def stands_after_add(
        self, producer_id: int, guard: VerificationGuard, batch_epoch: int
    ) -> bool:
        """Whether a batch of `batch_epoch` that the coordinator added (KIP-890 part 2) may
        still open a transaction (see the class docstring)."""
        if self.holds(producer_id, guard):
            return True
        marker_epoch = guard.max_marker_epoch
        return marker_epoch <= batch_epoch and marker_epoch < _TOP_PRODUCER_EPOCH

    def finish(self, producer_id: int, guard: VerificationGuard) -> None:
        guard.holders -= 1
        if guard.holders > 0:
            return
        if self._guards.get(producer_id) is guard:
            del self._guards[producer_id]
            return
        dropped = self._dropped.get(producer_id)
        if dropped is not None and guard in dropped:
            dropped.remove(guard)
            if not dropped:
                del self._dropped[producer_id]

    def end_transaction(self, producer_id: int, marker_epoch: int = _TOP_PRODUCER_EPOCH) -> None:
        """A marker (of `marker_epoch`) for the producer landed: verifications in flight no
        longer count."""
        for held in self._dropped.get(producer_id, ()):
            held.max_marker_epoch = max(held.max_marker_epoch, marker_epoch)
        guard = self._guards.pop(producer_id, None)
        if guard is not None:
            guard.max_marker_epoch = max(guard.max_marker_epoch, marker_epoch)
            self._dropped.setdefault(producer_id, []).append(guard)

    def __len__(self) -> int:
        return len(self._guards) + sum(len(held) for held in self._dropped.values())


class ProducerStateHolder:
    """The producer-state table of one replica plus its loading and snapshot bookkeeping."""

    def __init__(self, plog: PartitionLog, config: ProducerStateConfig | None = None) -> None:
        self.log = plog
        self.config = config or ProducerStateConfig()
        self._table = ProducerStateTable(self.config)
        # Unset while the table is (re)loading; set once `table` matches the log.
        self.ready = trio.Event()
        self.lock = trio.Lock()
        # Bumped by every invalidation: a reload that started before the last one must
        # not publish its (already stale) table.
        self.generation = 0
        self._reset_pending = False  # the log was emptied: every snapshot is void
        self._full_rebuild = True  # False: after_log_truncation on the old table suffices
        self._reloading = False
        self.snapshot_offset = -1  # offset of the newest snapshot this holder wrote
        self.segment_base_offset = plog.active_segment.base_offset if not plog.closed else 0
        self.verifications = VerificationGuards()

    @property
    def snapshot_dir(self) -> Path:
        return self.log.directory

    @property
    def loaded(self) -> bool:
        return self.ready.is_set()

    @property
    def table(self) -> ProducerStateTable:
        """The table; only valid while `loaded` (callers check it, or await `ready`)."""
        if not self.ready.is_set():
            raise RuntimeError(f"producer state of {self.log.directory.name} is loading")
        return self._table

    # ------------------------------------------------------------------ (re)loading
    def start_empty(self) -> None:
        """A log created just now: no batches and no snapshots, nothing to read."""
        self._table = ProducerStateTable(self.config)
        self._table.next_offset = self.log.log_end_offset
        self._reset_pending = self._full_rebuild = False
        self.ready.set()

    def invalidate(self, *, reset: bool = False, truncated: bool = False) -> bool:
        """The log was truncated (`truncated`), emptied (`reset`) or the table is wrong:
        stop using the table until `reload` ran. Returns True when the caller must start a
        `reload` task (none is running)."""
        was_ready = self.ready.is_set()
        if was_ready:
            self.ready = trio.Event()
        self.generation += 1
        self._reset_pending = self._reset_pending or reset
        # A plain truncation of a ready table can be cut back; anything else rebuilds.
        self._full_rebuild = self._full_rebuild or not (truncated and was_ready)
        return not self._reloading

    async def reload(self, now_ms: int) -> None:
        """Rebuild the table in a worker thread until no invalidation raced with it."""
        if self._reloading:
            return
        self._reloading = True
        try:
            while not self.ready.is_set():
                if self.log.closed:
                    return  # dropped meanwhile: nobody will ask again
                generation = self.generation
                reset, full = self._reset_pending, self._full_rebuild
                self._reset_pending = self._full_rebuild = False
                async with self.lock:
                    table = await trio.to_thread.run_sync(self._load, reset, full, now_ms)
                if table is not None and generation == self.generation:
                    self._table = table
                    self.ready.set()
                elif table is None:
                    return
        finally:
            self._reloading = False

    def _load(self, reset: bool, full: bool, now_ms: int) -> ProducerStateTable | None:
        """Blocking: the table matching the log (None when the log went away)."""
        plog = self.log
        name = plog.directory.name
        try:
            if reset:
                delete_snapshots_above(self.snapshot_dir, -1)
            if full:
                table = rebuild(plog, self.snapshot_dir, self.config, now_ms=now_ms)
                log.info(
                    "%s: producer state loaded up to offset %d (%d producer ids)",
                    name,
                    table.next_offset,
                    len(table),
                )
                return table
            return after_log_truncation(self._table, plog, self.snapshot_dir)
        except Exception as exc:
            if plog.closed:
                return None
            # Unreadable batch headers: serving without duplicate detection for the old
            # producers beats refusing every write to the partition. Say so loudly.
            log.error(
                "%s: producer state rebuild failed (%r); starting empty at offset %d",
                name,
                exc,
                plog.log_end_offset,
            )
            table = ProducerStateTable(self.config)
            table.next_offset = plog.log_end_offset
            return table

    # ------------------------------------------------------------------ transactions
    def record_completed(self, completed: list[CompletedTxn]) -> None:
        """Index the aborted transactions a just-appended batch ended (same event-loop step
        as the append, so the flusher fsyncs the entries with their markers)."""
        aborted = [
            AbortedTxn(c.producer_id, c.first_offset, c.last_offset, c.last_stable_offset)
            for c in completed
            if c.aborted
        ]
        if aborted:
            self.log.append_aborted_txns(aborted)

    def last_stable_offset(self, high_watermark: int) -> int | None:
        """The LSO (never above `high_watermark`), None while the table is loading.

        Never below the log start either (Kafka clamps its first unstable offset there):
        retention may delete the start of a transaction that never ends, and what is gone
        cannot be unstable."""
        if not self.ready.is_set():
            return None
        stable = self._table.last_stable_offset(high_watermark)
        return min(max(stable, self.log.log_start_offset), high_watermark)

    # ------------------------------------------------------------------ snapshots
    def rolled(self) -> bool:
        """True once per segment roll since the last call (a snapshot is due)."""
        if self.log.closed:
            return False
        base = self.log.active_segment.base_offset
        if base == self.segment_base_offset:
            return False
        self.segment_base_offset = base
        return True

    def snapshot_due(self) -> bool:
        return (
            self.ready.is_set()
            and not self.log.closed
            and self._table.next_offset != self.snapshot_offset
            and not self.lock.locked()
        )

    async def write_snapshot(self, now_ms: int) -> None:
        """Snapshot the table at its next offset (payload on the loop, file in a thread)."""
        if not self.snapshot_due():
            return
        async with self.lock:
            if not self.ready.is_set() or self.log.closed:
                return
            offset, payload = snapshot_payload(self._table, now_ms)
            try:
                await trio.to_thread.run_sync(
                    write_payload, self.snapshot_dir, offset, payload, self.config.max_snapshots
                )
            except OSError as exc:
                # A deleted partition or a full disk: the next trigger tries again, and a
                # missing snapshot only costs a longer replay.
                if not self.log.closed:
                    log.warning("%s: producer snapshot failed: %r", self.log.directory.name, exc)
                return
            self.snapshot_offset = offset
