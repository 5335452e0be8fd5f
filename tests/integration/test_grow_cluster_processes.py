"""Growing a running cluster from three nodes to five and retiring two of the originals, with
real node processes under a steady acks=all idempotent load from a stock confluent-kafka
producer (keyed, several partitions):

- nodes 4 and 5 start as observers of the metadata quorum and become controller voters
  (AddRaftVoter, KIP-853);
- every partition of the loaded topic moves onto them (AlterPartitionReassignments, KIP-455);
- nodes 1 and 2 are drained, removed from the voters (RemoveRaftVoter), stopped and
  unregistered (UnregisterBroker), the steps of `raftlog cluster remove-node`, whose
  functions (cli/cluster_nodes.py) this test drives.

Then every acknowledged record is read back at the offset it was acknowledged at, in order per
partition, and every replica holds the same batches, byte for byte, below the high watermark.
The second test does the same while the active controller is killed with SIGKILL in the
middle of a voter change and in the middle of the reassignment, and restarted. The third, a
faster variant that `make test` runs, grows to five voters and moves one partition.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from confluent_kafka import Producer
from raftlog_cli.cluster_nodes import (
    change_voters,
    drain,
    drain_plan,
    gather_view,
    move_leaders,
    removal_refusals,
    start_moves,
    wait_moved,
)
from raftlog_cli.render import Renderer

from raftlog.client import Admin, Cluster, NewTopic, open_cluster
from raftlog.client.admin import ListedOffset
from raftlog.client.connection import ConnectionClosed, call_negotiated
from raftlog.client.quorum import QUORUM_API_VERSIONS, QuorumAdmin, QuorumDescription
from raftlog.errors import CorruptRecordError, ErrorCode
from raftlog.records import iter_batches
from raftlog.testing.cluster import ProcessCluster
from tests.integration.test_replication_processes import (
    check_exactly_once,
    partition_info,
    read_all,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster

T = TypeVar("T")

TOPIC = "growing"
PARTITIONS = 4
REPLICATION_FACTOR = 3
ORIGINAL = (1, 2, 3)
NEW = (4, 5)
RETIRED = (1, 2)
# A steady, modest load: enough that every step happens while records are in flight.
RATE_PER_S = 300
KEYS = 32
# Each step (a voter change, a set of moves, a drain) gets this long on 2 shared cores.
STEP_TIMEOUT_S = 60.0
# How many records acknowledged after each step show the cluster still takes writes.
PROGRESS_RECORDS = 150
# They take under a second, and a few after a controller is killed; a stall fails sooner.
PROGRESS_TIMEOUT_S = 30.0
OUT = Renderer(json_mode=True)


# ---------------------------------------------------------------------------- the load
class PacedProducer:
    """A confluent-kafka producer (acks=all, idempotent) in a thread, sending keyed records at
    RATE_PER_S until stopped; remembers the offset each acknowledged value got, per partition.
    Values are increasing numbers, so the order of a partition's records can be checked."""

    def __init__(
        self, bootstrap_servers: str, topic: str = TOPIC, partitions: int = PARTITIONS
    ) -> None:
        self.topic = topic
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap_servers,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                # Long enough to ride out a controller kill and a leader move without a
                # delivery failure; a failure is reported, not retried by hand.
                "message.timeout.ms": 120_000,
            }
        )
        self.acked: dict[int, dict[bytes, int]] = {p: {} for p in range(partitions)}
        self.errors: list[object] = []
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="paced-producer", daemon=True)

    def _on_delivery(self, error: Any, message: Any) -> None:
        if error is None:
            self.acked[message.partition()][message.value()] = message.offset()
        else:
            self.errors.append(error)

    def _run(self) -> None:
        interval_s = 1.0 / RATE_PER_S
        next_send = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= next_send:
                try:
                    self.producer.produce(
                        self.topic,
                        key=f"key-{self.sent % KEYS}".encode(),
                        value=f"{self.sent:09d}".encode(),
                        on_delivery=self._on_delivery,
                    )
                    self.sent += 1
                    # After a stall, resume the rate rather than send the backlog at once.
                    next_send = max(next_send + interval_s, now - 1.0)
                except BufferError:
                    pass
            # Serves delivery reports until the next send is due (the pace of the load).
            self.producer.poll(max(0.0, next_send - time.monotonic()))
        self.producer.flush(120)

    def acked_count(self) -> int:
        return sum(len(values) for values in self.acked.values())

    @contextlib.contextmanager
    def running(self) -> Iterator[PacedProducer]:
        self.thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            self.thread.join(150)

    def wait_progress(self, cluster: ProcessCluster, what: str) -> None:
        """Wait until PROGRESS_RECORDS more records are acknowledged (writes go on)."""
        target = self.acked_count() + PROGRESS_RECORDS
        cluster.wait_for(
            lambda: self.acked_count() >= target, f"acknowledged writes {what}", PROGRESS_TIMEOUT_S
        )


