"""A paused active controller (SIGSTOP): the other two voters elect a new one within about an
election timeout, requests the brokers had sent to the paused one (a forwarded CreateTopics,
heartbeats) are re-sent to the new one at the election instead of waiting out their timeout,
the live brokers stay unfenced, every partition keeps a leader, and the new controller stays
in place through the pause and through the ISR changes that follow the old one's return.

A stopped process keeps its TCP connections open (the kernel still accepts and buffers), so
nothing but the quorum's own election tells the others that it is gone.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio
from kafka.admin import KafkaAdminClient, NewTopic

from raftlog.client.cluster import ClusterLimits, open_cluster
from raftlog.testing.cluster import ProcessCluster

pytestmark = pytest.mark.cluster

TOPIC = "t"
# Enough that each live node leads more partitions than a connection may have requests in
# flight (64): when the paused follower drops out of their ISRs, each leader asks the
# controller to shrink all of them at once.
PARTITIONS = 240
PAUSE_S = 12.0
OVERRIDES = {
    # A heartbeat in flight when the controller stopped waits its full timeout (the session
    # timeout) unless abandoned at the election, then one interval more: with these the
    # broker would miss the new controller's first session.
    "broker_session_timeout_ms": 6000,
    "broker_heartbeat_interval_ms": 1500,
    # The paused replica drops out of the ISRs well before its session ends.
    "replica_lag_time_max_ms": 2000,
}
ELECTION_DEADLINE_S = 10.0
# From the new controller's election until every partition is led by a live node: the paused
# broker's session runs out first (6 s), then its leaderships move.
LEADERS_DEADLINE_S = 12.0
# After the resume: the old controller catches up and rejoins every ISR.
REJOIN_DEADLINE_S = 60.0
PROBE_TIMEOUT_S = 2.0
# An admin request forwarded to the paused controller: its timeout, and how long it may take
# when it is re-sent to the new controller at the election.
FORWARDED_TIMEOUT_MS = 25_000
FORWARDED_DEADLINE_S = 10.0
SAMPLE_INTERVAL_S = 0.25
_QUORUM = {"topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]}


def _view(cluster: ProcessCluster, node_id: int) -> dict[str, Any]:
    """What node_id says: its metadata quorum leader, unfenced brokers, partition leaders and
    ISR sizes."""
    host, port = cluster.nodes[node_id].client_address.rsplit(":", 1)

    async def probe() -> dict[str, Any]:
        with trio.fail_after(PROBE_TIMEOUT_S):
            limits = ClusterLimits(max_retries=0)
            async with open_cluster(f"{host}:{port}", client_id="probe", limits=limits) as c:
                connection = await c.connect((host, int(port)))
                quorum = await connection.call("describe_quorum", _QUORUM)
                partition = quorum.topics[0].partitions[0]
                ok = quorum.error_code == 0 and partition.error_code == 0
                topic = c.topics.get(TOPIC)
                partitions = topic.partitions if topic else ()
                return {
                    "quorum_leader": int(partition.leader_id) if ok else -1,
                    "brokers": set(c.brokers),
                    "leaders": {p.partition: p.leader_id for p in partitions},
                    "isr": {p.partition: len(p.isr) for p in partitions},
                }

    return trio.run(probe)


def _create_through(cluster: ProcessCluster, node_id: int, name: str) -> int:
    """CreateTopics sent to node_id, which forwards it to the controller it knows of."""
    host, port = cluster.nodes[node_id].client_address.rsplit(":", 1)
    topic = {
        "name": name,
        "num_partitions": 1,
        "replication_factor": 2,
        "assignments": [],
        "configs": [],
    }
    values = {"topics": [topic], "timeout": FORWARDED_TIMEOUT_MS, "validate_only": False}

    async def create() -> int:
        with trio.fail_after(FORWARDED_TIMEOUT_MS / 1000 + PROBE_TIMEOUT_S):
            limits = ClusterLimits(max_retries=0)
            async with open_cluster(f"{host}:{port}", client_id="admin", limits=limits) as c:
                connection = await c.connect((host, int(port)))
                response = await connection.call(
                    "create_topics", values, timeout_ms=FORWARDED_TIMEOUT_MS + 5000
                )
                return int(response.topics[0].error_code)

    return trio.run(create)


def _led_by(view: dict[str, Any], leader: int, live: set[int]) -> bool:
    """Quorum led by `leader`, every live broker unfenced, every partition led by one."""
    return (
        view["quorum_leader"] == leader
        and live <= view["brokers"]
        and len(view["leaders"]) == PARTITIONS
        and set(view["leaders"].values()) <= live
    )


def test_a_paused_controller_is_replaced_and_brokers_follow_the_new_one(tmp_path):
    with ProcessCluster(tmp_path / "c", 3, OVERRIDES) as cluster:
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)])
        admin.close()
        everyone = set(cluster.nodes)
        old = cluster.wait_for(
            lambda: (
                (leader := _view(cluster, 1)["quorum_leader"]) > 0
                and all(_led_by(_view(cluster, n), leader, everyone) for n in everyone)
                and leader
            ),
            "every partition led and every broker unfenced",
        )
        live = everyone - {old}
        cluster.pause(old)
        try:
            paused_at = time.monotonic()
            # A live broker forwards this to the controller it knows, the paused one: the
            # request must be re-sent to the new controller at the election, not wait out its
            # timeout.
            error = _create_through(cluster, min(live), "created-during-the-pause")
            took_s = time.monotonic() - paused_at
            assert (error, took_s < FORWARDED_DEADLINE_S) == (0, True), (error, took_s)
            new = cluster.wait_for(
                lambda: (
                    len(leaders := {_view(cluster, n)["quorum_leader"] for n in live}) == 1
                    and (leader := leaders.pop()) in live
                    and leader
                ),
                f"a new metadata quorum leader while node {old} is paused",
                timeout_s=ELECTION_DEADLINE_S,
            )
            cluster.wait_for(
                lambda: all(_led_by(_view(cluster, n), new, live) for n in live),
                f"every partition led by a live node under controller {new}",
                timeout_s=LEADERS_DEADLINE_S,
            )
            # For the rest of the pause the new controller stays, the live brokers stay
            # unfenced (their heartbeats reach it) and no partition loses its leader.
            while time.monotonic() < paused_at + PAUSE_S:
                for node_id in sorted(live):
                    view = _view(cluster, node_id)
                    assert _led_by(view, new, live), (node_id, view)
                cluster._pause_s(SAMPLE_INTERVAL_S)
        finally:
            cluster.resume(old)
        # The old controller catches up; every leader asks the new controller to put it back
        # into the ISRs, all at once. The controller stays throughout.
        deadline = time.monotonic() + REJOIN_DEADLINE_S
        while True:
            views = {n: _view(cluster, n) for n in sorted(live)}
            for node_id, view in views.items():
                assert view["quorum_leader"] == new, (node_id, view["quorum_leader"])
                assert set(view["leaders"].values()) <= everyone, (node_id, view["leaders"])
            if all(
                set(v["isr"].values()) == {3} and v["brokers"] == everyone for v in views.values()
            ):
                break
            assert time.monotonic() < deadline, f"node {old} not back in every ISR"
            cluster._pause_s(SAMPLE_INTERVAL_S)
