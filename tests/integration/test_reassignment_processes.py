"""Partition reassignment on three real node processes: every partition of an RF 2 topic moves
onto other brokers (its leader's replica leaves, so leadership moves too) while a stock
acks=all idempotent producer (confluent-kafka) writes to it, driven by the CLI as an operator
would (`raftlog topics reassign --execute --wait`, then `--verify`). Every acknowledged record
is then read back once, at its acknowledged offset, in order, from the new replicas; the
removed replicas' logs are gone from disk."""

import json
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import ElectionType, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from raftlog_cli.main import cli

from raftlog.net.kafka import authz
from tests.integration.test_replication_processes import partition_info, read_all

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        "alter_partition_reassignments" not in authz.API_RULES,
        reason="the reassignment APIs are served once authz.API_RULES names them",
    ),
]

TOPIC = "moving"
PARTITIONS = 3
MOVE_TIMEOUT_S = 120


def run_cli(cluster, *args: str) -> str:
    result = CliRunner().invoke(
        cli,
        [*args, "--bootstrap-server", cluster.bootstrap_servers],
        catch_exceptions=False,
        prog_name="raftlog",
    )
    assert result.exit_code == 0, result.output
    return result.output


class BackgroundProducer:
    """Sends increasing values to every partition with acks=all until stopped; remembers the
    offset each acknowledged value got, per partition."""

    def __init__(self, cluster) -> None:
        self.producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap_servers,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 90_000,
            }
        )
        self.acked: dict[int, dict[bytes, int]] = {p: {} for p in range(PARTITIONS)}
        self.errors: list[object] = []
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _on_delivery(self, error, message) -> None:
        if error is None:
            self.acked[message.partition()][message.value()] = message.offset()
        else:
            self.errors.append(error)

    def _run(self) -> None:
        while not self.stop.is_set():
            value = f"{self.sent:08d}".encode()
            try:
                self.producer.produce(
                    TOPIC,
                    value=value,
                    partition=self.sent % PARTITIONS,
                    on_delivery=self._on_delivery,
                )
                self.sent += 1
            except BufferError:
                pass
            self.producer.poll(0.001)
        self.producer.flush(90)

    def acked_count(self) -> int:
        return sum(len(values) for values in self.acked.values())


def test_moving_every_partition_under_an_acks_all_producer(cluster, tmp_path: Path) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 2)])[TOPIC].result(30)
    cluster.wait_for(
        lambda: all(partition_info(cluster, TOPIC, p)["leader_id"] > 0 for p in range(PARTITIONS)),
        "every partition has a leader",
    )
    before = {p: partition_info(cluster, TOPIC, p) for p in range(PARTITIONS)}
    # Each partition moves to the broker it lacks, and its leader's replica leaves.
    plan = {}
    for p, info in before.items():
        (spare,) = {1, 2, 3} - set(info["replicas"])
        follower = next(b for b in info["replicas"] if b != info["leader_id"])
        plan[p] = [spare, follower]
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(
        json.dumps(
            {
                "version": 1,
                "partitions": [
                    {"topic": TOPIC, "partition": p, "replicas": rs} for p, rs in plan.items()
                ],
            }
        )
    )

    producer = BackgroundProducer(cluster)
    producer.thread.start()
    try:
        cluster.wait_for(lambda: producer.acked_count() >= 300, "the producer under way")
        out = run_cli(
            cluster,
            "topics",
            "reassign",
            "--execute",
            "--wait",
            "--timeout",
            str(MOVE_TIMEOUT_S),
            "--reassignment-json-file",
            str(plan_file),
        )
        assert "complete" in out
        moved_at = producer.acked_count()
        # Writes go on to the new replicas after the move.
        cluster.wait_for(lambda: producer.acked_count() >= moved_at + 300, "writes after the move")
    finally:
        producer.stop.set()
        producer.thread.join(120)
    assert not producer.thread.is_alive()
    assert not producer.errors, producer.errors[:3]

    out = run_cli(
        cluster, "topics", "reassign", "--verify", "--reassignment-json-file", str(plan_file)
    )
    assert out.count(": complete") == PARTITIONS, out
    for p, target in plan.items():
        after = cluster.wait_for(
            lambda p=p, target=target: (
                list((info := partition_info(cluster, TOPIC, p))["replicas"]) == target
                and sorted(info["isr"]) == sorted(target)
                and info
            ),
            f"{TOPIC}-{p} on {target} with a full ISR",
        )
        assert after["leader_id"] in target
        (removed,) = set(before[p]["replicas"]) - set(target)
        log_dir = Path(cluster.nodes[removed].config.data_dir) / "logs" / f"{TOPIC}-{p}"
        cluster.wait_for(lambda d=log_dir: not d.exists(), f"{log_dir} deleted on broker {removed}")

    for p in range(PARTITIONS):
        records = read_all(cluster, TOPIC, p)
        acked = producer.acked[p]
        values = [v for _, v in records]
        assert len(values) == len(set(values)), f"partition {p}: a record was written twice"
        where = {v: o for o, v in records}
        missing = [v for v in acked if v not in where]
        assert not missing, f"partition {p}: {len(missing)} acknowledged records lost"
        wrong = [(v, o, where[v]) for v, o in acked.items() if where[v] != o]
        assert not wrong, f"partition {p}: acknowledged at one offset, stored at another"
        assert values == sorted(values), f"partition {p}: records out of order"


