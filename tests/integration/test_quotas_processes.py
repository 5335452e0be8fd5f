"""Client quotas with real node processes and stock clients (issue 7).

- confluent-kafka producer under producer_byte_rate = 1 MiB/s, sending as fast as it can for
  10 s, gets 1 MiB/s +-15 % while an unthrottled client id in the same run gets what it offers;
  the same for consumer_byte_rate with consumers;
- quotas written with AlterClientQuotas (raw kio requests from the project client) and read
  back with DescribeClientQuotas agree, on every broker, after a controller failover and
  after a full cluster restart, and are still enforced then.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest
import trio

from benchmarks.quotas import alter_quotas, consume_for, create_topic, produce_for
from raftlog.client.admin import Admin
from raftlog.client.cluster import open_cluster
from raftlog.constants import MIB
from raftlog.errors import ErrorCode
from raftlog.quotas import QuotaEntity
from raftlog.quotas.usage_rpc import UsageRow, fetch_usage
from raftlog.testing.cluster import ProcessCluster

pytestmark = pytest.mark.cluster

RUN_S = 10.0
TOLERANCE = 0.15
# What the unthrottled producer offers: well above the quota, well below what one broker
# takes on a busy 2-core machine, so "not slowed" means "got what it asked for".
UNTHROTTLED_OFFER_BYTES_S = 4 * MIB


def usage(cluster: ProcessCluster) -> list[UsageRow]:
    rows: list[UsageRow] = []
    for node in cluster.nodes.values():
        if node.running:
            host, port = node.config.internal_address
            rows += trio.run(fetch_usage, node.node_id, host, port)
    return rows


def test_byte_rate_quotas_hold_a_greedy_client_and_spare_the_others(tmp_path) -> None:
    with ProcessCluster(tmp_path / "c", 3) as cluster:
        bootstrap = cluster.bootstrap_servers
        create_topic(bootstrap, "quota")
        alter_quotas(
            bootstrap,
            [
                (QuotaEntity.client("slow-producer"), {"producer_byte_rate": MIB}),
                (QuotaEntity.client("slow-consumer"), {"consumer_byte_rate": MIB}),
            ],
        )
        produced = produce_for(
            bootstrap,
            "quota",
            {"slow-producer": None, "free-producer": UNTHROTTLED_OFFER_BYTES_S},
            RUN_S,
        )
        print(f"produced bytes/s: {produced}")
        assert produced["slow-producer"] == pytest.approx(MIB, rel=TOLERANCE), produced
        assert produced["free-producer"] >= 0.9 * UNTHROTTLED_OFFER_BYTES_S, produced

        consumed = consume_for(bootstrap, "quota", ["slow-consumer", "free-consumer"], RUN_S)
        print(f"consumed bytes/s: {consumed}")
        assert consumed["slow-consumer"] == pytest.approx(MIB, rel=TOLERANCE), consumed
        # The topic holds ~50 MiB: the free consumer reads far faster than the quota.
        assert consumed["free-consumer"] >= 3 * MIB, consumed

        rows = usage(cluster)
        by_client = {(row.quota_key, row.client_id): row for row in rows}
        throttled = by_client[("producer_byte_rate", "slow-producer")]
        assert throttled.quota == MIB and throttled.throttle_time_total_ms > 0
        consumer = by_client[("consumer_byte_rate", "slow-consumer")]
        assert consumer.quota == MIB and consumer.throttle_time_total_ms > 0
        # No quota applies to the free clients: the brokers keep no state for them at all.
        assert not [row for row in rows if row.client_id.startswith("free-")], rows


# ---------------------------------------------------------------------------- persistence
ALTERATIONS: list[tuple[QuotaEntity, dict[str, object]]] = [
    (QuotaEntity.client("limited"), {"producer_byte_rate": 1000}),
    (QuotaEntity.user("alice"), {"consumer_byte_rate": 2048, "request_percentage": 50.0}),
    (QuotaEntity.user_client(None, "batch"), {"request_percentage": 25.5}),
    (QuotaEntity.user_client("alice", None), {"producer_byte_rate": 4096}),
    (QuotaEntity.client(None), {"controller_mutation_rate": 10.0}),
]
EXPECTED: dict[QuotaEntity, dict[str, float]] = {
    entity: {key: float(value) for key, value in values.items()}  # type: ignore[arg-type]
    for entity, values in ALTERATIONS
}


async def _alter(bootstrap: str, alterations: Any, validate_only: bool = False) -> dict:
    async with open_cluster(bootstrap, client_id="quota-admin") as cluster:
        return await Admin(cluster).alter_client_quotas(alterations, validate_only=validate_only)


async def _describe_everywhere(bootstrap: str) -> dict[int, dict[QuotaEntity, dict[str, float]]]:
    """DescribeClientQuotas (no filter) sent to each broker in turn: each answers from its
    own metadata image."""
    seen = {}
    async with open_cluster(bootstrap, client_id="quota-describe") as cluster:
        for node_id in sorted(cluster.brokers):
            connection = await cluster.broker(node_id)
            response = await connection.call(
                "describe_client_quotas", {"components": [], "strict": False}
            )
            assert response.error_code == ErrorCode.none
            seen[node_id] = {
                QuotaEntity.of((e.entity_type, e.entity_name) for e in entry.entity): {
                    v.key: float(v.value) for v in entry.values
                }
                for entry in response.entries or ()
            }
    return seen


def _all_brokers_agree(cluster: ProcessCluster, expected: dict) -> bool:
    seen = trio.run(_describe_everywhere, cluster.live_bootstrap_servers())
    running = {n.node_id for n in cluster.nodes.values() if n.running}
    return set(seen) == running and all(table == expected for table in seen.values())


def _controller(cluster: ProcessCluster) -> int | None:
    controller = cluster.describe()["controller_id"]
    return controller if controller > 0 else None


def test_quotas_agree_and_survive_failover_and_full_restart(tmp_path) -> None:
    with ProcessCluster(tmp_path / "c", 3) as cluster:
        bootstrap = cluster.bootstrap_servers
        results = trio.run(_alter, bootstrap, ALTERATIONS)
        assert {r.error for r in results.values()} == {ErrorCode.none}, results
        # validate_only changes nothing; a bad value is refused before it is sent.
        dry = trio.run(
            _alter, bootstrap, [(QuotaEntity.client("dry"), {"producer_byte_rate": 5})], True
        )
        assert {r.error for r in dry.values()} == {ErrorCode.none}
        expected = dict(EXPECTED)
        cluster.wait_for(lambda: _all_brokers_agree(cluster, expected), "every broker's quotas")
        # The project client's own describe (through any broker) agrees too.
        described = trio.run(_describe_via_admin, bootstrap)
        assert described == expected

        controller = cluster.wait_for(lambda: _controller(cluster), "an active controller")
        cluster.kill(controller, signal.SIGKILL)
        new_controller = cluster.wait_for(
            lambda: (c := _controller(cluster)) not in (None, controller) and c,
            "a new controller",
        )
        assert new_controller != controller
        change = [
            (QuotaEntity.client("limited"), {"producer_byte_rate": 2000}),
            (QuotaEntity.user("alice"), {"request_percentage": None}),
        ]
        results = cluster.wait_for(
            lambda: _all_ok(trio.run(_alter, cluster.live_bootstrap_servers(), change)),
            "altering quotas on the new controller",
            timeout_s=30,
        )
        expected[QuotaEntity.client("limited")] = {"producer_byte_rate": 2000.0}
        expected[QuotaEntity.user("alice")] = {"consumer_byte_rate": 2048.0}
        cluster.wait_for(lambda: _all_brokers_agree(cluster, expected), "quotas after failover")

        cluster.start(controller)
        cluster.wait_ready()
        cluster.wait_for(lambda: _all_brokers_agree(cluster, expected), "restarted node caught up")

        cluster.stop()
        cluster.start()
        cluster.wait_ready()
        cluster.wait_for(lambda: _all_brokers_agree(cluster, expected), "quotas after restart")

        # Still enforced after the restart: 20 kB at 2000 B/s from a standing start is
        # held back about 10 s (the usage shows the throttle on the partition's leader).
        # Right after a full restart a broker may be fenced again for a moment (it missed
        # the new controller's first session window) while still listed: topic creation
        # is retried as a client would, until every broker can take a replica.
        cluster.wait_for(
            lambda: _created(cluster.bootstrap_servers, "after-restart"),
            "the topic created with all three brokers unfenced",
        )
        produce_for(cluster.bootstrap_servers, "after-restart", {"limited": 20_000.0}, 1.0)
        rows = [row for row in usage(cluster) if row.client_id == "limited"]
        assert rows and rows[0].quota == 2000.0 and rows[0].throttle_time_total_ms > 0, rows


def _all_ok(results: dict) -> dict | None:
    return results if {r.error for r in results.values()} == {ErrorCode.none} else None


async def _describe_via_admin(bootstrap: str) -> dict:
    async with open_cluster(bootstrap, client_id="quota-describe") as cluster:
        return await Admin(cluster).describe_client_quotas()


def _created(bootstrap: str, topic: str) -> bool:
    from confluent_kafka import KafkaError, KafkaException

    try:
        create_topic(bootstrap, topic)
    except KafkaException as exc:
        if "replication factor" in str(exc):
            return False
        # An earlier attempt created it after its answer was lost (the client timed out
        # while the controller went on): the topic is there, as the test wants.
        if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return True
        raise
    return True
