"""The trio driver of one node: listeners, metadata quorum, broker roles, clean shutdown.

A node is a thin shell: every decision lives in a sans-IO core (Raft, controller, partition
replication, groups, quotas) or in storage; this module opens the data directory, starts each
component in one nursery with `nursery.start` (so a component that fails to start stops the
node with its error), routes internal RPC methods, and on SIGTERM/SIGINT shuts down in order:
controlled shutdown (leadership moves away), Raft resignation, then cancellation.
"""

from __future__ import annotations

import functools
import gc
import logging
import signal
import ssl
import sys
import uuid
from typing import Any

import trio

from raftlog.broker import BrokerBackend
from raftlog.clock import clock_ms, wall_clock_ms
from raftlog.codec import DecodeError
from raftlog.config import NodeConfig
from raftlog.config_listeners import Listener, parse_bootstrap_scram
from raftlog.errors import (
    ConfigError,
    ErrorCode,
    KafkaError,
    LocalError,
    exception_leaves,
)
from raftlog.groups.node_service import NodeGroupService
from raftlog.metadata.controller import messages as cm
from raftlog.metadata.controller.broker_lifecycle import BrokerLifecycle, ControllerClient
from raftlog.metadata.controller.liveness import BrokerReachability
from raftlog.metadata.raft.describe import QuorumDescription
from raftlog.metadata.raft.describe import describe as describe_core
from raftlog.metadata.raft.driver import QuorumDriver
from raftlog.metadata.raft.log_store import MetadataLogStore, MetadataRecoveryError
from raftlog.metadata.raft.messages import CODEC
from raftlog.metadata.raft.types import NotLeader, RoleChange
from raftlog.metadata.service import MetadataService
from raftlog.metrics.node import node_metrics, run_metrics
from raftlog.net.kafka.apis import default_registry
from raftlog.net.kafka.handlers_groups import register_group_apis
from raftlog.net.kafka.handlers_quorum import register_quorum_apis
from raftlog.net.kafka.handlers_security import register as register_security_apis
from raftlog.net.kafka.handlers_txn import register_txn_apis
from raftlog.net.kafka.server import ListenerSecurity
from raftlog.net.kafka.server import serve as serve_kafka
from raftlog.net.limits import ListenerGuard, ListenerLimits
from raftlog.net.rpc import (
    PeerSet,
    RpcError,
    RpcLimits,
    identify_by_certificate,
    serve_rpc,
)
from raftlog.quotas.broker_hook import BrokerQuotas
from raftlog.quotas.manager import QuotaLimits
from raftlog.replication.manager import ReplicaManager
from raftlog.security import principal as principals
from raftlog.security import tls
from raftlog.security.acl import ScramMechanism
from raftlog.storage.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from raftlog.storage.manager import LogManager
from raftlog.txn.node_service import NodeTxnService, start_node_txn_service

log = logging.getLogger("raftlog.node")
kafka_log = logging.getLogger("raftlog.kafka")

META_FILE = "meta.checkpoint"
DATA_DIR_VERSION = 1
# Upper bound for the controlled shutdown handshake before the node stops anyway.
CONTROLLED_SHUTDOWN_TIMEOUT_S = 15.0
# After resigning, give the event loop this long to put EndQuorumEpoch on the wire.
RESIGN_GRACE_S = 0.2
# Slack on top of the replica fetch long-poll before the RPC gives up on the leader.
REPLICA_FETCH_RPC_TIMEOUT_S = 10.0
PARTITIONS_DIR = "logs"
# The cyclic GC's young-generation threshold in a node process (CPython: 700). A full
# collection walks every tracked object; a node's start-up heap (modules, the metadata image,
# the logs) made each one a 50-120 ms stop of the event loop under produce load, a few times
# a minute. Frozen after start-up, that heap is never walked again, and a larger first
# threshold makes the (now small) collections rarer.
GC_GEN0_THRESHOLD = 20_000


class DataDirError(LocalError):
    """The data directory belongs to another node or cluster, or cannot be read."""


