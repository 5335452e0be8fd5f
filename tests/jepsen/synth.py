"""A seeded simulation of a correct Kafka-like log, recorded as a history: the checker must
find nothing in it, the report must draw it, and it is big enough to time the checker.

Concurrent processes each send and poll; a send takes effect (gets its offset) when it
completes, so the log is linearizable. During fault windows latency rises and some ops
end info (an info send may or may not have been appended) or fail (never appended).
The run ends with Jepsen-style final polls: each process crashes its client, assigns every
key seeking to the beginning, and polls until it has read everything.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from jepsen.history import ASSIGN, CRASH, FINAL_POLL, POLL, SEND, History, Recorder

FAULT_KINDS = ("partition", "kill", "pause", "clock")
NODES = ("n1", "n2", "n3")


@dataclass
class Sim:
    seed: int
    duration_s: float = 10.0
    processes: int = 5
    keys: int = 4
    # Mean time a process waits between ops; with processes this sets the op rate.
    think_ms: float = 2.0
    faults: bool = True
    poll_max_records: int = 20
    final_poll_max_records: int = 2000
    rng: random.Random = field(init=False)
    logs: dict[str, list[int]] = field(init=False)
    clock_ns: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.logs = {f"k{i}": [] for i in range(self.keys)}


def synthetic_history(
    seed: int,
    duration_s: float = 10.0,
    processes: int = 5,
    keys: int = 4,
    think_ms: float = 2.0,
    faults: bool = True,
) -> History:
    sim = Sim(seed, duration_s, processes, keys, think_ms, faults)
    rec = Recorder(lambda: sim.clock_ns, lambda: 1.7e9 + sim.clock_ns / 1e9)
    rng = sim.rng
    end_ns = int(duration_s * 1e9)
    windows = _fault_windows(rng, end_ns) if faults else []
    positions: dict[int, dict[str, int]] = {p: {} for p in range(processes)}
    next_value = 0
    events: list[tuple[int, int, str, int, object]] = []
    seq = 0

    def push(t_ns: int, kind: str, p: int, payload: object = None) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t_ns, seq, kind, p, payload))

    for t_ns, _, kind, w in _window_events(windows):
        push(t_ns, kind, -1, w)
    for p in range(processes):
        # Every consumer starts assigned to every key, from the beginning.
        rec.invoke(p, ASSIGN, {"keys": list(sim.logs), "seek_to_beginning": True})
        rec.ok(p)
        positions[p] = dict.fromkeys(sim.logs, 0)
        push(int(rng.expovariate(1 / think_ms) * 1e6), "invoke", p)

    while events:
        t_ns, _, kind, p, payload = heapq.heappop(events)
        sim.clock_ns = t_ns
        if kind in ("start", "stop"):
            w = payload
            assert isinstance(w, tuple)
            rec.fault(kind, w[2], [w[3]])
            continue
        in_fault = any(a <= t_ns < b for a, b, _, _ in windows)
        if kind == "invoke":
            if t_ns >= end_ns:
                continue
            roll = rng.random()
            if roll < 0.5:
                value = next_value
                next_value += 1
                key = rng.choice(list(sim.logs))
                rec.invoke(p, SEND, [key, value])
                payload = (SEND, (key, value))
            elif roll < 0.97:
                rec.invoke(p, POLL)
                payload = (POLL, None)
            elif roll < 0.99:
                keys = rng.sample(list(sim.logs), rng.randint(1, len(sim.logs)))
                seek = rng.random() < 0.3
                rec.invoke(p, ASSIGN, {"keys": keys, "seek_to_beginning": seek})
                payload = (ASSIGN, (keys, seek))
            else:
                rec.invoke(p, CRASH)
                payload = (CRASH, None)
            latency_ms = rng.lognormvariate(0.0, 0.6) * (40 if in_fault else 1)
            push(t_ns + int(latency_ms * 1e6), "complete", p, payload)
            continue
        # completion
        assert isinstance(payload, tuple)
        f, data = payload
        outcome = "ok"
        if in_fault and f in (SEND, POLL):
            r = rng.random()
            outcome = "info" if r < 0.2 else "fail" if r < 0.3 else "ok"
        if f == SEND:
            key, value = data
            appended = outcome == "ok" or (outcome == "info" and rng.random() < 0.5)
            if appended:
                sim.logs[key].append(value)
            if outcome == "ok":
                rec.ok(p, offset=len(sim.logs[key]) - 1)
            else:
                rec.complete(p, outcome, error="timeout" if outcome == "info" else "NOT_LEADER")
        elif f == POLL:
            if outcome == "ok":
                rec.ok(p, _read(sim, positions[p], sim.poll_max_records))
            else:
                rec.complete(p, outcome, error="timeout")
        elif f == ASSIGN:
            keys, seek = data
            old = positions[p]
            positions[p] = {k: 0 if seek else old.get(k, 0) for k in keys}
            rec.ok(p)
        else:  # crash
            positions[p] = {k: 0 for k in positions[p]}
            rec.info(p, error="client crashed")
        if outcome == "info":
            # The workload rebuilds the client; the new one resumes from somewhere earlier.
            positions[p] = {k: max(0, o - rng.randint(0, 5)) for k, o in positions[p].items()}
        push(sim.clock_ns + int(rng.expovariate(1 / think_ms) * 1e6), "invoke", p)

    _final_polls(sim, rec, processes)
    return rec.history


def _read(sim: Sim, position: dict[str, int], max_records: int) -> dict[str, list[list[int]]]:
    out = {}
    for key, offset in position.items():
        log = sim.logs[key]
        upto = min(len(log), offset + max_records)
        if upto > offset:
            out[key] = [[o, log[o]] for o in range(offset, upto)]
            position[key] = upto
    return out


def _final_polls(sim: Sim, rec: Recorder, processes: int) -> None:
    for p in range(processes):
        sim.clock_ns += 1_000_000
        rec.invoke(p, CRASH)
        sim.clock_ns += 1_000_000
        rec.info(p, error="final polls start with a fresh client")
        rec.invoke(p, ASSIGN, {"keys": list(sim.logs), "seek_to_beginning": True})
        rec.ok(p)
        position = dict.fromkeys(sim.logs, 0)
        while True:
            sim.clock_ns += 2_000_000
            rec.invoke(p, FINAL_POLL)
            reads = _read(sim, position, sim.final_poll_max_records)
            sim.clock_ns += 3_000_000
            rec.ok(p, reads)
            if not reads:
                break


def _fault_windows(rng: random.Random, end_ns: int) -> list[tuple[int, int, str, str]]:
    out = []
    t = int(end_ns * 0.15)
    while t < end_ns * 0.8:
        length = int(end_ns * rng.uniform(0.05, 0.12))
        out.append((t, t + length, rng.choice(FAULT_KINDS), rng.choice(NODES)))
        t += length + int(end_ns * rng.uniform(0.08, 0.2))
    return out


def _window_events(windows: list[tuple[int, int, str, str]]):  # type: ignore[no-untyped-def]
    for w in windows:
        yield w[0], 0, "start", w
        yield w[1], 1, "stop", w