# ---------------------------------------------------------------------------- the cluster
@contextlib.contextmanager
def three_of_five(root: Path, **overrides: Any) -> Iterator[ProcessCluster]:
    """Nodes 1-3 running (the voters); 4 and 5 configured as observers, not started yet."""
    cluster = ProcessCluster(root, 5, overrides=overrides)
    cluster.make_observers(NEW)
    try:
        for node_id in ORIGINAL:
            cluster.start(node_id)
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop()


def connect(cluster: ProcessCluster) -> Callable[[], AbstractAsyncContextManager[Cluster]]:
    """A client factory bootstrapped, each time, from the nodes running then."""
    return lambda: open_cluster(cluster.live_bootstrap_servers(), client_id="grow-test")


def with_client(cluster: ProcessCluster, call: Callable[[Cluster], Awaitable[T]]) -> T:
    async def go() -> T:
        async with connect(cluster)() as client:
            return await call(client)

    return trio.run(go)


def quorum(cluster: ProcessCluster) -> QuorumDescription:
    return with_client(cluster, lambda c: QuorumAdmin(c).describe_quorum())


def voter_ids(cluster: ProcessCluster) -> set[int]:
    return {v.replica_id for v in quorum(cluster).voters}


def add_voter(cluster: ProcessCluster, node_id: int) -> None:
    host, port = cluster.nodes[node_id].config.advertised_internal_address
    trio.run(partial(change_voters, connect(cluster), STEP_TIMEOUT_S, add=(node_id, host, port)))


def create_topic(
    cluster: ProcessCluster,
    topic: str = TOPIC,
    partitions: int = PARTITIONS,
    replication_factor: int = REPLICATION_FACTOR,
) -> None:
    async def create(client: Cluster) -> None:
        new = NewTopic(topic, partitions, replication_factor)
        results = await Admin(client).create_topics([new])
        assert results[topic].error == ErrorCode.none, results

    with_client(cluster, create)
    cluster.wait_for(
        lambda: all(partition_info(cluster, topic, p)["leader_id"] > 0 for p in range(partitions)),
        "every partition has a leader",
    )


def grow(cluster: ProcessCluster) -> None:
    """Start nodes 4 and 5 (observers, registered brokers) and make them voters."""
    for node_id in NEW:
        cluster.start(node_id)
    cluster.wait_ready()
    for node_id in NEW:
        add_voter(cluster, node_id)
    assert voter_ids(cluster) == {*ORIGINAL, *NEW}


def onto_new_nodes(partitions: range) -> dict[tuple[str, int], tuple[int, ...]]:
    """Each partition onto both new nodes, one of them first (the preferred leader), and one
    original that stays for now; nodes 1 and 2 keep some, so retiring them drains replicas.
    The original kept is the partition's first leader (its replicas were placed round-robin):
    leaderships stay where they are while the moves run, as in most operators' plans."""
    return {
        (TOPIC, p): (NEW if p % 2 == 0 else NEW[::-1]) + (ORIGINAL[p % len(ORIGINAL)],)
        for p in partitions
    }