def format_data_dir(config: NodeConfig) -> str:
    """Create or check `meta.checkpoint`; returns the cluster id. Node id and cluster id are
    fixed when a data directory is first used and checked at every later start."""
    data_dir = config.data_path
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / META_FILE
    if path.exists():
        try:
            meta = read_checkpoint(path, "node-meta")
        except CheckpointError as exc:
            raise DataDirError(f"{path}: {exc}") from None
        if meta["node_id"] != config.node_id:
            raise DataDirError(
                f"{data_dir} was formatted for node {meta['node_id']}, but "
                f"this config says node_id = {config.node_id}"
            )
        if config.cluster_id and meta["cluster_id"] != config.cluster_id:
            raise DataDirError(
                f"{data_dir} belongs to cluster {meta['cluster_id']!r}, but "
                f"this config says cluster_id = {config.cluster_id!r}"
            )
        return str(meta["cluster_id"])
    cluster_id = config.cluster_id
    if not cluster_id:
        cluster_id = uuid.uuid4().hex
        if len(config.voters) > 1:
            log.warning(
                "no cluster_id configured: generated %s; every node of a multi-node "
                "cluster must be given the same cluster_id",
                cluster_id,
            )
    write_checkpoint(
        path,
        "node-meta",
        {"node_id": config.node_id, "cluster_id": cluster_id, "version": DATA_DIR_VERSION},
    )
    log.info("formatted %s for node %d of cluster %s", data_dir, config.node_id, cluster_id)
    return cluster_id


