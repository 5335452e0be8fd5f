"""The workload with stock confluent-kafka clients against the in-process Kafka server (the
single-node test backend, no faults): every operation is recorded, final reads reach the
end of every key, and the checker finds the history valid."""

from __future__ import annotations

import random
from pathlib import Path

import trio

from jepsen.checker import check
from jepsen.history import ASSIGN, CRASH, FINAL_POLL, POLL, SEND, Recorder
from jepsen.workload import Workload, WorkloadOptions
from raftlog.client import Admin, NewTopic
from raftlog.client.cluster import open_cluster
from tests.kafka.conftest import start_broker

SEED = 20240611
RUN_S = 4.0
DEADLINE_S = 60.0


async def test_workload_records_a_valid_history(nursery: trio.Nursery, tmp_path: Path) -> None:
    broker = await start_broker(nursery, tmp_path)
    try:
        async with open_cluster(broker.bootstrap) as client:
            await Admin(client).create_topics([NewTopic("jepsen", 6, 1)])
        t0 = trio.current_time()
        recorder = Recorder(lambda: int((trio.current_time() - t0) * 1e9))
        opts = WorkloadOptions(
            senders=2, pollers=2, crash_probability=0.05, reassign_probability=0.2
        )
        workload = Workload(broker.bootstrap, opts, recorder, random.Random(SEED), "test")
        with trio.fail_after(DEADLINE_S):
            await workload.run(trio.current_time() + RUN_S)
            done = await workload.final_reads()
    finally:
        broker.backend.close()
    history = recorder.history
    results = check(history)
    fs = {op.f for op in history.ops}
    assert {SEND, POLL, ASSIGN, CRASH, FINAL_POLL} <= fs, f"seed={SEED} ops {fs}"
    assert done == {2: True, 3: True}, f"seed={SEED} final reads {done}"
    sends_ok = results["ops"]["send"]["ok"]
    assert sends_ok > 20, f"seed={SEED} only {sends_ok} acknowledged sends"
    assert results["valid"], f"seed={SEED} {results['anomaly_counts']} {results['anomalies']}"
    # Every completion follows an invoke of the same process (the recorder enforces it), and
    # nothing was left in flight: the loops stopped themselves at the deadline.
    assert not any(c.complete_ns is None for c in history.completed()), f"seed={SEED}"
    print(f"seed={SEED} ops {results['ops']} stats {results['stats']}")
