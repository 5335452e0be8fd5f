"""Issue 16 (metrics) with real processes: every node serves /metrics (metrics_listener), and
the figures move when the cluster does: one active controller, Raft epoch, leader and commit
latency; produce raises bytes and records in and times Produce; a consumer raises bytes and
records out, and its group's lag follows its commits; a client over its quota is throttled;
an acks=all produce waits in the purgatory while a follower is paused;
killing a follower makes the leader's partitions under-replicated (and under min ISR, through
an ISR shrink; acks=all is then refused and counted as an error), its own single-replica
partition offline; its return expands the ISR and clears them again."""

from __future__ import annotations

import dataclasses
import signal
import socket
import time
import urllib.error
import urllib.request

import pytest
import trio
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from raftlog.client.admin import Admin
from raftlog.client.cluster import open_cluster
from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode
from raftlog.quotas import QuotaEntity
from raftlog.testing.cluster import NodeProcess, ProcessCluster, free_ports

pytestmark = pytest.mark.cluster

TOPIC = "metered"
SOLO = "solo"
GROUP = "metrics-reader"
THROTTLED_CLIENT = "throttled-producer"
# Far below what one round of the producer below sends: it is throttled at once.
THROTTLED_BYTES_S = 1024
RECORDS = 200
SCRAPE_TIMEOUT_S = 5.0
# ISR shrink waits replica_lag_time_max_ms (3 s in FAST_TIMINGS); fencing the session (2 s).
CHANGE_TIMEOUT_S = 30.0

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(node: NodeProcess) -> Samples:
    url = f"http://{node.config.metrics_listener}/metrics"
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
        assert response.status == 200
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(cluster: ProcessCluster, name: str, **labels: str) -> float:
    return sum(
        value(scrape(node), name, **labels) for node in cluster.nodes.values() if node.running
    )


def metered_cluster(root) -> ProcessCluster:
    """Three nodes, each with a metrics_listener on a port of its own."""
    cluster = ProcessCluster(root, 3)
    taken = {
        port
        for node in cluster.nodes.values()
        for port in (node.config.client_address[1], node.config.internal_address[1])
    }
    ports = [p for p in free_ports(6) if p not in taken][:3]
    assert len(ports) == 3
    for node, port in zip(cluster.nodes.values(), ports, strict=True):
        values = dataclasses.asdict(node.config)
        values["metrics_listener"] = f"127.0.0.1:{port}"
        node.config = NodeConfig.from_dict(values)
        node.config_path.write_text(node.config.to_toml())
    return cluster


@pytest.fixture
def cluster(tmp_path):
    with metered_cluster(tmp_path / "cluster") as running:
        yield running


def partition_leader(cluster: ProcessCluster, topic: str) -> int:
    partitions = cluster.describe()["topics"].get(topic) or []
    return next((p["leader_id"] for p in partitions if p["partition"] == 0), -1)


def active_controller(cluster: ProcessCluster) -> int | None:
    active = [
        node.node_id
        for node in cluster.nodes.values()
        if node.running and value(scrape(node), ACTIVE_CONTROLLER)
    ]
    return active[0] if len(active) == 1 else None


# The names scraped below (docs/operations.md, "Metrics", maps them to Kafka's).
ACTIVE_CONTROLLER = "raftlog_controller_kafka_controller_active_controller_count"
OFFLINE = "raftlog_controller_kafka_controller_offline_partitions_count"
UNDER_REPLICATED = "raftlog_server_replica_manager_under_replicated_partitions"
UNDER_MIN_ISR = "raftlog_server_replica_manager_under_min_isr_partition_count"
ISR_SHRINKS = "raftlog_server_replica_manager_isr_shrinks_total"
ISR_EXPANDS = "raftlog_server_replica_manager_isr_expands_total"
RAFT = "raftlog_server_raft_metrics_"
TOPIC_METRICS = "raftlog_server_broker_topic_metrics_"
REQUESTS = "raftlog_network_request_metrics_"
FLUSH_COUNT = "raftlog_log_log_flush_stats_log_flush_time_seconds_count"
PURGATORY = "raftlog_server_delayed_operation_purgatory_purgatory_size"
LAG = "raftlog_consumer_group_lag"
COMMITTED = "raftlog_consumer_group_committed_offset"
THROTTLE = "raftlog_server_quota_throttle_time_seconds_total"
QUOTA_LIMIT = "raftlog_server_quota_limit"