def off_its_leader(
    cluster: ProcessCluster, partition: int
) -> dict[tuple[str, int], tuple[int, ...]]:
    """The partition onto both new nodes and one of its followers: its leader's replica leaves,
    so the controller elects a new leader when the move completes."""
    info = partition_info(cluster, TOPIC, partition)
    follower = min(b for b in info["replicas"] if b != info["leader_id"])
    return {(TOPIC, partition): (*NEW, follower)}


def move(cluster: ProcessCluster, plan: dict[tuple[str, int], tuple[int, ...]]) -> None:
    with_client(cluster, lambda c: drain(c, plan, STEP_TIMEOUT_S, OUT))


def retire(cluster: ProcessCluster, node_id: int) -> None:
    """remove-node's steps: drain, move leaderships, RemoveRaftVoter, stop, UnregisterBroker."""

    async def empty(client: Cluster) -> None:
        view = await gather_view(client)
        assert not removal_refusals(node_id, view)
        plan = drain_plan(node_id, view)
        if plan:
            await drain(client, plan, STEP_TIMEOUT_S, OUT)
        await move_leaders(client, node_id, STEP_TIMEOUT_S, OUT)

    with_client(cluster, empty)
    trio.run(partial(change_voters, connect(cluster), STEP_TIMEOUT_S, remove=node_id))
    cluster.wait_for(
        lambda: (
            node_id not in voter_ids(cluster) and quorum(cluster).leader_id not in (-1, node_id)
        ),
        f"a leader among the voters without node {node_id}",
    )
    cluster.kill(node_id, signal.SIGTERM)
    with_client(cluster, lambda c: Admin(c).unregister_broker(node_id))
    cluster.wait_for(
        lambda: node_id not in {b["node_id"] for b in cluster.describe()["brokers"]},
        f"node {node_id} gone from the brokers",
    )


# ---------------------------------------------------------------------------- the checks
def batches_below(directory: Path, high_watermark: int) -> list[bytes]:
    """The record batches of a replica's segment files that start below high_watermark."""
    out: list[bytes] = []
    for segment in sorted(directory.glob("*.log")):
        data = segment.read_bytes()
        try:
            for position, header in iter_batches(data):
                if header.base_offset >= high_watermark:
                    return out
                out.append(data[position : position + header.size_bytes])
        except CorruptRecordError:
            break  # a batch being appended above the high watermark (a torn tail)
    return out


async def _latest_offset(client: Cluster, *, topic: str, partition: int) -> ListedOffset:
    return await Admin(client).list_offsets(topic, partition)


def check_replicas_identical(
    cluster: ProcessCluster, partitions: range, topic: str = TOPIC
) -> None:
    """Every replica of each partition holds the same batches (bytes) below the HW, and they
    cover every offset from 0 to the HW."""
    for p in partitions:
        info = cluster.wait_for(
            lambda p=p: (
                sorted((i := partition_info(cluster, topic, p))["isr"]) == sorted(i["replicas"])
                and i
            ),
            f"{topic}-{p} with a full ISR",
        )
        listed = with_client(cluster, partial(_latest_offset, topic=topic, partition=p))
        high_watermark = listed.offset
        copies = {
            b: batches_below(cluster.partition_log_dir(b, topic, p), high_watermark)
            for b in info["replicas"]
        }
        leader = copies[info["leader_id"]]
        next_offset = 0
        for batch in leader:
            (_, header) = next(iter_batches(batch))
            assert header.base_offset == next_offset, f"{topic}-{p}: a gap at {next_offset}"
            next_offset = header.next_offset
        assert next_offset >= high_watermark, f"{topic}-{p}: leader has {next_offset}"
        for broker, batches in copies.items():
            assert batches == leader, (
                f"{topic}-{p}: replica {broker} differs from leader {info['leader_id']} below "
                f"the HW {high_watermark} ({len(batches)} vs {len(leader)} batches)"
            )


