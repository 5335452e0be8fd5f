"""Transactions (KIP-98) with stock clients against three real node processes.

- confluent-kafka consume-transform-produce: a read_committed consumer in a group, a
  transactional producer sending the group's positions with its outputs; aborted transactions
  leave neither outputs nor offsets behind.
- kafka-python's and aiokafka's transactional producers commit and abort; read_committed
  consumers of all three clients see exactly the committed records, in order.
- zombie fencing, the coordinator aborting a transaction past its timeout, a kill -9 of the
  coordinator while it commits or aborts, and a kill -9 of a partition leader between the
  first produce of a transaction to a partition and its marker: every transaction ends
  whole (all of its records, across partitions, visible to read_committed, or none).

The coordinator of a transactional id is found as clients find it (FindCoordinator key type 1,
through raftlog's TransactionAdmin) and checked against the metadata (the leader of the id's
`__transaction_state` partition); DescribeTransactions shows the coordinator's own view.

Read_committed readers stop on a non-transactional END record written to each partition after
the transactions under test: a reader sees it only once the last stable offset has passed
every transaction before it, so reaching it proves those transactions ended.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from raftlog.client.admin_txn import TransactionAdmin
from raftlog.client.cluster import open_cluster
from raftlog.testing.cluster import ProcessCluster
from raftlog.txn.settings import partition_for_transactional_id

pytestmark = pytest.mark.cluster

END = b"END"
CLIENT_TIMEOUT_S = 30.0
READ_DEADLINE_S = 60.0
TXN_STATE_TOPIC = "__transaction_state"
# How a fenced producer is told (librdkafka turns both broker codes into its own _FENCED).
FENCED_CODES = {
    KafkaError._FENCED,
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH,
}


# ---------------------------------------------------------------- one cluster for the module
@pytest.fixture(scope="module")
def txn_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    """One three-node cluster for every test here (each uses its own topics and ids)."""
    with ProcessCluster(tmp_path_factory.mktemp("txn") / "cluster", 3) as running:
        yield running


@pytest.fixture
def cluster(txn_cluster: ProcessCluster) -> ProcessCluster:
    """The module's cluster with every node up: a test that failed mid-kill leaves none down."""
    for node_id, node in txn_cluster.nodes.items():
        if not node.running:
            txn_cluster.start(node_id)
    txn_cluster.wait_ready()
    return txn_cluster


# ---------------------------------------------------------------- helpers
def _logs(cluster: ProcessCluster, lines: int = 30) -> str:
    return "\n".join(f"--- node {n.node_id}\n{n.log_tail(lines)}" for n in cluster.nodes.values())


def _create_topic(cluster: ProcessCluster, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    topic = NewTopic(name, partitions, 3, config={"min.insync.replicas": "2"})
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while True:
        try:
            admin.create_topics([topic])[name].result(CLIENT_TIMEOUT_S)
            break
        except KafkaException as exc:
            # A node killed by the previous test may still be fenced (not yet caught up):
            # three replicas need it back. A retry pace, not a wait for state: the loop asks.
            if exc.args[0].code() != KafkaError.INVALID_REPLICATION_FACTOR:
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)

    def led() -> bool:
        found = cluster.describe().get("topics", {}).get(name, [])
        return len(found) == partitions and all(p["leader_id"] > 0 for p in found)

    cluster.wait_for(led, f"leaders for every partition of {name}")


def _leaders(cluster: ProcessCluster, topic: str) -> dict[int, int]:
    return {p["partition"]: p["leader_id"] for p in cluster.describe()["topics"][topic]}


def _txn_admin(cluster: ProcessCluster, operation: Callable[[TransactionAdmin], Any]) -> Any:
    """Run one raftlog TransactionAdmin call (FindCoordinator, DescribeTransactions)."""

    async def run() -> Any:
        with trio.fail_after(CLIENT_TIMEOUT_S):
            async with open_cluster(cluster.live_bootstrap_servers()) as client:
                return await operation(TransactionAdmin(client))

    return trio.run(run)


