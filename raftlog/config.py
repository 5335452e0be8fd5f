"""Typed node configuration, loaded from TOML and validated with clear errors.

Every key is a dataclass field with a default, a unit in its name and a one-line doc; the docs
feed `raftlog node --help` and docs/operations.md, so a key is documented where it is defined.
Keys are flat (one TOML table) and spelled like Kafka's with underscores.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raftlog.codec import I32_MAX
from raftlog.config_listeners import (
    DEFAULT_LISTENER_NAME,
    INTERNAL_SECURITY_PROTOCOLS,
    SSL_CLIENT_AUTH,
    STANDARD_AUTHORIZER_NAMES,
    Listener,
    parse_bootstrap_scram,
    parse_host_port,
    parse_listeners,
    parse_protocol_map,
    parse_sasl_mechanisms,
    parse_super_users,
)
from raftlog.constants import FRAME_SIZE_PREFIX_BYTES, GIB, MAX_RACK_CHARS, MIB
from raftlog.errors import ConfigError

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS

ROLES = ("controller", "broker")
FLUSH_POLICIES = ("always", "interval")
CLEANUP_POLICIES = ("delete", "compact")
GROUP_CONSUMER_ASSIGNORS = ("uniform", "range")


def _key(
    default: Any,
    doc: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    choices: tuple[str, ...] | None = None,
) -> Any:
    meta = {"doc": doc, "lo": lo, "hi": hi, "choices": choices}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def parse_voters(value: str) -> dict[int, tuple[str, int]]:
    """Parse Kafka's `controller.quorum.voters` form: "1@host:port,2@host:port"."""
    voters: dict[int, tuple[str, int]] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        node_text, at, address = item.partition("@")
        if not at or not node_text.isdigit():
            raise ConfigError(
                f"controller_quorum_voters: expected ID@HOST:PORT entries, got {item!r}"
            )
        node_id = int(node_text)
        if node_id in voters:
            raise ConfigError(f"controller_quorum_voters: node {node_id} is listed twice")
        voters[node_id] = parse_host_port(address, f"controller_quorum_voters[{node_id}]")
    return voters