def test_a_reorder_then_a_preferred_election_by_a_stock_client(cluster, tmp_path: Path) -> None:
    """A plan that only reorders the replicas completes at once and keeps the leader; a
    preferred election (confluent-kafka's AdminClient.elect_leaders) then moves leadership to
    the new first replica, and a second one has nothing to do."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic("reorder", 1, 3)])["reorder"].result(30)
    info = cluster.wait_for(
        lambda: (i := partition_info(cluster, "reorder", 0))["leader_id"] > 0 and i, "a leader"
    )
    leader = info["leader_id"]
    target = [b for b in info["replicas"] if b != leader] + [leader]
    plan_file = tmp_path / "reorder.json"
    plan_file.write_text(
        json.dumps(
            {"version": 1, "partitions": [{"topic": "reorder", "partition": 0, "replicas": target}]}
        )
    )
    run_cli(cluster, "topics", "reassign", "--execute", "--wait", "--reassignment-json-file",
            str(plan_file))  # fmt: skip
    moved = cluster.wait_for(
        lambda: list((i := partition_info(cluster, "reorder", 0))["replicas"]) == target and i,
        "the new replica order",
    )
    assert moved["leader_id"] == leader  # a reorder moves no leadership

    tp = TopicPartition("reorder", 0)
    result = admin.elect_leaders(ElectionType.PREFERRED, [tp]).result(30)
    assert result[tp] is None, result
    cluster.wait_for(
        lambda: partition_info(cluster, "reorder", 0)["leader_id"] == target[0],
        "the preferred replica leads",
    )
    again = admin.elect_leaders(ElectionType.PREFERRED, [tp]).result(30)
    assert again[tp].code() == KafkaError.ELECTION_NOT_NEEDED, again
    out = run_cli(cluster, "topics", "elect-leaders", "--election-type", "PREFERRED",
                  "--all-topic-partitions")  # fmt: skip
    assert "No election was needed." in out

    # --generate proposes a plan over the brokers given, in Kafka's format.
    topics_file = tmp_path / "topics.json"
    topics_file.write_text(json.dumps({"version": 1, "topics": [{"topic": "reorder"}]}))
    out = run_cli(cluster, "topics", "reassign", "--generate", "--broker-list", "1,2,3",
                  "--topics-to-move-json-file", str(topics_file), "--json")  # fmt: skip
    proposed = json.loads(out)["proposed"]["partitions"]
    assert [(p["topic"], p["partition"], sorted(p["replicas"])) for p in proposed] == [
        ("reorder", 0, [1, 2, 3])
    ]