def _coordinator(cluster: ProcessCluster, transactional_id: str) -> int:
    """The transactional id's coordinator, as FindCoordinator (key type 1) names it, once the
    metadata agrees: the leader of the id's __transaction_state partition."""

    def agreed() -> int:
        node_id, _address = _txn_admin(
            cluster, lambda admin: admin.find_coordinator(transactional_id)
        )
        partitions = cluster.describe()["topics"][TXN_STATE_TOPIC]
        index = partition_for_transactional_id(transactional_id, len(partitions))
        leader = next(p["leader_id"] for p in partitions if p["partition"] == index)
        return int(node_id) if node_id == leader else 0

    return int(cluster.wait_for(agreed, f"the coordinator of {transactional_id}"))


def _txn_state(cluster: ProcessCluster, transactional_id: str) -> str:
    """The id's transaction state at its coordinator (DescribeTransactions)."""
    found = _txn_admin(cluster, lambda admin: admin.describe_transactions([transactional_id]))
    return str(found[transactional_id].state)


def _txn_producer(cluster: ProcessCluster, transactional_id: str, **extra: Any) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 20_000,
            "linger.ms": 5,
            **extra,
        }
    )
    producer.init_transactions(CLIENT_TIMEOUT_S)
    return producer


def _write_end(cluster: ProcessCluster, topic: str, partitions: int) -> None:
    """One plain END record per partition, after everything the test wrote."""
    producer = Producer(
        {"bootstrap.servers": cluster.live_bootstrap_servers(), "acks": "all", "linger.ms": 0}
    )
    for partition in range(partitions):
        producer.produce(topic, value=END, partition=partition)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0, "END records not acknowledged"


def _read_committed_confluent(
    cluster: ProcessCluster, topic: str, partitions: int
) -> dict[int, list[bytes]]:
    """Every value a read_committed confluent-kafka consumer sees before END, per partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.live_bootstrap_servers(),
            "group.id": f"rc-{time.monotonic_ns()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    got: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    ended: set[int] = set()
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + READ_DEADLINE_S
        while len(ended) < partitions and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            partition, value = int(message.partition() or 0), bytes(message.value() or b"")
            if value == END:
                ended.add(partition)
            elif partition not in ended:
                got[partition].append(value)
    finally:
        consumer.close()
    assert len(ended) == partitions, (
        f"read_committed reached END on {sorted(ended)} of {partitions} partitions of {topic} "
        f"(a transaction never ended, so the LSO stays below END)\n{_logs(cluster)}"
    )
    return got


def _read_committed_kafka_python(
    cluster: ProcessCluster, topic: str, partitions: int
) -> dict[int, list[bytes]]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=cluster.live_bootstrap_servers(),
        isolation_level="read_committed",
        enable_auto_commit=False,
    )
    got: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    ended: set[int] = set()
    try:
        consumer.assign([KTopicPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + READ_DEADLINE_S
        while len(ended) < partitions and time.monotonic() < deadline:
            for tp, messages in consumer.poll(500).items():
                for message in messages:
                    if message.value == END:
                        ended.add(tp.partition)
                    elif tp.partition not in ended:
                        got[tp.partition].append(message.value)
    finally:
        consumer.close()
    assert len(ended) == partitions, f"kafka-python reached END on {sorted(ended)}"
    return got


def _read_committed_aiokafka(
    cluster: ProcessCluster, topic: str, partitions: int
) -> dict[int, list[bytes]]:
    async def read() -> dict[int, list[bytes]]:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.structs import TopicPartition as ATopicPartition

        consumer = AIOKafkaConsumer(
            bootstrap_servers=cluster.live_bootstrap_servers(),
            isolation_level="read_committed",
            enable_auto_commit=False,
        )
        await consumer.start()
        got: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        ended: set[int] = set()
        try:
            consumer.assign([ATopicPartition(topic, p) for p in range(partitions)])
            await consumer.seek_to_beginning()
            deadline = time.monotonic() + READ_DEADLINE_S
            while len(ended) < partitions and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                for tp, messages in batches.items():
                    for message in messages:
                        if message.value == END:
                            ended.add(tp.partition)
                        elif tp.partition not in ended:
                            got[tp.partition].append(message.value)
        finally:
            await consumer.stop()
        assert len(ended) == partitions, f"aiokafka reached END on {sorted(ended)}"
        return got

    return asyncio.run(read())


def _end_transaction(producer: Producer, commit: bool, deadline_s: float = 60.0) -> str:
    """Commit (or abort) through failures the way an application does: retry a retriable
    error, abort after an abortable one; "committed", "aborted" or "fatal: ..."."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            if commit:
                producer.commit_transaction(CLIENT_TIMEOUT_S)
                return "committed"
            producer.abort_transaction(CLIENT_TIMEOUT_S)
            return "aborted"
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.fatal() or time.monotonic() > deadline:
                return f"fatal: {error}"
            if error.txn_requires_abort():
                commit = False
            elif not error.retriable():
                return f"fatal: {error}"


