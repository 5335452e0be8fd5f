"""raftlog's transaction admin and read_committed fetches against three real node processes.

confluent-kafka's transactional producers leave, on one partition: a committed transaction,
an aborted one, a hanging one (its producer killed with SIGKILL mid-transaction, with a
transaction timeout far beyond the test, so no coordinator ends it here), and a committed
one after it. Then:
- list/describe/describe-producers show the three transactional ids and the open
  transaction's start offset;
- a read_committed read stops at the hanging transaction (the LSO) and never returns
  aborted records; read_uncommitted returns every data record, never a control record;
- abort (by the start offset, as kafka-transactions.sh does) ends the hanging transaction:
  the LSO moves to the HW and read_committed reads on to the later committed records.

The scenario helpers are shared with the CLI test (tests/cli/test_transactions_processes.py).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from confluent_kafka import Producer

from raftlog.client import (
    Admin,
    Consumer,
    IsolationLevel,
    NewTopic,
    TransactionAdmin,
    open_cluster,
)
from raftlog.errors import ErrorCode
from raftlog.testing.cluster import ProcessCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster

TOPIC = "txns"
COMMITTER = "committer"
ABORTER = "aborter"
HANGER = "hanger"
CLIENT_TIMEOUT_S = 30.0
CONDITION_DEADLINE_S = 30.0
# Far beyond the test: the coordinator must not end the hanging transaction by itself.
HANGING_TXN_TIMEOUT_MS = 600_000

# The hanging producer: begins a transaction, produces one record, says so, and waits to be
# killed (a producer that died mid-transaction).
HANGING_PRODUCER = """
import sys
from confluent_kafka import Producer
bootstrap, transactional_id, topic, ready_path, timeout_ms = sys.argv[1:6]
producer = Producer({
    "bootstrap.servers": bootstrap,
    "transactional.id": transactional_id,
    "transaction.timeout.ms": int(timeout_ms),
})
producer.init_transactions(30)
producer.begin_transaction()
producer.produce(topic, b"h0", partition=0)
if producer.flush(30) != 0:
    sys.exit("h0 was not delivered")