def check_no_acked_record_lost(
    cluster: ProcessCluster, producer: PacedProducer, partitions: range
) -> None:
    assert not producer.thread.is_alive(), "the producer did not finish"
    assert not producer.errors, producer.errors[:5]
    assert producer.acked_count() > 0
    for p in partitions:
        check_exactly_once(producer.acked[p], read_all(cluster, producer.topic, p))


# ---------------------------------------------------------------------------- the tests
def test_grow_to_five_voters_and_move_a_partition_under_load(tmp_path: Path) -> None:
    with three_of_five(tmp_path / "c") as cluster:
        create_topic(cluster)
        producer = PacedProducer(cluster.bootstrap_servers)
        with producer.running():
            producer.wait_progress(cluster, "before the change")
            grow(cluster)
            producer.wait_progress(cluster, "with five voters")
            move(cluster, off_its_leader(cluster, 0))
            producer.wait_progress(cluster, "after the move")
        check_no_acked_record_lost(cluster, producer, range(PARTITIONS))
        check_replicas_identical(cluster, range(PARTITIONS))


@pytest.mark.slow  # `make test-all`; the first test of this file is the quick one
def test_grow_to_five_move_everything_and_retire_two_originals(tmp_path: Path) -> None:
    with three_of_five(tmp_path / "c") as cluster:
        create_topic(cluster)
        producer = PacedProducer(cluster.bootstrap_servers)
        with producer.running():
            producer.wait_progress(cluster, "before the change")
            grow(cluster)
            move(cluster, onto_new_nodes(range(PARTITIONS)))
            producer.wait_progress(cluster, "after the moves")
            for node_id in RETIRED:
                retire(cluster, node_id)
            producer.wait_progress(cluster, "after the retirements")
        check_final_layout(cluster)
        check_no_acked_record_lost(cluster, producer, range(PARTITIONS))
        check_replicas_identical(cluster, range(PARTITIONS))


def check_final_layout(cluster: ProcessCluster) -> None:
    remaining = {*ORIGINAL, *NEW} - set(RETIRED)
    assert voter_ids(cluster) == remaining
    for p in range(PARTITIONS):
        assert set(partition_info(cluster, TOPIC, p)["replicas"]) <= remaining


# ---- the controller killed mid-change
# Wide enough that a leader whose followers are paused stays leader while it takes a change.
KILL_TIMINGS = {"fetch_timeout_ms": 2000, "broker_session_timeout_ms": 4000}


def add_voter_killing_the_controller(cluster: ProcessCluster, node_id: int) -> None:
    """AddRaftVoter(node_id) that the controller appends but cannot commit (every other voter
    is paused, so only node_id, fetching as an observer, gets the VotersRecord); the
    controller is then killed with SIGKILL and restarted, the others resumed, and the change
    asked again until it is in force (DUPLICATE_VOTER: a new leader committed the first)."""
    leader = quorum(cluster).leader_id
    followers = voter_ids(cluster) - {leader}
    host, port = cluster.nodes[node_id].config.advertised_internal_address
    unanswered: list[bool] = []

    async def ask_then_kill() -> None:
        address = cluster.nodes[leader].client_address
        # Two clients: a connection answers in request order, so a DescribeQuorum sent after
        # the AddRaftVoter on the same one would wait for the change to commit.
        async with open_cluster(address) as client, open_cluster(address) as observer:
            assert client.controller_id == observer.controller_id == leader
            connection = await client.controller()
            await observer.controller()
            for follower in followers:
                cluster.pause(follower)

            async def ask() -> None:
                values = {
                    "cluster_id": None,
                    "timeout": 30_000,
                    "voter_id": node_id,
                    "voter_directory_id": None,
                    "listeners": [{"name": "CONTROLLER", "host": host, "port": port}],
                }
                try:
                    response = await call_negotiated(
                        connection, "add_raft_voter", values, QUORUM_API_VERSIONS
                    )
                except ConnectionClosed:
                    unanswered.append(True)
                else:
                    raise AssertionError(f"answered with the majority paused: {response}")

            async def appended() -> bool:
                described = await QuorumAdmin(observer).describe_quorum()
                return node_id in {v.replica_id for v in described.voters}

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask)
                await wait_until(f"node {leader} to append the change", appended, 1.5)
                cluster.kill(leader)

    try:
        trio.run(ask_then_kill)
    finally:
        for follower in followers:
            cluster.resume(follower)
    assert unanswered == [True]
    cluster.start(leader)
    add_voter(cluster, node_id)
    cluster.wait_ready()  # the restarted broker registered and unfenced again
    cluster.wait_for(
        lambda: voter_ids(cluster) == {*ORIGINAL, *NEW} and quorum(cluster).leader_id > 0,
        "five voters and a leader",
    )


