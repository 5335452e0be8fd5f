"""A follower refuses a downloaded snapshot its state machine cannot apply (sans-IO).

Three RaftCores on a hand-driven network with instant delivery and instant flushes. Node 2
lags behind the others' snapshot, and its SnapshotCheck refuses every snapshot not marked
"good" (as a node refuses one that does not decode). It must keep its log, keep following
without a hot loop or an election, and catch up once the leader serves a snapshot it can
apply.
"""

from __future__ import annotations

import dataclasses
import random

from raftlog.metadata.raft.core import RaftCore
from raftlog.metadata.raft.messages import Entry, Fetch, FetchSnapshot, Message
from raftlog.metadata.raft.roles import Follower, Leader
from raftlog.metadata.raft.types import QuorumState, RaftConfig, Ready, Snapshot

CONFIG = RaftConfig(
    election_timeout_ms=100,
    fetch_timeout_ms=300,
    election_backoff_max_ms=100,
    fetch_max_wait_ms=50,
    snapshot_chunk_bytes=4,  # several chunks per snapshot
    snapshot_retry_backoff_ms=1000,
    snapshot_retry_backoff_max_ms=3000,
)
VOTERS = frozenset({1, 2, 3})
LAGGING = 2
BAD = Snapshot(10, 1, b"written by a newer version")


def only_good(snapshot: Snapshot) -> str | None:
    return None if snapshot.data.startswith(b"good") else "unknown metadata record type 99"


class Net:
    """Delivers every message at once and makes every append durable at once."""

    def __init__(self, cores: list[RaftCore]) -> None:
        self.cores = {core.node_id: core for core in cores}
        self.now_ms = 0
        self.readies: dict[int, list[tuple[int, Ready]]] = {n: [] for n in self.cores}
        self.sent: list[tuple[int, int, int, Message]] = []  # now_ms, from, to, message

    def settle(self) -> None:
        for _ in range(10_000):
            inflight: list[tuple[int, int, Message]] = []
            flushed = False
            for node_id, core in self.cores.items():
                ready = core.take_ready()
                if ready.is_empty() and not ready.committed:
                    continue
                self.readies[node_id].append((self.now_ms, ready))
                if ready.entries:
                    core.flushed(offset=core.log_end)  # may have more to say: take_ready again
                    flushed = True
                for to_id, message in ready.messages:
                    self.sent.append((self.now_ms, node_id, to_id, message))
                    inflight.append((node_id, to_id, message))
            if not inflight and not flushed:
                return
            for from_id, to_id, message in inflight:
                self.cores[to_id].receive(now_ms=self.now_ms, from_id=from_id, message=message)
        raise AssertionError("the network never went quiet (a hot loop)")

    def run_until(self, end_ms: int) -> None:
        while True:
            self.settle()
            next_ms = min(core.next_deadline_ms() for core in self.cores.values())
            if next_ms > end_ms:
                self.now_ms = end_ms
                return
            self.now_ms = max(self.now_ms, next_ms)
            for core in self.cores.values():
                if core.next_deadline_ms() <= self.now_ms:
                    core.tick(now_ms=self.now_ms)

    def leader(self) -> RaftCore:
        (leader,) = [c for c in self.cores.values() if isinstance(c.role, Leader)]
        return leader

    def refusals(self) -> list[tuple[int, Ready]]:
        return [(t, r) for t, r in self.readies[LAGGING] if r.snapshot_rejected is not None]

    def sent_by(self, node_id: int, kind: type, start_ms: int, end_ms: int) -> int:
        return sum(
            1
            for t, f, _, m in self.sent
            if f == node_id and isinstance(m, kind) and start_ms <= t < end_ms
        )


def cluster(check: object = only_good) -> tuple[Net, list[Entry]]:
    lagging_log = [Entry(i, 1, b"e%d" % i) for i in range(4)]

    def core(node_id: int, **kw: object) -> RaftCore:
        return RaftCore(
            node_id=node_id,
            voters=VOTERS,
            config=CONFIG,
            persisted=QuorumState(1, None, None),
            rng=random.Random(node_id),
            **kw,  # type: ignore[arg-type]
        )

    net = Net(
        [
            core(1, snapshot=BAD),
            core(LAGGING, entries=lagging_log, snapshot_check=check),
            core(3, snapshot=BAD),
        ]
    )
    return net, lagging_log


