"""Issue 5 against three real node processes: every stock client (confluent-kafka,
kafka-python, aiokafka, kcat) produces keyed records with headers in each compression codec it
supports (acks=all), reads them back identical and in order per partition; consumer groups of
two members split the partitions and rebalance when one leaves; a confluent-kafka producer
keeps going when its partition leader is killed.

One cluster serves the whole module; the failover test runs last because it kills a node.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pytest
import trio
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from raftlog.client import open_connection
from raftlog.client.protocol import build_request
from raftlog.errors import ErrorCode
from raftlog.records import Record, build_batch
from raftlog.testing.cluster import ProcessCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster

PARTITIONS = 3
RECORDS_PER_CODEC = 40
KEYS = [f"key-{k}".encode() for k in range(7)]
DEADLINE_S = 60.0


@dataclass(frozen=True)
class Sent:
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class Got:
    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("clients")
    with ProcessCluster(root / "c", 3, {"min_insync_replicas": 2}) as running:
        yield running


def _create_topic(cluster, name: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.live_bootstrap_servers()})
    futures = admin.create_topics(
        [NewTopic(name, partitions, 3, config={"min.insync.replicas": "2"})]
    )
    futures[name].result(30)


def _records(client: str, codecs: list[str]) -> list[tuple[str, Sent]]:
    """(codec, record) in production order; the value carries a global sequence number."""
    out = []
    seq = 0
    for codec in codecs:
        for i in range(RECORDS_PER_CODEC):
            headers = (("codec", codec.encode()), ("seq", str(seq).encode()), ("empty", b""))
            out.append((codec, Sent(KEYS[i % len(KEYS)], f"{client}-{seq:06d}".encode(), headers)))
            seq += 1
    return out


def _check_round_trip(sent: list[tuple[str, Sent]], got: list[Got]) -> None:
    """Identical records, each key in one partition, production order kept per partition."""
    want = [s for _, s in sent]
    assert sorted((g.key, g.value, g.headers) for g in got) == sorted(
        (s.key, s.value, s.headers) for s in want
    ), "consumed records differ from produced ones"
    key_partitions: dict[bytes, set[int]] = defaultdict(set)
    by_partition: dict[int, list[Got]] = defaultdict(list)
    for g in got:
        key_partitions[g.key].add(g.partition)
        by_partition[g.partition].append(g)
    assert all(len(p) == 1 for p in key_partitions.values()), key_partitions
    order = {s.value: i for i, s in enumerate(want)}
    for partition, records in by_partition.items():
        records.sort(key=lambda g: g.offset)
        sequence = [order[g.value] for g in records]
        assert sequence == sorted(sequence), f"partition {partition} out of order: {sequence}"


# ------------------------------------------------------------------------------ confluent-kafka
CONFLUENT_CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def _confluent_consume(bootstrap: str, topic: str, want: int, partitions: int) -> list[Got]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    got: list[Got] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len(got) < want and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            got.append(
                Got(
                    message.partition(),
                    message.offset(),
                    message.key(),
                    message.value(),
                    tuple((k, v or b"") for k, v in message.headers() or []),
                )
            )
    finally:
        consumer.close()
    return got


def test_confluent_kafka_round_trip_every_codec(cluster):
    topic = "confluent-codecs"
    _create_topic(cluster, topic)
    sent = _records("confluent", CONFLUENT_CODECS)
    errors = []
    for codec in CONFLUENT_CODECS:
        producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap_servers,
                "acks": "all",
                "enable.idempotence": True,
                "compression.type": codec,
                "linger.ms": 5,
            }
        )
        for c, record in sent:
            if c == codec:
                producer.produce(
                    topic,
                    key=record.key,
                    value=record.value,
                    headers=list(record.headers),
                    on_delivery=lambda err, msg: err and errors.append(err),
                )
        assert producer.flush(30) == 0
    assert not errors, errors
    _check_round_trip(sent, _confluent_consume(cluster.bootstrap_servers, topic, len(sent), 3))


# ------------------------------------------------------------------------------ kafka-python
# Without python-snappy installed kafka-python cannot use snappy; it has gzip, lz4 and zstd.
KAFKA_PYTHON_CODECS = [None, "gzip", "lz4", "zstd"]


def test_kafka_python_round_trip_every_codec(cluster):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTopicPartition

    topic = "kafka-python-codecs"
    _create_topic(cluster, topic)
    names = [c or "none" for c in KAFKA_PYTHON_CODECS]
    sent = _records("kafka-python", names)
    for codec in KAFKA_PYTHON_CODECS:
        producer = KafkaProducer(
            bootstrap_servers=cluster.bootstrap_servers,
            acks="all",
            compression_type=codec,
            linger_ms=5,
        )
        futures = [
            producer.send(topic, key=r.key, value=r.value, headers=list(r.headers))
            for c, r in sent
            if c == (codec or "none")
        ]
        producer.flush(30)
        for future in futures:
            future.get(30)
        producer.close()
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap_servers, enable_auto_commit=False)
    consumer.assign([KTopicPartition(topic, p) for p in range(PARTITIONS)])
    consumer.seek_to_beginning()
    got: list[Got] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len(got) < len(sent) and time.monotonic() < deadline:
            for tp, messages in consumer.poll(500).items():
                got.extend(
                    Got(tp.partition, m.offset, m.key, m.value, tuple(m.headers)) for m in messages
                )
    finally:
        consumer.close()
    _check_round_trip(sent, got)


# ------------------------------------------------------------------------------ aiokafka
AIOKAFKA_CODECS = [None, "gzip", "snappy", "lz4", "zstd"]


async def _aiokafka_round_trip(bootstrap: str, topic: str, sent: list[tuple[str, Sent]]) -> list:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as ATopicPartition

    for codec in AIOKAFKA_CODECS:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", compression_type=codec, linger_ms=5
        )
        await producer.start()
        try:
            futures = [
                await producer.send(topic, key=r.key, value=r.value, headers=list(r.headers))
                for c, r in sent
                if c == (codec or "none")
            ]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    got: list[Got] = []
    try:
        consumer.assign([ATopicPartition(topic, p) for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        async with asyncio.timeout(DEADLINE_S):
            while len(got) < len(sent):
                batches = await consumer.getmany(timeout_ms=500)
                for tp, messages in batches.items():
                    got.extend(
                        Got(tp.partition, m.offset, m.key, m.value, tuple(m.headers))
                        for m in messages
                    )
    finally:
        await consumer.stop()
    return got


def test_aiokafka_round_trip_every_codec(cluster):
    topic = "aiokafka-codecs"
    _create_topic(cluster, topic)
    sent = _records("aiokafka", [c or "none" for c in AIOKAFKA_CODECS])
    got = asyncio.run(_aiokafka_round_trip(cluster.bootstrap_servers, topic, sent))
    _check_round_trip(sent, got)


# ------------------------------------------------------------------------------ kcat
KCAT_CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
# Separators no record contains: kcat splits input on them and prints with them.
FIELD_SEP = "\x1f"


def test_kcat_round_trip_every_codec(cluster):
    topic = "kcat-codecs"
    _create_topic(cluster, topic)
    sent = _records("kcat", KCAT_CODECS)
    for codec in KCAT_CODECS:
        # kcat's -H puts the same headers on every record of a run, so each record carries
        # only its run's codec header (no per-record "seq"); the comparison uses exactly that.
        lines = "".join(
            f"{r.key.decode()}{FIELD_SEP}{r.value.decode()}\n" for c, r in sent if c == codec
        )
        subprocess.run(
            [
                "kcat",
                "-P",
                "-b",
                cluster.bootstrap_servers,
                "-t",
                topic,
                "-K",
                FIELD_SEP,
                "-z",
                codec,
                "-H",
                f"codec={codec}",
                "-X",
                "acks=all",
                "-X",
                "enable.idempotence=true",
            ],
            input=lines.encode(),
            check=True,
            timeout=DEADLINE_S,
        )
    out = subprocess.run(
        [
            "kcat",
            "-C",
            "-b",
            cluster.bootstrap_servers,
            "-t",
            topic,
            "-o",
            "beginning",
            "-e",
            "-c",
            str(len(sent)),
            "-f",
            f"%p{FIELD_SEP}%o{FIELD_SEP}%k{FIELD_SEP}%s{FIELD_SEP}%h\n",
        ],
        capture_output=True,
        check=True,
        timeout=DEADLINE_S,
    ).stdout.decode()
    got = []
    for line in out.splitlines():
        partition, offset, key, value, header = line.split(FIELD_SEP)
        name, _, text = header.partition("=")
        got.append(
            Got(int(partition), int(offset), key.encode(), value.encode(), ((name, text.encode()),))
        )
    expected = [(c, Sent(r.key, r.value, (("codec", c.encode()),))) for c, r in sent]
    _check_round_trip(expected, got)


# ------------------------------------------------------------------------------ groups
def _split_and_rebalance(members: list, assignment, poll, close, what: str) -> None:
    """Two members share the partitions disjointly; after one leaves the other has all."""
    everything = set(range(PARTITIONS))
    deadline = time.monotonic() + DEADLINE_S

    def split() -> bool:
        a, b = (assignment(m) for m in members)
        return bool(a) and bool(b) and not (a & b) and (a | b) == everything

    while not split():
        assert time.monotonic() < deadline, f"{what}: members never split the partitions"
        for m in members:
            poll(m)
    close(members[0])
    while assignment(members[1]) != everything:
        assert time.monotonic() < deadline, f"{what}: no rebalance after a member left"
        poll(members[1])
    close(members[1])


def test_confluent_kafka_group_splits_and_rebalances(cluster):
    topic = "group-confluent"
    _create_topic(cluster, topic)
    members = [
        Consumer(
            {
                "bootstrap.servers": cluster.bootstrap_servers,
                "group.id": "g-confluent",
                "session.timeout.ms": 6000,
                "auto.offset.reset": "earliest",
            }
        )
        for _ in range(2)
    ]
    for m in members:
        m.subscribe([topic])
    _split_and_rebalance(
        members,
        lambda m: {tp.partition for tp in m.assignment()},
        lambda m: m.poll(0.2),
        lambda m: m.close(),
        "confluent-kafka",
    )


async def test_kafka_python_group_splits_and_rebalances(cluster):
    """kafka-python joins the group inside poll(), which blocks: polling two members in turn
    from one thread can leave one waiting in JoinGroup for the other. Each member is polled
    from its own worker thread instead, as two applications would be.

    Each member loads the topic's metadata before it first polls. Otherwise a leader can
    assign before its metadata names the topic (assigning nothing), rejoin when the metadata
    arrives, and - if that rejoin outlasts the poll() it began in - kafka-python 3.0.12 drops
    the finished join (its assignment snapshot now matches, so nothing awaits the join task),
    stops heartbeating and is expelled for good."""
    from kafka import KafkaConsumer

    topic = "group-kafka-python"
    await trio.to_thread.run_sync(_create_topic, cluster, topic)

    def make() -> KafkaConsumer:
        return KafkaConsumer(
            topic,
            bootstrap_servers=cluster.bootstrap_servers,
            group_id="g-kafka-python",
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
            max_poll_interval_ms=10_000,
        )

    members = [await trio.to_thread.run_sync(make) for _ in range(2)]
    everything = set(range(PARTITIONS))
    for member in members:
        assert await trio.to_thread.run_sync(member.partitions_for_topic, topic) == everything
    assigned: list[set[int]] = [set(), set()]
    stops = [trio.Event(), trio.Event()]

    def poll(i: int) -> None:
        members[i].poll(200)
        assigned[i] = {tp.partition for tp in members[i].assignment()}

    polled = trio.Event()  # replaced by each waiter; set after every poll

    async def run_member(i: int) -> None:
        while not stops[i].is_set():
            await trio.to_thread.run_sync(poll, i)
            polled.set()
        await trio.to_thread.run_sync(members[i].close)

    def split() -> bool:
        a, b = assigned
        return bool(a) and bool(b) and not (a & b) and (a | b) == everything

    async def next_poll() -> None:
        nonlocal polled
        polled = trio.Event()
        await polled.wait()

    async with trio.open_nursery() as nursery:
        for i in range(2):
            nursery.start_soon(run_member, i)
        await wait_until(
            "kafka-python members to split the partitions", split, DEADLINE_S, wake=next_poll
        )
        stops[0].set()
        await wait_until(
            "a rebalance after a member left",
            lambda: assigned[1] == everything,
            DEADLINE_S,
            wake=next_poll,
        )
        stops[1].set()


async def _aiokafka_group(bootstrap: str, topic: str) -> None:
    from aiokafka import AIOKafkaConsumer

    members = [
        AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id="g-aiokafka",
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )
        for _ in range(2)
    ]
    for m in members:
        await m.start()
    everything = set(range(PARTITIONS))

    def parts(m) -> set[int]:
        return {tp.partition for tp in m.assignment()}

    async with asyncio.timeout(DEADLINE_S):
        # aiokafka rebalances in its own coordinator task; getmany just yields to it.
        # A member keeps its old assignment until it rejoins, so wait for a settled split.
        def split() -> bool:
            a, b = parts(members[0]), parts(members[1])
            return bool(a) and bool(b) and not (a & b) and (a | b) == everything

        while not split():
            await asyncio.gather(*(m.getmany(timeout_ms=200) for m in members))
        await members[0].stop()
        while parts(members[1]) != everything:
            await members[1].getmany(timeout_ms=200)
    await members[1].stop()


def test_aiokafka_group_splits_and_rebalances(cluster):
    topic = "group-aiokafka"
    _create_topic(cluster, topic)
    asyncio.run(_aiokafka_group(cluster.bootstrap_servers, topic))


# ------------------------------------------------------------------------------ failover
def _leader_of(cluster, topic: str, partition: int) -> int:
    partitions = cluster.describe()["topics"][topic]
    return next(p["leader_id"] for p in partitions if p["partition"] == partition)


def test_follower_answers_not_leader_with_the_kip_951_leader_hint(cluster):
    """What lets a client re-route without a metadata refresh: a produce or fetch sent to a
    replica that is not the leader names the leader (and, for produce v10, its endpoint)."""
    topic = "leader-hint"
    _create_topic(cluster, topic, partitions=1)
    cluster.wait_for(lambda: _leader_of(cluster, topic, 0) > 0, "a leader")
    leader = _leader_of(cluster, topic, 0)
    follower = next(n for n in cluster.nodes.values() if n.node_id != leader and n.running)
    host, port = follower.client_address.rsplit(":", 1)
    batch = build_batch([Record(key=b"k", value=b"v")])

    async def ask() -> tuple[Any, Any]:
        async with open_connection(host, int(port)) as connection:
            produce = await connection.request(
                build_request(
                    "produce",
                    10,
                    {
                        "transactional_id": None,
                        "acks": -1,
                        "timeout": 10_000,
                        "topic_data": [
                            {"name": topic, "partition_data": [{"index": 0, "records": batch}]}
                        ],
                    },
                )
            )
            fetch = await connection.request(
                build_request(
                    "fetch",
                    12,
                    {
                        "replica_id": -1,
                        "max_wait": 0,
                        "min_bytes": 0,
                        "max_bytes": 1 << 20,
                        "isolation_level": 0,
                        "session_id": 0,
                        "session_epoch": -1,
                        "rack_id": "",
                        "topics": [
                            {
                                "topic": topic,
                                "partitions": [
                                    {
                                        "partition": 0,
                                        "fetch_offset": 0,
                                        "partition_max_bytes": 1 << 20,
                                        "current_leader_epoch": -1,
                                        "log_start_offset": -1,
                                        "last_fetched_epoch": -1,
                                    }
                                ],
                            }
                        ],
                    },
                )
            )
        return produce, fetch

    produce, fetch = trio.run(ask)
    (answer,) = produce.responses[0].partition_responses
    assert int(answer.error_code) == ErrorCode.not_leader_or_follower
    assert int(answer.current_leader.leader_id) == leader
    endpoints = {int(n.node_id): f"{n.host}:{n.port}" for n in produce.node_endpoints}
    assert endpoints == {leader: cluster.nodes[leader].client_address}
    (answer,) = fetch.responses[0].partitions
    assert int(answer.error_code) == ErrorCode.not_leader_or_follower
    assert int(answer.current_leader.leader_id) == leader


def test_producer_reroutes_after_partition_leader_is_killed(cluster):
    """Runs last in the module: it kills a node and leaves it dead."""
    topic = "failover"
    _create_topic(cluster, topic, partitions=1)
    delivered: list[bytes] = []
    failed: list[str] = []

    def on_delivery(err, msg) -> None:
        if err:
            failed.append(str(err))
        else:
            delivered.append(msg.value())

    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 2,
            "message.timeout.ms": 30_000,
        }
    )
    sequence = 0

    def produce_until(count: int, deadline_s: float) -> float:
        nonlocal sequence
        deadline = time.monotonic() + deadline_s
        while len(delivered) < count:
            assert time.monotonic() < deadline, (
                f"only {len(delivered)}/{count} delivered; failures {failed[:5]}"
            )
            if sequence - len(delivered) - len(failed) < 50:
                producer.produce(topic, value=f"m{sequence:06d}".encode(), on_delivery=on_delivery)
                sequence += 1
            producer.poll(0.005)
        return time.monotonic()

    produce_until(200, 30)
    leader = _leader_of(cluster, topic, 0)
    killed_at = time.monotonic()
    cluster.kill(leader, signal.SIGKILL)
    before = len(delivered)
    resumed_at = produce_until(before + 1, 30)
    produce_until(before + 200, 30)
    assert producer.flush(30) == 0
    assert not failed, failed
    new_leader = _leader_of(cluster, topic, 0)
    assert new_leader not in (leader, -1)
    print(f"producer resumed {resumed_at - killed_at:.2f}s after the leader was killed")
    # Fencing takes broker_session_timeout_ms (2 s in the harness); the producer must be
    # back well within a few of those, not after a metadata refresh interval (5 min).
    assert resumed_at - killed_at < 15, f"producer stalled {resumed_at - killed_at:.1f}s"
    expected = [f"m{i:06d}".encode() for i in range(sequence)]
    assert delivered == expected, "the idempotent producer must deliver every record in order"
    got = _confluent_consume(cluster.live_bootstrap_servers(), topic, len(expected), 1)
    values = [g.value for g in sorted(got, key=lambda g: g.offset)]
    assert values == expected, "acknowledged records lost, duplicated or reordered"
