"""Seeded simulation of transactions driven by the real sans-IO TxnCoordinator.

Three data partitions and the `__transaction_state` partition are each a PartitionSim
(partition_sim.py: the real replication core, lossy network, flush delays) on the same three
brokers, one clock and one event queue; a fault (crash, restart, cut link, isolation, leader
move) hits a broker on every partition at once, as it would a node.

- The coordinator is the real TxnCoordinator, one per leadership of `__transaction_state`-0,
  with the partition's leader epoch as coordinator epoch. It is created when its broker
  becomes leader, load()s the records of that broker's log after a short delay (answering
  COORDINATOR_LOAD_IN_PROGRESS meanwhile), resign()s when the broker loses leadership and is
  gone when the broker crashes. Its appends go through the partition with acks=all (lost with
  an unflushed leader, failed by a leader change or the purgatory timeout).
- Markers (WriteMarkers) go to each partition's leader, may be dropped or delivered twice, and
  are checked with the real ProducerStateTable.check_marker (coordinator epoch fencing,
  retries answered without a second append); an answer that does not come within
  MARKER_TIMEOUT_MS counts as REQUEST_TIMED_OUT. A marker request arrives within the network
  delay or never (as on one TCP connection), so a retry never races its own original.
- A transactional batch that would open a transaction on a partition is first verified with
  the coordinator (TxnCoordinator.verify, KIP-890 part 1: a network round trip, as the real
  produce path awaits it), then checked with check_headers (epoch, sequence, duplicates).
  With `slow_verify_probability` (default 0) that share of the answers is held up for
  LONG_DELAY_MS, which opens the race of KNOWN_VERIFY_RACE; the leader holds the real
  VerificationGuards around each verification, as produce.py does.
- Clients (one live instance per transactional id) run InitProducerId, AddPartitionsToTxn,
  produces, EndTxn, with retries; some stall past their transaction timeout (the coordinator
  aborts with tick()); a produce whose outcome is unknown aborts and bumps the epoch (KIP-360).
  A restarted client leaves a zombie (same transactional id, older epoch) that keeps sending;
  once told it is fenced it sends a few more batches tagged Z. Produce requests may be dropped,
  duplicated, or held for up to LONG_DELAY_MS (a retry may overtake its original); requests to
  the coordinator may be dropped or held, in order (`TxnWorld.connection_send` says why).

Invariants (`TxnWorld.check_views` every CHECK_EVERY_EVENTS events and at the end, on every
live replica of every data partition):
- LSO <= HW, a leader's LSO never moves back within its epoch, and no open transaction (data
  of a producer after its last marker, scanned here apart from the table) starts below it;
- each partition's own Checker (partition_checker.py): acknowledged produces, markers and
  coordinator records are never lost, replicas agree below the HW, one leader per epoch;
- what a replica shows below its LSO (records, and whether each is committed) never changes
  and agrees across replicas (a read_committed view once shown is never lost or flipped);
- a record read_committed shows is never of a transaction the client aborted (EndTxn abort
  answered NONE), never a zombie's batch sent after it was fenced; a record of a transaction
  the client committed is never shown aborted; and one transaction's records are never shown
  committed on one partition and aborted on another.
At the end (faults healed, clients stopped): on every leader LSO == HW (no hanging
transaction), every acknowledged record of every committed transaction is visible, all of a
transaction's records or none are visible, and the coordinator holds no transaction open.

KIP-890 part 2: with `tv2_probability` (default TV2_CLIENT_PROBABILITY) a client instance
speaks transaction version 2: it sends no AddPartitionsToTxn, its first batch on a partition
makes the partition leader ask the coordinator to add the partition (AddPartitionsTxn with
client_transaction_version 2, answered once the Ongoing record is replicated; the leader holds
the verification guard meanwhile and checks it with `stands_after_add`), it ends with EndTxn
v5 and carries on with the producer id and epoch that answer names (sequences restart), and a
produce whose outcome is unknown is fenced by the abort's own bump (no InitProducerId). The
invariants are the same for both kinds of client; TV2_FENCED_LATE counts the late batches of
an ended epoch that a partition refused.

RAFTLOG_SIM_TRACE=1 prints the transaction-level trace (client calls, coordinator records,
markers, faults) while a seed runs.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import os
import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from raftlog.constants import NO_LEADER
from raftlog.errors import ErrorCode
from raftlog.records import BatchHeader, ControlType, TxnMarker, make_attributes
from raftlog.replication.core.producer_table import ProducerStateTable, Verdict
from raftlog.replication.core.purgatory import DelayedProduce, ProduceCompletion, ProduceWait
from raftlog.replication.idempotence import VerificationGuard, VerificationGuards
from raftlog.txn import log_format as fmt
from raftlog.txn.coordinator import TxnCoordinator
from raftlog.txn.effects import Append, Effects, WriteMarkers
from raftlog.txn.log_format import TV_2, Record, TopicPartition
from raftlog.txn.messages import (
    AddPartitionsTxn,
    AddPartitionsTxnResult,
    EndTxnRequest,
    EndTxnResult,
    InitProducerIdRequest,
    InitProducerIdResult,
)
from raftlog.txn.settings import TxnConfig
from raftlog.txn.state import IDLE_STATES
from tests.replication.memory_log import Entry
from tests.sim.partition_checker import InvariantViolation
from tests.sim.partition_controller import BROKER_IDS
from tests.sim.partition_sim import PARTITION, SAFE, PartitionSim, SimBroker

DATA_PARTITIONS: tuple[TopicPartition, ...] = (("orders", 0), ("orders", 1), ("payments", 0))
TXN_STATE_PARTITION: TopicPartition = (fmt.TRANSACTION_STATE_TOPIC, 0)
TRANSACTIONAL_IDS = ("app-a", "app-b", "app-c", "app-d", "app-e")
PARTITION_CONFIG = dataclasses.replace(SAFE, producers=0)
FAULT_PERIOD_MS = PARTITION_CONFIG.fault_period_ms
# Long enough for a partition whose ISR change was refused just before the heal (the leader
# waits ALTER_PARTITION_RETRY_BACKOFF_MS, 1 s) and then for the last transactions to end.
SETTLE_MS = 3000
TXN_CONFIG = TxnConfig(
    transaction_state_log_num_partitions=1,
    transaction_abort_timed_out_transaction_cleanup_interval_ms=50,
    transaction_marker_retry_backoff_ms=20,
)
# Past the partitions' purgatory timeout plus both network legs: every delivered marker
# request has been answered (or its answer dropped) by then.
MARKER_TIMEOUT_MS = PARTITION_CONFIG.request_timeout_ms + 50
# Client requests: dropped, duplicated, or held in a queue this long.
CLIENT_DROP_PROBABILITY = 0.02
DUPLICATE_PROBABILITY = 0.03
LONG_DELAY_PROBABILITY = 0.03
LONG_DELAY_MS = (50, 400)
# A broker's view of `__transaction_state` leadership lags this often, by this much.
METADATA_LAG_PROBABILITY = 0.2
METADATA_LAG_MS = (20, 300)
CLIENT_RESTART_WEIGHT = 1  # among the 7 broker fault kinds
CHECK_EVERY_EVENTS = 50
# A coordinator whose log end is not yet covered by the HW looks again this much later.
LOAD_RETRY_MS = 5
PARTITION_CHECK_EVERY_EVENTS = 5
TRACE_LINES = 40

# The race the verification guards close: a verification answer held up while the client
# gives up on the produce and aborts; the abort marker lands on the partition first. Without
# the guard the late batch opened a transaction no coordinator knows of and the LSO stayed
# below it for good. (seed, slow_verify_probability) that shows it:
KNOWN_VERIFY_RACE = (380, 0.3)
# The share of client instances of transaction version 2 (KIP-890 part 2). The seeds above
# and the planted-bug tests were found with none (tv2_probability=0).
TV2_CLIENT_PROBABILITY = 0.5

# Violation kinds.
LSO_ABOVE_HW = "lso_above_hw"
LSO_PAST_OPEN_TXN = "lso_past_open_transaction"
LSO_WENT_BACK = "lso_went_back"
VIEW_CHANGED = "read_committed_view_changed"
ABORTED_VISIBLE = "aborted_record_visible"
ZOMBIE_VISIBLE = "fenced_zombie_record_visible"
COMMITTED_LOST = "committed_transaction_lost"
PARTIAL_TXN = "partial_transaction"
HANGING_TXN = "hanging_transaction"
# A read_committed reader sees what it must not.
FENCED_VISIBLE_KINDS = frozenset({ZOMBIE_VISIBLE, ABORTED_VISIBLE})
COORDINATOR_STUCK = "coordinator_not_idle"
# A stat, not a violation: a TV2 client's batch refused for an epoch an end bumped past.
TV2_FENCED_LATE = "tv2_late_batch_fenced"


@dataclass(frozen=True)
class AddToken:
    """The token of a TV2 add a partition leader asked for: its answer goes back to it."""

    part: DataPartitionSim
    coordinator_node: int
    leader_node: int
    rest: tuple[Any, ...]


# ------------------------------------------------------------------------------ payloads
# A sim log entry is one batch. Data: D|tid|instance|txn|pid|epoch|seq|zombie;
# marker: M|pid|epoch|coordinator epoch|C or A; `__transaction_state` record: R|n.
def data_payload(key: TxnKey, pid: int, epoch: int, seq: int, zombie: bool) -> str:
    tid, instance, txn = key
    return f"D|{tid}|{instance}|{txn}|{pid}|{epoch}|{seq}|{'Z' if zombie else '-'}"


def marker_payload(marker: WriteMarkers, coordinator_epoch: int) -> str:
    kind = "C" if marker.commit else "A"
    return f"M|{marker.producer_id}|{marker.producer_epoch}|{coordinator_epoch}|{kind}"


@dataclass(frozen=True)
class Parsed:
    pid: int
    epoch: int
    seq: int
    marker: TxnMarker | None
    txn: TxnKey | None
    zombie: bool


@lru_cache(maxsize=1 << 16)
def parse(payload: str) -> Parsed:
    f = payload.split("|")
    if f[0] == "D":
        return Parsed(
            int(f[4]), int(f[5]), int(f[6]), None, (f[1], int(f[2]), int(f[3])), f[7] == "Z"
        )
    if f[0] == "M":
        control = ControlType.COMMIT if f[4] == "C" else ControlType.ABORT
        marker = TxnMarker(int(f[1]), int(f[2]), control, int(f[3]))
        return Parsed(int(f[1]), int(f[2]), -1, marker, None, False)
    raise ValueError(f"no transactional batch: {payload!r}")


def header_of(offset: int, parsed: Parsed) -> BatchHeader:
    control = parsed.marker is not None
    return BatchHeader(
        base_offset=offset,
        batch_length=49,
        partition_leader_epoch=0,
        magic=2,
        crc=0,
        attributes=make_attributes(is_transactional=True, is_control=control),
        last_offset_delta=0,
        base_timestamp_ms=0,
        max_timestamp_ms=0,
        producer_id=parsed.pid,
        producer_epoch=parsed.epoch,
        base_sequence=-1 if control else parsed.seq,
        record_count=1,
    )


# ------------------------------------------------------------------------------ replicas
class ReplicaTxnState:
    """The producer state of one replica's log (the real table) and this file's own scan of
    the same log (open transactions, each record's decision), kept up to date by appends."""

    def __init__(self, identity: tuple[int, int]) -> None:
        self.identity = identity  # (incarnation, log generation): anything else rebuilds
        self.table = ProducerStateTable()
        self.size = 0
        self.open_offsets: dict[int, list[int]] = {}  # pid -> data offsets after its last marker
        self.decision: dict[int, bool] = {}  # data offset -> committed
        self.last_hw = 0
        self.verified_below = 0  # compared with the partition's known view up to here

    def catch_up(self, entries: list[Entry]) -> None:
        for entry in entries[self.size :]:
            parsed = parse(entry.payload)
            header = header_of(entry.offset, parsed)
            marker = parsed.marker
            self.table.update([header], None if marker is None else {entry.offset: marker})
            if marker is not None:
                for offset in self.open_offsets.pop(parsed.pid, []):
                    self.decision[offset] = marker.commit
            else:
                self.open_offsets.setdefault(parsed.pid, []).append(entry.offset)
        self.size = len(entries)

    def first_open_offset(self) -> int | None:
        return min((offsets[0] for offsets in self.open_offsets.values()), default=None)


class _SharedClockSim(PartitionSim):
    """A PartitionSim on the world's clock, queue, rng and cut links."""

    world: TxnWorld

    def __init__(self, world: TxnWorld, key: TopicPartition) -> None:
        self.world = world
        self.key = key
        super().__init__(world.seed, PARTITION_CONFIG)
        self.rng = world.rng
        self.cut_links = world.cut_links

    @property  # type: ignore[override]
    def now_ms(self) -> int:
        return self.world.now_ms

    @now_ms.setter
    def now_ms(self, value: int) -> None:
        pass  # the world's clock is the one clock

    def at(self, delay_ms: int, handler: Callable[..., None], *args: Any) -> None:
        self.world.at(delay_ms, handler, *args)

    def _dispatch(self, broker: SimBroker, completions) -> None:
        for completion in completions:
            token = completion.token
            if isinstance(completion, ProduceCompletion) and token[0] in ("txn", "coord"):
                if completion.error == ErrorCode.none:
                    # The partition's own Checker then holds it to "acked is never lost".
                    *_, acked, floor_offset = token
                    for offset, payload in acked:
                        self.checker.on_ack(-1, payload, offset, floor_offset)
                self._completed(broker, token, completion.error)
            else:
                super()._dispatch(broker, [completion])

    def _completed(self, broker: SimBroker, token: tuple, error: ErrorCode) -> None:
        raise NotImplementedError

    def _wait_covered(
        self,
        broker: SimBroker,
        required_offset: int,
        token: tuple,
        acked: tuple[tuple[int, str], ...],
        floor_offset: int = -1,
    ) -> None:
        """Answer `token` once the HW covers `required_offset`; then `acked` (offset,
        payload) count as acknowledged writes, each after `floor_offset`."""
        leader = broker.partition.leader
        assert leader is not None
        token = (*token, acked, floor_offset)
        waiter = DelayedProduce(
            PARTITION,
            required_offset,
            self.now_ms + self.config.request_timeout_ms,
            self.config.min_insync_replicas,
            token,
            ProduceWait.HIGH_WATERMARK,
        )
        done = broker.purgatory.add_produce(waiter=waiter, progress=leader.progress())
        if done is not None:
            self._dispatch(broker, [done])

    def _append_local(self, broker: SimBroker, payloads: list[str]) -> int:
        leader = broker.partition.leader
        assert leader is not None
        _, last = broker.log.append(leader.leader_epoch, payloads)
        self._request_flush(broker)
        self._leader_effects(broker, leader.on_local_append(now_ms=self.now_ms))
        return last


class DataPartitionSim(_SharedClockSim):
    """A data partition: transactional produces (verified, sequence-checked) and markers."""

    def __init__(self, world: TxnWorld, key: TopicPartition) -> None:
        super().__init__(world, key)
        self.states: dict[int, ReplicaTxnState] = {}
        # The real KIP-890 guards, per broker, as produce.py holds them around a verification.
        self.guards: dict[int, VerificationGuards] = {}
        self.held: dict[tuple[int, int, int], VerificationGuard] = {}

    def state_of(self, broker: SimBroker) -> ReplicaTxnState:
        identity = (broker.incarnation, broker.log.generation)
        state = self.states.get(broker.broker_id)
        hw = broker.partition.high_watermark
        if state is None or state.identity != identity or hw < state.last_hw:
            state = self.states[broker.broker_id] = ReplicaTxnState(identity)
        state.catch_up(broker.log.entries)
        state.last_hw = hw
        return state

    # ------------------------------------------------------------------ produce
    def on_produce(self, broker: SimBroker, client: TxnClient, rid: int, payload: str) -> None:
        leader = broker.partition.leader
        if leader is None:
            return self.world.reply(client, rid, ErrorCode.not_leader_or_follower)
        error = leader.check_produce(acks=-1, min_insync_replicas=self.config.min_insync_replicas)
        if error != ErrorCode.none:
            return self.world.reply(client, rid, error)
        parsed = parse(payload)
        entry = self.state_of(broker).table.get(parsed.pid)
        if entry is None or entry.current_txn_first_offset < 0:
            # It would open a transaction here: ask the coordinator first (KIP-890 part 1),
            # holding the producer's guard while the answer travels.
            # A TV2 client's batch (Produce v12) asks for an add instead (part 2).
            guards = self.guards.setdefault(broker.broker_id, VerificationGuards())
            self.held[(broker.broker_id, id(client), rid)] = guards.start(parsed.pid)
            self.world.verify(self, broker, leader.leader_epoch, client, rid, payload)
            return None
        return self.append_produce(broker, leader.leader_epoch, client, rid, payload)

    def verification_stands(
        self, broker_id: int, client: TxnClient, rid: int, pid: int, epoch: int
    ) -> bool:
        """Release the guard this verification (or TV2 add) held; False if a marker
        dropped it (for an add: a marker that ended the batch's own transaction)."""
        guard = self.held.pop((broker_id, id(client), rid), None)
        if guard is None:
            return False
        guards = self.guards[broker_id]
        if client.tv2:
            stands = guards.stands_after_add(pid, guard, epoch)
        else:
            stands = guards.holds(pid, guard)
        guards.finish(pid, guard)
        return stands

    def append_produce(
        self, broker: SimBroker, leader_epoch: int, client: TxnClient, rid: int, payload: str
    ) -> None:
        leader = broker.partition.leader
        if not broker.alive or leader is None or leader.leader_epoch != leader_epoch:
            return self.world.reply(client, rid, ErrorCode.not_leader_or_follower)
        state = self.state_of(broker)
        parsed = parse(payload)
        check = state.table.check_headers([header_of(broker.log.log_end_offset, parsed)])
        if check.verdict is Verdict.ERROR:
            self.world.stats[f"produce_refused_{check.error.name}"] += 1
            if client.tv2 and check.error == ErrorCode.invalid_producer_epoch:
                self.world.stats[TV2_FENCED_LATE] += 1
            return self.world.reply(client, rid, check.error)
        floor = -1  # a retry's original may sit before writes acked since
        if check.verdict is Verdict.DUPLICATE:
            self.world.stats["produce_retry_not_appended"] += 1
            assert check.duplicate_of is not None
            required = check.duplicate_of.last_offset + 1
        else:
            floor = self.checker.max_acked_offset
            required = self._append_local(broker, [payload]) + 1
            self.state_of(broker)
            self.world.trace(
                f"{self.key} broker {broker.broker_id} appends {payload}@{required - 1}"
            )
        # A retry is answered for the batch already there (a zombie's batch may repeat the
        # producer id, epoch and sequence of an earlier one with another payload).
        original = broker.log.entry_at(required - 1)
        assert original is not None
        acked = ((required - 1, original.payload),)
        self._wait_covered(broker, required, ("txn", "produce", client, rid), acked, floor)
        return None

    # ------------------------------------------------------------------ markers
    def on_marker(self, broker: SimBroker, send: MarkerSend) -> None:
        leader = broker.partition.leader
        if leader is None:
            return self.world.marker_answer(send, self.key, ErrorCode.not_leader_or_follower)
        error = leader.check_produce(acks=-1, min_insync_replicas=self.config.min_insync_replicas)
        if error != ErrorCode.none:
            return self.world.marker_answer(send, self.key, error)
        marker = send.marker
        control = ControlType.COMMIT if marker.commit else ControlType.ABORT
        check = self.state_of(broker).table.check_marker(
            TxnMarker(marker.producer_id, marker.producer_epoch, control, send.coordinator_epoch)
        )
        if check.verdict is Verdict.ERROR:
            self.world.stats[f"marker_refused_{check.error.name}"] += 1
            self.world.trace(f"{self.key} refuses marker {send.label}: {check.error.name}")
            return self.world.marker_answer(send, self.key, check.error)
        self.guards.setdefault(broker.broker_id, VerificationGuards()).end_transaction(
            marker.producer_id, marker.producer_epoch
        )
        payload = marker_payload(marker, send.coordinator_epoch)
        floor = -1
        if check.verdict is Verdict.DUPLICATE:
            self.world.stats["marker_retry_not_appended"] += 1
            required = check.duplicate_offset + 1
        else:
            floor = self.checker.max_acked_offset
            required = self._append_local(broker, [payload]) + 1
            self.state_of(broker)
            self.world.trace(
                f"{self.key} broker {broker.broker_id} appends {payload}@{required - 1}"
            )
        acked = ((required - 1, payload),)
        self._wait_covered(broker, required, ("txn", "marker", send), acked, floor)
        return None

    def _completed(self, broker: SimBroker, token: tuple, error: ErrorCode) -> None:
        if token[1] == "produce":
            self.world.reply(token[2], token[3], error)
        else:
            self.world.marker_answer(token[2], self.key, error)


class TxnStatePartitionSim(_SharedClockSim):
    """`__transaction_state`-0: its leader hosts the coordinator. A broker sometimes learns
    of a leader change late (its metadata log lags), so a deposed coordinator keeps working
    for a while beside the new one."""

    def publish_metadata(self, broker_id: int, state) -> None:
        lag_ms = 0
        if self.rng.random() < METADATA_LAG_PROBABILITY:
            lag_ms = self.rng.randint(*METADATA_LAG_MS)
            self.world.stats["metadata_lags"] += 1
        # Still in order: the next update is due no earlier than this one.
        self._metadata_due_ms[broker_id] = max(
            self._metadata_due_ms[broker_id], self.now_ms + lag_ms
        )
        super().publish_metadata(broker_id, state)

    def _apply_metadata(self, broker: SimBroker, state) -> None:
        super()._apply_metadata(broker, state)
        self.world.sync_coordinators()

    def append_records(self, broker: SimBroker, coordinator: TxnCoordinator, append: Append):
        leader = broker.partition.leader
        error = ErrorCode.none
        if leader is None or leader.leader_epoch != coordinator.coordinator_epoch:
            error = ErrorCode.not_leader_or_follower
        else:
            error = leader.check_produce(
                acks=-1, min_insync_replicas=self.config.min_insync_replicas
            )
        if error != ErrorCode.none:
            self.at(0, self.world.append_done, coordinator, append.append_id, error)
            return
        payloads = [self.world.store_record(r) for r in append.records]
        floor = self.checker.max_acked_offset
        last = self._append_local(broker, payloads)
        first = last + 1 - len(payloads)
        acked = tuple(zip(range(first, last + 1), payloads, strict=True))
        token = ("coord", "append", coordinator, append.append_id)
        self._wait_covered(broker, last + 1, token, acked, floor)

    def _completed(self, broker: SimBroker, token: tuple, error: ErrorCode) -> None:
        # Not from inside the purgatory's own dispatch: the coordinator may append again.
        self.at(0, self.world.append_done, token[2], token[3], error)


@dataclass(eq=False)
class MarkerSend:
    coordinator: TxnCoordinator
    node_id: int
    marker: WriteMarkers
    coordinator_epoch: int
    results: dict[TopicPartition, ErrorCode] = field(default_factory=dict)

    @property
    def label(self) -> str:
        m = self.marker
        kind = "COMMIT" if m.commit else "ABORT"
        epochs = f"e{m.producer_epoch} c{self.coordinator_epoch}"
        return f"{kind}({m.transactional_id} pid {m.producer_id} {epochs})"


# ------------------------------------------------------------------------------ the world
class TxnWorld:
    def __init__(
        self,
        seed: int,
        slow_verify_probability: float = 0.0,
        tv2_probability: float = TV2_CLIENT_PROBABILITY,
    ) -> None:
        self.seed = seed
        self.tv2_probability = tv2_probability
        # How often a verification answer is held up (LONG_DELAY_MS); off by default, as it
        # opens the race of KNOWN_VERIFY_RACE.
        self.slow_verify_probability = slow_verify_probability
        self.rng = random.Random(seed)
        self.now_ms = 0
        self._queue: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._order = itertools.count()
        self.cut_links: set[frozenset[int]] = set()
        self.events = 0
        # What the seed exercised (tests assert the faults did happen).
        self.stats: Counter[str] = Counter()
        self.print_trace = os.environ.get("RAFTLOG_SIM_TRACE") == "1"
        self._trace: deque[str] = deque(maxlen=TRACE_LINES)
        self.data = {key: DataPartitionSim(self, key) for key in DATA_PARTITIONS}
        self.txn_state = TxnStatePartitionSim(self, TXN_STATE_PARTITION)
        self.parts: list[_SharedClockSim] = [*self.data.values(), self.txn_state]
        # node id -> its coordinator (created when it leads `__transaction_state`-0).
        self.coordinators: dict[int, TxnCoordinator] = {}
        self.records: list[Record] = []
        self._next_producer_id = 1000
        self._marker_sends: dict[tuple[int, int], MarkerSend] = {}
        self.clients: dict[str, TxnClient] = {}
        self.txns: dict[TxnKey, TxnOutcome] = {}
        # Per data partition: (payload, committed or None for a marker) of every offset
        # some replica showed below its LSO.
        self.known: dict[TopicPartition, list[tuple[str, bool | None]]] = {k: [] for k in self.data}
        self.seen_decisions: dict[TxnKey, set[bool]] = {}
        self.visible_payloads: set[str] = set()
        # (partition, node, incarnation, leader epoch) -> the last LSO that leader showed.
        self._leader_lso: dict[tuple[TopicPartition, int, int, int], int] = {}
        # (client, node) -> when the last request on that connection arrives.
        self._fifo_due_ms: dict[tuple[int, int], int] = {}

    # ------------------------------------------------------------------ plumbing
    def at(self, delay_ms: int, handler: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._queue, (self.now_ms + delay_ms, next(self._order), handler, args))

    def trace(self, line: str) -> None:
        line = f"t={self.now_ms} {line}"
        self._trace.append(line)
        if self.print_trace:
            print(line)

    def fail(self, kind: str, detail: str) -> None:
        recent = "\n  ".join(self._trace)
        raise InvariantViolation(
            kind, self.seed, self.now_ms, f"{detail}\n  last events:\n  {recent}"
        )

    def node(self, node_id: int) -> SimBroker:
        # A node's liveness and incarnation are the same on every partition it hosts.
        return self.txn_state.brokers[node_id]

    def _delay_ms(self, long_delay: bool, probability: float = LONG_DELAY_PROBABILITY) -> int:
        if long_delay and self.rng.random() < probability:
            self.stats["long_delays"] += 1
            return self.rng.randint(*LONG_DELAY_MS)
        return self.rng.randint(*PARTITION_CONFIG.network_delay_ms)

    def client_send(self, node_id: int, handler: Callable[..., None], *args: Any) -> None:
        """Client to broker: dropped, delayed (sometimes long), or delivered twice."""
        rng = self.rng
        if rng.random() < CLIENT_DROP_PROBABILITY:
            return
        copies = 2 if rng.random() < DUPLICATE_PROBABILITY else 1
        incarnation = self.node(node_id).incarnation
        for _ in range(copies):
            self.at(self._delay_ms(True), self._deliver, node_id, incarnation, handler, args)

    def connection_send(
        self, client: TxnClient, node_id: int, handler: Callable[..., None], *args: Any
    ) -> None:
        """Client to coordinator, on the client's one connection to that node: dropped or
        held up (sometimes long), but never duplicated nor overtaken by a later request.
        (EndTxn names no transaction, only the producer id and epoch: an EndTxn(commit) that
        a later transaction's requests overtook would commit that transaction's first part.
        Kafka's clients rule this out with one ordered connection; KIP-890 part 2's epoch
        bump per transaction removes it.)"""
        if self.rng.random() < CLIENT_DROP_PROBABILITY:
            return
        fifo = (id(client), node_id)
        due_ms = max(self.now_ms + self._delay_ms(True), self._fifo_due_ms.get(fifo, 0))
        self._fifo_due_ms[fifo] = due_ms
        incarnation = self.node(node_id).incarnation
        self.at(due_ms - self.now_ms, self._deliver, node_id, incarnation, handler, args)

    def node_send(
        self, src: int, dst: int, handler: Callable[..., None], *args: Any, slow: float = 0.0
    ) -> None:
        """Broker to broker: cut links, drops and the usual short delay (with probability
        `slow` a long one, as from a busy broker)."""
        if frozenset((src, dst)) in self.cut_links:
            return
        if self.rng.random() < PARTITION_CONFIG.drop_probability:
            return
        incarnation = self.node(dst).incarnation
        delay_ms = self._delay_ms(slow > 0, slow)
        self.at(delay_ms, self._deliver, dst, incarnation, handler, args)

    def _deliver(self, node_id: int, incarnation: int, handler: Callable[..., None], args) -> None:
        node = self.node(node_id)
        if node.alive and node.incarnation == incarnation:
            handler(node_id, *args)

    def reply(self, client: TxnClient, rid: int, result: object) -> None:
        if self.rng.random() < CLIENT_DROP_PROBABILITY:
            return
        self.at(self._delay_ms(False), client.on_reply, rid, result)

    # ------------------------------------------------------------------ client entry points
    def produce(self, client: TxnClient, rid: int, key: TopicPartition, payload: str) -> None:
        part = self.data[key]
        leader_id = part.controller.state.leader_id
        if leader_id == NO_LEADER:
            return self.reply(client, rid, ErrorCode.not_leader_or_follower)
        self.client_send(leader_id, self._produce_at, key, client, rid, payload)
        return None

    def _produce_at(self, node_id: int, key, client: TxnClient, rid: int, payload: str) -> None:
        part = self.data[key]
        part.on_produce(part.brokers[node_id], client, rid, payload)

    def to_coordinator(
        self, client: TxnClient, rid: int, call: Callable[[TxnCoordinator, object], Effects]
    ) -> None:
        leader_id = self.txn_state.controller.state.leader_id
        if leader_id == NO_LEADER:
            return self.reply(client, rid, ErrorCode.coordinator_not_available)
        self.connection_send(client, leader_id, self._at_coordinator, client, rid, call)
        return None

    def _at_coordinator(self, node_id: int, client: TxnClient, rid: int, call) -> None:
        coordinator = self.coordinators.get(node_id)
        if coordinator is None:
            return self.reply(client, rid, ErrorCode.not_coordinator)
        self.apply(node_id, coordinator, call(coordinator, (client, rid)))
        return None

    # ------------------------------------------------------------------ KIP-890 verification
    def verify(self, part: DataPartitionSim, broker: SimBroker, leader_epoch: int,
               client: TxnClient, rid: int, payload: str) -> None:  # fmt: skip
        coordinator_node = self.txn_state.controller.state.leader_id
        if coordinator_node == NO_LEADER:
            return self.reply(client, rid, ErrorCode.coordinator_not_available)
        args = (part, broker.broker_id, leader_epoch, client, rid, payload)
        self.node_send(broker.broker_id, coordinator_node, self._verify_at, *args)
        return None

    def _verify_at(self, node_id: int, part: DataPartitionSim, leader_node: int, *rest) -> None:
        payload = rest[-1]
        coordinator = self.coordinators.get(node_id)
        parsed = parse(payload)
        assert parsed.txn is not None
        client = rest[1]
        if coordinator is not None and client.tv2:
            request = AddPartitionsTxn(
                parsed.txn[0],
                parsed.pid,
                parsed.epoch,
                (part.key,),
                client_transaction_version=TV_2,
            )
            token = AddToken(part, node_id, leader_node, rest)
            self.trace(f"coordinator on {node_id} adds {part.key} for {payload}")
            fx = coordinator.add_partitions_to_txn(token, [request], self.now_ms)
            self.apply(node_id, coordinator, fx)
            return
        if coordinator is None:
            code = ErrorCode.not_coordinator
        else:
            code = coordinator.verify(parsed.txn[0], parsed.pid, parsed.epoch, *part.key)
        self.trace(f"coordinator on {node_id} verifies {payload} for {part.key}: {code.name}")
        # The answer comes on the partition leader's own connection, not the one markers
        # use: a marker written after the check may overtake it.
        slow = self.slow_verify_probability
        self.node_send(node_id, leader_node, self._verified, part, code, *rest, slow=slow)

    def _added(self, token: AddToken, result: object) -> None:
        code = error_of(result)
        self.trace(f"coordinator on {token.coordinator_node} added {token.part.key}: {code.name}")
        slow = self.slow_verify_probability
        self.node_send(
            token.coordinator_node,
            token.leader_node,
            self._verified,
            token.part,
            code,
            *token.rest,
            slow=slow,
        )

    def _verified(self, node_id: int, part: DataPartitionSim, code: ErrorCode, *rest) -> None:
        leader_epoch, client, rid, payload = rest
        parsed = parse(payload)
        stands = part.verification_stands(node_id, client, rid, parsed.pid, parsed.epoch)
        if code == ErrorCode.none and not stands:
            self.stats["verify_voided_by_marker"] += 1
            self.trace(f"{part.key} refuses {payload}: a marker voided its verification")
            return self.reply(client, rid, ErrorCode.invalid_txn_state)
        if code != ErrorCode.none:
            self.stats[f"verify_refused_{code.name}"] += 1
            self.trace(f"{part.key} refuses {payload}: verify {code.name}")
            return self.reply(client, rid, code)
        part.append_produce(part.brokers[node_id], leader_epoch, client, rid, payload)
        return None

    # ------------------------------------------------------------------ coordinators
    def allocate_producer_id(self) -> int:
        self._next_producer_id += 1
        return self._next_producer_id

    def store_record(self, record: Record) -> str:
        self.records.append(record)
        return f"R|{len(self.records) - 1}"

    def sync_coordinators(self) -> None:
        """One coordinator per node that leads `__transaction_state`-0, at its epoch."""
        for node_id in BROKER_IDS:
            broker = self.txn_state.brokers[node_id]
            leader = broker.partition.leader if broker.alive else None
            epoch = None if leader is None else leader.leader_epoch
            coordinator = self.coordinators.get(node_id)
            if coordinator is not None and coordinator.coordinator_epoch != epoch:
                del self.coordinators[node_id]
                if broker.alive:
                    self.trace(f"coordinator c{coordinator.coordinator_epoch} on {node_id} resigns")
                    self.apply(node_id, coordinator, coordinator.resign(self.now_ms))
                else:
                    self.trace(f"coordinator c{coordinator.coordinator_epoch} on {node_id} died")
                coordinator = None
            if coordinator is None and epoch is not None:
                coordinator = TxnCoordinator(0, epoch, TXN_CONFIG, self.allocate_producer_id)
                self.coordinators[node_id] = coordinator
                self.trace(f"coordinator c{epoch} on {node_id} starts loading")
                delay = self.rng.randint(*PARTITION_CONFIG.network_delay_ms)
                self.at(delay, self._load, node_id, coordinator)

    def _current(self, node_id: int, coordinator: TxnCoordinator) -> bool:
        return self.coordinators.get(node_id) is coordinator and self.node(node_id).alive

    def _load(self, node_id: int, coordinator: TxnCoordinator) -> None:
        if not self._current(node_id, coordinator):
            return
        broker = self.txn_state.brokers[node_id]
        entries = broker.log.entries
        if entries and broker.partition.high_watermark <= entries[-1].offset:
            # As the node's loader (internal_topics.wait_committed): a record past the HW
            # may be cut away with this leader, so nothing is loaded before the HW covers it.
            self.stats["load_waits_for_hw"] += 1
            self.at(LOAD_RETRY_MS, self._load, node_id, coordinator)
            return
        records = [self.records[int(e.payload[2:])] for e in entries]
        fx = coordinator.load(records, self.now_ms)
        owed = sorted(coordinator.transactions.items())
        self.stats["coordinator_loads"] += 1
        self.stats["loaded_prepare"] += sum(m.state.name.startswith("PREPARE") for _, m in owed)
        # Ongoing transactions an earlier coordinator may have committed in one phase.
        self.stats["loaded_in_doubt"] += len(coordinator._in_doubt)
        self.trace(
            f"coordinator c{coordinator.coordinator_epoch} on {node_id} loaded "
            f"{len(records)} records: "
            + ", ".join(
                f"{t}={m.state.name}/pid {m.producer_id} e{m.producer_epoch}" for t, m in owed
            )
        )
        self.apply(node_id, coordinator, fx)

    def _node_of(self, coordinator: TxnCoordinator) -> int | None:
        for node_id, current in self.coordinators.items():
            if current is coordinator:
                return node_id
        return None

    def append_done(self, coordinator: TxnCoordinator, append_id: int, error: ErrorCode) -> None:
        node_id = self._node_of(coordinator)
        if node_id is None or not self.node(node_id).alive:
            return
        self.trace(f"coordinator c{coordinator.coordinator_epoch} append {append_id}: {error.name}")
        self.apply(node_id, coordinator, coordinator.on_append_done(append_id, error, self.now_ms))

    def apply(self, node_id: int, coordinator: TxnCoordinator, fx: Effects) -> None:
        for token, result in fx.replies:
            if isinstance(token, AddToken):
                self._added(token, result)
                continue
            client, rid = token  # type: ignore[misc]
            self.reply(client, rid, result)
        for append in fx.appends:
            for key, value in append.records:
                stored = fmt.decode_value(value)
                what = (
                    "tombstone"
                    if stored is None
                    else (
                        f"{stored.state.name} pid {stored.producer_id} e{stored.producer_epoch} "
                        f"{list(stored.partitions)}"
                    )
                )
                if stored is not None:
                    self.stats[f"appended_{stored.state.name}"] += 1
                self.trace(
                    f"coordinator c{coordinator.coordinator_epoch} appends "
                    f"{fmt.decode_key(key)}={what} as {append.append_id}"
                )
            self.txn_state.append_records(self.txn_state.brokers[node_id], coordinator, append)
        for marker in fx.markers:
            self.send_markers(node_id, coordinator, marker)

    def coordinator_tick(self) -> None:
        for node_id, coordinator in list(self.coordinators.items()):
            if self.node(node_id).alive:
                self.apply(node_id, coordinator, coordinator.tick(self.now_ms))
        self.at(PARTITION_CONFIG.tick_ms, self.coordinator_tick)

    # ------------------------------------------------------------------ markers
    def send_markers(self, node_id: int, coordinator: TxnCoordinator, marker: WriteMarkers) -> None:
        send = MarkerSend(coordinator, node_id, marker, marker.coordinator_epoch)
        self._marker_sends[(id(coordinator), marker.marker_id)] = send
        if marker.transactional_id in coordinator._committing:
            self.stats["one_phase_commit_markers"] += 1
        self.trace(f"coordinator writes {send.label} to {list(marker.partitions)}")
        for key in marker.partitions:
            part = self.data[key]
            leader_id = part.controller.state.leader_id
            if leader_id == NO_LEADER:
                send.results[key] = ErrorCode.not_leader_or_follower
                continue
            copies = 2 if self.rng.random() < DUPLICATE_PROBABILITY else 1
            for _ in range(copies):
                self.node_send(node_id, leader_id, self._marker_at, key, send)
        self.at(MARKER_TIMEOUT_MS, self._marker_deadline, send)
        self._maybe_finish(send)

    def _marker_at(self, node_id: int, key: TopicPartition, send: MarkerSend) -> None:
        part = self.data[key]
        part.on_marker(part.brokers[node_id], send)

    def marker_answer(self, send: MarkerSend, key: TopicPartition, error: ErrorCode) -> None:
        leader_id = self.data[key].controller.state.leader_id
        src = leader_id if leader_id != NO_LEADER else send.node_id
        self.node_send(src, send.node_id, self._marker_answered, send, key, error)

    def _marker_answered(self, node_id: int, send: MarkerSend, key, error: ErrorCode) -> None:
        send.results.setdefault(key, error)
        self._maybe_finish(send)

    def _marker_deadline(self, send: MarkerSend) -> None:
        for key in send.marker.partitions:
            send.results.setdefault(key, ErrorCode.request_timed_out)
        self._maybe_finish(send)

    def _maybe_finish(self, send: MarkerSend) -> None:
        handle = (id(send.coordinator), send.marker.marker_id)
        if self._marker_sends.get(handle) is not send:
            return
        if any(key not in send.results for key in send.marker.partitions):
            return
        del self._marker_sends[handle]
        if not self._current(send.node_id, send.coordinator):
            return
        codes = ", ".join(f"{k[0]}-{k[1]}={c.name}" for k, c in send.results.items())
        self.trace(f"markers {send.label} done: {codes}")
        fx = send.coordinator.on_markers_done(send.marker.marker_id, send.results, self.now_ms)
        self.apply(send.node_id, send.coordinator, fx)

    # ------------------------------------------------------------------ clients
    def start_client(self, transactional_id: str, instance: int) -> TxnClient:
        tv2 = self.tv2_probability > 0 and self.rng.random() < self.tv2_probability
        client = TxnClient(self, transactional_id, instance, tv2)
        self.stats["tv2_clients" if tv2 else "tv0_clients"] += 1
        self.clients[transactional_id] = client
        client.start()
        return client

    def on_fenced(self, client: TxnClient) -> None:
        """A fenced producer is done for good; its application starts a new one."""
        if self.clients.get(client.transactional_id) is client and not self.stopped:
            self.start_client(client.transactional_id, client.instance + 1)

    @property
    def stopped(self) -> bool:
        return self.now_ms >= FAULT_PERIOD_MS

    def on_outcome(self, outcome: TxnOutcome) -> None:
        self.trace(f"client {outcome.key} learns {outcome.outcome}")
        self._check_decision(outcome.key)

    # ------------------------------------------------------------------ faults
    def _fault(self) -> None:
        if self.stopped:
            return
        rng = self.rng
        live = [b for b in BROKER_IDS if self.node(b).alive]
        dead = [b for b in BROKER_IDS if not self.node(b).alive]
        kinds = ["crash", "restart", "restart", "cut", "isolate", "heal", "move"]
        kinds += ["client_restart"] * CLIENT_RESTART_WEIGHT
        kind = rng.choice(kinds)
        if kind == "crash" and len(live) > 1:
            victim = rng.choice(live)
            self.trace(f"fault: node {victim} crashes")
            for part in self.parts:
                part.brokers[victim].crash()
                part.controller.broker_crashed(victim)
            self.sync_coordinators()
        elif kind == "restart" and dead:
            node_id = rng.choice(dead)
            self.trace(f"fault: node {node_id} restarts")
            for part in self.parts:
                part._restart(node_id)
        elif kind == "cut":
            self.cut_links.add(frozenset(rng.sample(BROKER_IDS, 2)))
        elif kind == "isolate":
            lonely = rng.choice(BROKER_IDS)
            self.cut_links |= {frozenset((lonely, b)) for b in BROKER_IDS if b != lonely}
        elif kind == "heal":
            self.cut_links.clear()
        elif kind == "move":
            part = rng.choice(self.parts)
            self.trace(f"fault: leader of {part.key} moves")
            part.controller.move_leader()
        elif kind == "client_restart":
            old = self.clients[rng.choice(TRANSACTIONAL_IDS)]
            old.superseded = True
            self.stats["client_restarts"] += 1
            self.trace(f"fault: client {old.transactional_id}#{old.instance} restarts")
            self.start_client(old.transactional_id, old.instance + 1)
        self.at(rng.randint(*PARTITION_CONFIG.fault_interval_ms), self._fault)

    def _heal(self) -> None:
        self.trace("heal everything")
        for part in self.parts:
            part._heal_everything()

    # ------------------------------------------------------------------ run
    def run(self) -> None:
        config = PARTITION_CONFIG
        for part in self.parts:
            part.controller.commit(part.controller.state)
            for broker_id in BROKER_IDS:
                self.at(self.rng.randint(0, config.tick_ms), part._tick, broker_id)
        for transactional_id in TRANSACTIONAL_IDS:
            self.at(self.rng.randint(1, 20), self.start_client, transactional_id, 0)
        self.at(config.tick_ms, self.coordinator_tick)
        self.at(self.rng.randint(*config.fault_interval_ms), self._fault)
        self.at(FAULT_PERIOD_MS, self._heal)
        end_ms = FAULT_PERIOD_MS + SETTLE_MS
        queue = self._queue
        while queue and queue[0][0] <= end_ms:
            self.now_ms, _, handler, args = heapq.heappop(queue)
            handler(*args)
            self.events += 1
            if self.events % PARTITION_CHECK_EVERY_EVENTS == 0:
                for part in self.parts:
                    part.checker.check()
            if self.events % CHECK_EVERY_EVENTS == 0:
                self.check_views()
        self.final_check()

    # ------------------------------------------------------------------ invariants
    def check_views(self) -> None:
        for part in self.data.values():
            for broker in part.brokers.values():
                if broker.alive:
                    self._check_replica(part, broker)

    def _check_replica(self, part: DataPartitionSim, broker: SimBroker) -> int:
        state = part.state_of(broker)
        hw = broker.partition.high_watermark
        lso = state.table.last_stable_offset(hw)
        where = f"{part.key} broker {broker.broker_id}"
        if lso > hw:
            self.fail(LSO_ABOVE_HW, f"{where}: LSO {lso} above HW {hw}")
        first_open = state.first_open_offset()
        if first_open is not None and lso > first_open:
            entry = broker.log.entry_at(first_open)
            self.fail(
                LSO_PAST_OPEN_TXN,
                f"{where}: LSO {lso} (HW {hw}) passes the transaction open at {first_open}: "
                f"{entry}",
            )
        leader = broker.partition.leader
        if leader is not None:
            # A new transaction opens at the log end, above the HW: within one leader epoch
            # (its HW only grows) the LSO only grows.
            handle = (part.key, broker.broker_id, broker.incarnation, leader.leader_epoch)
            last = self._leader_lso.get(handle, lso)
            if lso < last:
                self.fail(
                    LSO_WENT_BACK,
                    f"{where} (leader epoch {leader.leader_epoch}): LSO {last} -> {lso}",
                )
            self._leader_lso[handle] = lso
        known = self.known[part.key]
        entries = broker.log.entries
        upto = min(lso, len(known))
        for offset in range(state.verified_below, upto):
            mine = (entries[offset].payload, state.decision.get(offset))
            if parse(mine[0]).marker is not None:
                mine = (mine[0], None)
            if mine != known[offset]:
                self.fail(
                    VIEW_CHANGED,
                    f"{where} (LSO {lso}) shows {mine} at {offset}; shown before: {known[offset]}",
                )
        for offset in range(len(known), lso):
            payload = entries[offset].payload
            parsed = parse(payload)
            decision = None if parsed.marker is not None else state.decision[offset]
            known.append((payload, decision))
            if parsed.txn is not None and decision is not None:
                self._on_stable(part.key, offset, payload, parsed, decision)
        state.verified_below = max(state.verified_below, lso)
        return lso

    def _on_stable(self, key, offset: int, payload: str, parsed: Parsed, committed: bool) -> None:
        assert parsed.txn is not None
        if committed:
            self.visible_payloads.add(payload)
            if parsed.zombie:
                self.fail(ZOMBIE_VISIBLE, f"{payload}@{key}-{offset} is read_committed")
        self.seen_decisions.setdefault(parsed.txn, set()).add(committed)
        self._check_decision(parsed.txn, f" ({payload}@{key[0]}-{key[1]}-{offset})")

    def _check_decision(self, txn: TxnKey, where: str = "") -> None:
        seen = self.seen_decisions.get(txn, set())
        outcome = self.txns[txn].outcome if txn in self.txns else None
        if len(seen) > 1:
            self.fail(PARTIAL_TXN, f"transaction {txn} shown committed and aborted{where}")
        if outcome == "abort" and True in seen:
            self.fail(ABORTED_VISIBLE, f"transaction {txn} was aborted, shown committed{where}")
        if outcome == "commit" and False in seen:
            self.fail(COMMITTED_LOST, f"transaction {txn} was committed, shown aborted{where}")

    def final_check(self) -> None:
        for part in self.parts:
            part.checker.check()
            part.checker.final_check()
        self.check_views()
        for part in self.data.values():
            leader = part.active_leader()
            assert leader is not None  # final_check() said so
            lso = self._check_replica(part, leader)
            hw = leader.partition.high_watermark
            if lso != hw:
                entry = leader.log.entry_at(lso)
                self.fail(HANGING_TXN, f"{part.key}: LSO {lso} stays below HW {hw} at {entry}")
        for outcome in self.txns.values():
            if outcome.outcome != "commit":
                continue
            for key, payload in outcome.acked:
                if payload not in self.visible_payloads:
                    self.fail(
                        COMMITTED_LOST,
                        f"{outcome.key} committed, its acked {payload} on {key} is not visible",
                    )
        # All or none: every record of a transaction in the logs is decided alike.
        written: dict[TxnKey, set[bool]] = {}
        for known in self.known.values():
            for payload, decision in known:
                parsed = parse(payload)
                if parsed.txn is not None:
                    written.setdefault(parsed.txn, set()).add(bool(decision))
        for txn, decisions in written.items():
            if len(decisions) > 1:
                self.fail(PARTIAL_TXN, f"transaction {txn}: some records visible, some not")
        self._check_coordinator_idle()

    def _check_coordinator_idle(self) -> None:
        leader_id = self.txn_state.controller.state.leader_id
        coordinator = self.coordinators.get(leader_id)
        if coordinator is None or coordinator.loading:
            self.fail(COORDINATOR_STUCK, f"no loaded coordinator on leader {leader_id}")
            return
        for txn_id, txn in coordinator.transactions.items():
            if txn.state not in IDLE_STATES or txn.pending_in_progress:
                self.fail(COORDINATOR_STUCK, f"{txn_id} is {txn!r} after settling")


# ------------------------------------------------------------------------------ clients
TxnKey = tuple[str, int, int]  # (transactional id, client instance, transaction number)
TRANSACTION_TIMEOUT_MS = 300
CLIENT_REQUEST_TIMEOUT_MS = PARTITION_CONFIG.request_timeout_ms + 50
RETRY_BACKOFF_MS = (5, 30)
PRODUCE_ATTEMPTS = 3
STALL_PROBABILITY = 0.12
STALL_MS = (100, 700)  # past the transaction timeout, often
COMMIT_PROBABILITY = 0.7
ZOMBIE_SENDS = (1, 4)
RETRIABLE = frozenset(
    {
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_not_available,
        ErrorCode.concurrent_transactions,
        ErrorCode.request_timed_out,
        ErrorCode.not_leader_or_follower,
        ErrorCode.not_enough_replicas,
        ErrorCode.not_enough_replicas_after_append,
    }
)
FENCED = frozenset(
    {
        ErrorCode.producer_fenced,
        ErrorCode.invalid_producer_epoch,
        ErrorCode.invalid_producer_id_mapping,
    }
)


@dataclass
class TxnOutcome:
    key: TxnKey
    # (partition, payload) of every produce answered NONE.
    acked: list[tuple[TopicPartition, str]] = field(default_factory=list)
    outcome: str | None = None  # "commit" / "abort": EndTxn answered NONE


def error_of(result: object) -> ErrorCode:
    if isinstance(result, ErrorCode):
        return result
    if isinstance(result, (InitProducerIdResult, EndTxnResult)):
        return result.error_code
    if isinstance(result, list):
        for txn in result:
            assert isinstance(txn, AddPartitionsTxnResult)
            for code in txn.errors.values():
                if code != ErrorCode.none:
                    return code
        return ErrorCode.none
    raise AssertionError(f"unexpected reply {result!r}")


class TxnClient:
    """A transactional producer, as a Kafka client runs one: one request at a time, retries
    of retriable errors, abort (and an epoch bump, KIP-360) when a produce's outcome is
    unknown. Once fenced it is a zombie: a few more batches, then silence."""

    def __init__(
        self, world: TxnWorld, transactional_id: str, instance: int, tv2: bool = False
    ) -> None:
        self.world = world
        # KIP-890 part 2: no AddPartitionsToTxn, EndTxn v5 (an epoch bump per end).
        self.tv2 = tv2
        self.transactional_id = transactional_id
        self.instance = instance
        self.producer_id = -1
        self.producer_epoch = -1
        self.sequences: dict[TopicPartition, int] = {}
        self.txn_number = 0
        self.txn: TxnOutcome | None = None
        self.batches: list[TopicPartition] = []
        self.added: set[TopicPartition] = set()
        self.payload = ""
        self.attempts = 0
        self.rid = 0
        self.waiting: Callable[[object], None] | None = None
        self.bump_after_end = False
        self.superseded = False  # a newer instance runs (it does not know)
        self.fenced = False  # it was told

    def __repr__(self) -> str:
        return f"{self.transactional_id}#{self.instance}{'/tv2' if self.tv2 else ''}"

    def later(self, handler: Callable[..., None], *args: Any) -> None:
        self.world.at(self.world.rng.randint(*RETRY_BACKOFF_MS), handler, *args)

    # ------------------------------------------------------------------ requests
    def _request(self, on_reply: Callable[[object], None], send: Callable[[int], None]) -> None:
        self.rid += 1
        self.waiting = on_reply
        send(self.rid)
        self.world.at(
            CLIENT_REQUEST_TIMEOUT_MS, self.on_reply, self.rid, ErrorCode.request_timed_out
        )

    def on_reply(self, rid: int, result: object) -> None:
        if rid != self.rid or self.waiting is None:
            return  # a stale or duplicate answer
        on_reply, self.waiting = self.waiting, None
        on_reply(result)

    def _coordinator(self, what: str, call, on_reply: Callable[[object], None]) -> None:
        world = self.world

        def answer(result: object) -> None:
            world.trace(f"client {self} {what}: {error_of(result).name}")
            on_reply(result)

        self._request(answer, lambda rid: world.to_coordinator(self, rid, call))

    # ------------------------------------------------------------------ the flow
    def start(self) -> None:
        self.init(bump=False)

    def init(self, bump: bool) -> None:
        pid, epoch = (self.producer_id, self.producer_epoch) if bump else (-1, -1)
        req = InitProducerIdRequest(self.transactional_id, TRANSACTION_TIMEOUT_MS, pid, epoch)
        self._coordinator(
            f"InitProducerId(pid {pid} e{epoch})",
            lambda c, token: c.init_producer_id(token, req, self.world.now_ms),
            lambda result: self._on_init(bump, result),
        )

    def _on_init(self, bump: bool, result: object) -> None:
        code = error_of(result)
        if code == ErrorCode.none:
            assert isinstance(result, InitProducerIdResult)
            self.producer_id, self.producer_epoch = result.producer_id, result.producer_epoch
            self.sequences = {}
            self.later(self.begin)
        elif code in RETRIABLE:
            self.later(self.init, bump)
        else:
            self.later(self.init, False)  # a bump the coordinator refuses: start afresh

    def begin(self) -> None:
        world = self.world
        if world.stopped or self.superseded or self.fenced:
            return
        self.txn_number += 1
        key = (self.transactional_id, self.instance, self.txn_number)
        self.txn = world.txns[key] = TxnOutcome(key)
        rng = world.rng
        partitions = rng.sample(DATA_PARTITIONS, rng.randint(1, len(DATA_PARTITIONS)))
        self.batches = partitions + [rng.choice(partitions) for _ in range(rng.randint(0, 2))]
        rng.shuffle(self.batches)
        self.added = set()
        if self.tv2:
            # Produce v12 adds each partition at the leader (KIP-890 part 2).
            self.added = set(DATA_PARTITIONS)
            self.produce_next()
        elif rng.random() < 0.5:
            self.add(tuple(sorted(partitions)))  # all at once
        else:
            self.produce_next()  # each partition just before its first batch, as Kafka's

    def add(self, partitions: tuple[TopicPartition, ...]) -> None:
        req = AddPartitionsTxn(
            self.transactional_id, self.producer_id, self.producer_epoch, partitions
        )
        self._coordinator(
            f"AddPartitionsToTxn({self.txn and self.txn.key}, {list(partitions)})",
            lambda c, token: c.add_partitions_to_txn(token, [req], self.world.now_ms),
            lambda result: self._on_add(partitions, result),
        )

    def _on_add(self, partitions: tuple[TopicPartition, ...], result: object) -> None:
        code = error_of(result)
        if code == ErrorCode.none:
            self.added.update(partitions)
            self.produce_next()
        elif code in RETRIABLE:
            self.later(self.add, partitions)
        elif code in FENCED:
            self.on_fenced()
        else:
            self.abort(bump=True)

    def produce_next(self) -> None:
        world = self.world
        if not self.batches:
            # Past the fault period every transaction ends promptly, so the end state is idle.
            stall = not world.stopped and world.rng.random() < STALL_PROBABILITY
            delay = world.rng.randint(*STALL_MS) if stall else world.rng.randint(*RETRY_BACKOFF_MS)
            world.stats["stalls"] += stall
            world.at(delay, self.end, world.rng.random() < COMMIT_PROBABILITY)
            return
        key = self.batches[0]
        if key not in self.added:
            self.add((key,))
            return
        assert self.txn is not None
        seq = self.sequences.get(key, 0)
        self.payload = data_payload(self.txn.key, self.producer_id, self.producer_epoch, seq, False)
        self.attempts = 0
        self._send_produce()

    def _send_produce(self) -> None:
        key, payload = self.batches[0], self.payload
        self.attempts += 1
        self._request(
            lambda result: self._on_produced(key, payload, error_of(result)),
            lambda rid: self.world.produce(self, rid, key, payload),
        )

    def _on_produced(self, key: TopicPartition, payload: str, code: ErrorCode) -> None:
        if code == ErrorCode.none:
            assert self.txn is not None
            self.txn.acked.append((key, payload))
            self.sequences[key] = self.sequences.get(key, 0) + 1
            self.batches.pop(0)
            self.produce_next()
            return
        self.world.trace(f"client {self} produce {payload} to {key}: {code.name}")
        if code in RETRIABLE and self.attempts < PRODUCE_ATTEMPTS:
            self.later(self._send_produce)
        elif code in FENCED:
            self.on_fenced()
        else:
            self.abort(bump=True)  # its outcome is unknown: a new epoch fences it

    def abort(self, bump: bool) -> None:
        # TV2: the abort's own epoch bump fences what is in flight.
        self.bump_after_end = bump and not self.tv2
        self.end(False)

    def end(self, commit: bool) -> None:
        if self.fenced:
            return
        version = 5 if self.tv2 else 4
        req = EndTxnRequest(
            self.transactional_id, self.producer_id, self.producer_epoch, commit, version
        )
        assert self.txn is not None
        self._coordinator(
            f"EndTxn v{version}({self.txn.key}, {'commit' if commit else 'abort'}, "
            f"pid {self.producer_id} e{self.producer_epoch})",
            lambda c, token: c.end_txn(token, req, self.world.now_ms),
            lambda result: self._on_end(commit, result),
        )

    def _on_end(self, commit: bool, result: object) -> None:
        txn = self.txn
        assert txn is not None
        code = error_of(result)
        if code == ErrorCode.none and self.tv2:
            assert isinstance(result, EndTxnResult)
            assert result.producer_id >= 0 and result.producer_epoch >= 0, result
            if result.producer_epoch == 0:
                self.world.stats["tv2_producer_id_rotations"] += 1
            self.world.stats["tv2_ends"] += 1
            self.producer_id, self.producer_epoch = result.producer_id, result.producer_epoch
            self.sequences = {}  # a new epoch starts its sequences over
        if code == ErrorCode.none:
            txn.outcome = "commit" if commit else "abort"
            self.world.on_outcome(txn)
            if self.bump_after_end:
                self.bump_after_end = False
                self.later(self.init, True)
            else:
                self.later(self.begin)
        elif code in RETRIABLE:
            self.later(self.end, commit)
        elif code in FENCED:
            self.on_fenced()
        else:
            self.bump_after_end = False
            self.later(self.init, True)  # the outcome is unknown: fence what is in flight

    def on_fenced(self) -> None:
        if self.fenced:
            return
        self.fenced = True
        self.world.trace(f"client {self} is fenced (pid {self.producer_id} e{self.producer_epoch})")
        self.world.on_fenced(self)
        self.zombie_sends = self.world.rng.randint(*ZOMBIE_SENDS)
        self.later(self._zombie_send)

    def _zombie_send(self) -> None:
        """A zombie keeps writing its transaction with its old epoch, tagged Z: none of these
        may ever be read_committed."""
        world = self.world
        if self.zombie_sends <= 0 or self.txn is None or self.producer_id < 0:
            return
        self.zombie_sends -= 1
        world.stats["zombie_sends"] += 1
        key = world.rng.choice(DATA_PARTITIONS)
        seq = self.sequences.get(key, 0)
        self.sequences[key] = seq + 1
        payload = data_payload(self.txn.key, self.producer_id, self.producer_epoch, seq, True)
        self.rid += 1
        world.produce(self, self.rid, key, payload)
        self.later(self._zombie_send)


def run_seed(
    seed: int,
    slow_verify_probability: float = 0.0,
    tv2_probability: float = TV2_CLIENT_PROBABILITY,
) -> TxnWorld:
    """Run one seed; any failure names the seed."""
    world = TxnWorld(seed, slow_verify_probability, tv2_probability)
    try:
        world.run()
    except InvariantViolation:
        raise
    except Exception as exc:
        recent = "\n  ".join(world._trace)
        raise AssertionError(
            f"[seed={seed}] t={world.now_ms}ms crashed: {exc!r} "
            f"(replay with RAFTLOG_SIM_SEED={seed})\n  last events:\n  {recent}"
        ) from exc
    return world