def test_refused_snapshot_keeps_the_log_and_backs_off_until_a_good_one_comes() -> None:
    net, lagging_log = cluster()
    lagging = net.cores[LAGGING]
    net.run_until(2_000)
    leader = net.leader()
    assert leader.node_id != LAGGING  # its log is behind the others'
    epoch = leader.epoch

    # The lagging follower downloaded the leader's snapshot, refused it, and kept its log.
    ((refused_ms, first), *_) = net.refusals()
    assert first.snapshot_rejected is not None
    assert (first.snapshot_rejected.end_offset, first.snapshot_rejected.epoch) == (10, 1)
    assert first.snapshot_rejected.leader_id == leader.node_id
    assert "unknown metadata record type 99" in first.snapshot_rejected.reason
    assert first.snapshot_rejected.retry_in_ms == 1000
    for _, ready in net.readies[LAGGING]:
        assert ready.snapshot is None and ready.truncate_to is None and not ready.entries
    assert lagging.entries() == lagging_log and lagging.log_start == 0
    assert lagging.snapshot is None and lagging.high_watermark == 0

    # Until the backoff ends: no new download, and fetches at the long-poll pace, not in a
    # loop. Leader and follower still hear from each other: no election, same epoch.
    window_ms = (refused_ms + 1, refused_ms + 1000)
    assert net.sent_by(LAGGING, FetchSnapshot, *window_ms) == 0
    fetches = net.sent_by(LAGGING, Fetch, *window_ms)
    assert 1000 // CONFIG.fetch_max_wait_ms - 2 <= fetches <= 1000 // CONFIG.fetch_max_wait_ms + 2
    assert isinstance(lagging.role, Follower) and lagging.role.leader_id == leader.node_id
    assert net.leader() is leader and leader.epoch == epoch

    # The same snapshot is refused again after the backoff, which then doubles (to its cap).
    retries = [r.snapshot_rejected.retry_in_ms for _, r in net.refusals()]  # type: ignore[union-attr]
    assert retries == [1000, 2000]
    net.run_until(12_000)
    retries = [r.snapshot_rejected.retry_in_ms for _, r in net.refusals()]  # type: ignore[union-attr]
    assert retries == [1000, 2000, 3000, 3000, 3000]
    assert lagging.entries() == lagging_log and leader.epoch == epoch

    # The leader moves on to a snapshot the follower can apply: installed after the backoff.
    offsets = leader.propose(now_ms=net.now_ms, payloads=[b"x", b"y"])
    net.run_until(net.now_ms + 100)
    assert leader.high_watermark == offsets[-1] + 1
    end_offset = leader.high_watermark
    leader.snapshot_written(end_offset=end_offset, epoch=epoch, data=b"good image")
    net.run_until(net.now_ms + 3_100)
    installed = [r.snapshot for _, r in net.readies[LAGGING] if r.snapshot is not None]
    assert installed == [Snapshot(end_offset, epoch, b"good image")]
    assert lagging.log_start == end_offset and lagging.entries() == []

    # And it replicates what comes after, like any follower.
    leader.propose(now_ms=net.now_ms, payloads=[b"z"])
    net.run_until(net.now_ms + 100)
    assert lagging.log_end == leader.log_end == end_offset + 1
    assert lagging.high_watermark == leader.high_watermark == end_offset + 1
    assert leader.epoch == epoch


def test_a_snapshot_the_check_accepts_installs_at_once() -> None:
    net, _ = cluster(check=lambda snapshot: None)  # this node can apply anything
    lagging = net.cores[LAGGING]
    net.run_until(1_000)
    assert net.refusals() == []
    assert lagging.snapshot == BAD and lagging.log_start == 10


def test_a_snapshot_above_the_size_bound_is_refused_before_it_is_buffered() -> None:
    net, lagging_log = cluster(check=lambda snapshot: None)
    bound = dataclasses.replace(CONFIG, max_snapshot_bytes=len(BAD.data) - 1)
    net.cores[LAGGING].config = bound
    lagging = net.cores[LAGGING]
    net.run_until(1_000)
    ((refused_ms, first), *_) = net.refusals()
    assert first.snapshot_rejected is not None
    assert "above max_snapshot_bytes" in first.snapshot_rejected.reason
    # One chunk was asked for: the claimed size is checked before any more is buffered.
    assert net.sent_by(LAGGING, FetchSnapshot, 0, refused_ms + 1) == 1
    assert lagging.entries() == lagging_log and lagging.snapshot is None