def move_killing_the_controller(
    cluster: ProcessCluster, plan: dict[tuple[str, int], tuple[int, ...]]
) -> None:
    """Start the moves, and kill the controller with SIGKILL while they are under way; it is
    restarted and the moves finish under the controller elected meanwhile."""
    leader = quorum(cluster).leader_id

    async def start_then_kill(client: Cluster) -> int:
        await start_moves(client, plan)
        ongoing = await Admin(client).list_partition_reassignments(list(plan))
        cluster.kill(leader)
        return len(ongoing)

    ongoing = with_client(cluster, start_then_kill)
    assert ongoing > 0, "the moves finished before the controller was killed"
    cluster.start(leader)
    cluster.wait_ready()
    with_client(cluster, lambda c: wait_moved(c, plan, STEP_TIMEOUT_S, OUT))


@pytest.mark.slow  # `make test-all`; the first test of this file is the quick one
def test_the_same_with_the_controller_killed_mid_change(tmp_path: Path) -> None:
    with three_of_five(tmp_path / "c", **KILL_TIMINGS) as cluster:
        create_topic(cluster)
        producer = PacedProducer(cluster.bootstrap_servers)
        with producer.running():
            producer.wait_progress(cluster, "before the change")
            for node_id in NEW:
                cluster.start(node_id)
            cluster.wait_ready()
            add_voter(cluster, NEW[0])
            add_voter_killing_the_controller(cluster, NEW[1])
            producer.wait_progress(cluster, "after the voter change")
            move_killing_the_controller(cluster, onto_new_nodes(range(PARTITIONS)))
            producer.wait_progress(cluster, "after the moves")
            for node_id in RETIRED:
                retire(cluster, node_id)
            producer.wait_progress(cluster, "after the retirements")
        check_final_layout(cluster)
        check_no_acked_record_lost(cluster, producer, range(PARTITIONS))
        check_replicas_identical(cluster, range(PARTITIONS))


# ---- brokers reach an active controller that joined by AddRaftVoter
def test_brokers_reach_a_controller_that_joined_as_a_voter(tmp_path: Path) -> None:
    """Nodes 4 and 5 become voters and 1-3 leave the voters (they stay brokers), so the
    metadata leader, the active controller, is 4 or 5: a node the other nodes' config files
    do not name. A broker restarted then must register with it, and heartbeat."""
    with three_of_five(tmp_path / "c") as cluster:
        grow(cluster)
        for node_id in ORIGINAL:
            trio.run(partial(change_voters, connect(cluster), STEP_TIMEOUT_S, remove=node_id))
        cluster.wait_for(
            lambda: quorum(cluster).leader_id in NEW and voter_ids(cluster) == set(NEW),
            "a leader among the voters 4 and 5",
        )
        cluster.kill(1, signal.SIGTERM)
        cluster.start(1)
        cluster.wait_ready(timeout_s=20)
