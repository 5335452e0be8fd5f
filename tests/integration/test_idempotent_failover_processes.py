"""An idempotent confluent-kafka producer (acks=all, one RF 3 partition, a steady stream)
survives repeated kill -9s of the partition leader: no fatal producer error, and every
acknowledged record is in the log exactly once, at the offset it was acknowledged at.

Each round kills the leader and restarts it at once, keeps producing while another replica
takes over, and keeps producing until the restarted node is back in the ISR. A restarted
broker answers NOT_LEADER_OR_FOLLOWER until it knows the partition and leads nothing its
previous process was leader of; a new leader answers a retried batch it already holds with
the batch's original offset.
"""

from __future__ import annotations

import signal
import time

import pytest
from confluent_kafka import KafkaError, Producer

from raftlog.testing.cluster import ProcessCluster
from tests.integration.test_replication_processes import (
    TOPIC,
    check_exactly_once,
    create_topic,
    partition_info,
    read_all,
)

pytestmark = pytest.mark.cluster

# Records acknowledged between two kills: a steady stream with batches in flight.
RECORDS_PER_ROUND = 300
ROUND_DEADLINE_S = 60.0


class _Stream:
    """One idempotent producer sending numbered values for as long as the test polls it."""

    def __init__(self, cluster: ProcessCluster) -> None:
        self.acked: dict[bytes, int] = {}
        self.failed: list[KafkaError] = []
        self.fatal: list[KafkaError] = []
        self.sent = 0
        self.producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap_servers,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "request.timeout.ms": 2000,
                "message.timeout.ms": 120_000,
                "error_cb": self._on_error,
            }
        )

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self.fatal.append(error)

    def _on_delivery(self, error: KafkaError | None, message) -> None:
        if error is None:
            self.acked[message.value()] = message.offset()
        else:
            self.failed.append(error)

    def pump(self, seconds: float = 0.05) -> None:
        """Keep a bounded window of records in flight and serve callbacks for `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            while self.sent - len(self.acked) - len(self.failed) < 200:
                try:
                    self.producer.produce(
                        TOPIC,
                        value=f"{self.sent:08d}".encode(),
                        partition=0,
                        on_delivery=self._on_delivery,
                    )
                except BufferError:
                    break
                self.sent += 1
            self.producer.poll(0.01)
            assert not self.fatal, f"fatal producer error: {self.fatal[0]}"
            if time.monotonic() >= deadline:
                return

    def until(self, cluster: ProcessCluster, predicate, what: str) -> None:
        """Produce until predicate() holds (checked between polls), failing after a deadline."""
        deadline = time.monotonic() + ROUND_DEADLINE_S
        while True:
            self.pump()
            try:
                if predicate():
                    return
            except Exception:  # a node starting up or just killed refuses the probe
                pass
            cluster._check_unexpected_exits()
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{what} (acked {len(self.acked)} of {self.sent})")


def _kill_leader_repeatedly(tmp_path, kills: int) -> None:
    with ProcessCluster(tmp_path / "c", 3) as cluster:
        create_topic(cluster)
        stream = _Stream(cluster)
        everyone = set(cluster.nodes)
        for round_ in range(kills):
            target = len(stream.acked) + RECORDS_PER_ROUND
            stream.until(
                cluster, lambda target=target: len(stream.acked) >= target, "records acknowledged"
            )
            stream.until(
                cluster,
                lambda: set(partition_info(cluster)["isr"]) == everyone,
                "every replica in the ISR",
            )
            leader = partition_info(cluster)["leader_id"]
            # kill -9 and an immediate restart, as a supervisor does: the new process comes
            # up while the controller still holds its old registration (its session has not
            # expired) and the metadata still names it leader.
            cluster.kill(leader, signal.SIGKILL)
            cluster.start(leader)
            stream.until(
                cluster,
                lambda leader=leader: partition_info(cluster)["leader_id"] not in (leader, -1),
                f"a new leader after killing node {leader} (round {round_})",
            )
        target = len(stream.acked) + RECORDS_PER_ROUND
        stream.until(cluster, lambda: len(stream.acked) >= target, "records after the last kill")
        remaining = stream.producer.flush(ROUND_DEADLINE_S)
        assert remaining == 0, f"{remaining} records never answered"
        assert not stream.fatal, stream.fatal
        assert not stream.failed, f"{len(stream.failed)} failed, e.g. {stream.failed[:3]}"
        assert len(stream.acked) == stream.sent
        records = read_all(cluster)
        check_exactly_once(stream.acked, records)
        assert len(records) == stream.sent


def test_leader_kills_under_an_idempotent_stream(tmp_path):
    _kill_leader_repeatedly(tmp_path, kills=3)


@pytest.mark.slow
def test_twenty_leader_kills_under_an_idempotent_stream(tmp_path):
    _kill_leader_repeatedly(tmp_path, kills=20)
