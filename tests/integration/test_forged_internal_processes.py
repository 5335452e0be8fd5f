"""Issue 13 with real processes: a rogue client on the internal listener sends replica.fetch
requests naming a stopped follower's replica id, following the leader's log as a follower
would. Before the fix the leader counted them as that follower's acknowledgements: the
follower stayed in the ISR and acks=all records were acknowledged with one real copy. Now the
connection is closed at the first such request, the follower drops out of the ISR as it does
without the rogue, and acks=all with min.insync.replicas=2 fails with NOT_ENOUGH_REPLICAS.

The rogue speaks msgpack frames by hand on a raw socket: no node ever sends these.
"""

from __future__ import annotations

import signal
import socket
import struct
import threading
import time

import msgpack
import pytest
from kafka import KafkaProducer
from kafka.errors import KafkaError, NotEnoughReplicasError

from raftlog.records import iter_batches
from raftlog.testing.cluster import ProcessCluster
from tests.integration.test_replication_processes import create_topic, partition_info

pytestmark = pytest.mark.cluster

TOPIC = "forged"
ROGUE_SENDER_ID = -1  # a client that is not a node, as the CLI introduces itself
KIND_REQUEST = 1
SOCKET_TIMEOUT_S = 5.0
# The follower is fenced only after this long (so the ISR can shrink only through the
# leader's own lag check, which is what forged fetches used to defeat).
OVERRIDES = {"broker_session_timeout_ms": 60_000, "replica_lag_time_max_ms": 2_000}
PRODUCE_DEADLINE_S = 40.0


class RogueFollower(threading.Thread):
    """Fetches for `replica_id` from the leader's internal listener, acknowledging everything."""

    def __init__(self, address: str, replica_id: int, leader_epoch: int) -> None:
        super().__init__(daemon=True)
        host, port = address.rsplit(":", 1)
        self.address = (host, int(port))
        self.replica_id = replica_id
        self.leader_epoch = leader_epoch
        self.stop = threading.Event()
        self.requests = 0
        self.answers = 0
        self.closed_by_leader = 0
        self.fetch_offset = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with socket.create_connection(self.address, timeout=SOCKET_TIMEOUT_S) as sock:
                    while not self.stop.is_set():
                        self._fetch_once(sock)
            except (ConnectionError, OSError):
                self.closed_by_leader += 1
                time.sleep(0.05)

    def _fetch_once(self, sock: socket.socket) -> None:
        self.requests += 1
        partition = {
            "topic": TOPIC,
            "partition": 0,
            "fetch_offset": self.fetch_offset,
            "last_fetched_epoch": -1,
            "leader_epoch": self.leader_epoch,
            "high_watermark": -1,
        }
        body = {
            "replica_id": self.replica_id,
            "max_wait_ms": 100,
            "min_bytes": 1,
            "partitions": [partition],
        }
        payload = msgpack.packb(
            [KIND_REQUEST, self.requests, ROGUE_SENDER_ID, "replica.fetch", body],
            use_bin_type=True,
        )
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        (size,) = struct.unpack(">i", _exactly(sock, 4))
        _kind, _cid, _sender, _method, answer = msgpack.unpackb(_exactly(sock, size), raw=False)
        self.answers += 1
        records = answer["partitions"][0].get("records") or b""
        for _, header in iter_batches(records):
            self.fetch_offset = header.last_offset + 1


def _exactly(sock: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("closed by the leader")
        data += chunk
    return bytes(data)


def test_forged_replica_fetches_do_not_keep_a_stopped_follower_in_the_isr(tmp_path):
    with ProcessCluster(tmp_path / "c", 3, OVERRIDES) as cluster:
        create_topic(cluster, TOPIC, rf=2, min_isr=2)
        info = partition_info(cluster, TOPIC)
        leader = info["leader_id"]
        (follower,) = [r for r in info["replicas"] if r != leader]
        producer = KafkaProducer(
            bootstrap_servers=cluster.bootstrap_servers,
            acks="all",
            enable_idempotence=False,
            retries=0,
            request_timeout_ms=5_000,
        )
        try:
            producer.send(TOPIC, b"before", partition=0).get(timeout=30)
            cluster.kill(follower, signal.SIGKILL)
            rogue = RogueFollower(
                cluster.nodes[leader].config.internal_listener, follower, info["leader_epoch"]
            )
            rogue.start()
            outcomes: list[str] = []
            deadline = time.monotonic() + PRODUCE_DEADLINE_S
            while time.monotonic() < deadline:
                try:
                    producer.send(TOPIC, b"needs-two", partition=0).get(timeout=10)
                    outcomes.append("acknowledged")
                except NotEnoughReplicasError:
                    outcomes.append("NOT_ENOUGH_REPLICAS")
                    break
                except KafkaError as exc:  # timed out, or NOT_ENOUGH_REPLICAS_AFTER_APPEND
                    outcomes.append(type(exc).__name__)
            rogue.stop.set()
            rogue.join(SOCKET_TIMEOUT_S * 2)
        finally:
            producer.close()
        acknowledged = outcomes.count("acknowledged")
        assert not acknowledged, (
            f"{acknowledged} acks=all records acknowledged with only the leader's copy "
            f"(of {len(outcomes)} sent; last outcomes {outcomes[-3:]})"
        )
        assert outcomes and outcomes[-1] == "NOT_ENOUGH_REPLICAS", outcomes[-5:]
        assert rogue.requests > 0 and rogue.answers == 0, (rogue.requests, rogue.answers)
        assert list(partition_info(cluster, TOPIC)["isr"]) == [leader]
        log_text = cluster.nodes[leader].log_path.read_text(errors="replace")
        assert "replica.fetch a replica fetch names another replica" in log_text


def test_the_forge_nemesis_changes_nothing_on_three_real_nodes(tmp_path):
    """Every forgery the Jepsen `forge` nemesis sends, for a few seconds, against every node:
    no election, no fenced broker, no leader change, and acks=all still works."""
    import random

    import trio

    from jepsen.forger import Forger, Target

    with ProcessCluster(tmp_path / "c", 3) as cluster:
        create_topic(cluster, TOPIC, partitions=3, rf=3, min_isr=2)
        before = cluster.describe()
        addresses = {}
        for node_id, node in cluster.nodes.items():
            host, port = node.config.internal_listener.rsplit(":", 1)
            addresses[node_id] = (host, int(port))
        forger = Forger(addresses, Target(sorted(addresses), TOPIC, 3), random.Random(13), 0.01)

        async def forge_for_a_while() -> None:
            with trio.move_on_after(6):
                await forger.run()

        trio.run(forge_for_a_while)
        cluster.wait_ready()
        after = cluster.describe()
        assert after["controller_id"] == before["controller_id"]
        assert after["topics"][TOPIC] == before["topics"][TOPIC]  # leaders, epochs, ISRs
        # Only a node that is not the controller answers a heartbeat (it names the controller,
        # as Metadata does to anyone); everything else is dropped or closes the connection.
        answered = {name for (name, outcome) in forger.outcomes if outcome == "answered"}
        assert answered <= {"shutdown_heartbeat"}, forger.summary()
        assert sum(forger.outcomes.values()) > 30, forger.summary()
        producer = KafkaProducer(bootstrap_servers=cluster.bootstrap_servers, acks="all")
        try:
            producer.send(TOPIC, b"after", partition=0).get(timeout=30)
        finally:
            producer.close()
