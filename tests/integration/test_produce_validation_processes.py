"""Issue 13 against three real node processes: batches that pass the CRC but lie (a record
count of 1,000,000 over 3 records, random record bytes, undecodable gzip and zstd) are refused
over a raw Kafka connection, nothing of them is appended, and confluent-kafka and kafka-python
then read the partition cleanly to its end. A client's Produce to __consumer_offsets is
refused with INVALID_TOPIC_EXCEPTION while the group coordinator keeps committing offsets.
"""

from __future__ import annotations

import time

import pytest
import trio
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from raftlog.client import open_connection
from raftlog.errors import ErrorCode
from raftlog.groups.hashing import partition_for_group
from raftlog.groups.settings import OFFSETS_TOPIC
from raftlog.records import Compression, Record, build_batch, make_attributes
from raftlog.testing.cluster import ProcessCluster
from tests.test_batch_validation import forge, three_records

pytestmark = pytest.mark.cluster

TOPIC = "validated"
DEADLINE_S = 60.0
GZIP = make_attributes(Compression.GZIP)
ZSTD = make_attributes(Compression.ZSTD)
# What an attacker sends, and the code Kafka answers it with.
LYING_BATCHES: dict[str, tuple[bytes, ErrorCode]] = {
    "recordCount 1,000,000 over 3 records": (
        forge(three_records(), 1_000_000),
        ErrorCode.invalid_record,
    ),
    "recordCount 2^31-1 over 3 records": (
        forge(three_records(), 2**31 - 1),
        ErrorCode.invalid_record,
    ),
    "random record bytes, good CRC": (forge(bytes(range(7, 250)), 3), ErrorCode.invalid_record),
    "undecodable gzip, good CRC": (
        forge(b"\x1f\x8b\x08\x00" + b"garbage" * 9, 3, attributes=GZIP),
        ErrorCode.corrupt_message,
    ),
    "undecodable zstd, good CRC": (
        forge(b"\x28\xb5\x2f\xfd" + b"garbage" * 9, 3, attributes=ZSTD),
        ErrorCode.corrupt_message,
    ),
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("validation")
    overrides = {"min_insync_replicas": 2, "offsets_topic_num_partitions": 3}
    with ProcessCluster(root / "c", 3, overrides) as running:
        admin = AdminClient({"bootstrap.servers": running.bootstrap_servers})
        admin.create_topics([NewTopic(TOPIC, 1, 3)])[TOPIC].result(30)
        running.wait_for(
            lambda: any(p["leader_id"] > 0 for p in running.describe()["topics"].get(TOPIC, [])),
            f"a leader for {TOPIC}",
        )
        yield running


def _produce_values(topic: str, partition: int, records: bytes) -> dict:
    return {
        "transactional_id": None,
        "acks": -1,
        "timeout": 10_000,
        "topic_data": [
            {"name": topic, "partition_data": [{"index": partition, "records": records}]}
        ],
    }


async def _raw_produce(address: str, topic: str, partition: int, records: bytes) -> tuple[int, str]:
    host, port = address.rsplit(":", 1)
    async with open_connection(host, int(port)) as connection:
        response = await connection.call("produce", _produce_values(topic, partition, records))
    (answer,) = response.responses[0].partition_responses
    return int(answer.error_code), str(answer.error_message or "")


async def _log_end(address: str, topic: str, partition: int) -> int:
    host, port = address.rsplit(":", 1)
    async with open_connection(host, int(port)) as connection:
        response = await connection.call(
            "list_offsets",
            {
                "replica_id": -1,
                "isolation_level": 0,
                "topics": [
                    {
                        "name": topic,
                        "partitions": [
                            {
                                "partition_index": partition,
                                "timestamp": -1,
                                "current_leader_epoch": -1,
                            }
                        ],
                    }
                ],
            },
        )
    (answer,) = response.topics[0].partitions
    assert int(answer.error_code) == 0, answer
    return int(answer.offset)


def _leader_address(cluster: ProcessCluster, topic: str, partition: int) -> str:
    leaders = {p["partition"]: p["leader_id"] for p in cluster.describe()["topics"][topic]}
    return cluster.nodes[leaders[partition]].client_address


def _produce_good(cluster: ProcessCluster, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    errors: list[object] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None:
            errors.append(error)

    for value in values:
        producer.produce(TOPIC, value=value, partition=0, on_delivery=delivered)
    assert producer.flush(30) == 0 and not errors, errors


def _confluent_read_to_end(bootstrap: str) -> list[tuple[int | None, bytes | None]]:
    """Every record of the partition, then its end reached (EOF), with no error on the way."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
    got: list[tuple[int | None, bytes | None]] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                return got
            got.append((message.offset(), message.value()))
    finally:
        consumer.close()
    raise AssertionError(f"confluent-kafka never reached the end of {TOPIC}-0; got {got}")


def _kafka_python_read(bootstrap: str, want: int) -> list[tuple[int, bytes]]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tp = KTopicPartition(TOPIC, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning()
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        assert consumer.end_offsets([tp])[tp] == want
        while len(got) < want and time.monotonic() < deadline:
            for messages in consumer.poll(500).values():
                got.extend((m.offset, m.value) for m in messages)
    finally:
        consumer.close()
    return got


def test_lying_batches_are_refused_and_clients_read_the_partition_cleanly(cluster):
    before = [b"before-%d" % i for i in range(5)]
    after = [b"after-%d" % i for i in range(5)]
    _produce_good(cluster, before)
    leader = _leader_address(cluster, TOPIC, 0)
    for what, (batch, code) in LYING_BATCHES.items():
        error, message = trio.run(_raw_produce, leader, TOPIC, 0, batch)
        assert error == code, (what, error, message)
        assert trio.run(_log_end, leader, TOPIC, 0) == len(before), f"{what}: appended"
    _produce_good(cluster, after)
    want = list(enumerate(before + after))
    assert _confluent_read_to_end(cluster.bootstrap_servers) == want
    assert _kafka_python_read(cluster.bootstrap_servers, len(want)) == want
    for node in cluster.nodes.values():
        assert "Traceback" not in node.log_tail(200), node.log_tail(200)


def test_produce_to_internal_topics_is_refused_and_groups_keep_working(cluster):
    group = "validated-group"
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": group,
            "enable.auto.commit": False,
        }
    )
    try:
        first = [TopicPartition(TOPIC, 0, 1)]
        consumer.commit(offsets=first, asynchronous=False)
        offsets_partition = partition_for_group(group, 3)
        leader = _leader_address(cluster, OFFSETS_TOPIC, offsets_partition)
        end = trio.run(_log_end, leader, OFFSETS_TOPIC, offsets_partition)
        # A record the coordinator cannot decode: a key of garbage, as the client sent.
        forged = build_batch([Record(key=b"\xff\x00garbage", value=b"\x00\x01")])
        for topic, partition in ((OFFSETS_TOPIC, offsets_partition), ("__cluster_metadata", 0)):
            for address in (leader, cluster.bootstrap_servers.split(",")[0]):
                error, _ = trio.run(_raw_produce, address, topic, partition, forged)
                assert error == ErrorCode.invalid_topic_exception, (topic, address, error)
        assert trio.run(_log_end, leader, OFFSETS_TOPIC, offsets_partition) == end
        # The coordinator's own appends still go through.
        consumer.commit(offsets=[TopicPartition(TOPIC, 0, 3)], asynchronous=False)
        (committed,) = consumer.committed([TopicPartition(TOPIC, 0)], timeout=30)
        assert committed.offset == 3
        assert trio.run(_log_end, leader, OFFSETS_TOPIC, offsets_partition) > end
    finally:
        consumer.close()


def test_a_forged_transactional_batch_is_refused_while_no_coordinator_exists(cluster):
    """No stock client can hold a transactional producer id yet, so a transactional batch is
    forged; stored, it would hold the last stable offset (and read_committed readers) back for
    ever."""
    leader = _leader_address(cluster, TOPIC, 0)
    end = trio.run(_log_end, leader, TOPIC, 0)
    forged = build_batch(
        [Record(value=b"never committed")],
        producer_id=4242,
        producer_epoch=0,
        base_sequence=0,
        is_transactional=True,
    )
    error, _ = trio.run(_raw_produce, leader, TOPIC, 0, forged)
    assert error == ErrorCode.invalid_txn_state
    assert trio.run(_log_end, leader, TOPIC, 0) == end


def test_keyless_records_to_a_compacted_topic_fail_alone(cluster):
    """KIP-467 with librdkafka (its test 0011): a batch to a compacted topic whose every tenth
    record has no key is refused, and the delivery reports fail exactly those records with
    INVALID_RECORD and the others with _INVALID_DIFFERENT_RECORD, which a producer may send
    again."""
    topic = "compacted-keys"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    created = admin.create_topics([NewTopic(topic, 1, 3, config={"cleanup.policy": "compact"})])
    created[topic].result(DEADLINE_S)
    reports: dict[int, str] = {}

    def on_delivery(error, message) -> None:
        reports[int(message.value().decode())] = error.name() if error else "ok"

    # One batch: a long linger and one flush.
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 1000})
    for i in range(100):
        key = None if i % 10 == 0 else f"k{i}"
        producer.produce(topic, str(i).encode(), key=key, partition=0, on_delivery=on_delivery)
    assert producer.flush(DEADLINE_S) == 0
    assert {i for i, name in reports.items() if name == "INVALID_RECORD"} == set(range(0, 100, 10))
    others = {name for i, name in reports.items() if i % 10}
    assert others == {"_INVALID_DIFFERENT_RECORD"}, reports
