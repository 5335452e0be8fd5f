"""Nemeses: faults injected on a schedule, each recorded in the history as a start/stop pair.

Families (``--nemesis kill,pause,partition,restart``; ``all`` is every one):

- ``kill``      kill -9, restarted at the stop: one random node, the controller (metadata
                quorum) leader, a partition leader, or a majority of nodes;
- ``pause``     SIGSTOP, SIGCONT at the stop: a random node, the controller leader or a
                partition leader;
- ``partition`` dropped packets (a grudge): isolate one node, the controller leader or a
                partition leader, random halves, a majorities ring, or a bridge;
- ``restart``   every node killed and restarted together (no membership change);
- ``corrupt``   one replica of one partition (its leader's or a follower's) gets a flipped
                byte in an old batch of its segment files: the node is killed, the file
                damaged, the node started again;
- ``truncate``  the same, but the replica's last segment is cut in the middle of a batch (a
                torn write below what it had flushed);
- ``forge``     a rogue client on the internal listener sends forged Raft, replication and
                controller messages (jepsen.forger) for the whole fault window;
- ``membership`` the cluster's shape changes (jepsen.membership): a partition reassigned, a
                controller voter removed, a broker drained, the spare node added as a
                voter (alone or replacing one); the stop undoes it.

Damage hits one replica of a partition at a time, and only a partition whose replicas are
all in sync (the previous damage repaired): the failure RF 3 with min ISR 2 promises to
survive.

The schedule is Jepsen's: wait an interval, start a fault of a random enabled family, wait
an interval, stop it, repeat, until cancelled. A ``--nemesis`` entry is a family (a random
mode each time) or one fault kind, ``family-mode`` as the history records it (e.g.
``partition-partition-leader``): a run can aim at the one fault that matters to it.
Whatever is cancelled, ``heal_all`` always runs so the final reads see a whole cluster.
The cluster is anything with the ClusterControl methods (the real jepsen.cluster.Cluster,
or a fake in tests).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import trio

from jepsen import membership
from jepsen.forger import Forger
from jepsen.history import FAULT_START, FAULT_STOP, Recorder
from jepsen.membership import Membership, MembershipControl
from raftlog.metadata.raft.majority import majority_size

log = logging.getLogger(__name__)

FAMILIES = ("kill", "pause", "partition", "restart", "corrupt", "truncate", "forge", "membership")
MODES = {
    "kill": ("one", "controller-leader", "partition-leader", "majority"),
    "pause": ("one", "controller-leader", "partition-leader"),
    "partition": ("one", "controller-leader", "partition-leader", "halves", "ring", "bridge"),
    "restart": ("all",),
    "corrupt": ("follower", "leader"),
    "truncate": ("follower", "leader"),
    "forge": ("internal",),
    "membership": membership.MODES,
}
DAMAGE_FAMILIES = ("corrupt", "truncate")
# Healing must finish even when the run is being cancelled; past this something is wrong
# with the machine and the run reports it rather than hanging.
HEAL_TIMEOUT_S = 60.0
# Putting the membership back (voters, moves, placement; jepsen.membership) has its own bound,
# after the rest is healed: it needs a quorum and moves data.
MEMBERSHIP_HEAL_TIMEOUT_S = 90.0
# One fault's start (a leader lookup and a few signals or nft calls) gives up after this.
START_TIMEOUT_S = 20.0

Grudge = dict[str, list[str]]


class ClusterControl(MembershipControl, Protocol):
    @property
    def names(self) -> list[str]: ...
    async def kill(self, name: str) -> None: ...
    async def start(self, name: str) -> None: ...
    async def pause(self, name: str) -> None: ...
    async def resume(self, name: str) -> None: ...
    async def partition(self, grudge: Mapping[str, Sequence[str]]) -> None: ...
    async def heal_network(self) -> None: ...
    async def controller_leader(self) -> str | None: ...
    async def partition_leaders(self) -> dict[int, str]: ...
    async def partition_replicas(self) -> dict[int, PartitionReplicas]: ...
    async def damage(self, name: str, partition: int, kind: str, rng: random.Random) -> str:
        """Kill `name`, damage its replica of `partition` ("corrupt" or "truncate"), start
        it again; returns what was done (raises if there was nothing to damage)."""
        ...

    def forger(self, rng: random.Random) -> Forger: ...


@dataclass(frozen=True)
class PartitionReplicas:
    leader: str | None
    replicas: tuple[str, ...]
    isr: tuple[str, ...]

    @property
    def whole(self) -> bool:
        """Every replica in sync and a leader: any earlier damage here has been repaired."""
        return self.leader is not None and set(self.isr) == set(self.replicas)


def split_kind(entry: str) -> tuple[str, str | None] | None:
    """ "kill" -> ("kill", None): a family, random modes; "kill-partition-leader" -> ("kill",
    "partition-leader"): one fault kind; anything else -> None."""
    if entry in FAMILIES:
        return entry, None
    family, _, mode = entry.partition("-")
    if family in FAMILIES and mode in MODES[family]:
        return family, mode
    return None


def fault_kinds() -> list[str]:
    return [f"{family}-{mode}" for family in FAMILIES for mode in MODES[family]]


def parse_families(spec: str) -> list[str]:
    """ "kill,partition" -> ["kill", "partition"]; "all" -> every family; "none" or "" -> [];
    a fault kind ("partition-partition-leader") is kept as it is."""
    items = [s.strip() for s in spec.split(",") if s.strip()]
    if items in ([], ["none"]):
        return []
    if items == ["all"]:
        return list(FAMILIES)
    unknown = [s for s in items if split_kind(s) is None]
    if unknown:
        raise ValueError(
            f"unknown nemesis {unknown}; choose from {', '.join(FAMILIES)}, all, none, "
            f"or one fault kind: {', '.join(fault_kinds())}"
        )
    return list(dict.fromkeys(items))


# -- grudges: for each node, the peers it cannot hear (always symmetric) ----------------------


def complete_grudge(side_a: Iterable[str], side_b: Iterable[str]) -> Grudge:
    """Nobody in side_a hears anybody in side_b, and the reverse."""
    a, b = sorted(side_a), sorted(side_b)
    grudge: Grudge = {n: list(b) for n in a}
    grudge.update({n: list(a) for n in b})
    return grudge


def isolate(node: str, nodes: Sequence[str]) -> Grudge:
    return complete_grudge([node], [n for n in nodes if n != node])


def halves(nodes: Sequence[str], rng: random.Random) -> tuple[Grudge, list[str]]:
    """Random minority | majority split; returns the grudge and the minority side."""
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    minority = sorted(shuffled[: len(nodes) // 2])
    return complete_grudge(minority, shuffled[len(nodes) // 2 :]), minority


def majorities_ring(nodes: Sequence[str], rng: random.Random) -> Grudge:
    """Nodes on a shuffled ring each hear only their nearest neighbours, so every node sees a
    majority (itself included) but no two see the same one. Needs 5+ nodes: with 3, a node's
    two neighbours are everyone, so it degenerates to isolating one node's link to another
    (each node still sees a majority of two)."""
    ring = list(nodes)
    rng.shuffle(ring)
    n = len(ring)
    if n < 5:
        # 3 nodes: cut a single link; the two ends each keep a majority through the third.
        return complete_grudge([ring[0]], [ring[1]])
    # Neighbours on each side so that the node plus 2*reach is at least a majority.
    reach = majority_size(n) // 2
    grudge: Grudge = {}
    for i, node in enumerate(ring):
        near = {ring[(i + d) % n] for d in range(-reach, reach + 1)}
        grudge[node] = sorted(set(ring) - near)
    return grudge


def bridge(nodes: Sequence[str], rng: random.Random) -> tuple[Grudge, str]:
    """Two halves that cannot talk, and one node in the middle that hears both; returns the
    grudge and the bridging node."""
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    half = len(shuffled) // 2
    middle = shuffled[half]
    return complete_grudge(shuffled[:half], shuffled[half + 1 :]), middle


# -- faults -----------------------------------------------------------------------------------


@dataclass
class Fault:
    """An applied fault: what to record at its stop and what undoes it."""

    family: str
    kind: str
    targets: list[str]
    # A fault that runs for its whole window (forge): cancelling this scope ends it.
    scope: trio.CancelScope | None = None
    forger: Forger | None = None


class Nemesis:
    def __init__(
        self,
        cluster: ClusterControl,
        families: Sequence[str],
        recorder: Recorder,
        rng: random.Random,
        interval_s: float,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        unknown = [f for f in families if split_kind(f) is None]
        if unknown:
            raise ValueError(f"unknown nemesis {unknown}")
        self.cluster = cluster
        # Families and/or single fault kinds (see parse_families).
        self.families = list(families)
        self.recorder = recorder
        self.rng = rng
        self.interval_s = interval_s
        self.active: list[Fault] = []
        self.started = 0
        # Where running faults (forge) live; run() opens it.
        self._nursery: trio.Nursery | None = None
        self.membership = Membership(cluster, rng)

    # ------------------------------------------------------------------ schedule
    async def run(self) -> None:
        """Start and stop faults until cancelled, then heal everything (shielded)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if not self.families:
                    await trio.sleep_forever()
                if any(self._family_of(e) == "membership" for e in self.families):
                    await self.membership.start_spare()
                while True:
                    await trio.sleep(self.interval_s)
                    entry = self.rng.choice(self.families)
                    with trio.move_on_after(START_TIMEOUT_S):
                        await self.start_fault(entry)
                    await trio.sleep(self.interval_s)
                    await self.stop_all_active()
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True):
                await self.heal_all()

    @staticmethod
    def _family_of(entry: str) -> str | None:
        split = split_kind(entry)
        return None if split is None else split[0]

    async def start_fault(self, entry: str) -> Fault | None:
        """Start one fault of ``entry``: a family (random mode) or a ``family-mode`` kind."""
        split = split_kind(entry)
        if split is None:
            raise ValueError(f"unknown nemesis {entry!r}")
        family, chosen = split
        modes = self.membership.modes() if family == "membership" else MODES[family]
        mode = chosen if chosen is not None else self.rng.choice(modes)
        names = list(self.cluster.names)
        try:
            fault = await self._apply(family, mode, names)
        except Exception as exc:
            # The fault did not take (e.g. a lookup failed): record it as a failed start.
            log.warning("nemesis %s-%s failed to start: %r", family, mode, exc)
            self.recorder.fault(FAULT_START, f"{family}-{mode}", [], applied=False)
            return None
        self.recorder.fault(FAULT_START, fault.kind, fault.targets)
        self.active.append(fault)
        self.started += 1
        return fault

    async def _target(self, mode: str, names: list[str]) -> tuple[str, str]:
        """One node for a single-node mode, falling back to a random one when the leader is
        unknown; the returned mode says which it was."""
        if mode == "controller-leader":
            leader = await self.cluster.controller_leader()
            if leader is not None:
                return leader, mode
        elif mode == "partition-leader":
            leaders = await self.cluster.partition_leaders()
            if leaders:
                return leaders[self.rng.choice(sorted(leaders))], mode
        return self.rng.choice(names), "one"

    async def _apply(self, family: str, mode: str, names: list[str]) -> Fault:
        if family == "kill":
            if mode == "majority":
                targets = sorted(self.rng.sample(names, majority_size(len(names))))
            else:
                target, mode = await self._target(mode, names)
                targets = [target]
            for t in targets:
                await self.cluster.kill(t)
            return Fault(family, f"kill-{mode}", targets)
        if family == "pause":
            target, mode = await self._target(mode, names)
            await self.cluster.pause(target)
            return Fault(family, f"pause-{mode}", [target])
        if family == "partition":
            if mode in ("one", "controller-leader", "partition-leader"):
                # Isolating a partition leader for longer than the broker session timeout
                # makes the controller elect another: what it acknowledged alone meanwhile
                # is exactly what acks=1 can lose.
                target, mode = await self._target(mode, names)
                grudge, targets = isolate(target, names), [target]
            elif mode == "halves":
                grudge, targets = halves(names, self.rng)
            elif mode == "ring":
                grudge = majorities_ring(names, self.rng)
                targets = sorted(n for n, g in grudge.items() if g)
            else:
                grudge, middle = bridge(names, self.rng)
                targets = [middle]
            await self.cluster.partition(grudge)
            return Fault(family, f"partition-{mode}", targets)
        if family == "restart":
            for name in names:
                await self.cluster.kill(name)
            return Fault(family, "restart-all", sorted(names))
        if family in DAMAGE_FAMILIES:
            return await self._damage(family, mode)
        if family == "forge":
            if self._nursery is None:
                raise RuntimeError("forge runs inside Nemesis.run()")
            forger = self.cluster.forger(self.rng)
            scope = trio.CancelScope()

            async def forge() -> None:
                with scope:
                    await forger.run()

            self._nursery.start_soon(forge)
            return Fault(family, "forge-internal", sorted(names), scope=scope, forger=forger)
        if family == "membership":
            targets = await self.membership.start(mode)
            return Fault(family, f"membership-{mode}", targets)
        raise ValueError(f"unknown nemesis family {family!r}")

    async def _damage(self, family: str, mode: str) -> Fault:
        """Damage one replica of a partition whose replicas are all in sync."""
        states = await self.cluster.partition_replicas()
        whole = sorted(p for p, state in states.items() if state.whole)
        if not whole:
            raise RuntimeError("no partition has every replica in sync: nothing may be damaged")
        partition = self.rng.choice(whole)
        state = states[partition]
        assert state.leader is not None
        if mode == "leader":
            target = state.leader
        else:
            target = self.rng.choice(sorted(set(state.replicas) - {state.leader}))
        what = await self.cluster.damage(target, partition, family, self.rng)
        log.info("nemesis %s-%s: %s on %s (partition %d)", family, mode, what, target, partition)
        return Fault(family, f"{family}-{mode}", [target])

    async def stop_fault(self, fault: Fault) -> None:
        if fault.scope is not None:
            fault.scope.cancel()
            if fault.forger is not None:
                log.info("nemesis forge: %s", fault.forger.summary() or "nothing sent")
        if fault.family in ("kill", "restart"):
            for name in fault.targets:
                await self.cluster.start(name)
        elif fault.family == "pause":
            for name in fault.targets:
                await self.cluster.resume(name)
        elif fault.family == "partition":
            await self.cluster.heal_network()
        elif fault.family == "membership":
            await self._restore_membership()
        self.active.remove(fault)
        self.recorder.fault(FAULT_STOP, fault.kind, fault.targets)

    async def _restore_membership(self) -> None:
        """Undo membership changes on the schedule; what cannot be undone now is left to
        the next stop or to heal_all (which raises when it cannot either)."""
        try:
            await self.membership.restore()
        except Exception as exc:  # TooSlowError included; heal_all tries again
            log.warning("nemesis membership: restore failed: %r", exc)

    async def stop_all_active(self) -> None:
        for fault in list(self.active):
            await self.stop_fault(fault)
        if self.membership.dirty:
            # A membership start that was cancelled or failed half-way left a change behind.
            await self._restore_membership()

    async def heal_all(self) -> None:
        """Stop every recorded fault, then make sure of it: every node resumed and running,
        the network whole, then the original voters and placement back and the spare node
        stopped (jepsen.membership). Safe to call any number of times."""
        with trio.fail_after(HEAL_TIMEOUT_S):
            for fault in [f for f in self.active if f.family != "membership"]:
                await self.stop_fault(fault)
            await self.cluster.heal_network()
            for name in self.cluster.names:
                await self.cluster.resume(name)
                await self.cluster.start(name)
        # Membership last, on a whole network with every node up; a failure raises here so
        # the run says the final reads did not see the cluster it started with.
        await self.membership.restore(stop_spare=True, timeout_s=MEMBERSHIP_HEAL_TIMEOUT_S)
        for fault in list(self.active):
            self.active.remove(fault)
            self.recorder.fault(FAULT_STOP, fault.kind, fault.targets)
