"""The partition simulator's controller: always available, one partition, epoch-checked."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from raftlog.constants import NO_LEADER
from raftlog.errors import ErrorCode
from raftlog.replication.core.types import AlterPartitionRequest, LeaderAndIsr

if TYPE_CHECKING:
    from tests.sim.partition_sim import PartitionSim

BROKER_IDS = (1, 2, 3)


class SimController:
    """Always available; commits AlterPartition with epoch checks and elects leaders."""

    def __init__(self, sim: PartitionSim) -> None:
        self.sim = sim
        self.state = LeaderAndIsr(1, 1, 1, BROKER_IDS, frozenset(BROKER_IDS))
        self.live = set(BROKER_IDS)
        # Replicas their brokers report unsafe to lead (lost or damaged records): as
        # metadata/controller/elections.py, out of the ISR and never elected, not even as
        # the last ISR member.
        self.unsafe: set[int] = set()
        # Damaged replicas not yet back in a committed ISR (a leader's stale view may still
        # count the durability they lost).
        self.repairing: set[int] = set()

    def commit(self, state: LeaderAndIsr) -> None:
        self.state = state
        for broker_id in BROKER_IDS:
            self.sim.publish_metadata(broker_id, state)

    def alter_partition(self, request: AlterPartitionRequest) -> LeaderAndIsr | ErrorCode:
        state = self.state
        if request.leader_epoch != state.leader_epoch or request.leader_id != state.leader_id:
            return ErrorCode.fenced_leader_epoch
        if request.partition_epoch != state.partition_epoch:
            return ErrorCode.invalid_update_version
        # The real controller lets an unsafe replica in and takes it out at the next
        # heartbeat; refusing it is the same end state.
        if any(r not in self.live or r in self.unsafe for r in request.new_isr - state.isr):
            return ErrorCode.ineligible_replica
        if request.leader_id not in request.new_isr:
            return ErrorCode.invalid_request
        new = replace(state, partition_epoch=state.partition_epoch + 1, isr=request.new_isr)
        self.repairing -= request.new_isr - state.isr
        self.commit(new)
        return new

    def _elect(self, isr: frozenset[int], exclude: int | None = None) -> LeaderAndIsr:
        state = self.state
        safe = self.live - self.unsafe
        candidates = [r for r in state.replicas if r in isr and r in safe and r != exclude]
        if candidates:
            leader = self.sim.rng.choice(candidates)
        elif self.sim.config.unclean_leader_election and safe - {exclude}:
            leader = self.sim.rng.choice(sorted(safe - {exclude}))
            isr = frozenset({leader})
        else:
            leader = NO_LEADER
        return replace(
            state,
            leader_id=leader,
            leader_epoch=state.leader_epoch + 1,
            partition_epoch=state.partition_epoch + 1,
            isr=isr,
        )

    def broker_crashed(self, broker_id: int) -> None:
        self.live.discard(broker_id)
        state = self.state
        # Fencing removes the broker from the ISR, except the last member (it has the data).
        isr = state.isr - {broker_id} if len(state.isr) > 1 else state.isr
        if state.leader_id == broker_id:
            self.commit(self._elect(isr))
        elif isr != state.isr:
            self.commit(replace(state, partition_epoch=state.partition_epoch + 1, isr=isr))

    def broker_restarted(self, broker_id: int) -> None:
        self.live.add(broker_id)
        if self.state.leader_id == NO_LEADER:
            self.commit(self._elect(self.state.isr))
        else:
            self.sim.publish_metadata(broker_id, self.state)

    def report_unsafe(self, broker_id: int) -> None:
        """Out of the ISR (never emptied) and out of leadership; offline if no safe member."""
        self.unsafe.add(broker_id)
        self.repairing.add(broker_id)
        state = self.state
        isr = state.isr - {broker_id} or state.isr
        if state.leader_id == broker_id or state.leader_id == NO_LEADER:
            self.commit(self._elect(isr))
        elif isr != state.isr:
            self.commit(replace(state, partition_epoch=state.partition_epoch + 1, isr=isr))

    def clear_unsafe(self, broker_id: int) -> None:
        # It rejoins the ISR the usual way, when the leader sees it caught up.
        self.unsafe.discard(broker_id)
        if self.state.leader_id == NO_LEADER:
            self.commit(self._elect(self.state.isr))

    def move_leader(self) -> None:
        """A controlled leader change: another live ISR member takes over."""
        if self.state.leader_id == NO_LEADER:
            return
        new = self._elect(self.state.isr, exclude=self.state.leader_id)
        if new.leader_id != NO_LEADER and new.isr == self.state.isr:
            self.commit(new)
