"""Issue 13 with real processes: a byte flipped inside a committed batch of a follower while it
was stopped (after a clean shutdown, so recovery trusts the segment) is found by the
scrubber after the restart, cut out and fetched again from the leader; once the repaired
replica is whole again, consumers read the original values."""

import signal
from pathlib import Path

import pytest
from confluent_kafka import Producer

from raftlog.testing.cluster import ProcessCluster
from tests.integration.test_replication_processes import create_topic, partition_info, read_all

pytestmark = pytest.mark.cluster

TOPIC = "scrubbed"
RECORDS = 2000


def segment_of(cluster: ProcessCluster, node_id: int) -> Path:
    data_dir = Path(cluster.nodes[node_id].config.data_dir)
    (path,) = data_dir.glob(f"**/{TOPIC}-0/{0:020d}.log")
    return path


def flip_a_value_byte(path: Path) -> int:
    """Flip the last value byte of the batch in the middle of the segment; its offset."""
    data = path.read_bytes()
    batches = []
    position = 0
    while position + 12 <= len(data):
        size = 12 + int.from_bytes(data[position + 8 : position + 12], "big")
        batches.append((position, size, int.from_bytes(data[position : position + 8], "big")))
        position += size
    position, size, base_offset = batches[len(batches) // 2]
    # The last record ends with its value and an empty header count (one byte).
    at = position + size - 2
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes([data[at] ^ 0x20]))
    return base_offset


def test_scrubber_repairs_a_follower_damaged_while_stopped(tmp_path: Path) -> None:
    with ProcessCluster(tmp_path) as cluster:
        create_topic(cluster, TOPIC, min_isr=2)
        # Many small batches: the segment gets offset-index entries, and recovery then trusts
        # the batches before the last one without reading them (a segment without any entry
        # is rescanned whole, which would find the damage itself).
        producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap_servers,
                "acks": "all",
                "linger.ms": 5,
                "batch.num.messages": 20,
            }
        )
        values = [f"{i:08d}".encode() * 8 for i in range(RECORDS)]
        for value in values:
            producer.produce(TOPIC, value)
        assert producer.flush(60) == 0
        cluster.wait_for(lambda: len(partition_info(cluster, TOPIC)["isr"]) == 3, "ISR of 3")
        # What consumers read before the damage (a retried batch may have landed out of send
        # order: the log, not the send order, is the original).
        original = read_all(cluster, TOPIC)
        assert sorted(set(v for _, v in original)) == values
        info = partition_info(cluster, TOPIC)
        leader = info["leader_id"]
        victim = next(n for n in info["replicas"] if n != leader)

        cluster.kill(victim, signal.SIGTERM)  # a clean shutdown: recovery trusts the segment
        damaged_offset = flip_a_value_byte(segment_of(cluster, victim))
        cluster.start(victim)
        victim_log = cluster.nodes[victim].log_path

        def repaired() -> bool:
            text = victim_log.read_text(errors="replace")
            return (
                f"found a damaged batch at offset {damaged_offset}" in text
                and "eligible to lead again" in text
            )

        cluster.wait_for(repaired, "the scrubber to find and repair the damage", timeout_s=60)
        # The repaired copy holds the original bytes again: the same batches as the leader's.
        assert segment_of(cluster, victim).read_bytes() == segment_of(cluster, leader).read_bytes()
        assert read_all(cluster, TOPIC) == original
        # And once the leader stops, consumers read the original values from the others.
        cluster.wait_for(
            lambda: victim in partition_info(cluster, TOPIC)["isr"], "the victim in the ISR"
        )
        cluster.kill(leader, signal.SIGTERM)
        cluster.wait_for(
            lambda: partition_info(cluster, TOPIC, node_id=victim)["leader_id"] not in (-1, leader),
            "a new leader",
        )
        assert read_all(cluster, TOPIC) == original