def _whole(outcome: str, sent: dict[int, list[bytes]], seen: dict[int, list[bytes]]) -> bool:
    """Check one transaction ended whole; True when its records are visible."""
    sent_values = {v for values in sent.values() for v in values}
    seen_values = {v for values in seen.values() for v in values}
    visible = sent_values & seen_values
    assert visible in (set(), sent_values), (
        f"transaction ({outcome}) partly visible: {len(visible)} of {len(sent_values)} records"
    )
    if outcome == "committed":
        assert visible == sent_values, "an acknowledged commit lost its records"
    if outcome == "aborted":
        assert not visible, "an acknowledged abort left records visible"
    return bool(visible)


# ---------------------------------------------------------------- consume-transform-produce
INPUT, OUTPUT, IO_PARTITIONS = "ctp-in", "ctp-out", 3
INPUT_COMMITTED = 60
GROUP = "transformer"


def _write_input(cluster: ProcessCluster) -> list[bytes]:
    """Two committed input transactions around an aborted one; the committed values."""
    producer = _txn_producer(cluster, "ctp-input")
    committed: list[bytes] = []
    for name, commit in (("a", True), ("x", False), ("b", True)):
        producer.begin_transaction()
        for i in range(INPUT_COMMITTED // 2):
            value = f"in-{name}-{i:03d}".encode()
            producer.produce(INPUT, value=value, partition=i % IO_PARTITIONS)
            if commit:
                committed.append(value)
        assert _end_transaction(producer, commit) == ("committed" if commit else "aborted")
    return committed


def _group_offsets(cluster: ProcessCluster) -> dict[int, int]:
    """The group's committed offsets (OffsetFetch, stable: waits out pending ones)."""
    reader = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": GROUP,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        asked = [TopicPartition(INPUT, p) for p in range(IO_PARTITIONS)]
        found = reader.committed(asked, timeout=CLIENT_TIMEOUT_S)
    finally:
        reader.close()
    return {tp.partition: tp.offset for tp in found if tp.offset >= 0}


def test_consume_transform_produce_commits_outputs_with_offsets(cluster: ProcessCluster) -> None:
    _create_topic(cluster, INPUT, IO_PARTITIONS)
    _create_topic(cluster, OUTPUT, IO_PARTITIONS)
    inputs = _write_input(cluster)
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": GROUP,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10_000,
        }
    )
    producer = _txn_producer(cluster, "transformer-1")
    consumer.subscribe([INPUT])
    expected: dict[int, list[bytes]] = {p: [] for p in range(IO_PARTITIONS)}
    aborted_outputs: set[bytes] = set()
    transformed: list[bytes] = []
    committed_positions: dict[int, int] = {}
    txn = 0
    deadline = time.monotonic() + READ_DEADLINE_S
    try:
        while len(transformed) < len(inputs):
            assert time.monotonic() < deadline, f"transformed {len(transformed)} of {len(inputs)}"
            records = [
                (int(m.partition() or 0), bytes(m.value() or b""))
                for m in consumer.consume(8, timeout=1.0)
                if m.error() is None
            ]
            if not records:
                continue
            commit = txn % 3 != 1  # every third transaction aborts
            producer.begin_transaction()
            outputs: dict[int, list[bytes]] = {p: [] for p in range(IO_PARTITIONS)}
            for partition, record in records:
                value = f"t{txn}:{record.decode()}".encode()
                producer.produce(OUTPUT, value=value, partition=partition)
                outputs[partition].append(value)
            positions = [
                tp
                for tp in consumer.position(consumer.assignment())
                if tp.offset >= 0 and tp.topic == INPUT
            ]
            producer.send_offsets_to_transaction(
                positions, consumer.consumer_group_metadata(), CLIENT_TIMEOUT_S
            )
            assert _end_transaction(producer, commit) == ("committed" if commit else "aborted")
            if commit:
                committed_positions |= {tp.partition: tp.offset for tp in positions}
                transformed += [record for _partition, record in records]
                for partition, values in outputs.items():
                    expected[partition] += values
            else:
                aborted_outputs |= {v for values in outputs.values() for v in values}
                # Start again from the last committed position, as after a crash.
                for partition in {partition for partition, _record in records}:
                    rewind = committed_positions.get(partition, 0)
                    consumer.seek(TopicPartition(INPUT, partition, rewind))
            # The group's offsets are those of the last committed transaction only.
            assert _group_offsets(cluster) == committed_positions, f"after transaction {txn}"
            txn += 1
    finally:
        consumer.close()
    assert aborted_outputs, "no transaction was aborted"
    assert sorted(transformed) == sorted(inputs), "each committed input transformed exactly once"
    _write_end(cluster, OUTPUT, IO_PARTITIONS)
    seen = _read_committed_confluent(cluster, OUTPUT, IO_PARTITIONS)
    assert seen == expected, "read_committed sees the committed outputs, in order, and no more"
    final = _group_offsets(cluster)
    assert final == committed_positions


