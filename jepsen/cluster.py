"""Cluster control for a run: real `raftlog node` processes, each in its own namespace.

The Cluster starts, kills (-9), stops, pauses (SIGSTOP/SIGCONT) and restarts nodes, cuts and
heals the network between them, and answers the questions nemeses ask ("who leads the
metadata quorum?", "who leads partition 3?") through raftlog's own admin client, from the
root namespace over the bridge, like the workload's clients.

Every node process writes its log to ``<run>/nodes/<name>/node.log`` (appended across
restarts) and keeps its data in ``<run>/nodes/<name>/data``.

With ``ClusterOptions.secure`` the nodes serve clients on SASL_SSL only (SCRAM-SHA-512),
speak mutual TLS among themselves and run the ACL authorizer (jepsen.secure); the harness's
own questions then go over SASL_SSL as the run's admin.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from jepsen import damage as disk_damage
from jepsen.cluster_membership import MembershipOps
from jepsen.forger import Forger, Target
from jepsen.nemesis import PartitionReplicas
from jepsen.netns import RunNetwork
from jepsen.secure import SecureSetup
from raftlog.client.properties import PLAINTEXT, ClientSecurity
from raftlog.config import NodeConfig

log = logging.getLogger(__name__)

CLIENT_PORT = 9092
INTERNAL_PORT = 19092
# A node asked to stop (SIGTERM) gets this long before it is killed.
STOP_GRACE_S = 5.0
# One control-plane question (leader lookup, topic creation) gives up after this long: a
# nemesis must never hang on a partitioned cluster.
ADMIN_TIMEOUT_S = 5.0
# A TCP connect probe to a node's client port.
CONNECT_PROBE_TIMEOUT_S = 1.0
# Between two readiness probes (a retry cadence while polling a condition under a deadline).
PROBE_INTERVAL_S = 0.2


@dataclass(frozen=True)
class ClusterOptions:
    """What the run's cluster looks like. ``unsafe`` is the lossy configuration Kafka itself
    documents: acks=1 producers, min ISR 1, unclean leader election, fsync on an interval."""

    nodes: int = 3
    topic: str = "jepsen"
    partitions: int = 6
    replication_factor: int = 3
    unsafe: bool = False
    # SASL_SSL clients, mutual TLS between nodes, the authorizer (jepsen.secure).
    secure: bool = False
    # One more node process, broker-only and outside the voters, for the membership
    # nemesis (jepsen.membership): not started with the cluster, never a target of the
    # other nemeses, and holding no replica and no vote outside a membership fault.
    spare: bool = False

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(f"n{i}" for i in range(1, self.nodes + 1))

    @property
    def spare_name(self) -> str | None:
        return f"n{self.nodes + 1}" if self.spare else None

    @property
    def all_node_names(self) -> tuple[str, ...]:
        """The namespaces a run needs: the nodes and the spare."""
        spare = self.spare_name
        return self.node_names + ((spare,) if spare is not None else ())

    @property
    def min_insync_replicas(self) -> int:
        return 1 if self.unsafe else 2

    def topic_configs(self) -> dict[str, str]:
        return {
            "min.insync.replicas": str(self.min_insync_replicas),
            "unclean.leader.election.enable": "true" if self.unsafe else "false",
        }


def node_config(
    net: RunNetwork,
    node: str,
    data_dir: Path,
    opts: ClusterOptions,
    cluster_id: str,
    secure: SecureSetup | None = None,
) -> NodeConfig:
    """The node's config: listeners on its namespace address, every node a voter, timeouts
    short enough that a 60 s run sees several failovers; `secure` adds its security keys.
    The spare is broker-only (config refuses a controller outside the static voters): it
    fetches the metadata log as an observer until AddRaftVoter makes it a voter."""
    voters = ",".join(
        f"{i}@{net.address(name)}:{INTERNAL_PORT}" for i, name in enumerate(opts.node_names, 1)
    )
    address = net.address(node)
    extra: dict[str, Any] = (
        secure.node_overrides(node, address, CLIENT_PORT) if secure is not None else {}
    )
    return NodeConfig(
        node_id=net.node_names.index(node) + 1,
        cluster_id=cluster_id,
        roles=["broker"] if node == opts.spare_name else ["controller", "broker"],
        data_dir=str(data_dir),
        client_listener=f"{address}:{CLIENT_PORT}",
        advertised_client_listener=f"{address}:{CLIENT_PORT}",
        internal_listener=f"{address}:{INTERNAL_PORT}",
        controller_quorum_voters=voters,
        election_timeout_ms=1000,
        fetch_timeout_ms=2000,
        broker_session_timeout_ms=6000,
        broker_heartbeat_interval_ms=1000,
        replica_lag_time_max_ms=10_000,
        request_timeout_ms=10_000,
        num_partitions=opts.partitions,
        default_replication_factor=min(opts.replication_factor, opts.nodes),
        min_insync_replicas=opts.min_insync_replicas,
        unclean_leader_election=opts.unsafe,
        flush_policy="interval" if opts.unsafe else "always",
        offsets_topic_replication_factor=min(3, opts.nodes),
        **extra,
    )


@dataclass
class Node:
    name: str
    node_id: int
    address: str
    dir: Path
    process: trio.Process | None = None
    paused: bool = False
    starts: int = 0

    @property
    def config_path(self) -> Path:
        return self.dir / "node.toml"

    @property
    def log_path(self) -> Path:
        return self.dir / "node.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None


@dataclass
class Cluster(MembershipOps):
    """The run's nodes. Build with ``Cluster.create``; every method is safe to call on a
    node in any state (killing a dead node does nothing). ``nodes`` holds the spare too;
    ``names`` (what nemeses target and start) does not."""

    net: RunNetwork
    opts: ClusterOptions
    nodes: dict[str, Node] = field(default_factory=dict)
    secure: SecureSetup | None = None

    @classmethod
    def create(cls, net: RunNetwork, nodes_dir: Path, opts: ClusterOptions) -> Cluster:
        cluster = cls(net, opts)
        # Every node of one cluster must share its id; a fresh one per run.
        cluster_id = uuid.uuid4().hex
        if opts.secure:
            cluster.secure = SecureSetup.create(
                nodes_dir,
                {name: (i, net.address(name)) for i, name in enumerate(net.node_names, 1)},
            )
        if opts.spare_name is not None and opts.spare_name not in net.node_names:
            raise ValueError(f"the network has no namespace for the spare {opts.spare_name}")
        for name in net.node_names:
            node_dir = nodes_dir / name
            (node_dir / "data").mkdir(parents=True, exist_ok=True)
            node = Node(name, net.node_names.index(name) + 1, net.address(name), node_dir)
            config = node_config(net, name, node_dir / "data", opts, cluster_id, cluster.secure)
            node.config_path.write_text(config.to_toml(), encoding="utf-8")
            cluster.nodes[name] = node
        return cluster

    @property
    def names(self) -> list[str]:
        return [name for name in self.nodes if name != self.spare]

    @property
    def spare(self) -> str | None:
        return self.opts.spare_name

    def _internal_port(self) -> int:
        return INTERNAL_PORT

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{self.nodes[n].address}:{CLIENT_PORT}" for n in self.names)

    @property
    def client_security(self) -> ClientSecurity:
        """How raftlog's client connects to this cluster (PLAINTEXT unless secure)."""
        return PLAINTEXT if self.secure is None else self.secure.client_security()

    def librdkafka_config(self) -> dict[str, Any]:
        """The security settings of confluent-kafka clients (empty unless secure)."""
        return {} if self.secure is None else self.secure.librdkafka()

    def name_of(self, node_id: int) -> str | None:
        for node in self.nodes.values():
            if node.node_id == node_id:
                return node.name
        return None

    def running(self) -> list[str]:
        return [n.name for n in self.nodes.values() if n.running]

    # ------------------------------------------------------------------ processes
    async def start(self, name: str) -> None:
        node = self.nodes[name]
        if node.running:
            return
        argv = self.net.exec_argv(
            name,
            [sys.executable, "-m", "raftlog_cli.main", "node", "--config", str(node.config_path)],
        )
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # A plain fd the child inherits; one short append, not worth a thread.
        fd = os.open(node.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"--- jepsen: start #{node.starts + 1} of {name}\n".encode())
            node.process = await trio.lowlevel.open_process(
                argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, env=env
            )
        finally:
            os.close(fd)
        node.paused = False
        node.starts += 1

    async def start_all(self) -> None:
        for name in self.names:
            await self.start(name)

    async def kill(self, name: str) -> None:
        """kill -9: no flush, no goodbye."""
        node = self.nodes[name]
        if node.process is None:
            return
        if node.running:
            node.process.send_signal(signal.SIGKILL)
        await node.process.wait()
        node.paused = False

    async def stop(self, name: str, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM, then SIGKILL after grace_s."""
        node = self.nodes[name]
        if node.process is None:
            return
        if node.running:
            if node.paused:
                node.process.send_signal(signal.SIGCONT)
            node.process.send_signal(signal.SIGTERM)
            with trio.move_on_after(grace_s):
                await node.process.wait()
        await self.kill(name)

    async def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        async with trio.open_nursery() as nursery:
            for name in self.nodes:
                nursery.start_soon(self.stop, name, grace_s)

    async def pause(self, name: str) -> None:
        node = self.nodes[name]
        if node.running and not node.paused:
            node.process.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
            node.paused = True

    async def resume(self, name: str) -> None:
        node = self.nodes[name]
        if node.running and node.paused:
            node.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        node.paused = False

    # ------------------------------------------------------------------ network
    async def partition(self, grudge: Mapping[str, Sequence[str]]) -> None:
        await self.net.apply_grudge(grudge)

    async def heal_network(self) -> None:
        await self.net.heal()

    # ------------------------------------------------------------------ questions
    async def controller_leader(self) -> str | None:
        """The metadata quorum's leader, or None when nobody answers in time."""
        from raftlog.client.admin import Admin
        from raftlog.client.cluster import open_cluster

        with trio.move_on_after(ADMIN_TIMEOUT_S):
            try:
                async with open_cluster(
                    self._live_bootstrap(), security=self.client_security
                ) as client:
                    try:
                        quorum = await Admin(client).describe_quorum()
                        return self.name_of(int(quorum["leader_id"]))
                    except Exception as exc:
                        # A node that is not the quorum leader may refuse DescribeQuorum;
                        # the metadata response still names the active controller.
                        log.info("describe_quorum failed (%r); using metadata", exc)
                        return self.name_of(client.controller_id)
            except Exception as exc:  # any failure means "unknown": the nemesis picks another
                log.info("controller leader lookup failed: %r", exc)
        return None

    async def partition_leaders(self) -> dict[int, str]:
        """{partition: leader name} of the run's topic for partitions that have a leader."""
        from raftlog.client.cluster import open_cluster

        with trio.move_on_after(ADMIN_TIMEOUT_S):
            try:
                async with open_cluster(
                    self._live_bootstrap(), security=self.client_security
                ) as client:
                    await client.refresh_metadata([self.opts.topic])
                    info = client.topics.get(self.opts.topic)
                    if info is None:
                        return {}
                    leaders = {}
                    for p in info.partitions:
                        name = self.name_of(p.leader_id)
                        if name is not None:
                            leaders[p.partition] = name
                    return leaders
            except Exception as exc:
                log.info("partition leader lookup failed: %r", exc)
        return {}

    async def partition_replicas(self) -> dict[int, PartitionReplicas]:
        """{partition: its leader, replicas and ISR} of the run's topic, as metadata says."""
        from raftlog.client.cluster import open_cluster

        with trio.move_on_after(ADMIN_TIMEOUT_S):
            try:
                async with open_cluster(
                    self._live_bootstrap(), security=self.client_security
                ) as client:
                    await client.refresh_metadata([self.opts.topic])
                    info = client.topics.get(self.opts.topic)
                    if info is None:
                        return {}
                    return {
                        p.partition: PartitionReplicas(
                            self.name_of(p.leader_id),
                            tuple(n for n in map(self.name_of, p.replicas) if n is not None),
                            tuple(n for n in map(self.name_of, p.isr) if n is not None),
                        )
                        for p in info.partitions
                    }
            except Exception as exc:
                log.info("partition replicas lookup failed: %r", exc)
        return {}

    def partition_dir(self, name: str, partition: int) -> Path:
        from raftlog.node import PARTITIONS_DIR

        data_dir = self.nodes[name].dir / "data" / PARTITIONS_DIR
        return disk_damage.partition_dir(data_dir, self.opts.topic, partition)

    async def damage(self, name: str, partition: int, kind: str, rng: random.Random) -> str:
        """Stop `name`, damage its replica of `partition`, start it again. A flipped byte
        follows a clean shutdown half the time (its recovery point then covers the whole log,
        so only a read or the scrubber can find the flip, as a disk's bit rot is found) and a
        kill -9 otherwise (recovery scans from an older recovery point and may cut it)."""
        damage_fn = disk_damage.flip_byte if kind == "corrupt" else disk_damage.cut_mid_batch
        directory = self.partition_dir(name, partition)
        clean = kind == "corrupt" and rng.random() < 0.5
        if clean:
            await self.stop(name)
        else:
            await self.kill(name)
        try:
            done = await trio.to_thread.run_sync(damage_fn, directory, rng)
        finally:
            await self.start(name)
        if done is None:
            raise RuntimeError(f"{directory} holds no batch to damage")
        return done.describe() + (" after a clean shutdown" if clean else " after kill -9")

    def forger(self, rng: random.Random) -> Forger:
        addresses = {
            n.node_id: (n.address, INTERNAL_PORT)
            for n in self.nodes.values()
            if n.name in self.names
        }
        target = Target(sorted(addresses), self.opts.topic, self.opts.partitions)
        # Under mutual TLS the rogue, holding no certificate, speaks plain TCP to a TLS port.
        return Forger(addresses, target, rng, tls=self.secure is not None)

    def _live_bootstrap(self) -> str:
        core = [self.nodes[name] for name in self.names]
        live = [n for n in core if n.running and not n.paused]
        return ",".join(f"{n.address}:{CLIENT_PORT}" for n in live or core)

    async def accepting(self, name: str) -> bool:
        """Whether the node's client port accepts a TCP connection right now."""
        with trio.move_on_after(CONNECT_PROBE_TIMEOUT_S):
            try:
                stream = await trio.open_tcp_stream(self.nodes[name].address, CLIENT_PORT)
            except OSError:
                return False
            await stream.aclose()
            return True
        return False

    async def create_topic(self) -> None:
        """Create the workload's topic; an existing one (a retry after a timeout) is fine.
        A secure cluster also gets the workload user's ACLs (creating one again is fine)."""
        from raftlog.client import Admin, NewTopic
        from raftlog.client.cluster import open_cluster
        from raftlog.errors import ErrorCode, KafkaError

        topic = NewTopic(
            self.opts.topic,
            self.opts.partitions,
            min(self.opts.replication_factor, self.opts.nodes),
            configs=self.opts.topic_configs(),
        )
        with trio.fail_after(ADMIN_TIMEOUT_S * 2):
            async with open_cluster(
                self._live_bootstrap(), security=self.client_security
            ) as client:
                admin = Admin(client)
                results = await admin.create_topics([topic])
                acls = []
                if self.secure is not None:
                    acls = await admin.create_acls(SecureSetup.workload_acls(self.opts.topic))
        result = results[self.opts.topic]
        if result.error not in (ErrorCode.none, ErrorCode.topic_already_exists):
            raise KafkaError(result.error, f"create topic {self.opts.topic}: {result.message}")
        for acl in acls:
            if acl.error != ErrorCode.none:
                raise KafkaError(acl.error, f"create the workload's ACLs: {acl.message}")

    async def wait_ready(self, timeout_s: float, *, topic: bool = True) -> None:
        """Wait until every running node accepts clients, the quorum has a leader and (with
        ``topic``) every partition of the run's topic has a leader. Raises TimeoutError
        naming what was still missing."""
        missing = "nothing checked yet"
        with trio.move_on_after(timeout_s):
            while True:
                missing = await self._not_ready(topic)
                if not missing:
                    return
                await trio.sleep(PROBE_INTERVAL_S)
        raise TimeoutError(f"cluster not ready after {timeout_s} s: {missing}")

    async def _not_ready(self, topic: bool) -> str:
        # The spare is no part of a ready cluster: stopped, or an observer at most.
        for node in (self.nodes[name] for name in self.names):
            if node.process is not None and node.process.returncode is not None:
                return f"{node.name} exited with {node.process.returncode} (see {node.log_path})"
            if node.running and not await self.accepting(node.name):
                return f"{node.name} does not accept connections on {node.address}:{CLIENT_PORT}"
        if await self.controller_leader() is None:
            return "no metadata quorum leader"
        if topic:
            leaders = await self.partition_leaders()
            without = sorted(set(range(self.opts.partitions)) - set(leaders))
            if without:
                return f"partitions {without} of {self.opts.topic} have no leader"
        return ""
