"""Metadata on a running node: the committed image, snapshots, and the active controller.

Every node applies committed Raft entries to its MetadataImage here and tells listeners (the
replica manager, the Kafka backend) what changed. On the Raft leader, once the no-op entry of
its epoch has committed (so the image holds everything any earlier leader committed), a
Controller is built from that image and serves requests: it turns each request into metadata
records, which are appended as ONE Raft entry (so a multi-record change is atomic), and the
reply is sent once that entry commits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode, KafkaError, LocalError
from raftlog.metadata import records as r
from raftlog.metadata.controller.controller import Controller
from raftlog.metadata.controller.messages import (
    AllocateProducerIds,
    AlterPartition,
    BrokerHeartbeat,
    RegisterBroker,
)
from raftlog.metadata.image import (
    MetadataApplyError,
    MetadataDelta,
    MetadataImage,
    diff_images,
)
from raftlog.metadata.raft.driver import QuorumDriver
from raftlog.metadata.raft.messages import Entry
from raftlog.metadata.raft.types import NotLeader, Overloaded, RoleChange, Snapshot
from raftlog.metadata.raft.voters import is_voters_record
from raftlog.metadata.snapshot import encode_snapshot, image_records
from raftlog.net.rpc import IdentityMismatch

log = logging.getLogger("raftlog.metadata")

# The active controller ticks when a fence or session expiry falls due
# (Controller.next_deadline_ms), and at once when the liveness watch feeds it something new
# (wake_controller); in between, at least this often, so that a deadline brought closer by a
# path that does not wake it costs at most this much. A tick walks the brokers: cheap.
CONTROLLER_TICK_MS = 250
# Least time between two ticks: a deadline that a tick did not clear (a bug, a clock step)
# must cost a few wakeups per second, never a busy loop.
CONTROLLER_MIN_TICK_GAP_MS = 10
# Cap on how long a controller request may wait for its records to commit.
CONTROLLER_COMMIT_TIMEOUT_MS = 30_000
# Controller results handled together share one Raft entry up to this many records; a
# result that would go past it opens the next entry (a single result is never split).
MAX_RECORDS_PER_ENTRY = 2_000

ImageListener = Callable[[MetadataImage, MetadataDelta], None]
# Requests a broker makes for itself: they name it (broker_id), and only it may send them.
BROKER_SCOPED_REQUESTS = (RegisterBroker, BrokerHeartbeat, AllocateProducerIds, AlterPartition)


class CommittedMetadataError(LocalError):
    """A committed metadata entry this node cannot decode or apply.

    Fatal by design, as in Kafka: skipping it would leave this node's image silently different
    from every other node's. It means a record from a newer version (upgrade every node
    before the controller writes it) or a bug; the message names the entry's offset.
    """


class _EntryBatch:
    """Controller results gathered into one Raft entry, and where that entry went."""

    def __init__(self) -> None:
        self.records: list[r.Record] = []
        self.proposed = trio.Event()
        self.offset = -1
        self.epoch = -1
        self.not_leader: NotLeader | None = None

    def propose(self, quorum: QuorumDriver) -> None:
        try:
            self.offset, self.epoch = quorum.propose(r.encode_entry(self.records))
        except NotLeader as exc:
            self.not_leader = exc
        except Overloaded:
            # The uncommitted backlog is full (followers slow or gone): refuse retriably, as
            # for a lost leadership, so the controller's image does not run ahead of the log.
            self.not_leader = NotLeader(quorum.core.leader_id, quorum.core.epoch)
        self.proposed.set()


class NotControllerError(KafkaError):
    def __init__(self, leader_id: int | None) -> None:
        super().__init__(ErrorCode.not_controller, f"the active controller is {leader_id}")
        self.leader_id = leader_id


class MetadataService:
    """Committed metadata image of this node, plus the controller when this node leads."""

    def __init__(self, config: NodeConfig, cluster_id: str) -> None:
        self.config = config
        self.image = MetadataImage.empty(cluster_id)
        self.cluster_id = cluster_id
        self.quorum: QuorumDriver | None = None
        self.controller: Controller | None = None
        self._listeners: list[ImageListener] = []
        self._records_since_snapshot = 0
        self._changed = trio.Event()
        self._leader_change_payload = b""
        self._gathering: _EntryBatch | None = None
        self._controller_woken = trio.Event()
        # Called (no await) right after a controller becomes active on this node.
        self._controller_listeners: list[Callable[[], None]] = []
        self._nursery: trio.Nursery | None = None  # while run() runs: snapshot persistence

    def attach(self, quorum: QuorumDriver) -> None:
        self.quorum = quorum
        self._leader_change_payload = quorum.core.config.leader_change_payload
        snapshot = quorum.core.snapshot
        if snapshot is not None:
            self._load_snapshot(snapshot, notify=False)

    def add_listener(self, listener: ImageListener) -> None:
        """Called with (image, delta) after every applied change; at once with a full delta."""
        self._listeners.append(listener)
        listener(self.image, full_delta(self.image))

    @property
    def applied_offset(self) -> int:
        return self.image.last_applied_offset

    async def wait_for_change(self) -> None:
        """Return after the next applied change (for tests and the CLI's waits)."""
        await self._changed.wait()

    # ---------------------------------------------------------------- quorum callbacks
    def on_commit(self, entries: list[Entry], high_watermark: int) -> None:
        assert self.quorum is not None
        # Everything committed in one go is applied as ONE change: a node replaying its log
        # after a restart jumps straight to the committed state instead of acting, entry by
        # entry, on history (e.g. briefly leading a partition at an old leader epoch).
        # Epoch-start (no-op) entries split the run: a new controller must start from exactly
        # the state committed before its epoch.
        pending: list[r.Record] = []
        last: Entry | None = None
        for entry in entries:
            if entry.data == self._leader_change_payload:
                self._apply_run(pending, last)
                pending, last = [], None
                self._on_epoch_start(entry)
                continue
            if is_voters_record(entry.data):
                # KIP-853's VotersRecord is the Raft layer's (the core already acts on it):
                # it holds no metadata record, but the image's offset moves past it.
                last = entry
                continue
            try:
                pending.extend(r.decode_entry(entry.data))
            except r.RecordDecodeError as exc:
                # A committed entry this node cannot read is a version skew or a bug; applying
                # the rest would diverge the image, so stop applying loudly.
                raise self._fatal(
                    f"cannot decode committed metadata entry at offset {entry.offset} "
                    f"(epoch {entry.epoch}): {exc.message}"
                ) from exc
            last = entry
        self._apply_run(pending, last)
        if self.controller is not None:
            self.controller.committed(high_watermark)
        if self._records_since_snapshot >= self.config.metadata_snapshot_max_records:
            self._take_snapshot(entries[-1])

    def _apply_run(self, records: list[r.Record], last: Entry | None) -> None:
        if last is None:
            return
        try:
            self.image, delta = self.image.apply(records, last.offset, last.epoch)
        except MetadataApplyError as exc:
            raise self._fatal(
                f"cannot apply committed metadata entries after offset "
                f"{self.image.last_applied_offset} up to {last.offset}: {exc}"
            ) from exc
        self._records_since_snapshot += len(records)
        if self.controller is not None:
            self.controller.committed(last.offset + 1)
        self._notify(delta)

    def _fatal(self, message: str) -> CommittedMetadataError:
        log.critical("node %d: %s; stopping", self.config.node_id, message)
        return CommittedMetadataError(f"node {self.config.node_id}: {message}")

    def _on_epoch_start(self, entry: Entry) -> None:
        assert self.quorum is not None
        core = self.quorum.core
        if core.role.name == "leader" and core.epoch == entry.epoch and self.controller is None:
            # Everything an earlier leader committed is now applied: safe to take over.
            self.controller = Controller.from_image(
                self.image,
                self.config,
                self.quorum.now_ms(),
                preferred_leader_check_interval_ms=self.config.leader_imbalance_check_interval_ms,
            )
            self.controller.committed(entry.offset + 1)
            log.info(
                "controller active in epoch %d at metadata offset %d", entry.epoch, entry.offset
            )
            for listener in self._controller_listeners:
                listener()
            self.wake_controller()

    def on_snapshot(self, snapshot: Snapshot) -> None:
        self._load_snapshot(snapshot, notify=True)

    def on_role_change(self, change: RoleChange) -> None:
        if change.role != "leader" and self.controller is not None:
            log.info("controller inactive: now %s in epoch %d", change.role, change.epoch)
            self.controller = None

    def _load_snapshot(self, snapshot: Snapshot, *, notify: bool) -> None:
        assert self.quorum is not None
        # Decoded (and so known to be good) when the quorum vetted it, before installing it.
        image = self.quorum.decoded_snapshot(snapshot)
        previous, self.image = self.image, image
        self._records_since_snapshot = 0
        if notify:
            # Against the image the listeners hold: what the skipped log deleted is dropped.
            self._notify(diff_images(previous, image))

    def _take_snapshot(self, last: Entry) -> None:
        assert self.quorum is not None
        data = encode_snapshot(self.image)
        end_offset = last.offset + 1
        written = self.quorum.snapshot_written(end_offset, last.epoch, data)
        self._records_since_snapshot = 0
        # The core's snapshot carries the voter set in force at its end (KIP-853).
        snapshot = (
            written if isinstance(written, Snapshot) else Snapshot(end_offset, last.epoch, data)
        )
        store = self.quorum.store

        async def persist() -> None:
            await trio.to_thread.run_sync(store.save_snapshot, snapshot)
            store.compact_to(end_offset)
            log.info("metadata snapshot at offset %d (%d bytes)", end_offset, len(data))

        self._background(persist)

    def _background(self, fn: Callable[[], Any]) -> None:
        nursery = self._nursery
        if nursery is not None:
            nursery.start_soon(fn)

    def _notify(self, delta: MetadataDelta) -> None:
        for listener in self._listeners:
            listener(self.image, delta)
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    # ---------------------------------------------------------------- controller
    def add_controller_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener` (no await) as soon as a controller becomes active on this node,
        before its first tick: the liveness watch hands it what it knows at once."""
        self._controller_listeners.append(listener)

    def wake_controller(self) -> None:
        """Tick the active controller now: something it was just told (a broker's refused
        connects, the previous metadata leader's silence) may make a fence due."""
        self._controller_woken.set()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Background work: snapshot persistence and the controller's ticks."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                while True:
                    controller = self.controller
                    now_ms = int(trio.current_time() * 1000)  # the quorum driver's clock
                    wake_ms = now_ms + CONTROLLER_TICK_MS
                    if controller is not None:
                        result = controller.tick(now_ms)
                        if result.records:
                            nursery.start_soon(self._commit_background, result.records)
                        deadline_ms = controller.next_deadline_ms(now_ms)
                        wake_ms = max(
                            now_ms + CONTROLLER_MIN_TICK_GAP_MS, min(wake_ms, deadline_ms)
                        )
                    with trio.move_on_at(wake_ms / 1000):
                        await self._controller_woken.wait()
                    self._controller_woken = trio.Event()
            finally:
                # Stopping: the quorum task may still apply entries on its way out (after a
                # worker thread returns), and a snapshot it starts then must be skipped (the
                # log keeps the entries), not started in a nursery that is closing.
                self._nursery = None

    async def _commit_background(self, records: tuple[r.Record, ...]) -> None:
        try:
            await self._append(records)
        except KafkaError as exc:
            log.info("controller change not committed: %s", exc)

    async def handle(self, request: Any, *, sender_id: int | None = None) -> Any:
        """Serve one controller request on the active controller; raises NotControllerError.

        sender_id is the node the request's connection speaks for (None: this node's own
        request). Raises IdentityMismatch, which closes that connection, for a request that
        speaks for another broker or comes from no known node."""
        controller = self.controller
        if controller is None or self.quorum is None:
            raise NotControllerError(self.quorum.core.leader_id if self.quorum else None)
        if sender_id is not None:
            self._check_sender(controller, request, sender_id)
        result = controller.handle(request, self.quorum.now_ms())
        if result.error_code != ErrorCode.none and isinstance(request, BROKER_SCOPED_REQUESTS):
            # The reply names no epoch (the peer may be a forger): the detail stays here.
            registration = controller.image.brokers.get(request.broker_id)
            log.info(
                "controller refused %r from node %s: %s (registered broker epoch %s)",
                request,
                sender_id if sender_id is not None else self.config.node_id,
                result.error_code.name,
                registration.epoch if registration is not None else None,
            )
        if result.records:
            await self._append(result.records)
        return result.reply

    def _check_sender(self, controller: Controller, request: Any, sender_id: int) -> None:
        """A broker's own requests (registration, heartbeats, ISR changes, producer ids) come
        from that broker; any other request from a voter or a registered broker."""
        if isinstance(request, BROKER_SCOPED_REQUESTS):
            if request.broker_id != sender_id:
                raise IdentityMismatch(f"{type(request).__name__} names another broker")
        elif sender_id not in self.config.voters and sender_id not in controller.image.brokers:
            raise IdentityMismatch(f"{type(request).__name__} from a node that is not known")

    async def _append(self, records: tuple[r.Record, ...]) -> None:
        """Append a controller result and wait until it commits.

        Results produced in the same scheduler pass share ONE Raft entry (as KRaft batches
        controller writes): still atomic per result, applied in the order the controller
        produced them, and the per-entry costs (append, commit, apply, listeners) are paid
        once per batch instead of once per request."""
        assert self.quorum is not None
        batch = self._gathering
        if batch is not None and len(batch.records) + len(records) > MAX_RECORDS_PER_ENTRY:
            # Full: propose it now. At most one batch is ever unproposed, so entries keep
            # the order in which the controller produced their records.
            self._gathering = None
            batch.propose(self.quorum)
            batch = None
        if batch is None:
            batch = self._gathering = _EntryBatch()
            batch.records.extend(records)
            # Shielded: the requests that join this batch wait for its proposal, so it must
            # happen even if the request that opened the batch is cancelled meanwhile.
            with trio.CancelScope(shield=True):
                await trio.lowlevel.checkpoint()  # let results handled in this pass join
            if not batch.proposed.is_set():
                self._gathering = None
                batch.propose(self.quorum)
        else:
            batch.records.extend(records)
            await batch.proposed.wait()
        if batch.not_leader is not None:
            # The controller's image already holds these records; it must not survive them.
            self._renounce("its records could not be appended")
            raise NotControllerError(batch.not_leader.leader_id)
        offset, epoch = batch.offset, batch.epoch
        with trio.move_on_after(CONTROLLER_COMMIT_TIMEOUT_MS / 1000):
            if await self.quorum.wait_committed(offset, epoch):
                return
        self._renounce("its records did not commit")
        raise NotControllerError(self.quorum.core.leader_id)

    def _renounce(self, why: str) -> None:
        """Drop the controller, and with it this node's leadership if it still leads.

        A controller is only built when its epoch's no-op entry commits, so dropping it
        while keeping the leadership (an overloaded backlog, a commit that timed out) would
        leave the cluster without an active controller until the next election. Resigning
        starts that election now, as KRaft's controller renounces on a failed write.
        """
        self.controller = None
        if self.quorum is not None and self.quorum.resign():
            log.warning("controller inactive (%s): resigned metadata leadership", why)


def full_delta(image: MetadataImage) -> MetadataDelta:
    """A delta that describes the whole image as new (start-up and snapshot loads)."""
    _rebuilt, delta = MetadataImage.empty(image.cluster_id).apply(
        image_records(image), image.last_applied_offset, image.last_applied_epoch
    )
    return delta
