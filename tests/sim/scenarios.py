"""A tiny step language for hand-written simulator scenarios.

A scenario is a list of tuples run in order against a Simulation with a lossless network.
Node arguments are ints or names bound by ("remember_leader", name) / ("remember_follower",
name). Steps:

  ("run", ms)                          advance simulated time, delivering whatever is due
  ("deliver",)                         run until no message is in flight
  ("drop", src, dst)                   drop every message in flight from src to dst
  ("until_leader", ms[, not_node])     run until a leader (other than not_node) exists
  ("remember_leader", name) / ("remember_follower", name)
  ("remember_epoch", name)             the leader's epoch, for ("expect", "epoch_gt", ...)
  ("isolate", n) / ("partition", [set, set]) / ("heal",)
  ("crash", n) / ("restart", n) / ("resign", n)   resign: graceful, sends EndQuorumEpoch
  ("propose", n, count)                client writes at node n (must be the leader)
  ("snapshot", n)                      node n snapshots everything it applied
  ("expect", what, ...)                what: leader, not_leader, role, epoch, epoch_gt,
                                       newest_epoch, hw_equal, stat_at_least, log_equal
"""

from __future__ import annotations

import heapq
from typing import Any

from tests.sim.cluster import NetworkConfig, Simulation

Step = tuple[Any, ...]


class Scenario:
    def __init__(self, seed: int = 1, voters: int = 3, observers: int = 1) -> None:
        network = NetworkConfig(min_delay_ms=1, max_delay_ms=5, flush_max_delay_ms=2)
        self.sim = Simulation(seed, voters=voters, observers=observers, network=network)
        self.names: dict[str, int] = {}

    def node(self, ref: Any) -> int:
        return self.names[ref] if isinstance(ref, str) else int(ref)

    def fail(self, step: Step, what: str) -> None:
        roles = {
            i: (n.core.role, n.core.high_watermark) if n.core else None
            for i, n in self.sim.nodes.items()
        }
        self.sim.fail(f"step {step!r}: {what}; roles: {roles}")

    def run(self, steps: list[Step]) -> Simulation:
        for step in steps:
            getattr(self, "_" + step[0])(step, *step[1:])
        return self.sim

    def _run(self, step: Step, ms: int) -> None:
        self.sim.run_until(self.sim.now_ms + ms)

    def _deliver(self, step: Step) -> None:
        sim = self.sim

        def quiet() -> bool:
            return not any(kind == "deliver" for _, _, kind, _ in sim._queue)

        if not sim.run_until(sim.now_ms + 10_000, quiet):
            self.fail(step, "messages still in flight after 10 s")

    def _drop(self, step: Step, src: Any, dst: Any) -> None:
        pair = (self.node(src), self.node(dst))
        queue = self.sim._queue
        queue[:] = [e for e in queue if not (e[2] == "deliver" and e[3][:2] == pair)]
        heapq.heapify(queue)

    def _until_leader(self, step: Step, ms: int, not_node: Any = None) -> None:
        excluded = None if not_node is None else self.node(not_node)

        def found() -> bool:
            return any(n != excluded for n in self.sim.leaders())

        if not self.sim.run_until(self.sim.now_ms + ms, found):
            self.fail(step, f"no leader within {ms} ms")

    def _remember_leader(self, step: Step, name: str) -> None:
        """The leader of the newest epoch: a cut-off leader of an older one may not have
        noticed yet (check-quorum) that the others elected a new one."""
        leaders = self.sim.leaders()
        newest = max((self.sim.core(n).epoch for n in leaders), default=None)
        current = [n for n in leaders if self.sim.core(n).epoch == newest]
        if len(current) != 1:
            self.fail(step, f"expected one leader, found {leaders}")
        self.names[name] = current[0]

    def _remember_follower(self, step: Step, name: str) -> None:
        for node_id in sorted(self.sim.voter_ids):
            core = self.sim.nodes[node_id].core
            if core is not None and core.role.name == "follower":
                self.names[name] = node_id
                return
        self.fail(step, "no follower")

    def _remember_epoch(self, step: Step, name: str) -> None:
        leaders = self.sim.leaders()
        if not leaders:
            self.fail(step, "no leader")
        self.names[name] = self.sim.core(leaders[0]).epoch

    def _isolate(self, step: Step, ref: Any) -> None:
        self.sim.isolate(self.node(ref))

    def _partition(self, step: Step, groups: list[set[Any]]) -> None:
        self.sim.partition([{self.node(r) for r in g} for g in groups])

    def _heal(self, step: Step) -> None:
        self.sim.heal()

    def _crash(self, step: Step, ref: Any) -> None:
        self.sim.crash(self.node(ref))

    def _restart(self, step: Step, ref: Any) -> None:
        self.sim.restart(self.node(ref))

    def _propose(self, step: Step, ref: Any, count: int) -> None:
        if not self.sim.propose(self.node(ref), count):
            self.fail(step, "proposal refused")

    def _resign(self, step: Step, ref: Any) -> None:
        self.sim.resign(self.node(ref))

    def _snapshot(self, step: Step, ref: Any) -> None:
        node = self.sim.nodes[self.node(ref)]
        self.sim.take_snapshot(node.node_id, node.sm_end)

    def _expect(self, step: Step, what: str, *args: Any) -> None:
        sim = self.sim
        live = [n for n in sim.nodes.values() if n.core is not None]
        if what == "leader":
            if sim.leaders() != [self.node(args[0])]:
                self.fail(step, f"leaders are {sim.leaders()}")
        elif what == "not_leader":
            if self.node(args[0]) in sim.leaders():
                self.fail(step, "still leader")
        elif what == "role":
            role = sim.core(self.node(args[0])).role.name
            if role not in args[1:]:
                self.fail(step, f"role is {role}")
        elif what == "epoch":
            expected = self.node(args[0])
            epochs = {n.node_id: n.core.epoch for n in live if n.core is not None}
            if set(epochs.values()) != {expected}:
                self.fail(step, f"epochs are {epochs}")
        elif what == "epoch_gt":
            leaders = sim.leaders()
            if not leaders or sim.core(leaders[0]).epoch <= self.node(args[0]):
                self.fail(step, "epoch did not grow")
        elif what == "newest_epoch":
            # ("expect", "newest_epoch", name, delta): the newest leader's epoch is name+delta
            newest = max((sim.core(n).epoch for n in sim.leaders()), default=None)
            if newest != self.node(args[0]) + args[1]:
                self.fail(step, f"newest leader epoch is {newest}")
        elif what == "hw_equal":
            hws = {n.node_id: n.core.high_watermark for n in live if n.core is not None}
            if len(set(hws.values())) != 1:
                self.fail(step, f"high watermarks differ: {hws}")
        elif what == "stat_at_least":
            node = sim.nodes[self.node(args[0])]
            if node.stats[args[1]] < args[2]:
                self.fail(step, f"stats are {node.stats}")
        elif what == "log_equal":
            logs = {
                n.node_id: [(e.offset, e.epoch) for e in n.core.entries()][-5:]
                for n in live
                if n.core is not None
            }
            if len({tuple(v) for v in logs.values()}) != 1:
                self.fail(step, f"log tails differ: {logs}")
        else:
            raise ValueError(f"unknown expectation {what!r}")


def run_scenario(steps: list[Step], seed: int = 1, voters: int = 3) -> Simulation:
    return Scenario(seed=seed, voters=voters).run(steps)