# ---------------------------------------------------------------- other clients' producers
MIXED, MIXED_PARTITIONS, PER_TXN = "txn-mixed", 2, 10


def _kafka_python_transactions(cluster: ProcessCluster) -> list[tuple[bool, list[bytes]]]:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=cluster.bootstrap_servers, transactional_id="kp-txn", linger_ms=5
    )
    producer.init_transactions()
    done: list[tuple[bool, list[bytes]]] = []
    for n, commit in enumerate((True, False, True)):
        producer.begin_transaction()
        values = [f"kp-{n}-{i}".encode() for i in range(PER_TXN)]
        for i, value in enumerate(values):
            producer.send(MIXED, value=value, partition=i % MIXED_PARTITIONS)
        producer.flush(CLIENT_TIMEOUT_S)  # the records are in the log before an abort
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
        done.append((commit, values))
    producer.close()
    return done


def _aiokafka_transactions(cluster: ProcessCluster) -> list[tuple[bool, list[bytes]]]:
    async def run() -> list[tuple[bool, list[bytes]]]:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(
            bootstrap_servers=cluster.bootstrap_servers,
            transactional_id="aio-txn",
            enable_idempotence=True,
            linger_ms=5,
        )
        await producer.start()
        done: list[tuple[bool, list[bytes]]] = []
        try:
            for n, commit in enumerate((True, False, True)):
                await producer.begin_transaction()
                values = [f"aio-{n}-{i}".encode() for i in range(PER_TXN)]
                for i, value in enumerate(values):
                    await producer.send_and_wait(MIXED, value=value, partition=i % 2)
                if commit:
                    await producer.commit_transaction()
                else:
                    await producer.abort_transaction()
                done.append((commit, values))
        finally:
            await producer.stop()
        return done

    return asyncio.run(run())


