"""The randomized workload: clients, faults and snapshots driven by one seed.

run_seed(seed) builds a 3- or 5-voter cluster plus one observer, runs 90 simulated seconds (by
default) of client writes under network faults, crashes and snapshots, then heals everything and
requires a leader that commits a new write on every node within a bound (liveness).
run_seed(seed, membership=True) starts 3 voters in a pool of 5 nodes and, under the same faults,
asks the leader now and then to add an observer or remove a voter (possibly itself), one change
at a time (KIP-853); the invariants check that the voter sets agree.
"""

from __future__ import annotations

import os

from tests.sim.cluster import Simulation

# 90 simulated seconds per seed keeps the default 500 seeds near 25 s of CPU, within the test
# budget on the shared machine; RAFTLOG_SIM_DURATION_MS runs longer (e.g. 300000 = 5 minutes).
DEFAULT_DURATION_MS = int(os.environ.get("RAFTLOG_SIM_DURATION_MS", "90000"))
LIVENESS_BOUND_MS = 30_000


def run_seed(
    seed: int,
    duration_ms: int = DEFAULT_DURATION_MS,
    liveness_bound_ms: int = LIVENESS_BOUND_MS,
    *,
    membership: bool = False,
) -> Simulation:
    pick = seed % 4
    voters = 5 if pick == 3 else 3
    if membership:
        sim = Simulation(seed, voters=3, observers=2)
    else:
        sim = Simulation(seed, voters=voters, observers=1)
    rng = sim.rng
    net = sim.network
    net.max_delay_ms = rng.choice([5, 20, 60])
    net.drop_probability = rng.choice([0.0, 0.01, 0.05])
    net.duplicate_probability = rng.choice([0.0, 0.01, 0.05])
    net.flush_max_delay_ms = rng.choice([1, 20, 300])
    net.vote_drop_probability = rng.choice([0.0, 0.0, 0.3])
    client_gap_ms = rng.choice([200, 500, 1500])
    fault_gap_ms = rng.choice([500, 1500, 5000])
    snapshot_gap_ms = rng.choice([2000, 8000])
    all_ids = sorted(sim.nodes)
    restarts: dict[int, int] = {}

    next_client = rng.randint(0, client_gap_ms)
    next_fault = rng.randint(fault_gap_ms // 2, fault_gap_ms)
    next_snapshot = rng.randint(0, snapshot_gap_ms)
    change_gap_ms = rng.choice([300, 1000, 3000])
    next_change = rng.randint(0, change_gap_ms) if membership else 1 << 62
    while True:
        next_restart = min(restarts.values(), default=1 << 62)
        t = min(next_client, next_fault, next_snapshot, next_restart, next_change)
        if t >= duration_ms:
            break
        sim.run_until(t)
        if t == next_client:
            next_client = t + rng.randint(1, 2 * client_gap_ms)
            _client_write(sim, rng.randint(1, 3))
        if t == next_snapshot:
            next_snapshot = t + rng.randint(1, 2 * snapshot_gap_ms)
            sim.take_snapshot(rng.choice(all_ids))
        if t == next_restart:
            for node_id, at_ms in list(restarts.items()):
                if at_ms <= t:
                    del restarts[node_id]
                    sim.restart(node_id)
        if t == next_fault:
            next_fault = t + rng.randint(fault_gap_ms // 2, 2 * fault_gap_ms)
            _inject_fault(sim, restarts)
        if t == next_change:
            next_change = t + rng.randint(1, 2 * change_gap_ms)
            _change_voters(sim)
    sim.run_until(duration_ms)
    check_liveness(sim, liveness_bound_ms)
    return sim


def _client_write(sim: Simulation, count: int) -> None:
    """A client picks a random node; if it is not the leader, follows the hint once."""
    node_id = sim.rng.choice(sorted(sim.nodes))
    core = sim.nodes[node_id].core
    if core is None:
        return
    if core.role.name != "leader" and core.leader_id is not None:
        node_id = core.leader_id
    if sim.rng.random() < 0.2:
        sim.read(node_id)
    else:
        sim.propose(node_id, count)


def _change_voters(sim: Simulation) -> None:
    """The operator adds a node of the pool that is not a voter, or removes a voter (the
    leader too), through whichever node leads now; a refusal (a change pending, the new
    voter not caught up, no commit in the leader's epoch yet) is fine."""
    leaders = sim.leaders()
    if not leaders:
        return
    leader = leaders[0]
    rng = sim.rng
    voters = sorted(sim.core(leader).voters)
    others = sorted(set(sim.nodes) - set(voters))
    if others and (len(voters) < 3 or rng.random() < 0.5):
        sim.change_voters(leader, add=rng.choice(others))
    elif len(voters) > 1:
        sim.change_voters(leader, remove=rng.choice(voters))


def _inject_fault(sim: Simulation, restarts: dict[int, int]) -> None:
    rng = sim.rng
    ids = sorted(sim.nodes)
    leaders = sim.leaders()
    kind = rng.choice(
        [
            "halves",
            "isolate",
            "isolate_leader",
            "heal",
            "heal",
            "crash",
            "crash_leader",
            "shutdown_leader",
            "crash_two",
            "power_loss",
        ]
    )
    if kind == "halves":
        shuffled = ids[:]
        rng.shuffle(shuffled)
        cut = rng.randint(1, len(ids) - 1)
        sim.partition([set(shuffled[:cut]), set(shuffled[cut:])])
    elif kind == "isolate":
        sim.isolate(rng.choice(ids))
    elif kind == "isolate_leader" and leaders:
        sim.isolate(leaders[0])
    elif kind == "heal":
        sim.heal()
    elif kind == "shutdown_leader" and leaders:
        # Graceful shutdown: resign (EndQuorumEpoch goes out), then stop and restart later.
        sim.resign(leaders[0])
        sim.crash(leaders[0])
        restarts[leaders[0]] = sim.now_ms + rng.randint(50, 3000)
    elif kind in ("crash", "crash_leader", "crash_two", "power_loss"):
        # crash_two: the leader and one more node together (a shared rack); power_loss:
        # every node at once. Either way all unflushed writes are gone.
        victims = [leaders[0] if kind == "crash_leader" and leaders else rng.choice(ids)]
        if kind == "crash_two":
            victims = [*leaders[:1], rng.choice(ids)]
        elif kind == "power_loss":
            victims = ids
        for victim in victims:
            if sim.nodes[victim].core is not None:
                sim.crash(victim)
                restarts[victim] = sim.now_ms + rng.randint(50, 3000)


def check_liveness(sim: Simulation, bound_ms: int) -> None:
    """After healing everything, a leader must commit a new write on every node in time."""
    sim.heal()
    sim.network.drop_probability = 0.0
    for node_id in sorted(sim.nodes):
        sim.restart(node_id)
    start_ms = sim.now_ms
    deadline_ms = start_ms + bound_ms
    written: list[bytes] = []

    def converged() -> bool:
        done = [w for w in written if w in sim.acked]
        if not done:
            return False
        offset = sim.acked[done[0]]
        return all(n.sm_end > offset for n in sim.nodes.values())

    last_write_ms = -(1 << 62)
    while sim.now_ms < deadline_ms:
        leaders = sim.leaders()
        if leaders and sim.now_ms - last_write_ms >= 1000:
            # Re-write every second: a leader may lose its job before committing a write.
            before = sim.proposed
            if sim.propose(leaders[0], 1):
                written.append(b"w%d" % (before + 1))
                last_write_ms = sim.now_ms
        if sim.run_until(min(sim.now_ms + 100, deadline_ms), converged):
            return
    roles = {i: (n.core.role if n.core else None) for i, n in sim.nodes.items()}
    sim.fail(f"no progress within {bound_ms} ms after healing: {roles}")


def check_acknowledged(sim: Simulation) -> None:
    """Every acknowledged write sits in the committed log, at its offset, exactly once."""
    for data, offset in sim.acked.items():
        if offset >= len(sim.committed) or sim.committed[offset].data != data:
            sim.fail(f"acknowledged write {data!r} at {offset} is not in the committed log")
        if sim.payload_offset.get(data) != offset:
            sim.fail(f"acknowledged write {data!r} found at {sim.payload_offset.get(data)}")