@dataclass(frozen=True)
class NodeConfig:
    # -- identity and layout
    node_id: int = _key(
        1, "This node's id, unique in the cluster; fixed at format time.", lo=0, hi=I32_MAX
    )
    roles: list[str] = _key(
        ["controller", "broker"],
        "Roles of this node: 'controller' (metadata voter), 'broker', or both.",
    )
    data_dir: str = _key(
        "./data",
        "Directory holding the metadata log, partition logs and "
        "checkpoints (created on first start).",
    )
    cluster_id: str = _key(
        "",
        "Cluster id; empty means generated on first start. A data dir "
        "formatted for another cluster id refuses to start.",
    )
    broker_rack: str = _key(
        "",
        "Kafka's broker.rack: the rack (or zone) this broker is in; empty means none. Replica "
        "placement spreads a partition's replicas over racks.",
    )
    # -- listeners
    client_listener: str = _key("127.0.0.1:9092", "HOST:PORT of the Kafka protocol listener.")
    advertised_client_listener: str = _key(
        "", "HOST:PORT clients are told to use; empty means client_listener."
    )
    internal_listener: str = _key(
        "127.0.0.1:19092", "HOST:PORT of the internal (Raft and replication, msgpack) listener."
    )
    advertised_internal_listener: str = _key(
        "",
        "HOST:PORT other nodes are told to use for the internal listener (broker "
        "registration, observer replies); empty means internal_listener. Set it when "
        "internal_listener binds 0.0.0.0.",
    )
    metrics_listener: str = _key(
        "",
        "HOST:PORT of the Prometheus endpoint (GET /metrics, plain HTTP; bind it to a private "
        "address). Empty: no endpoint.",
    )
    listeners: str = _key(
        "",
        "Kafka listeners as NAME://HOST:PORT,... (Kafka's listeners; an empty host binds every "
        "interface); each name's security protocol comes from listener_security_protocol_map. "
        "Empty means one PLAINTEXT listener at client_listener.",
    )
    advertised_listeners: str = _key(
        "",
        "NAME://HOST:PORT,... clients are told to use, per listener name; a listener not "
        "named here is advertised at its bind address. Metadata answers a client with the "
        "endpoints of the listener its request came in on.",
    )
    listener_security_protocol_map: str = _key(
        "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
        "Listener name -> security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL) as "
        "NAME:PROTOCOL,...; Kafka's default map.",
    )
    internal_security_protocol: str = _key(
        "PLAINTEXT",
        "Security of the internal listener and of this node's connections to other nodes: "
        "PLAINTEXT, or SSL = mutual TLS with the ssl_* certificate, key and CA. Under SSL a "
        "node certificate's subject CN must be node-<node id> (e.g. CN=node-2): a peer speaks "
        "only for the node its certificate names.",
        choices=INTERNAL_SECURITY_PROTOCOLS,
    )
    # -- TLS (PEM files: librdkafka's names, since Kafka's JKS/PKCS12 keystores are Java's)
    ssl_certificate_location: str = _key(
        "",
        "PEM certificate (chain) this node presents on SSL/SASL_SSL listeners and, with "
        "internal_security_protocol = SSL, to other nodes (librdkafka's name; Kafka's "
        "keystores are Java-only).",
    )
    ssl_key_location: str = _key("", "PEM private key of ssl_certificate_location.")
    ssl_key_password: str = _key(
        "", "Password of an encrypted ssl_key_location (empty: the key is not encrypted)."
    )
    ssl_ca_location: str = _key(
        "",
        "PEM CA certificate(s) that client and node certificates must chain to (empty: "
        "the system's default CAs for clients; required for internal mutual TLS).",
    )
    ssl_client_auth: str = _key(
        "none",
        "Client certificates on SSL listeners: 'none', 'requested' (checked if sent) or "
        "'required'. A verified certificate gives the connection its principal.",
        choices=SSL_CLIENT_AUTH,
    )
    ssl_principal_mapping_rules: str = _key(
        "DEFAULT",
        "Kafka's ssl.principal.mapping.rules: RULE:pattern/replacement/[LU],...,DEFAULT "
        "mapping a client certificate's distinguished name to a user name.",
    )
    # -- SASL
    sasl_enabled_mechanisms: str = _key(
        "SCRAM-SHA-256,SCRAM-SHA-512",
        "SASL mechanisms offered on SASL_PLAINTEXT/SASL_SSL listeners, comma-separated: "
        "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512. Kafka's default GSSAPI is not implemented; "
        "PLAIN sends the password itself, so it is left out unless asked for (use it under "
        "SASL_SSL only).",
    )
    connections_max_reauth_ms: int = _key(
        0,
        "KIP-368: a SASL session lasts at most this long; the client must re-authenticate "
        "(as the same principal) before it ends or its connection is closed. 0: no limit.",
        lo=0,
        hi=2**62,
    )
    bootstrap_scram_credentials: str = _key(
        "",
        "SCRAM users to create in a new cluster, so the first one can log in: entries of "
        "kafka-storage format --add-scram's syntax, SCRAM-SHA-512=[name=admin,iterations=8192,"
        'salt="<base64>",saltedpassword="<base64>"], separated by \';\' (salted; never the '
        "password). A node whose data directory is new writes each one the cluster lacks "
        "once it has caught up with the metadata; later starts never do.",
    )
    # -- authorization
    authorizer_class_name: str = _key(
        "",
        "'' (no authorization) or StandardAuthorizer (also accepted by Kafka's full name "
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer): ACLs decide every request.",
    )
    super_users: str = _key(
        "", "Principals every ACL check allows, as Kafka's super.users: User:alice;User:bob."
    )
    allow_everyone_if_no_acl_found: bool = _key(
        False, "With the authorizer on: allow access to a resource no ACL matches."
    )
    controller_quorum_voters: str = _key(
        "1@127.0.0.1:19092",
        "Metadata quorum voters as ID@HOST:PORT,... using their internal listeners.",
    )
    # -- metadata quorum (Raft)
    election_timeout_ms: int = _key(
        1000,
        "Kafka's quorum.election.timeout.ms: how long a candidate waits for its votes before "
        "it tries again, randomized in [t, 2t).",
        lo=10,
        hi=600_000,
    )
    fetch_timeout_ms: int = _key(
        2000,
        "Kafka's quorum.fetch.timeout.ms: the longest a voter waits to hear from its leader "
        "before a pre-vote (drawn after each answer from [3/4 of it, it], never below "
        "broker_session_timeout_ms), and a leader that has not heard fetches from a majority "
        "for this long resigns (check-quorum).",
        lo=20,
        hi=600_000,
    )
    election_backoff_max_ms: int = _key(
        1000,
        "Kafka's quorum.election.backoff.max.ms: the upper bound of the random wait after a "
        "lost or split election.",
        lo=1,
        hi=600_000,
    )
    raft_fetch_max_wait_ms: int = _key(
        500,
        "How long the Raft leader parks a follower fetch that has nothing new.",
        lo=0,
        hi=60_000,
    )
    metadata_snapshot_max_records: int = _key(
        20_000, "Write a metadata snapshot after this many committed records.", lo=10, hi=10**9
    )
    broker_session_timeout_ms: int = _key(
        1500,
        "A broker whose heartbeats stop for this long is fenced and its partitions get new "
        "leaders (Kafka: 9000). The broker counts the same session from its side and stops "
        "acting as a leader when it lapses, so a broker cut off from the controller hands "
        "over within it. The failover time after a network cut is about this long; a stall "
        "of either event loop longer than it fences a live broker.",
        lo=100,
        hi=3_600_000,
    )
    broker_heartbeat_interval_ms: int = _key(
        250,
        "Interval between broker heartbeats (Kafka: 2000). Short, so that a broker whose "
        "listener refuses connections is known to have missed one within "
        "broker_unreachable_fence_ms of it, and a session of broker_session_timeout_ms "
        "spans several heartbeats.",
        lo=10,
        hi=600_000,
    )
    broker_unreachable_fence_ms: int = _key(
        250,
        "The active controller fences a broker whose internal listener has refused every "
        "connection attempt for this long, with no heartbeat from it since and one overdue "
        "by this long: a killed broker's process is gone long before its session expires "
        "(timeouts are left to the session). A value at or above broker_session_timeout_ms "
        "leaves fencing to the session alone.",
        lo=0,
        hi=3_600_000,
    )
    # -- log
    segment_bytes: int = _key(
        1 * GIB, "Roll a segment when it reaches this size.", lo=14, hi=2 * GIB - 1
    )
    segment_ms: int = _key(
        7 * DAY_MS, "Roll a segment this old even if it is small.", lo=1, hi=2**62
    )
    index_interval_bytes: int = _key(
        4096, "Bytes of log between two offset-index entries.", lo=0, hi=I32_MAX
    )
    retention_ms: int = _key(
        7 * DAY_MS, "Delete segments older than this (-1: forever).", lo=-1, hi=2**62
    )
    retention_bytes: int = _key(
        -1, "Delete oldest segments above this size per partition (-1: unlimited).", lo=-1, hi=2**62
    )
    log_retention_check_interval_ms: int = _key(
        300_000,
        "How often retention and compaction run over hosted logs "
        "(Kafka's log.retention.check.interval.ms).",
        lo=10,
        hi=I32_MAX,
    )
    cleanup_policy: str = _key(
        "delete", "Default cleanup policy of new topics.", choices=CLEANUP_POLICIES
    )
    delete_retention_ms: int = _key(DAY_MS, "How long compaction keeps tombstones.", lo=0, hi=2**62)
    flush_policy: str = _key(
        "always",
        "'always': fsync (group commit) before acknowledging; "
        "'interval': trust replication and fsync every flush_interval_ms.",
        choices=FLUSH_POLICIES,
    )
    flush_interval_ms: int = _key(
        1000, "fsync interval under flush_policy='interval'.", lo=1, hi=I32_MAX
    )
    log_scrub_bytes_per_s: int = _key(
        4 * MIB,
        "Rate at which the background scrubber re-reads segments to verify every batch's "
        "CRC (0 turns it off).",
        lo=0,
        hi=2**40,
    )
    # -- topics and replication
    num_partitions: int = _key(1, "Partitions of auto-created topics.", lo=1, hi=100_000)
    default_replication_factor: int = _key(
        1, "Replication factor of auto-created topics.", lo=1, hi=32
    )
    min_insync_replicas: int = _key(1, "Default min.insync.replicas of new topics.", lo=1, hi=32)
    unclean_leader_election: bool = _key(
        False, "Allow a replica outside the ISR to become leader (may lose acknowledged data)."
    )
    leader_imbalance_check_interval_ms: int = _key(
        300_000,
        "How often the controller moves leadership back to preferred replicas and elects "
        "leaders for offline partitions.",
        lo=100,
        hi=I32_MAX,
    )
    auto_create_topics_enable: bool = _key(
        True, "Create a topic when a client asks for its metadata."
    )
    replica_lag_time_max_ms: int = _key(
        30_000,
        "Drop a follower from the ISR when it has not caught up for this long.",
        lo=10,
        hi=I32_MAX,
    )
    replica_fetch_max_bytes: int = _key(
        1 * MIB, "Max bytes per partition in a replica fetch.", lo=1024, hi=I32_MAX
    )
    replica_fetch_wait_max_ms: int = _key(
        500, "How long a leader parks a replica fetch that has nothing new.", lo=0, hi=60_000
    )
    # -- requests and limits
    socket_request_max_bytes: int = _key(
        100 * MIB, "Largest Kafka request frame accepted.", lo=1024, hi=I32_MAX
    )
    internal_frame_max_bytes: int = _key(
        64 * MIB, "Largest internal RPC frame accepted.", lo=1024, hi=I32_MAX
    )
    max_inflight_requests_per_connection: int = _key(
        16, "Requests read from one connection before its responses are sent.", lo=1, hi=1024
    )
    queued_max_request_bytes: int = _key(
        256 * MIB,
        "Request bytes each listener (Kafka, internal) may hold read but not yet answered, "
        "across all its connections and counting partly read frames; above it reading "
        "pauses until answers free memory (Kafka's queued.max.request.bytes, bounded here).",
        lo=1024,
        hi=2**62,
    )
    connections_max_idle_ms: int = _key(
        600_000,
        "Close a connection that has sent no complete request for this long (time this "
        "node paused reading for queued_max_request_bytes does not count).",
        lo=1,
        hi=I32_MAX,
    )
    max_connections: int = _key(
        10_000,
        "Connections each listener accepts; a new one above it is closed at once.",
        lo=1,
        hi=I32_MAX,
    )
    max_connections_per_ip: int = _key(
        10_000,
        "Connections each listener accepts from one IP address; a new one above it is "
        "closed at once.",
        lo=1,
        hi=I32_MAX,
    )
    request_read_timeout_ms: int = _key(
        30_000,
        "Longest time from a request frame's first byte to its last (time paused by "
        "queued_max_request_bytes included); a slower frame is dropped and its connection "
        "closed.",
        lo=1,
        hi=I32_MAX,
    )
    request_timeout_ms: int = _key(
        30_000, "Upper bound for a parked produce (acks=all).", lo=1, hi=I32_MAX
    )
    fetch_max_bytes: int = _key(
        50 * MIB, "Max bytes in one consumer fetch response.", lo=1024, hi=I32_MAX
    )
    # -- groups
    offsets_topic_num_partitions: int = _key(6, "Partitions of __consumer_offsets.", lo=1, hi=1000)
    offsets_topic_replication_factor: int = _key(
        3, "Replication factor of __consumer_offsets (capped by brokers).", lo=1, hi=32
    )
    group_initial_rebalance_delay_ms: int = _key(
        0, "Delay before the first rebalance of a new group.", lo=0, hi=600_000
    )
    group_consumer_session_timeout_ms: int = _key(
        45_000,
        "Kafka's group.consumer.session.timeout.ms: a KIP-848 (group.protocol=consumer) member "
        "whose heartbeats stop for this long leaves its group.",
        lo=1_000,
        hi=3_600_000,
    )
    group_consumer_heartbeat_interval_ms: int = _key(
        5_000,
        "Kafka's group.consumer.heartbeat.interval.ms: how often KIP-848 members are told to "
        "heartbeat (below group_consumer_session_timeout_ms).",
        lo=100,
        hi=3_600_000,
    )
    group_consumer_assignors: list[str] = _key(
        ["uniform", "range"],
        "Kafka's group.consumer.assignors: the server-side assignors KIP-848 members may "
        "name, the first being the default (uniform, range).",
    )
    # -- transactions (Kafka's names; fewer partitions than Kafka's 50, as for offsets)
    transaction_state_log_num_partitions: int = _key(
        6, "Partitions of __transaction_state.", lo=1, hi=1000
    )
    transaction_state_log_replication_factor: int = _key(
        3, "Replication factor of __transaction_state (capped by brokers).", lo=1, hi=32
    )
    transaction_state_log_min_isr: int = _key(
        2, "min.insync.replicas of __transaction_state (capped by its factor).", lo=1, hi=32
    )
    transaction_max_timeout_ms: int = _key(
        900_000, "Longest transaction.timeout.ms a producer may ask for.", lo=1, hi=I32_MAX
    )
    # -- quotas
    quota_window_num: int = _key(11, "Samples kept per quota rate.", lo=2, hi=1000)
    quota_window_size_s: int = _key(1, "Length of one quota sample.", lo=1, hi=3600)

    # ---------------------------------------------------------------- derived views
    @property
    def is_controller(self) -> bool:
        return "controller" in self.roles

    @property
    def is_broker(self) -> bool:
        return "broker" in self.roles

    @property
    def client_address(self) -> tuple[str, int]:
        return parse_host_port(self.client_listener, "client_listener")

    @property
    def advertised_client_address(self) -> tuple[str, int]:
        value = self.advertised_client_listener or self.client_listener
        return parse_host_port(value, "advertised_client_listener")

    @property
    def internal_address(self) -> tuple[str, int]:
        return parse_host_port(self.internal_listener, "internal_listener")

    @property
    def advertised_internal_address(self) -> tuple[str, int]:
        value = self.advertised_internal_listener or self.internal_listener
        return parse_host_port(value, "advertised_internal_listener")

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        if not self.metrics_listener:
            return None
        return parse_host_port(self.metrics_listener, "metrics_listener")

    @property
    def protocol_map(self) -> dict[str, str]:
        return parse_protocol_map(self.listener_security_protocol_map)

    @property
    def client_listeners(self) -> tuple[Listener, ...]:
        """The Kafka listeners to bind, in configured order."""
        if not self.listeners.strip():
            host, port = self.client_address
            return (Listener(DEFAULT_LISTENER_NAME, host, port, "PLAINTEXT"),)
        protocols = self.protocol_map
        out = []
        for name, host, port in parse_listeners(self.listeners, "listeners"):
            if name not in protocols:
                raise ConfigError(
                    f"listeners: {name} has no entry in listener_security_protocol_map "
                    f"({self.listener_security_protocol_map!r})"
                )
            out.append(Listener(name, host, port, protocols[name]))
        return tuple(out)

    @property
    def advertised_client_listeners(self) -> tuple[Listener, ...]:
        """What clients are told, one per bound listener, same names and order."""
        bound = self.client_listeners
        if not self.listeners.strip():
            host, port = self.advertised_client_address
            advertised = {DEFAULT_LISTENER_NAME: (host, port)}
        else:
            advertised = {b.name: (b.host, b.port) for b in bound}
        names = {b.name for b in bound}
        for name, host, port in parse_listeners(self.advertised_listeners, "advertised_listeners"):
            if name not in names:
                raise ConfigError(
                    f"advertised_listeners: {name} is not one of the listeners "
                    f"({', '.join(sorted(names))})"
                )
            advertised[name] = (host, port)
        out = []
        for b in bound:
            host, port = advertised[b.name]
            if host in ("0.0.0.0", "::", ""):
                raise ConfigError(
                    f"listener {b.name} binds every interface ({host}); name the address "
                    f"clients should use in advertised_listeners"
                )
            out.append(Listener(b.name, host, port, b.security_protocol))
        return tuple(out)

    @property
    def sasl_mechanisms(self) -> tuple[str, ...]:
        return parse_sasl_mechanisms(self.sasl_enabled_mechanisms)

    @property
    def internal_tls(self) -> bool:
        return self.internal_security_protocol == "SSL"

    @property
    def authorizer_enabled(self) -> bool:
        return self.authorizer_class_name in STANDARD_AUTHORIZER_NAMES

    @property
    def super_user_principals(self) -> frozenset[str]:
        return parse_super_users(self.super_users)

    @functools.cached_property
    def voters(self) -> dict[int, tuple[str, int]]:
        # Parsed once per config: every replica fetch looks its leader's address up here.
        # Callers read it and never change it.
        return parse_voters(self.controller_quorum_voters)

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str = "config") -> NodeConfig:
        known = {f.name: f for f in dataclasses.fields(cls)}
        for name in values:
            if name not in known:
                hint = difflib.get_close_matches(name, known, n=1)
                suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
                raise ConfigError(f"{source}: unknown key {name!r}{suggestion}")
        for name, value in values.items():
            _check_value(known[name], value, source)
        config = cls(**values)
        config.validate(source)
        return config

    @classmethod
    def load(cls, path: str | Path) -> NodeConfig:
        path = Path(path)
        try:
            with path.open("rb") as handle:
                values = tomllib.load(handle)
        except FileNotFoundError:
            raise ConfigError(f"config file {str(path)!r} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        return cls.from_dict(values, source=str(path))

    def validate(self, source: str = "config") -> None:
        """Cross-key checks; single-key types and bounds are checked in from_dict."""
        if not self.roles or any(role not in ROLES for role in self.roles):
            raise ConfigError(
                f"{source}: roles must be a non-empty subset of {list(ROLES)}, got {self.roles!r}"
            )
        self.client_address  # noqa: B018 - parse for the error
        self.internal_address  # noqa: B018
        self.advertised_internal_address  # noqa: B018
        self.metrics_address  # noqa: B018
        voters = self.voters
        if not voters:
            raise ConfigError(f"{source}: controller_quorum_voters names no voter")
        if self.is_controller and self.node_id not in voters:
            raise ConfigError(
                f"{source}: node {self.node_id} has the controller role but is "
                f"not in controller_quorum_voters {sorted(voters)}"
            )
        if self.fetch_timeout_ms <= self.election_timeout_ms // 2:
            raise ConfigError(
                f"{source}: fetch_timeout_ms ({self.fetch_timeout_ms}) must be "
                f"more than half of election_timeout_ms"
            )
        largest_frame_bytes = max(self.socket_request_max_bytes, self.internal_frame_max_bytes)
        if self.queued_max_request_bytes < largest_frame_bytes + FRAME_SIZE_PREFIX_BYTES:
            raise ConfigError(
                f"{source}: queued_max_request_bytes ({self.queued_max_request_bytes}) must "
                f"hold the largest frame: at least {largest_frame_bytes + FRAME_SIZE_PREFIX_BYTES}"
                f" (socket_request_max_bytes or internal_frame_max_bytes, plus its "
                f"{FRAME_SIZE_PREFIX_BYTES}-byte size prefix)"
            )
        if len(self.broker_rack) > MAX_RACK_CHARS or not self.broker_rack.isprintable():
            raise ConfigError(
                f"{source}: broker_rack must be at most {MAX_RACK_CHARS} printable characters"
            )
        if self.group_consumer_heartbeat_interval_ms >= self.group_consumer_session_timeout_ms:
            raise ConfigError(
                f"{source}: group_consumer_heartbeat_interval_ms must be below "
                "group_consumer_session_timeout_ms"
            )
        assignors = self.group_consumer_assignors
        if not assignors or not set(assignors) <= set(GROUP_CONSUMER_ASSIGNORS):
            raise ConfigError(
                f"{source}: group_consumer_assignors must name some of "
                f"{list(GROUP_CONSUMER_ASSIGNORS)}, got {assignors!r}"
            )
        if self.broker_heartbeat_interval_ms >= self.broker_session_timeout_ms:
            raise ConfigError(
                f"{source}: broker_heartbeat_interval_ms must be below broker_session_timeout_ms"
            )
        try:
            self._validate_security()
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    def _validate_security(self) -> None:
        """Listeners, TLS files, SASL mechanisms and the authorizer keys, checked together."""
        self.protocol_map  # noqa: B018 - parse for the error
        if self.advertised_listeners.strip() and not self.listeners.strip():
            for name, _, _ in parse_listeners(self.advertised_listeners, "advertised_listeners"):
                if name != DEFAULT_LISTENER_NAME:
                    raise ConfigError(
                        f"advertised_listeners names {name}, but listeners is empty (one "
                        f"{DEFAULT_LISTENER_NAME} listener at client_listener)"
                    )
        listeners = self.client_listeners if self.is_broker else ()
        if self.is_broker:
            self.advertised_client_listeners  # noqa: B018 - parse for the error
        # Port 0 (pick a free port) may repeat; a fixed port bound twice fails at start-up,
        # so say which keys collide now.
        taken: dict[tuple[str, int], str] = {}
        internal_host, internal_port = self.internal_address
        for what, host, port in [
            ("internal_listener", internal_host, internal_port),
            *((f"listener {b.name}", b.host, b.port) for b in listeners),
        ]:
            if port == 0:
                continue
            for (other_host, other_port), other in taken.items():
                wildcard = "0.0.0.0" in (host, other_host) or "::" in (host, other_host)
                if other_port == port and (other_host == host or wildcard):
                    raise ConfigError(f"{what} and {other} both use port {port}")
            taken[(host, port)] = what
        mechanisms = self.sasl_mechanisms
        for b in listeners:
            if b.sasl and not mechanisms:
                raise ConfigError(
                    f"listener {b.name} is {b.security_protocol} but sasl_enabled_mechanisms "
                    f"is empty"
                )
        tls_users = [f"listener {b.name} ({b.security_protocol})" for b in listeners if b.tls]
        if self.internal_tls:
            tls_users.append("internal_security_protocol = SSL")
        if tls_users:
            for key in ("ssl_certificate_location", "ssl_key_location"):
                if not getattr(self, key):
                    raise ConfigError(f"{tls_users[0]} needs {key} (a PEM file)")
        needs_ca = self.internal_tls or (tls_users and self.ssl_client_auth != "none")
        if needs_ca and not self.ssl_ca_location:
            why = (
                "internal_security_protocol = SSL (mutual TLS between nodes)"
                if self.internal_tls
                else f"ssl_client_auth = {self.ssl_client_auth}"
            )
            raise ConfigError(f"{why} needs ssl_ca_location (PEM CA certificates)")
        if tls_users:
            for key in ("ssl_certificate_location", "ssl_key_location", "ssl_ca_location"):
                location = getattr(self, key)
                if location and not Path(location).is_file():
                    raise ConfigError(f"{key}: {location!r} is not a readable file")
        rules = self.ssl_principal_mapping_rules.strip()
        if not rules:
            raise ConfigError("ssl_principal_mapping_rules is empty (Kafka's default: DEFAULT)")
        if self.authorizer_class_name and not self.authorizer_enabled:
            raise ConfigError(
                f"authorizer_class_name: {self.authorizer_class_name!r} is unknown; use '' "
                f"or {' / '.join(STANDARD_AUTHORIZER_NAMES)}"
            )
        self.super_user_principals  # noqa: B018 - parse for the error
        parse_bootstrap_scram(self.bootstrap_scram_credentials)

    def to_toml(self) -> str:
        """Render as TOML (used by `raftlog cluster up` to write node configs)."""
        lines = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            lines.append(f"{f.name} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _check_value(f: dataclasses.Field[Any], value: Any, source: str) -> None:
    expected = type(f.default) if f.default is not dataclasses.MISSING else list
    if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{source}: {f.name} must be an integer, got {value!r}")
    if expected is not int and not isinstance(value, expected):
        raise ConfigError(f"{source}: {f.name} must be a {expected.__name__}, got {value!r}")
    lo, hi, choices = f.metadata["lo"], f.metadata["hi"], f.metadata["choices"]
    if lo is not None and value < lo:
        raise ConfigError(f"{source}: {f.name} = {value} is below the minimum {lo}")
    if hi is not None and value > hi:
        raise ConfigError(f"{source}: {f.name} = {value} is above the maximum {hi}")
    if choices is not None and value not in choices:
        raise ConfigError(f"{source}: {f.name} must be one of {list(choices)}, got {value!r}")


def config_docs() -> list[tuple[str, str, str]]:
    """(key, default as TOML, doc) for every key, in definition order."""
    rows = []
    for f in dataclasses.fields(NodeConfig):
        # List-valued keys have a default factory instead of a default.
        factory: Any = f.default_factory
        default = f.default if f.default is not dataclasses.MISSING else factory()
        rows.append((f.name, _toml_value(default), f.metadata["doc"]))
    return rows