READERS: dict[str, Callable[[ProcessCluster, str, int], dict[int, list[bytes]]]] = {
    "confluent-kafka": _read_committed_confluent,
    "kafka-python": _read_committed_kafka_python,
    "aiokafka": _read_committed_aiokafka,
}


def test_kafka_python_and_aiokafka_transactions_read_committed_by_every_client(
    cluster: ProcessCluster,
) -> None:
    _create_topic(cluster, MIXED, MIXED_PARTITIONS)
    transactions = _kafka_python_transactions(cluster) + _aiokafka_transactions(cluster)
    _write_end(cluster, MIXED, MIXED_PARTITIONS)
    # One producer after the other, each record to partition i % 2: the committed order.
    expected: dict[int, list[bytes]] = {p: [] for p in range(MIXED_PARTITIONS)}
    aborted: set[bytes] = set()
    for commit, values in transactions:
        for i, value in enumerate(values):
            if commit:
                expected[i % MIXED_PARTITIONS].append(value)
            else:
                aborted.add(value)
    assert aborted
    for name, read in READERS.items():
        seen = read(cluster, MIXED, MIXED_PARTITIONS)
        assert seen == expected, f"{name}'s read_committed consumer"


# ---------------------------------------------------------------- zombie fencing
def test_zombie_producer_is_fenced_and_its_records_never_visible(cluster: ProcessCluster) -> None:
    topic, partitions = "zombie", 2
    _create_topic(cluster, topic, partitions)
    zombie = _txn_producer(cluster, "shared-id")
    zombie.begin_transaction()
    zombie_values = [f"zombie-{i}".encode() for i in range(10)]
    for i, value in enumerate(zombie_values):
        zombie.produce(topic, value=value, partition=i % partitions)
    assert zombie.flush(CLIENT_TIMEOUT_S) == 0  # in the log, inside an open transaction
    # A new instance with the same transactional.id: a higher epoch, the open transaction
    # aborted by the coordinator.
    successor = _txn_producer(cluster, "shared-id")
    # The zombie keeps going: the partition leader refuses its produce (old epoch) and the
    # commit fails fatally.
    late = [f"zombie-late-{i}".encode() for i in range(4)]
    late_reports: list[KafkaError | None] = []
    for i, value in enumerate(late):
        zombie.produce(
            topic,
            value=value,
            partition=i % partitions,
            on_delivery=lambda error, _message: late_reports.append(error),
        )
    with pytest.raises(KafkaException) as refused:
        zombie.commit_transaction(CLIENT_TIMEOUT_S)
    error: KafkaError = refused.value.args[0]
    assert error.code() in FENCED_CODES and error.fatal(), f"zombie commit answered {error}"
    zombie.flush(CLIENT_TIMEOUT_S)  # serves the late records' delivery reports
    assert len(late_reports) == len(late)
    assert all(e is not None and e.code() in FENCED_CODES for e in late_reports), late_reports
    # The successor commits its own transaction.
    successor.begin_transaction()
    successor_values = [f"successor-{i}".encode() for i in range(10)]
    for i, value in enumerate(successor_values):
        successor.produce(topic, value=value, partition=i % partitions)
    assert _end_transaction(successor, True) == "committed"
    _write_end(cluster, topic, partitions)
    seen = _read_committed_confluent(cluster, topic, partitions)
    visible = {v for values in seen.values() for v in values}
    assert visible == set(successor_values), "only the successor's records are visible"
    assert not visible & set(zombie_values + late)


