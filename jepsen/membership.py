"""The ``membership`` nemesis: the cluster's shape changes under the workload.

Modes (``membership-<mode>`` in the history; targets are the nodes whose role changes):

- ``reassign``  one in-sync partition of the run's topic gets one replica swapped for a
                broker outside its replica set (AlterPartitionReassignments). At the stop a
                move still in progress is cancelled (Kafka reverts it), a finished one is
                moved back, so the next fault finds the placement the run started with;
- ``voter``     one random controller voter (the leader among them) is removed from the
                metadata quorum (RemoveRaftVoter) and added back at the stop (AddRaftVoter).
                With three nodes the quorum runs on two voters for the window;
- ``broker``    one broker is drained: every replica of the run's topic it holds moves to
                a broker outside that partition's replica set; at the stop it gets them back;
- ``observer``  the spare node (a broker-only process that fetches the metadata log as an
                observer) is added as a voter (3 -> 4 voters) and removed at the stop;
- ``replace``   the spare is added as a voter, then an original voter removed (4 -> 3); the
                stop adds the original back before it removes the spare, so the quorum never
                has fewer than three voters.

Safety rules the nemesis keeps, after KIP-853 (docs/membership.md): one voter change at a
time, each awaited until committed before the next; a fault starts only when the cluster is
whole (the original voters, no reassignment in flight, the original placement), so changes
never pile up; removals never go below two voters (with three nodes only ``voter`` does).
Every change is undone by ``restore``, which compares what the cluster says with the
baseline taken at the first change and undoes whatever differs, whoever left it: a fault's
stop, a start cancelled half-way, or ``heal_all`` at the end of the run (which also stops
the spare). A voter change that is refused for a passing reason (another change pending,
the observer not caught up, no leader) is retried by the cluster control until its deadline.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

import trio

log = logging.getLogger(__name__)

MODES = ("reassign", "voter", "broker", "observer", "replace")
# Modes that need the spare node process.
SPARE_MODES = ("observer", "replace")
# Modes the family's random pick (so ``membership`` and ``all``) leaves out while raftlog has
# a known bug they hit; each still runs when named (``--nemesis membership-reassign``).
# None today: `reassign` and `broker` were held back until an AlterPartition answer arriving
# after a reassignment's completion stopped crashing the partition leader (docs/jepsen.md).
HELD_BACK_MODES: dict[str, str] = {}
# The spare starts with the nemesis; the first fault that needs it waits this long for its
# broker registration.
SPARE_READY_TIMEOUT_S = 30.0
# A restore (voters back, moves cancelled or reverted, placement back) gives up after this.
RESTORE_TIMEOUT_S = 45.0
# Between two looks at the cluster while waiting for a condition under a deadline.
POLL_INTERVAL_S = 0.5
# Voter changes in one restore: more than this means the cluster is not converging.
MAX_RESTORE_VOTER_CHANGES = 8


class MembershipControl(Protocol):
    """What the membership nemesis asks of the cluster (jepsen.cluster.Cluster, or a fake).
    Voter changes return once committed; the others raise when the cluster does not answer."""

    @property
    def names(self) -> list[str]: ...
    @property
    def spare(self) -> str | None:
        """A node process outside the cluster's voters and placement (None: there is none)."""
        ...

    def is_running(self, name: str) -> bool: ...
    async def start(self, name: str) -> None: ...
    async def stop(self, name: str) -> None: ...
    async def voters(self) -> list[str]: ...
    async def add_voter(self, name: str) -> None: ...
    async def remove_voter(self, name: str) -> None: ...
    async def brokers(self) -> list[str]: ...
    async def partition_replicas(self) -> Mapping[int, Placement]: ...
    async def reassign(self, moves: Mapping[int, Sequence[str] | None]) -> None: ...
    async def reassigning(self) -> set[int]: ...


class Placement(Protocol):
    """A partition's replicas and ISR (jepsen.nemesis.PartitionReplicas)."""

    @property
    def replicas(self) -> tuple[str, ...]: ...
    @property
    def whole(self) -> bool: ...


class MembershipNotWhole(RuntimeError):
    """A membership fault may not start: an earlier change is not undone yet."""


