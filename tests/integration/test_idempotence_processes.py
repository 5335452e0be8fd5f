"""Idempotent producers on real processes: client retries never become duplicate records.

Two ways a retry reaches the log twice without KIP-98: the client times out on a leader that
is only stalled (SIGSTOP longer than the request timeout) and resends to the same leader,
which then holds the original AND the retry; or the leader dies after replicating a batch it
never acknowledged and the client resends it to the new leader. Both happen here in one
stream, with kafka-python's defaults (idempotence on) and with confluent-kafka.
"""

import signal
import time
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka import KafkaProducer

from raftlog.testing.cluster import ProcessCluster
from tests.integration.test_replication_processes import (
    TOPIC,
    check_exactly_once,
    create_topic,
    partition_info,
    read_all,
)

pytestmark = pytest.mark.cluster

RECORDS = 2400
REQUEST_TIMEOUT_MS = 1000
# Longer than the client's request timeout (it retries into the stalled leader), shorter
# than broker_session_timeout_ms (the leader is not fenced for it).
STALL_S = 1.6


def confluent(cluster, acked, errors):
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "request.timeout.ms": REQUEST_TIMEOUT_MS,
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

    def wait(seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            producer.poll(0.05)

    return send, wait, lambda: producer.flush(120), producer


def kafka_python(cluster, acked, errors):
    producer = KafkaProducer(  # enable_idempotence and acks=all are its defaults
        bootstrap_servers=cluster.live_bootstrap_servers(),
        linger_ms=5,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        delivery_timeout_ms=90_000,
    )
    assert producer.config["enable_idempotence"] and producer.config["acks"] == -1

    def send(value):
        future = producer.send(TOPIC, value=value, partition=0)
        future.add_callback(lambda meta, value=value: acked.__setitem__(value, meta.offset))
        future.add_errback(errors.append)

    return send, time.sleep, lambda: producer.flush(120), producer


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka"])
def test_retries_through_a_stall_and_a_kill_leave_no_duplicates(tmp_path, client):
    with ProcessCluster(tmp_path / "c", 3) as cluster:
        create_topic(cluster)
        acked, errors = {}, []
        factory = confluent if client == "confluent-kafka" else kafka_python
        send, wait, flush, producer = factory(cluster, acked, errors)
        leader = partition_info(cluster)["leader_id"]
        third = RECORDS // 3
        for i in range(RECORDS):
            if i == third:
                # Requests in flight go unanswered past the client's timeout: it resends.
                cluster.pause(leader)
                wait(STALL_S)
                cluster.resume(leader)
            if i == 2 * third:
                cluster.kill(partition_info(cluster)["leader_id"], signal.SIGKILL)
            send(f"{i:06d}".encode())
        flush()
        if client == "kafka-python":
            producer.close()
        assert not errors, f"{len(errors)} records failed, e.g. {errors[:3]}"
        assert len(acked) == RECORDS
        records = read_all(cluster)
        check_exactly_once(acked, records)
        assert len(records) == RECORDS


async def test_init_producer_id_never_bumps_an_offered_id(cluster):
    """Without a transactional id, InitProducerId hands out a fresh id at epoch 0 even when
    the request names an existing id and epoch, as Kafka does: bumping the named id's epoch
    would let any client fence another producer."""
    from raftlog.client import open_cluster
    from raftlog.client.protocol import build_request

    def init(producer_id: int, producer_epoch: int) -> Any:
        return build_request(
            "init_producer_id",
            4,
            {
                "transactional_id": None,
                "transaction_timeout": 60_000,
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
            },
        )

    async with open_cluster(cluster.bootstrap_servers) as client:
        broker = await client.any_broker()
        first = await broker.request(init(-1, -1))
        assert first.error_code == 0 and first.producer_epoch == 0
        second = await broker.request(init(first.producer_id, first.producer_epoch))
        assert second.error_code == 0
        assert second.producer_id != first.producer_id
        assert second.producer_epoch == 0