def test_pipelined_batches_of_a_transaction_keep_their_order(cluster: ProcessCluster) -> None:
    """One batch per record with several requests in flight on one connection (librdkafka's
    0137 does this): the first batch of each transaction waits for the coordinator's
    verification, and the batches behind it on the connection must not pass it, or the
    partition refuses them OUT_OF_ORDER_SEQUENCE_NUMBER, which a transactional producer
    takes as fatal."""
    topic = "pipelined"
    _create_topic(cluster, topic, 1)
    producer = _txn_producer(
        cluster,
        "pipelined-id",
        **{"batch.num.messages": 1, "linger.ms": 0, "max.in.flight.requests.per.connection": 5},
    )
    values = []
    for txn in range(5):
        producer.begin_transaction()
        for i in range(8):
            values.append(f"t{txn}-{i}".encode())
            producer.produce(topic, value=values[-1], partition=0)
        assert _end_transaction(producer, True) == "committed"
    _write_end(cluster, topic, 1)
    seen = _read_committed_confluent(cluster, topic, 1)
    assert seen[0] == values


# ---------------------------------------------------------------- transaction timeout
TIMEOUT_MS = 3000


def test_coordinator_aborts_a_transaction_past_its_timeout(cluster: ProcessCluster) -> None:
    topic = "stuck"
    _create_topic(cluster, topic, 1)
    stuck = _txn_producer(cluster, "stuck-id", **{"transaction.timeout.ms": TIMEOUT_MS})
    stuck.begin_transaction()
    stuck_values = [f"stuck-{i}".encode() for i in range(10)]
    for value in stuck_values:
        stuck.produce(topic, value=value, partition=0)
    assert stuck.flush(CLIENT_TIMEOUT_S) == 0
    begun = time.monotonic()
    # Committed records after the open transaction: read_committed readers see them only
    # once the LSO moves past the open transaction, which only its abort can do.
    after = _txn_producer(cluster, "after-id")
    after.begin_transaction()
    after_values = [f"after-{i}".encode() for i in range(10)]
    for value in after_values:
        after.produce(topic, value=value, partition=0)
    assert _end_transaction(after, True) == "committed"
    _write_end(cluster, topic, 1)
    # The stuck producer never commits: only the coordinator's timeout ends its transaction.
    seen = _read_committed_confluent(cluster, topic, 1)
    waited_s = time.monotonic() - begun
    assert seen == {0: after_values}, "the timed-out transaction's records are never visible"
    assert waited_s >= TIMEOUT_MS / 1000 * 0.9, f"ended after {waited_s:.1f} s, before its timeout"
    assert _txn_state(cluster, "stuck-id") == "CompleteAbort", "the coordinator aborted it"
    # The coordinator bumped the epoch when it aborted: the stuck producer cannot commit.
    with pytest.raises(KafkaException):
        stuck.commit_transaction(CLIENT_TIMEOUT_S)


# ---------------------------------------------------------------- kill -9 during EndTxn
KILL_TOPIC, KILL_PARTITIONS, KILL_PER_PARTITION = "txn-kills", 3, 10


def _produce_txn(producer: Producer, topic: str, tag: str) -> dict[int, list[bytes]]:
    sent: dict[int, list[bytes]] = {p: [] for p in range(KILL_PARTITIONS)}
    for i in range(KILL_PER_PARTITION * KILL_PARTITIONS):
        value = f"{tag}-{i:03d}".encode()
        producer.produce(topic, value=value, partition=i % KILL_PARTITIONS)
        sent[i % KILL_PARTITIONS].append(value)
    return sent


def _kill_coordinator_during_end(
    cluster: ProcessCluster, producer: Producer, txn_id: str, commit: bool, at_call: bool
) -> str:
    """End the open transaction and kill -9 its coordinator: right after EndTxn is called
    (from another thread), or as soon as EndTxn is answered (the decision is durable, the
    markers may still be on their way). Restart the node; the outcome the producer saw."""
    coordinator = _coordinator(cluster, txn_id)
    outcome: list[str] = []
    called = threading.Event()

    def end() -> None:
        called.set()
        outcome.append(_end_transaction(producer, commit))

    if at_call:
        ender = threading.Thread(target=end, daemon=True)
        ender.start()
        assert called.wait(CLIENT_TIMEOUT_S)
        cluster.kill(coordinator, signal.SIGKILL)
        ender.join(90)
    else:
        end()
        cluster.kill(coordinator, signal.SIGKILL)
    assert outcome, f"EndTxn never answered\n{_logs(cluster)}"
    cluster.start(coordinator)
    cluster.wait_ready()
    assert outcome[0] in ("committed", "aborted"), f"{outcome[0]}\n{_logs(cluster)}"
    return outcome[0]


