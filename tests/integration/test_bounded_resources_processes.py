"""Issue 13, bounded resources, against a real node process: the attacks the issue
reproduced, all at once, while a confluent-kafka producer keeps producing.

- 20 frames claiming 100 MiB, each sent half-way: the node's peak RSS grows by about
  queued_max_request_bytes, not by the 1 GB sent at it (661 MB before), and every attacker is
  cut off at request_read_timeout_ms;
- 2,000 connections from one IP that never send anything: all but max_connections_per_ip are
  closed at once, the rest after connections_max_idle_ms;
- 30 connections sending a request one byte a second: cut off at the read deadline.
The internal listener gets a half-sent 64 MiB frame and 400 idle connections from one IP too.
Each attacker uses its own loopback address, so the per-IP cap is tested as it is meant: one
noisy host does not lock out the others. Raw sockets on purpose: stock clients never do this.
"""

from __future__ import annotations

import re
import socket
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from raftlog.constants import MIB
from raftlog.testing.cluster import ProcessCluster

pytestmark = pytest.mark.cluster

QUEUED_MAX_REQUEST_BYTES = 128 * MIB
READ_TIMEOUT_MS = 4_000
IDLE_MS = 6_000
PER_IP = 300
CLAIMED_FRAME_BYTES = 100 * MIB
FRAME_ATTACKERS = 20
IDLE_CONNECTIONS = 2_000
SLOW_SENDERS = 30
TOPIC = "bounded"
# Peak RSS may grow by the pool plus allocator slack; without the pool it grew by ~1 GB.
RSS_GROWTH_MAX_BYTES = 2 * QUEUED_MAX_REQUEST_BYTES + 64 * MIB
ATTACK_DEADLINE_S = 90.0
SEND_TIMEOUT_S = 60.0

NORMAL_IP, IDLE_IP, FRAME_IP, SLOW_IP = "127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"
INTERNAL_IP = "127.0.0.5"  # the same attacks on the internal listener
INTERNAL_FRAME_BYTES = 64 * MIB  # internal_frame_max_bytes


def _peak_rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmHWM:\s+(\d+) kB$", status, re.MULTILINE)
    assert match, status
    return int(match.group(1)) * 1024


def _connect(address: str, source_ip: str, *, blocking: bool = False) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10, source_address=(source_ip, 0))
    sock.setblocking(blocking)
    return sock


