"""Invariants of the partition simulator, checked after every event.

- No acknowledged write is lost or reordered: the current leader's log holds every acked
  write at its acked offset, and a write sent after another one was acked sits after it.
- The HW never moves back on a leader within its epoch, and never exceeds the durable
  (flushed) offset of any ISR member, the leader's own included (a replica that reported
  lost or damaged records is exempt until it has repaired).
- Replicas are identical up to the smaller of their two HWs.
- One leader per leader epoch.
- What a consumer read (below the HW) stays in the log: same offset, same payload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.sim.partition_sim import PartitionSim, SimBroker


class InvariantViolation(AssertionError):
    def __init__(self, kind: str, seed: int, now_ms: int, detail: str) -> None:
        super().__init__(
            f"[seed={seed}] t={now_ms}ms {kind}: {detail} (replay with RAFTLOG_SIM_SEED={seed})"
        )
        self.kind = kind
        self.seed = seed


# Violation kinds, so tests can say which one they expect.
ACKED_WRITE_LOST = "acked_write_lost"
ACK_REORDERED = "ack_reordered"
HW_WENT_BACK = "hw_went_back"
HW_ABOVE_DURABLE = "hw_above_durable"
REPLICAS_DIVERGE = "replicas_diverge"
TWO_LEADERS = "two_leaders_in_one_epoch"
NOT_CONVERGED = "not_converged"
CONSUMED_WRITE_LOST = "consumed_write_lost"


@dataclass(frozen=True)
class Ack:
    producer_id: int
    payload: str
    offset: int
    # The highest offset acked before this write was sent: it must land after that one.
    floor_offset: int


class Checker:
    def __init__(self, sim: PartitionSim) -> None:
        self.sim = sim
        self.acks: list[Ack] = []
        self.acked_offsets: dict[int, str] = {}
        self.max_acked_offset = -1
        self.consumed: dict[int, str] = {}
        self.leader_of_epoch: dict[int, int] = {}
        self._last_hw: dict[tuple[int, int, int], int] = {}
        # (broker, incarnation, leader epoch, log generation) -> acks verified in that log.
        self._verified: tuple[tuple[int, int, int, int], int] = ((-1, -1, -1, -1), 0)

    def fail(self, kind: str, detail: str) -> None:
        raise InvariantViolation(kind, self.sim.seed, self.sim.now_ms, detail)

    # ------------------------------------------------------------------ observations
    def on_ack(self, producer_id: int, payload: str, offset: int, floor_offset: int) -> None:
        if offset <= floor_offset:
            self.fail(
                ACK_REORDERED,
                f"{payload!r} acked at offset {offset}, but offset {floor_offset} was acked "
                f"before it was sent",
            )
        other = self.acked_offsets.get(offset)
        if other is not None and other != payload:
            self.fail(ACKED_WRITE_LOST, f"offset {offset} acked for {other!r} and {payload!r}")
        self.acked_offsets[offset] = payload
        self.acks.append(Ack(producer_id, payload, offset, floor_offset))
        self.max_acked_offset = max(self.max_acked_offset, offset)

    def on_consumed(self, offset: int, payload: str) -> None:
        seen = self.consumed.setdefault(offset, payload)
        acked = self.acked_offsets.get(offset, payload)
        if seen != payload or acked != payload:
            self.fail(
                CONSUMED_WRITE_LOST,
                f"offset {offset} read as {payload!r}, earlier read {seen!r}, acked {acked!r}",
            )

    def on_become_leader(self, broker_id: int, leader_epoch: int) -> None:
        previous = self.leader_of_epoch.setdefault(leader_epoch, broker_id)
        if previous != broker_id:
            self.fail(TWO_LEADERS, f"brokers {previous} and {broker_id} led epoch {leader_epoch}")

    # ------------------------------------------------------------------ invariants
    def check(self) -> None:
        sim = self.sim
        active = sim.active_leader()
        if active is not None:
            self._check_acked_writes(active)
        live = [b for b in sim.brokers.values() if b.alive]
        for broker in live:
            leader = broker.partition.leader
            if leader is None:
                continue
            key = (broker.broker_id, broker.incarnation, leader.leader_epoch)
            hw = leader.high_watermark
            if hw < self._last_hw.get(key, hw):
                self.fail(HW_WENT_BACK, f"leader {key}: HW {self._last_hw[key]} -> {hw}")
            self._last_hw[key] = hw
            members = set(leader.isr)
            if broker is active:
                members |= sim.controller.state.isr
            # A damaged replica's disk broke the durability the HW counted on; it is out of
            # the ISR (or on its way out) until it holds everything below the HW again.
            members -= sim.controller.repairing
            members -= {b.broker_id for b in sim.brokers.values() if b.unsafe}
            for member in members:
                durable = sim.brokers[member].log.flushed_offset
                if hw > durable:
                    self.fail(
                        HW_ABOVE_DURABLE,
                        f"leader {broker.broker_id} epoch {leader.leader_epoch} HW {hw} > "
                        f"durable offset {durable} of ISR member {member}",
                    )
        for i, first in enumerate(live):
            for second in live[i + 1 :]:
                upto = min(first.partition.high_watermark, second.partition.high_watermark)
                if first.log.digest_below(upto) != second.log.digest_below(upto):
                    self.fail(
                        REPLICAS_DIVERGE,
                        f"brokers {first.broker_id} and {second.broker_id} differ below {upto}: "
                        f"{first.log.read(0, upto)} vs {second.log.read(0, upto)}",
                    )

    def _check_acked_writes(self, broker: SimBroker) -> None:
        leader = broker.partition.leader
        assert leader is not None
        identity = (
            broker.broker_id,
            broker.incarnation,
            leader.leader_epoch,
            broker.log.generation,
        )
        seen_identity, verified = self._verified
        if identity != seen_identity:
            verified = 0
        log = broker.log
        for ack in self.acks[verified:]:
            entry = log.entry_at(ack.offset)
            if entry is None or entry.payload != ack.payload:
                self.fail(
                    ACKED_WRITE_LOST,
                    f"leader {broker.broker_id} (epoch {leader.leader_epoch}) has {entry} at "
                    f"offset {ack.offset}, acked write was {ack.payload!r}",
                )
        self._verified = (identity, len(self.acks))

    def final_check(self) -> None:
        """After healing: the committed log holds every acked write and replicas agree."""
        sim = self.sim
        active = sim.active_leader()
        if active is None:
            self.fail(NOT_CONVERGED, f"no leader after healing: {sim.controller.state}")
            return
        hw = active.partition.high_watermark
        if hw <= self.max_acked_offset:
            self.fail(NOT_CONVERGED, f"HW {hw} below acked offset {self.max_acked_offset}")
        self._check_acked_writes(active)
        committed = active.log.read(0, hw)
        acked_in_log = [e.offset for e in committed if e.offset in self.acked_offsets]
        if acked_in_log != sorted(self.acked_offsets):
            self.fail(ACKED_WRITE_LOST, "the committed log misses acked offsets")
        for offset, payload in self.consumed.items():
            entry = active.log.entry_at(offset)
            if entry is None or entry.payload != payload or offset >= hw:
                self.fail(CONSUMED_WRITE_LOST, f"consumed {payload!r}@{offset}, log has {entry}")
        for member in sim.controller.state.isr:
            other = sim.brokers[member]
            if other.log.digest_below(hw) != active.log.digest_below(hw):
                self.fail(REPLICAS_DIVERGE, f"ISR member {member} differs below HW {hw}")
