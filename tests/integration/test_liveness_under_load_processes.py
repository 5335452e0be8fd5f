"""The production liveness defaults (broker_session_timeout_ms, broker_heartbeat_interval_ms)
fence no live broker, and no live broker gives up leading, under load: three real nodes with
the production timings, acks=all producers sending as fast as they can to RF 3 partitions,
and processes burning CPU beside them on a machine that has only a few cores."""

import multiprocessing
import re
import threading
import time

import pytest

from benchmarks.failover import default_timings
from raftlog.testing.cluster import ProcessCluster

pytestmark = pytest.mark.cluster

LOAD_S = 20.0
TOPICS = ("load-a", "load-b", "load-c")
PARTITIONS = 3
VALUE_BYTES = 1000
# Busy loops beside the nodes: more runnable processes than cores, as on a shared machine.
CPU_BURNERS = 2
# Any of these in a node's log means a live broker lost its session (or gave up leading).
SPURIOUS = re.compile(r"fenced: no heartbeat|no heartbeat answered|fenced: its internal listener")


def _burn(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def _produce_flat_out(bootstrap: str, stop: threading.Event, acked: list[int]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    value = b"v" * VALUE_BYTES
    count = [0]

    def delivered(err, _msg):
        if err is None:
            count[0] += 1

    while not stop.is_set():
        for topic in TOPICS:
            try:
                producer.produce(topic, value, on_delivery=delivered)
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(30)
    acked.append(count[0])


def test_no_live_broker_is_fenced_under_load(tmp_path):
    from confluent_kafka.admin import AdminClient, NewTopic

    with ProcessCluster(tmp_path, 3, overrides=default_timings()) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        futures = admin.create_topics([NewTopic(t, PARTITIONS, 3) for t in TOPICS])
        for future in futures.values():
            future.result(30)
        stop = threading.Event()
        acked: list[int] = []
        producers = [
            threading.Thread(
                target=_produce_flat_out, args=(cluster.bootstrap_servers, stop, acked)
            )
            for _ in range(2)
        ]
        burners = [
            multiprocessing.Process(target=_burn, args=(time.monotonic() + LOAD_S,))
            for _ in range(CPU_BURNERS)
        ]
        for worker in [*producers, *burners]:
            worker.start()
        for burner in burners:
            burner.join(LOAD_S + 30)
        stop.set()
        for producer in producers:
            producer.join(60)
        spurious = {
            node_id: [
                line for line in node.log_path.read_text().splitlines() if SPURIOUS.search(line)
            ]
            for node_id, node in cluster.nodes.items()
        }
    assert sum(acked) > 0, "the load never got going"
    assert not any(spurious.values()), spurious