def test_every_node_serves_metrics_that_follow_the_cluster(cluster):
    nodes = cluster.nodes
    # One active controller, and every node agrees on the quorum's epoch and leader.
    controller = cluster.wait_for(lambda: active_controller(cluster), "one active controller")
    views = [scrape(node) for node in nodes.values()]
    assert {value(s, RAFT + "current_leader") for s in views} == {controller}
    epochs = {value(s, RAFT + "current_epoch") for s in views}
    assert len(epochs) == 1 and epochs.pop() >= 1
    assert all(value(s, RAFT + "leader_changes_total") >= 1 for s in views)

    # The leader of TOPIC is a node other than the victim, which holds SOLO alone.
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    created = admin.create_topics([NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "3"})])
    created[TOPIC].result(30)
    leader = cluster.wait_for(lambda: max(partition_leader(cluster, TOPIC), 0), "a leader")
    victim = next(n for n in sorted(nodes) if n not in (leader, controller))
    admin.create_topics([NewTopic(SOLO, 1, replica_assignment=[[victim]])])[SOLO].result(30)
    cluster.wait_for(lambda: partition_leader(cluster, SOLO) == victim, f"{SOLO} on {victim}")
    # Creating topics went through the metadata quorum: commits were timed.
    assert value(scrape(nodes[controller]), RAFT + "commit_latency_seconds_count") >= 1

    # Produce: bytes and records in on the leader, Produce timed, flushes timed.
    before = scrape(nodes[leader])
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    for i in range(RECORDS):
        producer.produce(TOPIC, value=f"record-{i:04d}".encode(), partition=0)
    assert producer.flush(30) == 0
    after = scrape(nodes[leader])
    bytes_in = TOPIC_METRICS + "bytes_in_total"
    assert value(after, bytes_in, topic=TOPIC) > value(before, bytes_in, topic=TOPIC)
    assert value(after, TOPIC_METRICS + "messages_in_total", topic=TOPIC) >= RECORDS
    produce_count = REQUESTS + "total_time_seconds_count"
    assert value(after, produce_count, request="Produce") > value(
        before, produce_count, request="Produce"
    )
    assert value(after, REQUESTS + "requests_total", request="Produce") > 0
    assert value(after, FLUSH_COUNT) > 0
    assert (PURGATORY, (("delayed_operation", "Produce"),)) in after

    consume_and_check_lag(cluster, leader)
    check_quota_throttle_time(cluster)
    check_purgatory(cluster, leader, victim)

    healthy = scrape(nodes[leader])
    assert value(healthy, UNDER_REPLICATED) == 0
    assert value(healthy, UNDER_MIN_ISR) == 0
    assert value(healthy, "raftlog_server_replica_manager_leader_count") >= 1
    assert total(cluster, OFFLINE) == 0
    shrinks_before = value(healthy, ISR_SHRINKS)

    # Kill a follower: the leader's partitions become under-replicated (TOPIC below its
    # min ISR of 3) through an ISR shrink, and SOLO goes offline once the victim is fenced.
    cluster.kill(victim, signal.SIGKILL)
    cluster.wait_for(
        lambda: value(scrape(nodes[leader]), UNDER_REPLICATED) >= 1,
        "under-replicated partitions on the leader",
        CHANGE_TIMEOUT_S,
    )
    degraded = scrape(nodes[leader])
    assert value(degraded, UNDER_MIN_ISR) >= 1
    assert value(degraded, ISR_SHRINKS) > shrinks_before
    check_produce_errors(cluster, leader)
    cluster.wait_for(lambda: total(cluster, OFFLINE) >= 1, "an offline partition", CHANGE_TIMEOUT_S)
    expands_before = value(scrape(nodes[leader]), ISR_EXPANDS)

    # Its return: the ISR expands and nothing is under-replicated or offline any more.
    cluster.start(victim)
    cluster.wait_for(
        lambda: value(scrape(nodes[leader]), UNDER_REPLICATED) == 0,
        "no under-replicated partitions",
        CHANGE_TIMEOUT_S,
    )
    assert value(scrape(nodes[leader]), ISR_EXPANDS) > expands_before
    cluster.wait_for(lambda: total(cluster, OFFLINE) == 0, "no offline partition", CHANGE_TIMEOUT_S)
    assert total(cluster, ACTIVE_CONTROLLER) == 1