@pytest.mark.parametrize("commit", [True, False], ids=["mid-commit", "mid-abort"])
def test_coordinator_kill_during_end_txn_ends_the_transaction_whole(
    cluster: ProcessCluster, commit: bool
) -> None:
    topic = f"{KILL_TOPIC}-{'commit' if commit else 'abort'}"
    _create_topic(cluster, topic, KILL_PARTITIONS)
    txn_id = f"killed-coordinator-{'commit' if commit else 'abort'}"
    producer = _txn_producer(cluster, txn_id, **{"request.timeout.ms": 3000})
    producer.begin_transaction()
    transactions = [("committed", _produce_txn(producer, topic, "before"))]
    assert _end_transaction(producer, True) == "committed"
    for at_call in (True, False):
        producer.begin_transaction()
        sent = _produce_txn(producer, topic, f"target-{at_call}")
        assert producer.flush(CLIENT_TIMEOUT_S) == 0  # on every partition, the txn open
        outcome = _kill_coordinator_during_end(cluster, producer, txn_id, commit, at_call)
        transactions.append((outcome, sent))
    # The producer goes on with its next transaction under the new coordinator.
    producer.begin_transaction()
    transactions.append(("committed", _produce_txn(producer, topic, "after")))
    assert _end_transaction(producer, True) == "committed"
    _write_end(cluster, topic, KILL_PARTITIONS)
    seen = _read_committed_confluent(cluster, topic, KILL_PARTITIONS)
    expected: dict[int, list[bytes]] = {p: [] for p in range(KILL_PARTITIONS)}
    for outcome, sent in transactions:
        if _whole(outcome, sent, seen):
            for partition, values in sent.items():
                expected[partition] += values
    assert seen == expected, "whole transactions, in order, and nothing else"


# ---------------------------------------------------------------- partition leader kill
def test_partition_leader_kill_inside_a_transaction_ends_it_whole(
    cluster: ProcessCluster,
) -> None:
    topic = f"{KILL_TOPIC}-leader"
    _create_topic(cluster, topic, KILL_PARTITIONS)
    txn_id = "killed-leader"
    producer = _txn_producer(cluster, txn_id, **{"request.timeout.ms": 3000})
    coordinator = _coordinator(cluster, txn_id)
    sent: list[tuple[str, dict[int, list[bytes]]]] = []
    for round_, commit in enumerate((True, False)):
        producer.begin_transaction()
        # The first produce to each partition adds it to the transaction (AddPartitionsToTxn).
        first = _produce_txn(producer, topic, f"r{round_}-first")
        assert producer.flush(CLIENT_TIMEOUT_S) == 0
        leaders = _leaders(cluster, topic)
        victim = next((n for n in leaders.values() if n != coordinator), None)
        assert victim is not None, f"every partition led by the coordinator: {leaders}"
        cluster.kill(victim, signal.SIGKILL)
        # More records while the partition fails over, then the marker.
        second = _produce_txn(producer, topic, f"r{round_}-second")
        outcome = _end_transaction(producer, commit)
        assert outcome == ("committed" if commit else "aborted"), f"{outcome}\n{_logs(cluster)}"
        sent.append((outcome, {p: first[p] + second[p] for p in first}))
        cluster.start(victim)
        cluster.wait_ready()
    _write_end(cluster, topic, KILL_PARTITIONS)
    seen = _read_committed_confluent(cluster, topic, KILL_PARTITIONS)
    committed, aborted = sent
    assert _whole(*committed, seen)
    assert not _whole(*aborted, seen)
    assert seen == committed[1], "the committed transaction's records, in order, and no more"
