"""Issue 4 with real processes: acks=all through a kill -9 of the partition leader loses and
duplicates nothing, the restarted node catches up and rejoins the ISR, and a partition that
lost two of its three replicas refuses acks=all (NOT_ENOUGH_REPLICAS) but takes acks=1."""

import signal
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer
from kafka.errors import NotEnoughReplicasError

from raftlog.testing.cluster import ProcessCluster

pytestmark = pytest.mark.cluster

TOPIC = "ledger"
RECORDS = 3000
READ_DEADLINE_S = 60.0


def create_topic(cluster, name=TOPIC, partitions=1, rf=3, min_isr=2):
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    topic = NewTopic(name, partitions, rf, config={"min.insync.replicas": str(min_isr)})
    admin.create_topics([topic])[name].result(30)
    cluster.wait_for(lambda: partition_info(cluster, name)["leader_id"] > 0, f"{name} leader")


def partition_info(cluster, name=TOPIC, index=0, node_id=None):
    partitions = cluster.describe(node_id)["topics"][name]
    return next(p for p in partitions if p["partition"] == index)


def read_all(cluster, name=TOPIC, index=0):
    """Every record of the partition up to its HW: [(offset, value)]."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.live_bootstrap_servers(),
            "group.id": f"reader-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(name, index), timeout=30)
        consumer.assign([TopicPartition(name, index, 0)])
        out = []
        deadline = time.monotonic() + READ_DEADLINE_S
        while (not out or out[-1][0] < high - 1) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or (message.error() and message.error().code() < 0):
                continue
            assert not message.error(), message.error()
            out.append((message.offset(), message.value()))
        assert not out or out[-1][0] == high - 1, f"read up to {out[-1][0]}, HW {high}"
        return out
    finally:
        consumer.close()


def check_exactly_once(acked, records):
    """acked: {value: offset} the producer was told; records: [(offset, value)] read back."""
    values = [v for _, v in records]
    assert len(values) == len(set(values)), "a record was written twice"
    where = dict((v, o) for o, v in records)
    missing = [v for v in acked if v not in where]
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:5]}"
    wrong = [(v, o, where[v]) for v, o in acked.items() if where[v] != o]
    assert not wrong, f"acknowledged at one offset, stored at another: {wrong[:5]}"
    # One producer, one partition: the log keeps the send order.
    sent_order = sorted(values, key=lambda v: int(v))
    assert values == sent_order, "records out of order"


def produce_through_leader_kill(cluster, producer_factory):
    """Send RECORDS values with acks=all; kill -9 the leader with a window in flight."""
    leader = partition_info(cluster)["leader_id"]
    acked, errors = {}, []
    send, flush = producer_factory(cluster, acked, errors)
    half = RECORDS // 2
    for i in range(half):
        send(f"{i:06d}".encode())
    flush()
    assert len(acked) == half and not errors, errors[:3]
    for i in range(half, half + 300):
        send(f"{i:06d}".encode())
    cluster.kill(leader, signal.SIGKILL)
    for i in range(half + 300, RECORDS):
        send(f"{i:06d}".encode())
    flush()
    return leader, acked, errors


def confluent_producer(cluster, acked, errors):
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 90_000,
        }
    )

    def on_delivery(error, message):
        if error is None:
            acked[message.value()] = message.offset()
        else:
            errors.append(error)

    def send(value):
        while True:
            try:
                producer.produce(TOPIC, value=value, partition=0, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)

    def flush():
        assert producer.flush(120) == 0, "records still unacknowledged after 120 s"

    return send, flush


def kafka_python_producer(cluster, acked, errors):
    producer = KafkaProducer(
        bootstrap_servers=cluster.live_bootstrap_servers(),
        acks="all",
        enable_idempotence=True,  # kafka-python's default, spelled out
        linger_ms=5,
        request_timeout_ms=10_000,
        delivery_timeout_ms=90_000,
    )

    def send(value):
        future = producer.send(TOPIC, value=value, partition=0)
        future.add_callback(lambda meta, value=value: acked.__setitem__(value, meta.offset))
        future.add_errback(errors.append)

    def flush():
        producer.flush(120)

    return send, flush


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python"])
def test_leader_kill_loses_and_duplicates_nothing_and_the_node_rejoins(tmp_path, client):
    with ProcessCluster(tmp_path / "c", 3) as cluster:
        create_topic(cluster)
        factory = confluent_producer if client == "confluent-kafka" else kafka_python_producer
        killed, acked, errors = produce_through_leader_kill(cluster, factory)
        assert not errors, f"{len(errors)} records failed, e.g. {errors[:3]}"
        assert len(acked) == RECORDS
        new_leader = partition_info(cluster)["leader_id"]
        assert new_leader not in (killed, -1)

        records = read_all(cluster)
        check_exactly_once(acked, records)
        assert len(records) == RECORDS

        cluster.start(killed)
        cluster.wait_ready()
        cluster.wait_for(
            lambda: killed in partition_info(cluster)["isr"],
            f"node {killed} back in the ISR",
        )
        # It serves the same log once it leads: move leadership by killing the current one.
        cluster.kill(new_leader, signal.SIGKILL)
        cluster.wait_for(
            lambda: partition_info(cluster)["leader_id"] not in (new_leader, -1),
            "a leader among the survivors",
        )
        check_exactly_once(acked, read_all(cluster))


def test_two_replicas_down_refuses_acks_all_and_takes_acks_one(tmp_path):
    # Five nodes so the metadata quorum survives two dead brokers: the ISR can only shrink
    # through the controller, and with it down acks=all would time out instead.
    with ProcessCluster(tmp_path / "c", 5) as cluster:
        create_topic(cluster, rf=3, min_isr=2)
        info = partition_info(cluster)
        leader = info["leader_id"]
        doomed = [r for r in info["replicas"] if r != leader]
        for node_id in doomed:
            cluster.kill(node_id, signal.SIGKILL)
        cluster.wait_for(
            lambda: list(partition_info(cluster)["isr"]) == [leader],
            f"the ISR to shrink to the leader {leader}",
        )

        def producer(acks):
            return KafkaProducer(
                bootstrap_servers=cluster.live_bootstrap_servers(),
                acks=acks,
                enable_idempotence=False,
                retries=0,
                request_timeout_ms=10_000,
            )

        refusing = producer("all")
        try:
            with pytest.raises(NotEnoughReplicasError):
                refusing.send(TOPIC, b"needs-two", partition=0).get(timeout=30)
        finally:
            refusing.close()
        accepting = producer(1)
        try:
            meta = accepting.send(TOPIC, b"one-is-enough", partition=0).get(timeout=30)
        finally:
            accepting.close()
        assert meta.offset == 0
        assert [v for _, v in read_all(cluster)] == [b"one-is-enough"]