class Node:
    """Everything one `raftlog node` process runs."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.cluster_id = ""
        self.ready = trio.Event()  # set when every listener is up
        self.metadata: MetadataService | None = None
        self.quorum: QuorumDriver | None = None
        self.lifecycle: BrokerLifecycle | None = None
        # A controller-only node's watch of brokers' listeners (a broker's lifecycle has one).
        self.reachability: BrokerReachability | None = None
        self.controller_client: ControllerClient | None = None
        self.replicas: ReplicaManager | None = None
        self.backend: BrokerBackend | None = None
        self.log_manager: LogManager | None = None
        self.quotas: BrokerQuotas | None = None
        self.groups: NodeGroupService | None = None
        self.txn: NodeTxnService | None = None
        self.metrics = node_metrics()
        self.rpc_port = 0
        self.kafka_port = 0  # the first listener's (the default endpoint)
        self.kafka_ports: dict[str, int] = {}  # listener name -> bound port
        self._rpc_methods: dict[str, Any] = {}
        self._own_endpoints: dict[str, tuple[str, int]] = {}  # listener -> advertised
        # Methods whose handler acts for the node the connection speaks for: handler(node
        # id bound to the connection, body).
        self._rpc_node_methods: dict[str, Any] = {}

    async def run(self, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED) -> None:
        config = self.config
        fresh_data_dir = not (config.data_path / META_FILE).exists()
        self.cluster_id = await trio.to_thread.run_sync(format_data_dir, config)
        limits = RpcLimits(
            max_frame_bytes=config.internal_frame_max_bytes,
            listener=ListenerLimits.from_node_config(config),
        )
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            # One group-commit flusher for every log of the node, metadata included.
            self.log_manager = LogManager(config.data_path / PARTITIONS_DIR, config)
            flusher = self.log_manager.flusher
            await nursery.start(flusher.run)
            internal_server_tls, internal_client_tls = _internal_tls_contexts(config)
            peers = PeerSet(config.node_id, limits, ssl_context=internal_client_tls)
            await nursery.start(peers.run)
            self.peers = peers

            store = await trio.to_thread.run_sync(
                functools.partial(MetadataLogStore, config.data_path, now_ms=wall_clock_ms())
            )
            self.metadata = MetadataService(config, self.cluster_id)
            self.controller_client = ControllerClient(config, peers, self.metadata)
            self.quorum = QuorumDriver(
                config,
                store,
                flusher,
                peers,
                on_commit=self.metadata.on_commit,
                on_snapshot=self.metadata.on_snapshot,
                on_role_change=self._on_role_change,
                metrics=self.metrics.raft,
            )
            self.metadata.attach(self.quorum)
            self._rpc_node_methods["controller"] = self.controller_client.serve
            self._rpc_methods["quorum.describe"] = self._describe_quorum_locally

            host, port = config.internal_address
            listeners = await nursery.start(
                functools.partial(
                    serve_rpc,
                    self._dispatch_rpc,
                    host,
                    port,
                    limits=limits,
                    ssl_context=internal_server_tls,
                    identify=identify_by_certificate if internal_server_tls is not None else None,
                )
            )
            self.rpc_port = listeners[0].socket.getsockname()[1]
            await nursery.start(self.metadata.run)
            await nursery.start(self.quorum.run)
            await nursery.start(run_metrics, self)

            if config.is_broker:
                await self._start_broker(nursery, flusher)
                if fresh_data_dir and config.bootstrap_scram_credentials:
                    nursery.start_soon(self._seed_scram_users)
            else:
                # A broker's lifecycle runs it; a controller-only node still sees (and, when
                # active, acts on) brokers whose listeners refuse it.
                self.reachability = BrokerReachability(
                    config.node_id, self.peers, self.metadata, config
                )
                await nursery.start(self.reachability.run)

            log.info(
                "node %d up: roles %s, internal %s:%d, client port %s, cluster %s",
                config.node_id,
                ",".join(config.roles),
                host,
                self.rpc_port,
                self.kafka_port or "-",
                self.cluster_id,
            )
            self.ready.set()
            task_status.started(self)

    def _on_role_change(self, change: RoleChange) -> None:
        assert self.metadata is not None and self.controller_client is not None
        self.metadata.on_role_change(change)
        # Controller requests in flight to a former leader go to the new one at once.
        self.controller_client.leader_changed(change.leader_id)

    async def _start_broker(self, nursery: trio.Nursery, flusher: Any) -> None:
        config = self.config
        assert self.metadata is not None and self.controller_client is not None
        assert self.log_manager is not None
        await self.log_manager.open_all_async(now_ms=wall_clock_ms())
        self.lifecycle = BrokerLifecycle(config, self.controller_client, self.metadata)
        controller_client = self.controller_client

        async def alter_partition(request: Any) -> Any:
            return await controller_client.call(request)

        self.replicas = ReplicaManager(
            config.node_id,
            config,
            self.log_manager,
            flusher,
            alter_partition=alter_partition,
            send_fetch=self._send_replica_fetch,
            clock_ms=clock_ms,
            log_cleanup_interval_ms=config.log_retention_check_interval_ms,
            # Stray logs are removed only once this incarnation's registration is unfenced,
            # i.e. the broker has caught up with the metadata log.
            incarnation_id=self.lifecycle.incarnation_id,
            metrics=self.metrics.replication,
        )
        await nursery.start(self.replicas.run)
        self.lifecycle.unsafe_partitions = self.replicas.unsafe_partitions
        self._rpc_node_methods["replica.fetch"] = self.replicas.reads.handle_replica_fetch
        self.metadata.add_listener(self.replicas.apply_metadata)
        self.quotas = BrokerQuotas(QuotaLimits.from_node_config(config), clock_ms)
        self.metadata.add_listener(self.quotas.on_metadata)
        self._rpc_methods["quotas.usage"] = self.quotas.usage_rows
        self.backend = BrokerBackend(
            config,
            self.metadata,
            self.controller_client,
            self.lifecycle,
            self.replicas,
        )
        # The group coordinator follows the replica manager: it reads the offsets partitions
        # the manager has just become leader of.
        self.groups = NodeGroupService(
            config, self.metadata, self.controller_client, self.replicas, clock_ms
        )
        await nursery.start(self.groups.run)
        self.metadata.add_listener(self.groups.on_metadata)
        # Likewise for `__transaction_state`; it also verifies transactional produces (KIP-890).
        self.txn = await start_node_txn_service(
            nursery,
            config,
            self.metadata,
            controller_client,
            self.lifecycle,
            self.replicas,
            self.peers,
            self._rpc_node_methods,
            self.groups.shell.complete_transaction,
        )
        registry = default_registry()
        register_group_apis(registry, self.groups, self.txn)
        register_txn_apis(registry, self.txn)
        register_security_apis(registry)
        if self.quorum is not None:
            # DescribeQuorum (v0-2) and KIP-853 membership; not in apis.VERSION_TABLE
            # because they need the quorum driver.
            register_quorum_apis(
                registry, self.quorum, self.describe_quorum_description, self.cluster_id
            )
        # One server per listener; each answers Metadata with its own listener's endpoints.
        endpoints = self._listener_endpoint if config.listeners.strip() else None
        self._own_endpoints = {b.name: (b.host, b.port) for b in config.advertised_client_listeners}
        # One guard for every Kafka listener: queued_max_request_bytes and the connection
        # caps bound the node's client traffic, however many listeners carry it.
        guard = ListenerGuard("Kafka", ListenerLimits.from_node_config(config), kafka_log)
        for listener in config.client_listeners:
            bound = await nursery.start(
                functools.partial(
                    serve_kafka,
                    self.backend,
                    listener.host,
                    listener.port,
                    config,
                    registry=registry,
                    quotas=self.quotas,
                    guard=guard,
                    security=_listener_security(config, listener),
                    endpoints=endpoints,
                    metrics=self.metrics.requests,
                )
            )
            self.kafka_ports[listener.name] = bound[0].socket.getsockname()[1]
        self.kafka_port = next(iter(self.kafka_ports.values()))
        await nursery.start(self.lifecycle.run)

    def _listener_endpoint(self, listener_name: str, broker_id: int) -> tuple[str, int] | None:
        assert self.metadata is not None
        registration = self.metadata.image.brokers.get(broker_id)
        if registration is None:
            return None
        if not registration.listeners and broker_id == self.config.node_id:
            # This node knows its own listeners even when its registration does not list
            # them (registered before it had several).
            return self._own_endpoints.get(listener_name)
        return registration.listener_endpoint(listener_name)

    async def _seed_scram_users(self) -> None:
        """bootstrap_scram_credentials: once caught up, create each user the cluster lacks.

        Only a node starting on a new data directory does this (a new cluster, where nobody
        can log in to create the first user), so a user deleted later is not brought back
        by a restart. Several new nodes may write the same user; each write is whole."""
        assert self.lifecycle is not None and self.backend is not None
        assert self.metadata is not None
        await self.lifecycle.unfenced.wait()
        held = self.metadata.image.scram_credentials
        upsertions = [
            cm.ScramCredentialUpsertion(
                c.user, int(mechanism), c.iterations, c.salt, c.salted_password
            )
            for c in parse_bootstrap_scram(self.config.bootstrap_scram_credentials)
            if (c.user, mechanism := ScramMechanism[c.mechanism.replace("-", "_")]) not in held
        ]
        if not upsertions:
            return
        try:
            results = await self.backend.alter_user_scram_credentials((), upsertions)
        except KafkaError as exc:
            log.warning("bootstrap_scram_credentials not written: %s", exc)
            return
        for result in results:
            if result.error == ErrorCode.none:
                log.info("bootstrap_scram_credentials: created SCRAM user %s", result.user)
            else:
                log.warning(
                    "bootstrap_scram_credentials: user %s refused: %s %s",
                    result.user,
                    result.error.name,
                    result.message or "",
                )

    async def _send_replica_fetch(self, leader_id: int, body: dict) -> dict:
        assert self.metadata is not None
        registration = self.metadata.image.brokers.get(leader_id)
        if registration is None:
            raise KafkaError(ErrorCode.broker_not_available, f"unknown broker {leader_id}")
        # A voter is reached at its controller_quorum_voters address, as the Raft driver and
        # the controller client reach it: PeerSet keeps one client per node and re-creates it
        # whenever a caller names another address, so mixing the two spellings of one node
        # ("localhost" there, "127.0.0.1" registered) would drop the connection every time.
        address = self.config.voters.get(leader_id) or registration.internal_endpoint
        peer = self.peers.peer(leader_id, *address)
        return await peer.call("replica.fetch", body, timeout_s=REPLICA_FETCH_RPC_TIMEOUT_S)

    async def describe_quorum_description(self) -> QuorumDescription:
        """DescribeQuorum (with KIP-853's endpoints): answered by the Raft leader, forwarded
        there by other nodes. Raises NotLeader when there is no leader to ask."""
        assert self.quorum is not None
        core = self.quorum.core
        local = describe_core(core, clock_ms(), wall_clock_ms())
        if local is not None:
            return local
        leader = core.leader_id
        address = None
        if leader is not None:
            address = self.config.voters.get(leader) or self.quorum.address_of(leader)
        # The epoch in these NotLeader errors is unknown (-1): the callers only need the code.
        if leader is None or address is None:
            raise NotLeader(leader, -1)
        try:
            wire = await self.peers.peer(leader, *address).call("quorum.describe", None)
            if wire is None:
                raise NotLeader(None, -1)  # it stopped leading meanwhile
            described: QuorumDescription = CODEC.from_wire(QuorumDescription, wire)
        except (RpcError, DecodeError) as exc:
            log.info("describing the quorum through leader %s failed: %s", leader, exc)
            raise NotLeader(leader, -1) from None
        return described

    async def _describe_quorum_locally(self, _body: Any) -> list[Any] | None:
        """The "quorum.describe" call: the leader's QuorumDescription, None elsewhere."""
        assert self.quorum is not None
        described = describe_core(self.quorum.core, clock_ms(), wall_clock_ms())
        if described is None:
            return None
        wire: list[Any] = CODEC.to_wire(described)
        return wire

    async def _dispatch_rpc(self, sender_id: int, method: str, body: Any) -> Any:
        if method == "raft":
            assert self.quorum is not None
            self.quorum.receive(sender_id, body)
            return None
        node_handler = self._rpc_node_methods.get(method)
        if node_handler is not None:
            return await node_handler(sender_id, body)
        handler = self._rpc_methods.get(method)
        if handler is None:
            raise ValueError(f"unknown internal method {method!r}")
        return await handler(body)

    async def shutdown(self) -> None:
        """Controlled shutdown, then Raft resignation, then stop every task."""
        if self.lifecycle is not None:
            log.info("controlled shutdown: moving leadership away")
            moved = await self.lifecycle.controlled_shutdown(CONTROLLED_SHUTDOWN_TIMEOUT_S)
            if not moved:
                log.warning(
                    "controlled shutdown not confirmed within %.0f s; stopping anyway",
                    CONTROLLED_SHUTDOWN_TIMEOUT_S,
                )
        if self.quorum is not None and self.quorum.core.role.name == "leader":
            log.info("resigning metadata leadership")
            self.quorum.resign()
            await trio.sleep(RESIGN_GRACE_S)
        self._nursery.cancel_scope.cancel()

    def close(self) -> None:
        if self.quorum is not None:
            self.quorum.close()
        if self.log_manager is not None:
            self.log_manager.close_all()


def _listener_security(config: NodeConfig, listener: Listener) -> ListenerSecurity:
    """How one Kafka listener authenticates: its TLS context, certificate principals, SASL."""
    ssl_context = None
    principal_of_certificate = None
    if listener.tls:
        ssl_context = tls.server_context(
            certfile=config.ssl_certificate_location,
            keyfile=config.ssl_key_location,
            cafile=config.ssl_ca_location or None,
            # KIP-684: ssl.client.auth is for SSL listeners; SASL_SSL clients log in with SASL.
            client_auth=config.ssl_client_auth if listener.security_protocol == "SSL" else "none",
            key_password=config.ssl_key_password or None,
        )
        try:
            rules = principals.PrincipalMappingRules.parse(config.ssl_principal_mapping_rules)
        except ValueError as exc:
            raise ConfigError(f"ssl_principal_mapping_rules: {exc}") from None
        principal_of_certificate = functools.partial(
            principals.principal_from_certificate, rules=rules
        )
    return ListenerSecurity(
        name=listener.name,
        security_protocol=listener.security_protocol,
        ssl_context=ssl_context,
        principal_of_certificate=principal_of_certificate,
        sasl_mechanisms=config.sasl_mechanisms if listener.sasl else (),
        connections_max_reauth_ms=config.connections_max_reauth_ms,
        handshake_timeout_ms=config.request_read_timeout_ms,
    )


def _internal_tls_contexts(
    config: NodeConfig,
) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """(server, client) contexts of internal mutual TLS, or (None, None) for PLAINTEXT.

    The client side checks the peer's node id (net/tls.py), not its host name: node
    certificates need not list every address nodes are configured with."""
    if not config.internal_tls:
        return None, None
    certfile, keyfile = config.ssl_certificate_location, config.ssl_key_location
    password = config.ssl_key_password or None
    server = tls.server_context(
        certfile=certfile,
        keyfile=keyfile,
        cafile=config.ssl_ca_location,
        client_auth="required",
        key_password=password,
    )
    client = tls.client_context(
        cafile=config.ssl_ca_location,
        certfile=certfile,
        keyfile=keyfile,
        check_hostname=False,
        key_password=password,
    )
    return server, client


async def _serve_until_signalled(config: NodeConfig) -> None:
    node = Node(config)
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(node.run)
                settle_gc()

                async def on_signal() -> None:
                    async for signum in signals:
                        log.info("received %s: shutting down", signal.Signals(signum).name)
                        with trio.move_on_after(CONTROLLED_SHUTDOWN_TIMEOUT_S + 5):
                            await node.shutdown()
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(on_signal)
    finally:
        node.close()
    log.info("node %d stopped", config.node_id)


def settle_gc() -> None:
    """Move what start-up allocated out of the cyclic GC's reach (gc.freeze) and make young
    collections rarer: a node process's tail latency is otherwise set by full collections."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def setup_logging(level: str, node_id: int) -> None:
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format=f"%(asctime)s %(levelname)-7s node{node_id} %(name)s: %(message)s",
        stream=sys.stderr,
    )


def run_node(config: NodeConfig, *, log_level: str = "INFO") -> int:
    """Run a node in this process until a signal stops it; returns the exit code."""
    setup_logging(log_level, config.node_id)
    exit_code = 0
    try:
        trio.run(_serve_until_signalled, config)
    except* (ConfigError, DataDirError, MetadataRecoveryError, CheckpointError) as group:
        # Bad config or data on disk the node will not guess about: one clear line, exit 2.
        for exc in exception_leaves(group):
            log.error("%s", exc)
        exit_code = 2
    except* KeyboardInterrupt:
        exit_code = 130
    return exit_code