open(ready_path, "w").write("ready")
sys.stdin.read()
"""


@dataclass(frozen=True)
class Scenario:
    cluster: ProcessCluster

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap_servers


def _transactional(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(CLIENT_TIMEOUT_S)
    return producer


def _transaction(producer: Producer, values: list[bytes], *, commit: bool) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(TOPIC, value, partition=0)
    if commit:
        producer.commit_transaction(CLIENT_TIMEOUT_S)
    else:
        producer.flush(CLIENT_TIMEOUT_S)
        producer.abort_transaction(CLIENT_TIMEOUT_S)


def _create_topic(bootstrap: str) -> None:
    async def run() -> None:
        async with open_cluster(bootstrap) as cluster:
            result = await Admin(cluster).create_topics([NewTopic(TOPIC, 1, 3)])
            assert result[TOPIC].error == ErrorCode.none, result

    trio.run(run)


def _start_hanging_producer(scenario: Scenario, ready: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HANGING_PRODUCER,
            scenario.bootstrap,
            HANGER,
            TOPIC,
            str(ready),
            str(HANGING_TXN_TIMEOUT_MS),
        ],
        stdin=subprocess.PIPE,
    )
    try:

        def is_ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the hanging producer exited with {process.returncode}")
            return ready.exists()

        scenario.cluster.wait_for(is_ready, "the hanging producer's record", CLIENT_TIMEOUT_S)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process


def make_transactions(cluster: ProcessCluster, tmp: Path) -> Scenario:
    """Partition TOPIC-0: c0 c1 c2 (committed), a0 a1 (aborted), h0 (hanging: its producer
    killed), c3 (committed), with the markers between them."""
    scenario = Scenario(cluster)
    _create_topic(scenario.bootstrap)
    committer = _transactional(scenario.bootstrap, COMMITTER)
    _transaction(committer, [b"c0", b"c1", b"c2"], commit=True)
    aborter = _transactional(scenario.bootstrap, ABORTER)
    _transaction(aborter, [b"a0", b"a1"], commit=False)
    hanging = _start_hanging_producer(scenario, tmp / "hanging-ready")
    hanging.kill()
    hanging.wait()
    _transaction(committer, [b"c3"], commit=True)
    # EndTxn is answered once the outcome is decided (PrepareCommit/PrepareAbort); the
    # markers, and the Complete* state, follow.
    cluster.wait_for(
        lambda: _states(scenario.bootstrap) == ENDED_STATES,
        f"transactions to reach {ENDED_STATES}",
        CONDITION_DEADLINE_S,
    )
    return scenario


ENDED_STATES = {COMMITTER: "CompleteCommit", ABORTER: "CompleteAbort", HANGER: "Ongoing"}


def _states(bootstrap: str) -> dict[str, str]:
    async def run() -> dict[str, str]:
        async with open_cluster(bootstrap) as cluster:
            listed = await TransactionAdmin(cluster).list_transactions()
        return {t.transactional_id: t.state for t in listed}

    return trio.run(run)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    root = tmp_path_factory.mktemp("txn-admin")
    with ProcessCluster(root / "cluster", 3) as cluster:
        yield make_transactions(cluster, root)


def _values(records: list) -> list[bytes]:
    return [r.value for r in records]


async def test_list_describe_and_describe_producers(scenario: Scenario) -> None:
    async with open_cluster(scenario.bootstrap) as cluster:
        admin = TransactionAdmin(cluster)
        listed = {t.transactional_id: t for t in await admin.list_transactions()}
        assert {COMMITTER, ABORTER, HANGER} <= set(listed)
        assert listed[COMMITTER].state == "CompleteCommit"
        assert listed[ABORTER].state == "CompleteAbort"
        assert listed[HANGER].state == "Ongoing"
        ongoing = await admin.list_transactions(states=["Ongoing"])
        assert [t.transactional_id for t in ongoing] == [HANGER]
        by_producer = await admin.list_transactions(producer_ids=[listed[ABORTER].producer_id])
        assert [t.transactional_id for t in by_producer] == [ABORTER]
        with pytest.raises(ValueError, match="unknown transaction state"):
            await admin.list_transactions(states=["Running"])

        described = await admin.describe_transactions([HANGER, COMMITTER, "nobody"])
        hanger = described[HANGER]
        assert hanger.error == ErrorCode.none
        assert hanger.state == "Ongoing"
        assert hanger.producer_id == listed[HANGER].producer_id
        assert hanger.coordinator_id == listed[HANGER].coordinator_id
        assert hanger.transaction_timeout_ms == HANGING_TXN_TIMEOUT_MS
        assert hanger.transaction_start_time_ms is not None
        assert hanger.topic_partitions == ((TOPIC, 0),)
        assert described[COMMITTER].state == "CompleteCommit"
        assert described["nobody"].error == ErrorCode.transactional_id_not_found

        found = await admin.describe_producers([(TOPIC, 0), ("no-such-topic", 0)])
        assert found[("no-such-topic", 0)].error == ErrorCode.unknown_topic_or_partition
        partition = found[(TOPIC, 0)]
        assert partition.error == ErrorCode.none
        producers = {p.producer_id: p for p in partition.producers}
        assert set(producers) == {listed[t].producer_id for t in (COMMITTER, ABORTER, HANGER)}
        open_at = producers[listed[HANGER].producer_id].current_transaction_start_offset
        # c0-c2, a COMMIT marker, a0 a1, an ABORT marker: h0 is the eighth offset.
        assert open_at == 7
        assert producers[listed[COMMITTER].producer_id].current_transaction_start_offset is None
        assert producers[listed[ABORTER].producer_id].coordinator_epoch is not None


async def test_read_committed_stops_at_the_hanging_transaction_until_aborted(
    scenario: Scenario,
) -> None:
    async with open_cluster(scenario.bootstrap) as cluster:
        committed = Consumer(cluster, isolation_level=IsolationLevel.READ_COMMITTED)
        uncommitted = Consumer(cluster)
        everything = await uncommitted.fetch_range(TOPIC, 0, 0)
        # Every data record, no marker (a marker has a 4-byte key and a 6-byte value).
        assert _values(everything) == [b"c0", b"c1", b"c2", b"a0", b"a1", b"h0", b"c3"]
        high_watermark = (await uncommitted.list_offset(TOPIC, 0)).offset
        assert high_watermark == 10  # seven records and three markers
        stable = (await committed.list_offset(TOPIC, 0)).offset
        assert stable == 7
        assert _values(await committed.fetch_range(TOPIC, 0, 0)) == [b"c0", b"c1", b"c2"]
        # Asked past the LSO, a read_committed read still ends there.
        assert _values(await committed.fetch_range(TOPIC, 0, 4, 10)) == []

        admin = TransactionAdmin(cluster)
        assert await admin.open_transaction_at(TOPIC, 0, 6) is None
        spec = await admin.open_transaction_at(TOPIC, 0, stable)
        assert spec is not None
        listed = {t.transactional_id: t for t in await admin.list_transactions()}
        assert spec.producer_id == listed[HANGER].producer_id
        await admin.abort_transaction(spec)

        async def lso_reached_the_end() -> bool:
            return (await committed.list_offset(TOPIC, 0)).offset > high_watermark

        # The ABORT marker is one more offset: the LSO passes the old HW.
        await wait_until("the LSO to pass the aborted transaction", lso_reached_the_end)
        assert _values(await committed.fetch_range(TOPIC, 0, 0)) == [b"c0", b"c1", b"c2", b"c3"]
        partition = (await admin.describe_producers([(TOPIC, 0)]))[(TOPIC, 0)]
        assert all(p.current_transaction_start_offset is None for p in partition.producers)
        # Out of range: refused before anything is sent.
        with pytest.raises(ValueError, match="producer epoch"):
            await admin.abort_transaction(
                type(spec)(TOPIC, 0, spec.producer_id, -1, spec.coordinator_epoch)
            )