def consume_and_check_lag(cluster: ProcessCluster, leader: int) -> None:
    """A consumer raises bytes and records out; its group's lag follows its commits."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": GROUP,
            "enable.auto.commit": False,
        }
    )
    where = {"group": GROUP, "topic": TOPIC, "partition": "0"}
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        read = 0
        deadline = time.monotonic() + CHANGE_TIMEOUT_S
        while read < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                read += 1
        assert read == RECORDS
        out = scrape(cluster.nodes[leader])
        assert value(out, TOPIC_METRICS + "bytes_out_total", topic=TOPIC) > 0
        assert value(out, TOPIC_METRICS + "messages_out_total", topic=TOPIC) >= RECORDS

        half = RECORDS // 2
        consumer.commit(offsets=[TopicPartition(TOPIC, 0, half)], asynchronous=False)
        cluster.wait_for(
            lambda: total(cluster, LAG, **where) == RECORDS - half,
            "the group's lag after a commit halfway",
            CHANGE_TIMEOUT_S,
        )
        consumer.commit(offsets=[TopicPartition(TOPIC, 0, RECORDS)], asynchronous=False)
        cluster.wait_for(
            lambda: (
                total(cluster, COMMITTED, **where) == RECORDS and total(cluster, LAG, **where) == 0
            ),
            "no lag after committing the end",
            CHANGE_TIMEOUT_S,
        )
    finally:
        consumer.close()


def check_quota_throttle_time(cluster: ProcessCluster) -> None:
    """A client over its producer_byte_rate quota: its throttle time rises."""

    async def set_quota() -> None:
        quota = {"producer_byte_rate": THROTTLED_BYTES_S}
        async with open_cluster(cluster.bootstrap_servers, client_id="quota-admin") as client:
            results = await Admin(client).alter_client_quotas(
                [(QuotaEntity.client(THROTTLED_CLIENT), quota)]
            )
        assert all(r.error == ErrorCode.none for r in results.values()), results

    trio.run(set_quota)
    labels = {"quota_type": "Produce", "user": "", "client_id": THROTTLED_CLIENT}
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "client.id": THROTTLED_CLIENT}
    )

    def throttled() -> bool:
        # Each check sends more than the quota allows in a second, until the leader (which
        # may learn of the quota a little later) throttles it.
        for _ in range(4):
            producer.produce(TOPIC, value=b"x" * 1024, partition=0)
        producer.flush(10)
        return total(cluster, THROTTLE, **labels) > 0

    cluster.wait_for(throttled, "throttle time of the throttled client", CHANGE_TIMEOUT_S)
    assert total(cluster, QUOTA_LIMIT, **labels) >= THROTTLED_BYTES_S


def check_purgatory(cluster: ProcessCluster, leader: int, follower: int) -> None:
    """An acks=all produce waits in the leader's purgatory while a follower is paused."""
    purgatory = {"delayed_operation": "Produce"}
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    # Connected to the leader before the pause: the parked produce then goes out at once,
    # well inside the window before the paused follower is fenced and leaves the ISR.
    producer.produce(TOPIC, value=b"warm-up", partition=0)
    assert producer.flush(30) == 0
    cluster.pause(follower)
    try:
        producer.produce(TOPIC, value=b"parked", partition=0)
        producer.poll(0)
        cluster.wait_for(
            lambda: value(scrape(cluster.nodes[leader]), PURGATORY, **purgatory) >= 1,
            "a produce parked in the purgatory",
            CHANGE_TIMEOUT_S,
        )
    finally:
        cluster.resume(follower)
    producer.flush(30)
    cluster.wait_for(
        lambda: (
            value(scrape(cluster.nodes[leader]), PURGATORY, **purgatory) == 0
            and value(scrape(cluster.nodes[leader]), UNDER_REPLICATED) == 0
        ),
        "an empty purgatory and a full ISR again",
        CHANGE_TIMEOUT_S,
    )


def check_produce_errors(cluster: ProcessCluster, leader: int) -> None:
    """acks=all below min.insync.replicas: the leader counts NOT_ENOUGH_REPLICAS errors."""
    labels = {"request": "Produce", "error": "NOT_ENOUGH_REPLICAS"}
    before = value(scrape(cluster.nodes[leader]), REQUESTS + "errors_total", **labels)
    producer = Producer(
        {
            "bootstrap.servers": cluster.live_bootstrap_servers(),
            "acks": "all",
            "message.timeout.ms": 10_000,
        }
    )
    outcomes: list[object] = []
    producer.produce(
        TOPIC, value=b"refused", partition=0, on_delivery=lambda error, _: outcomes.append(error)
    )
    producer.flush(30)
    assert outcomes and outcomes[0] is not None, outcomes
    assert value(scrape(cluster.nodes[leader]), REQUESTS + "errors_total", **labels) > before


def test_the_endpoint_answers_only_get_metrics_and_survives_garbage(cluster):
    node = next(iter(cluster.nodes.values()))
    base = f"http://{node.config.metrics_listener}"
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{base}/other", timeout=SCRAPE_TIMEOUT_S)
    assert missing.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as posted:
        urllib.request.urlopen(f"{base}/metrics", data=b"x", timeout=SCRAPE_TIMEOUT_S)
    assert posted.value.code == 405
    host, port = node.config.metrics_address or ("", 0)
    for garbage in (b"\x00\xff" * 100 + b"\r\n\r\n", b"A" * 20_000):
        with socket.create_connection((host, port), timeout=SCRAPE_TIMEOUT_S) as sock:
            try:
                sock.sendall(garbage)
                answer = sock.recv(100)
            except (ConnectionResetError, BrokenPipeError):
                answer = b""
            assert answer == b"" or answer.startswith(b"HTTP/1.1 400")
    # Still serving, and so is the node.
    assert value(scrape(node), "raftlog_server_raft_metrics_current_epoch") >= 1
    assert node.running
