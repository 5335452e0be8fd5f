"""Reassignment throttles on three real node processes: a partition holding 2 MiB moves to a
new replica under `raftlog topics reassign --execute --throttle 524288` (512 KiB/s), which
takes about the time the rate gives, while a stock acks=all producer (confluent-kafka) writing
to another topic is not slowed; `--verify` then removes the throttle, which a stock client's
DescribeConfigs confirms."""

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from raftlog_cli.main import cli

from raftlog.config_keys import TOPIC_CONFIGS
from raftlog.replication.core.throttle import (
    FOLLOWER_THROTTLED_RATE,
    FOLLOWER_THROTTLED_REPLICAS,
    LEADER_THROTTLED_RATE,
    LEADER_THROTTLED_REPLICAS,
    THROTTLE_BURST_S,
    UNTHROTTLED_RATE,
)
from tests.integration.test_replication_processes import partition_info

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        LEADER_THROTTLED_REPLICAS not in TOPIC_CONFIGS,
        reason="the throttled replica lists are accepted once config_keys.TOPIC_CONFIGS names them",
    ),
]

KIB = 1024
MIB = 1024 * KIB
THROTTLE_BYTES_PER_S = 512 * KIB
MOVED_BYTES = 2 * MIB
VALUE_BYTES = 16 * KIB
OTHER_BYTES = 1 * MIB
MOVE_DEADLINE_S = 60


def run_cli(cluster, *args: str) -> str:
    result = CliRunner().invoke(
        cli,
        [*args, "--bootstrap-server", cluster.bootstrap_servers],
        catch_exceptions=False,
        prog_name="raftlog",
    )
    assert result.exit_code == 0, result.output
    return result.output


def produce(cluster, topic: str, total_bytes: int, partition: int = 0) -> float:
    """Write total_bytes with acks=all; the seconds it took until all were acknowledged."""
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "acks": "all", "linger.ms": 5}
    )
    errors: list[object] = []
    started = time.monotonic()
    for i in range(total_bytes // VALUE_BYTES):
        producer.produce(
            topic,
            value=bytes([i % 256]) * VALUE_BYTES,
            partition=partition,
            on_delivery=lambda error, _: error is None or errors.append(error),
        )
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:3]
    return time.monotonic() - started


def log_bytes(cluster, node_id: int, topic: str, partition: int = 0) -> int:
    directory = Path(cluster.nodes[node_id].config.data_dir) / "logs" / f"{topic}-{partition}"
    return sum(f.stat().st_size for f in directory.glob("*.log")) if directory.exists() else 0


def test_a_throttled_move_keeps_to_the_rate_and_verify_removes_it(cluster, tmp_path) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    # The moving partition lives on broker 1 alone; the other topic's leaders and followers
    # include brokers 1 and 2, whose replication the throttle must leave alone.
    admin.create_topics([NewTopic("bulk", 1, replica_assignment=[[1]])])["bulk"].result(30)
    admin.create_topics([NewTopic("other", 3, 2)])["other"].result(30)
    cluster.wait_for(lambda: partition_info(cluster, "bulk", 0)["leader_id"] == 1, "bulk leader")
    cluster.wait_for(
        lambda: all(partition_info(cluster, "other", p)["leader_id"] > 0 for p in range(3)),
        "other leaders",
    )
    produce(cluster, "bulk", MOVED_BYTES)
    baseline_s = produce(cluster, "other", OTHER_BYTES)

    plan_file = tmp_path / "plan.json"
    plan_file.write_text(
        json.dumps(
            {"version": 1, "partitions": [{"topic": "bulk", "partition": 0, "replicas": [1, 2]}]}
        )
    )
    started = time.monotonic()
    out = run_cli(
        cluster,
        "topics",
        "reassign",
        "--execute",
        "--throttle",
        str(THROTTLE_BYTES_PER_S),
        "--reassignment-json-file",
        str(plan_file),
    )
    assert "throttled to 524288 bytes/s" in out, out
    # While it copies, another topic's acks=all writes go at their own pace.
    during_s = produce(cluster, "other", OTHER_BYTES)
    cluster.wait_for(
        lambda: sorted(partition_info(cluster, "bulk", 0)["isr"]) == [1, 2],
        "bulk-0 on brokers 1 and 2, both in sync",
        timeout_s=MOVE_DEADLINE_S,
    )
    moved_s = time.monotonic() - started
    # One burst goes at once, the rest at the rate.
    expected_s = (MOVED_BYTES - THROTTLE_BYTES_PER_S * THROTTLE_BURST_S) / THROTTLE_BYTES_PER_S
    assert moved_s >= 0.7 * expected_s, (moved_s, expected_s)
    assert moved_s < 4 * expected_s + 10, (moved_s, expected_s)
    assert log_bytes(cluster, 2, "bulk") >= MOVED_BYTES
    assert during_s < max(2.0, 3 * baseline_s), (during_s, baseline_s)
    assert during_s < 0.5 * moved_s, (during_s, moved_s)

    # Set as kafka-reassign-partitions.sh sets it, until --verify sees the move done.
    topic = ConfigResource(ConfigResource.Type.TOPIC, "bulk")
    broker_2 = ConfigResource(ConfigResource.Type.BROKER, "2")

    def shown(resource: ConfigResource) -> dict[str, str]:
        entries = admin.describe_configs([resource])[resource].result(30)
        return {name: entry.value for name, entry in entries.items()}

    assert shown(topic)[LEADER_THROTTLED_REPLICAS] == "0:1"
    assert shown(topic)[FOLLOWER_THROTTLED_REPLICAS] == "0:2"
    assert shown(broker_2)[LEADER_THROTTLED_RATE] == str(THROTTLE_BYTES_PER_S)
    out = run_cli(
        cluster, "topics", "reassign", "--verify", "--reassignment-json-file", str(plan_file)
    )
    assert "bulk-0: complete" in out and "Throttle removed" in out, out
    assert not shown(topic)[LEADER_THROTTLED_REPLICAS]
    assert not shown(topic)[FOLLOWER_THROTTLED_REPLICAS]
    for broker in ("1", "2"):
        rates = shown(ConfigResource(ConfigResource.Type.BROKER, broker))
        assert rates[LEADER_THROTTLED_RATE] == str(UNTHROTTLED_RATE)
        assert rates[FOLLOWER_THROTTLED_RATE] == str(UNTHROTTLED_RATE)
    # A second verify finds nothing to remove.
    out = run_cli(
        cluster, "topics", "reassign", "--verify", "--reassignment-json-file", str(plan_file)
    )
    assert "Throttle removed" not in out, out