class Membership:
    """Applies and undoes membership faults against a MembershipControl."""

    def __init__(self, cluster: MembershipControl, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.baseline_voters: frozenset[str] | None = None
        self.baseline: dict[int, tuple[str, ...]] | None = None
        # Set before the first change of a fault, cleared by a restore that finished: a
        # start cancelled half-way still gets undone.
        self.dirty = False

    def modes(self) -> tuple[str, ...]:
        """The modes a random pick chooses from: those this cluster allows (the spare's only
        with a spare), less the held-back ones."""
        return tuple(
            m
            for m in MODES
            if m not in HELD_BACK_MODES and (self.cluster.spare is not None or m not in SPARE_MODES)
        )

    async def start_spare(self) -> None:
        """Start the spare process early, so it has registered by the first fault."""
        spare = self.cluster.spare
        if spare is not None and not self.cluster.is_running(spare):
            await self.cluster.start(spare)

    # ------------------------------------------------------------------ faults
    async def start(self, mode: str) -> list[str]:
        """Apply one fault of ``mode``; returns its targets."""
        if mode not in MODES:
            raise ValueError(f"unknown membership mode {mode!r}")
        if mode in SPARE_MODES and self.cluster.spare is None:
            raise RuntimeError(f"membership-{mode} needs a spare node")
        placement = await self._check_whole()
        if mode == "voter":
            voters = sorted(await self.cluster.voters())
            if len(voters) < 3:
                raise RuntimeError(f"only {len(voters)} voters: none may be removed")
            victim = self.rng.choice(voters)
            self.dirty = True
            await self.cluster.remove_voter(victim)
            log.info("membership-voter: removed voter %s", victim)
            return [victim]
        if mode in SPARE_MODES:
            spare = await self._spare_ready()
            self.dirty = True
            await self.cluster.add_voter(spare)
            log.info("membership-%s: added voter %s", mode, spare)
            if mode == "observer":
                return [spare]
            victim = self.rng.choice(sorted(self.baseline_voters or ()))
            await self.cluster.remove_voter(victim)
            log.info("membership-replace: removed voter %s", victim)
            return sorted([spare, victim])
        brokers = await self._brokers()
        if mode == "reassign":
            whole = sorted(p for p, state in placement.items() if state.whole)
            movable = [p for p in whole if set(brokers) - set(placement[p].replicas)]
            if not movable:
                raise RuntimeError("no in-sync partition has a broker outside its replicas")
            partition = self.rng.choice(movable)
            replicas = list(placement[partition].replicas)
            index = self.rng.randrange(len(replicas))
            outside = sorted(set(brokers) - set(replicas))
            removed, added = replicas[index], self.rng.choice(outside)
            replicas[index] = added
            self.dirty = True
            await self.cluster.reassign({partition: replicas})
            log.info(
                "membership-reassign: partition %d %s -> %s",
                partition,
                list(placement[partition].replicas),
                replicas,
            )
            return sorted([removed, added])
        # broker: drain one broker of every replica of the run's topic it holds
        holders = {b for state in placement.values() for b in state.replicas}
        victim = self.rng.choice(sorted(holders & set(self.cluster.names)))
        moves: dict[int, list[str]] = {}
        for p, state in sorted(placement.items()):
            if victim not in state.replicas:
                continue
            outside = sorted(set(brokers) - set(state.replicas))
            if not outside:
                raise RuntimeError(f"partition {p} has no broker to take {victim}'s replica")
            moves[p] = [self.rng.choice(outside) if b == victim else b for b in state.replicas]
        self.dirty = True
        await self.cluster.reassign(moves)
        receivers = {b for p, new in moves.items() for b in new if b not in placement[p].replicas}
        log.info("membership-broker: draining %s: %s", victim, moves)
        return sorted({victim} | receivers)

    async def _check_whole(self) -> Mapping[int, Placement]:
        """Take the baseline at the first fault; refuse to start when anything differs."""
        placement = await self.cluster.partition_replicas()
        if not placement:
            raise RuntimeError("the run's topic has no known placement")
        if self.baseline is None:
            self.baseline = {p: tuple(s.replicas) for p, s in placement.items()}
            self.baseline_voters = frozenset(self.cluster.names)
        differs = self._differences(placement)
        if differs:
            raise MembershipNotWhole(f"placement not restored yet: {differs}")
        if await self.cluster.reassigning():
            raise MembershipNotWhole("a reassignment is still in progress")
        voters = set(await self.cluster.voters())
        if voters != self.baseline_voters:
            raise MembershipNotWhole(f"voters are {sorted(voters)}, not the original ones")
        return placement

    def _differences(self, placement: Mapping[int, Placement]) -> dict[int, tuple[str, ...]]:
        """Partitions whose replicas are not the baseline's: {partition: baseline replicas}."""
        assert self.baseline is not None
        return {
            p: replicas
            for p, replicas in self.baseline.items()
            if p not in placement or tuple(placement[p].replicas) != replicas
        }

    async def _brokers(self) -> list[str]:
        """Live brokers; a running spare counts once it has registered."""
        brokers = await self.cluster.brokers()
        spare = self.cluster.spare
        if spare is not None and spare not in brokers:
            await self._spare_ready()
            brokers = await self.cluster.brokers()
        return sorted(brokers)

    async def _spare_ready(self) -> str:
        spare = self.cluster.spare
        assert spare is not None
        await self.start_spare()
        with trio.fail_after(SPARE_READY_TIMEOUT_S):
            while True:
                # Another process's registration: polled, nothing here could set an Event.
                if spare in await self.cluster.brokers():
                    return spare
                await trio.sleep(POLL_INTERVAL_S)

    # ------------------------------------------------------------------ undo
    async def restore(
        self, *, stop_spare: bool = False, timeout_s: float = RESTORE_TIMEOUT_S
    ) -> list[str]:
        """Undo every membership change: cancel moves in flight, put the original voters
        back (an add before any removal, one committed change at a time), move partitions
        back to their original replicas and wait for it; with ``stop_spare`` the spare is
        then stopped. Retries what fails until ``timeout_s``, then raises TooSlowError.
        Returns what it did (empty when there was nothing to undo)."""
        done: list[str] = []
        if self.baseline is None:
            if stop_spare:
                await self._stop_spare(done)
            return done
        with trio.fail_after(timeout_s):
            await self._retrying(self._cancel_moves, done)
            await self._retrying(self._restore_voters, done)
            await self._retrying(self._restore_placement, done)
            if stop_spare:
                await self._stop_spare(done)
        self.dirty = False
        if done:
            log.info("membership restore: %s", "; ".join(done))
        return done

    async def _retrying(
        self, step: Callable[[list[str]], Awaitable[None]], done: list[str]
    ) -> None:
        """Run an idempotent step until it returns (the caller's deadline bounds it)."""
        said = ""
        while True:
            try:
                await step(done)
                return
            except Exception as exc:  # retried: the cluster may be electing a leader
                if repr(exc) != said:  # once per distinct reason, not every half second
                    said = repr(exc)
                    log.info("membership restore: %s: %s (retrying)", step.__name__, said)
            await trio.sleep(POLL_INTERVAL_S)

    async def _cancel_moves(self, done: list[str]) -> None:
        in_flight = await self.cluster.reassigning()
        if in_flight:
            # Kafka reverts a cancelled move to the replicas it started from.
            await self.cluster.reassign({p: None for p in sorted(in_flight)})
            done.append(f"cancelled the reassignment of partitions {sorted(in_flight)}")

    async def _restore_voters(self, done: list[str]) -> None:
        assert self.baseline_voters is not None
        for _ in range(MAX_RESTORE_VOTER_CHANGES):
            voters = set(await self.cluster.voters())
            missing = sorted(self.baseline_voters - voters)
            extra = sorted(voters - self.baseline_voters)
            if missing:
                await self.cluster.add_voter(missing[0])
                done.append(f"added voter {missing[0]}")
            elif extra:
                await self.cluster.remove_voter(extra[0])
                done.append(f"removed voter {extra[0]}")
            else:
                return
        raise RuntimeError(f"voters did not converge on {sorted(self.baseline_voters)}")

    async def _restore_placement(self, done: list[str]) -> None:
        """Move back what differs and wait until the placement is the baseline's."""
        moved: set[int] = set()
        while True:
            placement = await self.cluster.partition_replicas()
            if not placement:
                raise RuntimeError("the run's topic has no known placement")
            in_flight = await self.cluster.reassigning()
            differs = self._differences(placement)
            if not differs and not in_flight:
                return
            if differs and not in_flight:
                # Asked again while it still differs with nothing in flight: a move whose
                # request was lost is made again; one already done is a no-op.
                await self.cluster.reassign(differs)
                if set(differs) - moved:
                    done.append(f"moved partitions {sorted(set(differs) - moved)} back")
                    moved |= set(differs)
            await trio.sleep(POLL_INTERVAL_S)

    async def _stop_spare(self, done: list[str]) -> None:
        spare = self.cluster.spare
        if spare is not None and self.cluster.is_running(spare):
            await self.cluster.stop(spare)
            done.append(f"stopped the spare {spare}")
