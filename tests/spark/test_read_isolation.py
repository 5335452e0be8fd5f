"""kafka.isolation.level in the `raftlog` Spark source, against three real node processes and
real local Spark.

The partition holds (tests/client/test_admin_txn_processes.py's transactions, written by
confluent-kafka's transactional producers): c0 c1 c2 committed, a0 a1 aborted, h0 of a
transaction left hanging (its producer killed), c3 committed after it, and their markers.
read_uncommitted returns every data record and never a marker; read_committed stops at the
hanging transaction (the last stable offset), skips the aborted records even in a split that
starts inside their transaction, and once the hanging transaction is aborted reads on to c3.
"""

from __future__ import annotations

import pytest
import trio

from raftlog.client import TransactionAdmin, open_cluster
from raftlog.spark.options import OptionError, parse_options
from raftlog.testing.cluster import ProcessCluster
from tests.client.test_admin_txn_processes import TOPIC, Scenario, make_transactions

pytestmark = [pytest.mark.spark, pytest.mark.cluster]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("spark-isolation")
    running = ProcessCluster(root / "cluster", 3)
    running.start()
    try:
        # The nodes boot in their own processes while Spark's JVM starts.
        request.getfixturevalue("spark")
        running.wait_ready()
        yield make_transactions(running, root)
    finally:
        running.stop()


def _read(spark, scenario: Scenario, **options: str) -> list[tuple[int, bytes]]:
    reader = (
        spark.read.format("raftlog")
        .option("bootstrap.servers", scenario.bootstrap)
        .option("subscribe", TOPIC)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return sorted((r["offset"], bytes(r["value"])) for r in reader.load().collect())


def _abort_hanging(bootstrap: str, start_offset: int) -> None:
    async def run() -> None:
        async with open_cluster(bootstrap) as cluster:
            admin = TransactionAdmin(cluster)
            spec = await admin.open_transaction_at(TOPIC, 0, start_offset)
            assert spec is not None
            await admin.abort_transaction(spec)

    trio.run(run)


def test_isolation_levels(spark, scenario):
    everything = [
        (0, b"c0"), (1, b"c1"), (2, b"c2"), (4, b"a0"), (5, b"a1"), (7, b"h0"), (8, b"c3"),
    ]  # fmt: skip
    assert _read(spark, scenario) == everything
    assert _read(spark, scenario, **{"kafka.isolation.level": "read_uncommitted"}) == everything
    committed = {"kafka.isolation.level": "read_committed", "maxRecordsPerPartition": "2"}
    # Splits [0,1) [1,3) [3,5) [5,7): the last starts inside the aborted transaction (a1).
    assert _read(spark, scenario, **committed) == [(0, b"c0"), (1, b"c1"), (2, b"c2")]

    _abort_hanging(scenario.bootstrap, 7)

    def past_the_abort() -> list[tuple[int, bytes]]:
        rows = _read(spark, scenario, **{"kafka.isolation.level": "read_committed"})
        return rows if rows[-1:] == [(8, b"c3")] else []

    rows = scenario.cluster.wait_for(past_the_abort, "read_committed to reach c3", 60)
    assert rows == [(0, b"c0"), (1, b"c1"), (2, b"c2"), (8, b"c3")]


def test_isolation_level_option_is_checked():
    base = {"bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}
    assert parse_options(base).isolation_level.config_name == "read_uncommitted"
    level = parse_options({**base, "kafka.isolation.level": "READ_COMMITTED"}).isolation_level
    assert level.config_name == "read_committed"
    with pytest.raises(OptionError, match=r"kafka\.isolation\.level must be read_uncommitted"):
        parse_options({**base, "kafka.isolation.level": "committed"})
