"""Seeded, event-driven simulator of one partition replicated on three brokers.

It runs the real sans-IO replication core (raftlog.replication) against in-memory logs, a
simple always-available controller, a lossy network with delays and partitions, crashes that
lose unflushed data, restarts, and producers. `Checker` (partition_checker.py) asserts the
invariants after every event; a failure names the seed that replays it:

    RAFTLOG_SIM_SEED=<n> python -m pytest tests/sim/test_partition_sim.py
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raftlog.constants import NO_LEADER
from raftlog.errors import ErrorCode
from raftlog.replication.core.follower import FetchRequest, FetchResponse, FollowerAction
from raftlog.replication.core.partition import Partition, Transition
from raftlog.replication.core.purgatory import (
    DelayedFetch,
    DelayedProduce,
    FetchCompletion,
    FetchIsolation,
    ProduceCompletion,
    ProduceWait,
    Purgatory,
)
from raftlog.replication.core.types import (
    FetchOutcome,
    LeaderAndIsr,
    LeaderEffects,
    ReplicationSettings,
)
from tests.replication.memory_log import Entry, MemoryLog
from tests.sim.partition_checker import Checker, InvariantViolation
from tests.sim.partition_controller import BROKER_IDS, SimController

PARTITION = ("sim", 0)


@dataclass(frozen=True)
class SimConfig:
    min_insync_replicas: int = 2
    unclean_leader_election: bool = False
    acks: int = -1
    flush_policy: str = "always"
    producers: int = 2
    # Disk damage faults (#13): a lost suffix of the flushed log, and a flipped byte.
    disk_faults: bool = False
    fault_period_ms: int = 1200
    settle_ms: int = 1500
    fault_interval_ms: tuple[int, int] = (30, 200)
    drop_probability: float = 0.03
    network_delay_ms: tuple[int, int] = (1, 6)
    flush_delay_ms: tuple[int, int] = (1, 4)
    tick_ms: int = 10
    replica_lag_time_max_ms: int = 100
    replica_fetch_wait_max_ms: int = 25
    replica_fetch_max_entries: int = 8
    request_timeout_ms: int = 250
    produce_interval_ms: tuple[int, int] = (1, 8)


SAFE = SimConfig()
# min ISR 1 alone is safe: with one ISR member left, the partition waits for it to return.
SAFE_MIN_ISR_ONE = SimConfig(min_insync_replicas=1)
# min ISR 1 with unclean election: a lagging replica may become leader and drop acked data.
UNSAFE_UNCLEAN = SimConfig(min_insync_replicas=1, unclean_leader_election=True)
# acks=1: the leader answers before anyone else has the write.
UNSAFE_ACKS_ONE = SimConfig(min_insync_replicas=1, acks=1)
# The safe configuration plus damaged disks, one replica at a time.
SAFE_DISK_FAULTS = SimConfig(disk_faults=True)


class SimBroker:
    def __init__(self, broker_id: int, settings: ReplicationSettings) -> None:
        self.broker_id = broker_id
        self.settings = settings
        self.log = MemoryLog()
        self.alive = True
        self.incarnation = 0
        self.flush_in_progress = False
        # Unsafe to lead: it lost flushed records or found a damaged one, and has not yet
        # fetched back everything below its leader's HW. Survives restarts, as on disk.
        self.unsafe = False
        # First offset of a damaged batch on a leader: reads stop before it.
        self.damaged_from: int | None = None
        self._fresh_state()

    def _fresh_state(self) -> None:
        # The highest HW a leader sent in a valid fetch answer to this process.
        self.valid_leader_hw: int | None = None
        self.partition = Partition(replica_id=self.broker_id, log=self.log, settings=self.settings)
        self.purgatory = Purgatory(max_waiters=1000)

    def crash(self) -> None:
        self.alive = False
        self.incarnation += 1
        self.log.crash()
        self.flush_in_progress = False
        if self.damaged_from is not None:
            # Recovery finds the bad CRC and cuts before it.
            self.log.truncate_to(self.damaged_from)
            self.damaged_from = None

    def restart(self) -> None:
        self.alive = True
        self._fresh_state()


@dataclass
class SimProducer:
    producer_id: int
    seq: int = 0
    in_flight: tuple[int, int] | None = None  # (seq, floor offset)
    deadline_ms: int = 0


@dataclass
class SimConsumer:
    """Reads the partition from the leader (below the HW only) from offset 0 on."""

    position: int = 0
    in_flight: bool = False
    deadline_ms: int = 0


class PartitionSim:
    def __init__(self, seed: int, config: SimConfig = SAFE) -> None:
        self.seed = seed
        self.config = config
        self.rng = random.Random(seed)
        self.now_ms = 0
        self._queue: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._order = itertools.count()
        settings = ReplicationSettings(
            replica_lag_time_max_ms=config.replica_lag_time_max_ms,
            flush_policy=config.flush_policy,
            replica_fetch_timeout_ms=config.request_timeout_ms,
            replica_fetch_backoff_ms=config.tick_ms,
        )
        self.brokers = {b: SimBroker(b, settings) for b in BROKER_IDS}
        self.cut_links: set[frozenset[int]] = set()
        self._metadata_due_ms = dict.fromkeys(BROKER_IDS, 0)
        self.checker = Checker(self)
        self.controller = SimController(self)
        self.producers = [SimProducer(p) for p in range(config.producers)]
        self.consumer = SimConsumer()
        self.events = 0

    # ------------------------------------------------------------------ event loop
    def at(self, delay_ms: int, handler: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._queue, (self.now_ms + delay_ms, next(self._order), handler, args))

    def run(self) -> Checker:
        config = self.config
        self.controller.commit(self.controller.state)
        for broker_id in BROKER_IDS:
            self.at(self.rng.randint(0, config.tick_ms), self._tick, broker_id)
        for producer in self.producers:
            self.at(self.rng.randint(1, 10), self._produce_tick, producer)
        self.at(self.rng.randint(1, 10), self._consume_tick, self.consumer)
        self.at(self.rng.randint(*config.fault_interval_ms), self._fault)
        self.at(config.fault_period_ms, self._heal_everything)
        end_ms = config.fault_period_ms + config.settle_ms
        while self._queue and self._queue[0][0] <= end_ms:
            self.now_ms, _, handler, args = heapq.heappop(self._queue)
            handler(*args)
            self.events += 1
            self.checker.check()
        self.checker.final_check()
        return self.checker

    def active_leader(self) -> SimBroker | None:
        state = self.controller.state
        broker = self.brokers.get(state.leader_id)
        if broker is None or not broker.alive:
            return None
        leader = broker.partition.leader
        if leader is None or leader.leader_epoch != state.leader_epoch:
            return None
        return broker

    # ------------------------------------------------------------------ network
    def send(self, src: int, dst: int, handler: Callable[..., None], *args: Any) -> None:
        """Broker-to-broker message: may be dropped, delayed, reordered, or cut."""
        if frozenset((src, dst)) in self.cut_links:
            return
        if self.rng.random() < self.config.drop_probability:
            return
        delay = self.rng.randint(*self.config.network_delay_ms)
        self.at(delay, self._deliver, dst, self.brokers[dst].incarnation, handler, args)

    def _deliver(self, dst: int, incarnation: int, handler: Callable[..., None], args) -> None:
        broker = self.brokers[dst]
        # A restart breaks every connection: what was sent to the old process is gone.
        if broker.alive and broker.incarnation == incarnation:
            handler(broker, *args)

    def publish_metadata(self, broker_id: int, state: LeaderAndIsr) -> None:
        # The metadata log reaches each broker in order, with a delay.
        due = max(
            self.now_ms + self.rng.randint(*self.config.network_delay_ms),
            self._metadata_due_ms[broker_id],
        )
        self._metadata_due_ms[broker_id] = due
        broker = self.brokers[broker_id]
        self.at(
            due - self.now_ms,
            self._deliver,
            broker_id,
            broker.incarnation,
            self._apply_metadata,
            (state,),
        )

    # ------------------------------------------------------------------ faults
    def _fault(self) -> None:
        if self.now_ms >= self.config.fault_period_ms:
            return
        rng = self.rng
        live = [b for b in BROKER_IDS if self.brokers[b].alive]
        dead = [b for b in BROKER_IDS if not self.brokers[b].alive]
        kinds = ["crash", "restart", "restart", "cut", "isolate", "heal", "move"]
        if self.config.disk_faults:
            kinds += ["lose_suffix", "flip"]
        kind = rng.choice(kinds)
        if kind == "crash" and len(live) > 1:
            victim = rng.choice(live)
            self.brokers[victim].crash()
            self.controller.broker_crashed(victim)
        elif kind == "restart" and dead:
            self._restart(rng.choice(dead))
        elif kind == "cut":
            self.cut_links.add(frozenset(rng.sample(BROKER_IDS, 2)))
        elif kind == "isolate":
            lonely = rng.choice(BROKER_IDS)
            self.cut_links |= {frozenset((lonely, b)) for b in BROKER_IDS if b != lonely}
        elif kind == "heal":
            self.cut_links.clear()
        elif kind == "move":
            self.controller.move_leader()
        elif kind in ("lose_suffix", "flip"):
            self._damage(kind)
        self.at(rng.randint(*self.config.fault_interval_ms), self._fault)

    def _damage_victim(self) -> SimBroker | None:
        # One damaged replica at a time (what RF 3 with min ISR 2 survives): none may still
        # be repairing, and an ISR member is hit only while another live ISR member can lead.
        if self.controller.unsafe or any(b.unsafe for b in self.brokers.values()):
            return None
        isr = self.controller.state.isr
        candidates = []
        for broker_id in BROKER_IDS:
            broker = self.brokers[broker_id]
            if not broker.alive or broker.log.flushed_offset <= broker.log.log_start_offset:
                continue
            others = [b for b in isr if b != broker_id and self.brokers[b].alive]
            if broker_id not in isr or others:
                candidates.append(broker)
        return self.rng.choice(candidates) if candidates else None

    def _damage(self, kind: str) -> None:
        broker = self._damage_victim()
        if broker is None:
            return
        log = broker.log
        offset = self.rng.randint(log.log_start_offset, log.flushed_offset - 1)
        if kind == "lose_suffix":
            # Fsynced records vanish (a lying disk, or a torn tail cut by recovery). Recovery
            # sees it lost data below its recovery point: the replica restarts unsafe.
            broker.crash()
            log.truncate_to(offset)
            broker.unsafe = True
            self.controller.broker_crashed(broker.broker_id)
            return
        # A byte flips in a flushed batch: the CRC (scrubber or read) finds it at once.
        follower = broker.partition.follower
        if follower is not None:
            step = follower.truncation_for_damage(offset=offset)
            if step is None:
                return  # a cut is already out: the next scrub pass finds the damage again
            assert step.truncate_to_offset is not None
            log.truncate_to(step.truncate_to_offset)
            follower.on_truncated(now_ms=self.now_ms)
        else:
            # A leader marks the range damaged and serves nothing from it; it cuts once it
            # follows another leader.
            broker.damaged_from = offset
        broker.unsafe = True
        # Only a HW sent after the damage proves what it must fetch back.
        broker.valid_leader_hw = None
        self.controller.report_unsafe(broker.broker_id)
        self._drive_follower(broker)

    def _maybe_clear_unsafe(self, broker: SimBroker) -> None:
        # As the real fetcher: safe again once it holds, flushed, everything below a HW its
        # leader sent in a valid answer. The heartbeat carries it to the controller.
        if not broker.unsafe or broker.damaged_from is not None:
            return
        hw = broker.valid_leader_hw
        if hw is None or broker.log.flushed_offset < hw or broker.log.log_end_offset < hw:
            return
        broker.unsafe = False
        self.at(
            self.rng.randint(*self.config.network_delay_ms),
            self._deliver,
            broker.broker_id,
            broker.incarnation,
            self._heartbeat_safe,
            (),
        )

    def _heartbeat_safe(self, broker: SimBroker) -> None:
        if not broker.unsafe:
            self.controller.clear_unsafe(broker.broker_id)

    def _restart(self, broker_id: int) -> None:
        broker = self.brokers[broker_id]
        broker.restart()
        if broker.unsafe:
            # Its registration heartbeat already says so.
            self.controller.report_unsafe(broker_id)
        self.controller.broker_restarted(broker_id)

    def _heal_everything(self) -> None:
        self.cut_links.clear()
        for broker_id in BROKER_IDS:
            if not self.brokers[broker_id].alive:
                self._restart(broker_id)

    # ------------------------------------------------------------------ broker events
    def _tick(self, broker_id: int) -> None:
        broker = self.brokers[broker_id]
        if broker.alive:
            leader = broker.partition.leader
            if leader is not None:
                self._leader_effects(broker, leader.on_tick(now_ms=self.now_ms))
            completions = broker.purgatory.on_deadline(
                now_ms=self.now_ms, progress_of=lambda key: self._progress(broker)
            )
            self._dispatch(broker, completions)
            self._drive_follower(broker)
        self.at(self.config.tick_ms, self._tick, broker_id)

    def _progress(self, broker: SimBroker):
        leader = broker.partition.leader
        return None if leader is None else leader.progress()

    def _apply_metadata(self, broker: SimBroker, state: LeaderAndIsr) -> None:
        result = broker.partition.apply_metadata(now_ms=self.now_ms, state=state)
        if result.lost_leadership:
            failed = broker.purgatory.fail_partition(
                key=PARTITION, error=ErrorCode.not_leader_or_follower
            )
            self._dispatch(broker, failed)
        if result.transition is Transition.BECAME_LEADER:
            self.checker.on_become_leader(broker.broker_id, state.leader_epoch)
        if result.effects is not None:
            self._leader_effects(broker, result.effects)
        follower = broker.partition.follower
        if follower is not None and broker.damaged_from is not None:
            step = follower.truncation_for_damage(offset=broker.damaged_from)
            if step is not None:
                assert step.truncate_to_offset is not None
                broker.log.truncate_to(step.truncate_to_offset)
                follower.on_truncated(now_ms=self.now_ms)
                broker.damaged_from = None
        self._drive_follower(broker)

    def _leader_effects(self, broker: SimBroker, effects: LeaderEffects) -> None:
        leader = broker.partition.leader
        if leader is None:
            return
        if effects.alter_partition is not None:
            self.at(
                self.rng.randint(*self.config.network_delay_ms),
                self._controller_alter,
                broker.broker_id,
                broker.incarnation,
                effects.alter_partition,
            )
        completions = broker.purgatory.on_progress(
            key=PARTITION, progress=leader.progress(), bytes_between=_bytes_between
        )
        self._dispatch(broker, completions)

    def _controller_alter(self, broker_id: int, incarnation: int, request) -> None:
        if self.brokers[broker_id].incarnation != incarnation:
            return
        result = self.controller.alter_partition(request)
        self.at(
            self.rng.randint(*self.config.network_delay_ms),
            self._deliver,
            broker_id,
            incarnation,
            self._alter_result,
            (request, result),
        )

    def _alter_result(self, broker: SimBroker, request, result) -> None:
        leader = broker.partition.leader
        if leader is not None:
            self._leader_effects(
                broker, leader.on_alter_partition_result(request=request, result=result)
            )

    def _request_flush(self, broker: SimBroker) -> None:
        if broker.flush_in_progress:
            return
        broker.flush_in_progress = True
        target = broker.log.log_end_offset
        self.at(
            self.rng.randint(*self.config.flush_delay_ms),
            self._flush_done,
            broker.broker_id,
            broker.incarnation,
            target,
            broker.log.generation,
        )

    def _flush_done(self, broker_id: int, incarnation: int, target: int, generation: int) -> None:
        broker = self.brokers[broker_id]
        if not broker.alive or broker.incarnation != incarnation:
            return
        broker.flush_in_progress = False
        if generation == broker.log.generation:
            broker.log.flush_to(target)
        if broker.log.flushed_offset < broker.log.log_end_offset:
            self._request_flush(broker)
        leader = broker.partition.leader
        if leader is not None:
            self._leader_effects(broker, leader.on_flushed(now_ms=self.now_ms))
        self._maybe_clear_unsafe(broker)
        follower = broker.partition.follower
        if follower is not None and follower.on_flushed(now_ms=self.now_ms):
            self._drive_follower(broker)

    # ------------------------------------------------------------------ replication
    def _drive_follower(self, broker: SimBroker) -> None:
        follower = broker.partition.follower
        if follower is None:
            return
        request = follower.fetch_request(now_ms=self.now_ms)
        if request is not None:
            self.send(broker.broker_id, request.leader_id, self._leader_fetch, request)

    def _leader_fetch(self, broker: SimBroker, request: FetchRequest) -> None:
        leader = broker.partition.leader
        if leader is None:
            self._answer_fetch(broker, request, ErrorCode.not_leader_or_follower)
            return
        decision = leader.on_follower_fetch(
            now_ms=self.now_ms,
            replica_id=request.replica_id,
            fetch_offset=request.fetch_offset,
            last_fetched_epoch=request.last_fetched_epoch,
            current_leader_epoch=request.current_leader_epoch,
        )
        if decision.outcome is FetchOutcome.READ:
            waiter = DelayedFetch(
                PARTITION,
                request.fetch_offset,
                1,
                self.now_ms + self.config.replica_fetch_wait_max_ms,
                ("fetch", request),
                FetchIsolation.LOG_END,
            )
            done = broker.purgatory.add_fetch(
                waiter=waiter, progress=leader.progress(), bytes_between=_bytes_between
            )
            if done is not None:
                self._dispatch(broker, [done])
        else:
            self._answer_fetch(broker, request, decision.error, decision.diverging_epoch)
        self._leader_effects(broker, decision.effects)

    def _answer_fetch(
        self,
        broker: SimBroker,
        request: FetchRequest,
        error: ErrorCode,
        diverging=None,
        end_offset: int = 0,
    ) -> None:
        log = broker.log
        entries: list[Entry] = []
        leader = broker.partition.leader
        hw = broker.partition.high_watermark
        if error == ErrorCode.none and diverging is None and leader is not None:
            end_offset = _readable_end(broker, end_offset)
            count = min(self.config.replica_fetch_max_entries, end_offset - request.fetch_offset)
            entries = log.read(request.fetch_offset, max(0, count))
        response = FetchResponse(
            request.request_id, error, hw, log.log_start_offset, diverging, bool(entries)
        )
        self.send(broker.broker_id, request.replica_id, self._follower_response, response, entries)

    def _follower_response(self, broker: SimBroker, response: FetchResponse, entries) -> None:
        follower = broker.partition.follower
        if follower is None:
            return
        step = follower.on_fetch_response(now_ms=self.now_ms, response=response)
        valid = response.error == ErrorCode.none and response.diverging_epoch is None
        if valid and step.action is not FollowerAction.IGNORED:
            broker.valid_leader_hw = response.high_watermark
        if step.action is FollowerAction.APPEND:
            broker.log.append_entries(entries)
            self._request_flush(broker)
        elif step.action is FollowerAction.RESET:
            assert step.reset_to_offset is not None
            broker.log.truncate_fully_and_start_at(step.reset_to_offset)
            follower.on_truncated(now_ms=self.now_ms)
        elif step.action is FollowerAction.TRUNCATE:
            assert step.truncate_to_offset is not None
            broker.log.truncate_to(step.truncate_to_offset)
            follower.on_truncated(now_ms=self.now_ms)
        self._maybe_clear_unsafe(broker)
        self._drive_follower(broker)

    # ------------------------------------------------------------------ produce
    def _produce_tick(self, producer: SimProducer) -> None:
        config = self.config
        if producer.in_flight is not None and self.now_ms >= producer.deadline_ms:
            producer.in_flight = None  # no answer: outcome unknown, move on
        if producer.in_flight is None and self.now_ms < config.fault_period_ms:
            leader_id = self.controller.state.leader_id
            if leader_id != NO_LEADER:
                producer.seq += 1
                producer.in_flight = (producer.seq, self.checker.max_acked_offset)
                producer.deadline_ms = self.now_ms + config.request_timeout_ms + 50
                payload = f"p{producer.producer_id}-{producer.seq}"
                self.at(
                    self.rng.randint(*config.network_delay_ms),
                    self._deliver,
                    leader_id,
                    self.brokers[leader_id].incarnation,
                    self._leader_produce,
                    (producer, producer.seq, payload),
                )
        if producer.in_flight is not None or self.now_ms < config.fault_period_ms:
            self.at(self.rng.randint(*config.produce_interval_ms), self._produce_tick, producer)

    def _leader_produce(self, broker: SimBroker, producer: SimProducer, seq: int, payload: str):
        config = self.config
        leader = broker.partition.leader
        if leader is None:
            return self._answer_produce(producer, seq, payload, ErrorCode.not_leader_or_follower)
        error = leader.check_produce(
            acks=config.acks, min_insync_replicas=config.min_insync_replicas
        )
        if error != ErrorCode.none:
            return self._answer_produce(producer, seq, payload, error)
        first, last = broker.log.append(leader.leader_epoch, [payload])
        self._request_flush(broker)
        wait = ProduceWait.HIGH_WATERMARK if config.acks == -1 else ProduceWait.FLUSHED
        waiter = DelayedProduce(
            PARTITION,
            last + 1,
            self.now_ms + config.request_timeout_ms,
            config.min_insync_replicas,
            ("produce", producer, seq, payload, first),
            wait,
        )
        done = broker.purgatory.add_produce(waiter=waiter, progress=leader.progress())
        if done is not None:
            self._dispatch(broker, [done])
        self._leader_effects(broker, leader.on_local_append(now_ms=self.now_ms))

    def _answer_produce(self, producer, seq, payload, error, offset: int = -1) -> None:
        self.at(
            self.rng.randint(*self.config.network_delay_ms),
            self._produce_answer,
            producer,
            seq,
            payload,
            error,
            offset,
        )

    def _produce_answer(self, producer: SimProducer, seq, payload, error, offset) -> None:
        if producer.in_flight is None or producer.in_flight[0] != seq:
            return
        floor = producer.in_flight[1]
        producer.in_flight = None
        if error == ErrorCode.none:
            self.checker.on_ack(producer.producer_id, payload, offset, floor)

    def _dispatch(self, broker: SimBroker, completions) -> None:
        for completion in completions:
            token = completion.token
            if isinstance(completion, ProduceCompletion):
                _, producer, seq, payload, first = token
                self._answer_produce(producer, seq, payload, completion.error, first)
            elif isinstance(completion, FetchCompletion) and token[0] == "consume":
                _, consumer, position = token
                self._answer_consumer(broker, consumer, position, completion)
            elif isinstance(completion, FetchCompletion):
                _, request = token
                self._answer_fetch(
                    broker, request, completion.error, end_offset=completion.readable_end_offset
                )

    # ------------------------------------------------------------------ consume
    def _consume_tick(self, consumer: SimConsumer) -> None:
        if consumer.in_flight and self.now_ms >= consumer.deadline_ms:
            consumer.in_flight = False  # no answer: ask again
        leader_id = self.controller.state.leader_id
        if not consumer.in_flight and leader_id != NO_LEADER:
            consumer.in_flight = True
            consumer.deadline_ms = self.now_ms + self.config.request_timeout_ms
            self.at(
                self.rng.randint(*self.config.network_delay_ms),
                self._deliver,
                leader_id,
                self.brokers[leader_id].incarnation,
                self._leader_consumer_fetch,
                (consumer, consumer.position),
            )
        self.at(self.config.tick_ms, self._consume_tick, consumer)

    def _leader_consumer_fetch(self, broker: SimBroker, consumer: SimConsumer, position: int):
        leader = broker.partition.leader
        if leader is None or not broker.log.log_start_offset <= position <= leader.high_watermark:
            consumer.in_flight = False  # not leader (yet), or a HW behind us: try again later
            return
        waiter = DelayedFetch.for_consumer(
            PARTITION,
            position,
            1,
            self.config.replica_fetch_wait_max_ms,
            self.now_ms,
            ("consume", consumer, position),
        )
        done = broker.purgatory.add_fetch(
            waiter=waiter, progress=leader.progress(), bytes_between=_bytes_between
        )
        if done is not None:
            self._dispatch(broker, [done])

    def _answer_consumer(self, broker, consumer, position, completion: FetchCompletion) -> None:
        entries: list[Entry] = []
        if completion.error == ErrorCode.none:
            end_offset = _readable_end(broker, completion.readable_end_offset)
            count = min(self.config.replica_fetch_max_entries, end_offset - position)
            entries = broker.log.read(position, max(0, count))
        self.at(
            self.rng.randint(*self.config.network_delay_ms),
            self._consumer_answer,
            consumer,
            position,
            entries,
        )

    def _consumer_answer(self, consumer: SimConsumer, position: int, entries: list[Entry]):
        if not consumer.in_flight or position != consumer.position:
            return
        consumer.in_flight = False
        for entry in entries:
            self.checker.on_consumed(entry.offset, entry.payload)
            consumer.position = entry.offset + 1


def _readable_end(broker: SimBroker, end_offset: int) -> int:
    # A leader's damaged range fails reads; reads before it stop at it.
    if broker.damaged_from is None:
        return end_offset
    return min(end_offset, broker.damaged_from)


def _bytes_between(key, start_offset: int, end_offset: int) -> int:
    return max(0, end_offset - start_offset)


def run_seed(seed: int, config: SimConfig = SAFE) -> Checker:
    """Run one seed; any failure names the seed (InvariantViolation already does)."""
    sim = PartitionSim(seed, config)
    try:
        return sim.run()
    except InvariantViolation:
        raise
    except Exception as exc:
        raise AssertionError(
            f"[seed={seed}] t={sim.now_ms}ms crashed: {exc!r} (replay with RAFTLOG_SIM_SEED={seed})"
        ) from exc