def _closed_by_peer(sock: socket.socket) -> bool:
    """Non-blocking: True once the node closed the connection (EOF or reset)."""
    try:
        return sock.recv(65536, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@dataclass
class FrameAttacker:
    sent_bytes: int = 0
    cut_off: bool = False

    def run(
        self, address: str, source_ip: str = FRAME_IP, claimed_bytes: int = CLAIMED_FRAME_BYTES
    ) -> None:
        sock = _connect(address, source_ip, blocking=True)
        sock.settimeout(SEND_TIMEOUT_S)
        chunk = bytes(MIB)
        try:
            sock.sendall(struct.pack(">i", claimed_bytes))
            while self.sent_bytes < claimed_bytes // 2:
                sock.sendall(chunk)
                self.sent_bytes += len(chunk)
            # Half sent: now say nothing, as the attacker did, until the node gives up.
            self.cut_off = sock.recv(1) == b""
        except (ConnectionError, OSError):
            self.cut_off = True
        finally:
            sock.close()


class NormalProducer:
    """A confluent-kafka producer (acks=all) sending numbered values until stopped."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
        self.delivered: list[bytes] = []
        self.delivered_at: list[float] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _on_delivery(self, error, message) -> None:
        if error is not None:
            self.errors.append(str(error))
        else:
            self.delivered.append(message.value())
            self.delivered_at.append(time.monotonic())

    def _run(self) -> None:
        sequence = 0
        while not self.stop.is_set():
            self.producer.produce(TOPIC, f"v{sequence:07d}".encode(), on_delivery=self._on_delivery)
            sequence += 1
            self.producer.poll(0.01)  # also paces the stream at about 100 records a second
        self.producer.flush(60)


@pytest.fixture
def node(tmp_path):
    overrides = {
        "queued_max_request_bytes": QUEUED_MAX_REQUEST_BYTES,
        "request_read_timeout_ms": READ_TIMEOUT_MS,
        "connections_max_idle_ms": IDLE_MS,
        "max_connections_per_ip": PER_IP,
        "max_connections": 5 * PER_IP,
    }
    with ProcessCluster(tmp_path / "c", 1, overrides) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
        yield cluster


def test_a_node_under_every_attack_stays_bounded_and_keeps_serving(node) -> None:
    process = node.nodes[1]
    assert process.process is not None
    address = process.client_address
    normal = NormalProducer(node.bootstrap_servers)
    normal.thread.start()
    node.wait_for(lambda: len(normal.delivered) >= 50, "the normal producer to get going", 30)
    rss_before = _peak_rss_bytes(process.process.pid)

    attack_started = time.monotonic()
    frame_attackers = [FrameAttacker() for _ in range(FRAME_ATTACKERS)]
    threads = [threading.Thread(target=a.run, args=(address,)) for a in frame_attackers]
    internal_address = process.config.internal_listener
    internal_attacker = FrameAttacker()
    threads.append(
        threading.Thread(
            target=internal_attacker.run,
            args=(internal_address, INTERNAL_IP, INTERNAL_FRAME_BYTES),
        )
    )
    for thread in threads:
        thread.start()

    idle = [_connect(address, IDLE_IP) for _ in range(IDLE_CONNECTIONS)]
    internal_idle = [_connect(internal_address, INTERNAL_IP) for _ in range(PER_IP + 100)]
    for connections in (idle, internal_idle):
        node.wait_for(
            lambda c=connections: sum(not _closed_by_peer(s) for s in c) <= PER_IP,
            f"the node to keep at most {PER_IP} of {len(connections)} idle connections",
            30,
        )
    # Refused at once, not closed later as idle.
    assert time.monotonic() - attack_started < IDLE_MS / 1000

    request = struct.pack(">i", 40) + bytes(40)
    slow = [_connect(address, SLOW_IP) for _ in range(SLOW_SENDERS)]
    slow_sent = [0] * SLOW_SENDERS
    slow_started = time.monotonic()
    while not all(_closed_by_peer(s) for s in slow):
        assert time.monotonic() - slow_started < ATTACK_DEADLINE_S, "slow senders held"
        for i, sock in enumerate(slow):
            if slow_sent[i] < len(request):
                try:
                    sock.send(request[slow_sent[i] : slow_sent[i] + 1])
                    slow_sent[i] += 1
                except OSError:
                    slow_sent[i] = len(request)  # cut off
        # The attack itself: one byte a second per connection.
        time.sleep(1.0)
    # Cut off at the 4 s deadline: about 5 bytes each, never the whole request.
    assert all(sent < len(request) for sent in slow_sent), slow_sent

    node.wait_for(
        lambda: all(_closed_by_peer(s) for s in idle + internal_idle),
        "the idle connections to be closed",
        3 * IDLE_MS / 1000,
    )
    for thread in threads:
        thread.join(ATTACK_DEADLINE_S)
    assert all(a.cut_off for a in [*frame_attackers, internal_attacker])
    attack_ended = time.monotonic()
    rss_growth = _peak_rss_bytes(process.process.pid) - rss_before
    sent_total = sum(a.sent_bytes for a in frame_attackers)
    assert rss_growth < RSS_GROWTH_MAX_BYTES, (rss_growth, sent_total)

    # The normal client was served throughout: delayed while the pool was full (until the
    # attackers' frames were dropped at the read deadline), never stopped; and loses nothing.
    delivered_during = len(normal.delivered)
    node.wait_for(
        lambda: len(normal.delivered) >= delivered_during + 50, "more deliveries after", 30
    )
    times = [t for t in normal.delivered_at if attack_started <= t <= attack_ended]
    gaps = [b - a for a, b in zip([attack_started, *times], [*times, attack_ended], strict=True)]
    assert max(gaps) < 2 * READ_TIMEOUT_MS / 1000 + 2, gaps
    normal.stop.set()
    normal.thread.join(90)
    assert normal.errors == []
    consumer = Consumer(
        {
            "bootstrap.servers": node.bootstrap_servers,
            "group.id": "check",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < len(normal.delivered) and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            got.append(message.value())
    consumer.close()
    assert sorted(got) == sorted(normal.delivered)

    log = Path(process.log_path).read_text()
    assert f"max_connections_per_ip ({PER_IP}) reached" in log
    assert "internal listener: closing new connection from 127.0.0.5" in log
    assert "closing internal connection from 127.0.0.5" in log
    assert "queued_max_request_bytes" in log and "reading paused" in log
    assert f"took longer than {READ_TIMEOUT_MS} ms" in log
    assert process.running
    for sock in idle + internal_idle + slow:
        sock.close()
