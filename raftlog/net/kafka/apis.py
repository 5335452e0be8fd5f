"""Request dispatch: the one table of API versions this server implements.

`VERSION_TABLE` is what ApiVersions advertises, so it must list exactly the versions the
handlers implement and the tests exercise. docs/protocol.md explains each range. Other
packages add APIs (e.g. consumer groups) with `ApiRegistry.register` on the registry they
pass to `serve`, without editing this module.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass

from kio.schema.index import api_key_map, schema_name_map

from raftlog.net.kafka import (
    handlers_admin,
    handlers_cluster,
    handlers_core,
    handlers_fetch,
    handlers_log_dirs,
    handlers_reassign,
    handlers_records,
    handlers_topic_partitions,
)
from raftlog.net.kafka.context import Handler

_KEY_BY_NAME = {name: key for key, name in api_key_map.items()}


class ApiKey(enum.IntEnum):
    """The API keys this node serves (its own and the group APIs), valued from kio's table of
    the protocol, so a name kio does not know fails at import."""

    PRODUCE = _KEY_BY_NAME["produce"]
    FETCH = _KEY_BY_NAME["fetch"]
    LIST_OFFSETS = _KEY_BY_NAME["list_offsets"]
    METADATA = _KEY_BY_NAME["metadata"]
    OFFSET_COMMIT = _KEY_BY_NAME["offset_commit"]
    OFFSET_FETCH = _KEY_BY_NAME["offset_fetch"]
    FIND_COORDINATOR = _KEY_BY_NAME["find_coordinator"]
    JOIN_GROUP = _KEY_BY_NAME["join_group"]
    HEARTBEAT = _KEY_BY_NAME["heartbeat"]
    LEAVE_GROUP = _KEY_BY_NAME["leave_group"]
    SYNC_GROUP = _KEY_BY_NAME["sync_group"]
    DESCRIBE_GROUPS = _KEY_BY_NAME["describe_groups"]
    LIST_GROUPS = _KEY_BY_NAME["list_groups"]
    API_VERSIONS = _KEY_BY_NAME["api_versions"]
    CREATE_TOPICS = _KEY_BY_NAME["create_topics"]
    DELETE_TOPICS = _KEY_BY_NAME["delete_topics"]
    INIT_PRODUCER_ID = _KEY_BY_NAME["init_producer_id"]
    OFFSET_FOR_LEADER_EPOCH = _KEY_BY_NAME["offset_for_leader_epoch"]
    DESCRIBE_CONFIGS = _KEY_BY_NAME["describe_configs"]
    ALTER_CONFIGS = _KEY_BY_NAME["alter_configs"]
    CREATE_PARTITIONS = _KEY_BY_NAME["create_partitions"]
    DELETE_GROUPS = _KEY_BY_NAME["delete_groups"]
    OFFSET_DELETE = _KEY_BY_NAME["offset_delete"]
    DESCRIBE_TOPIC_PARTITIONS = _KEY_BY_NAME["describe_topic_partitions"]
    INCREMENTAL_ALTER_CONFIGS = _KEY_BY_NAME["incremental_alter_configs"]
    DESCRIBE_CLIENT_QUOTAS = _KEY_BY_NAME["describe_client_quotas"]
    ALTER_CLIENT_QUOTAS = _KEY_BY_NAME["alter_client_quotas"]
    DESCRIBE_QUORUM = _KEY_BY_NAME["describe_quorum"]
    DESCRIBE_CLUSTER = _KEY_BY_NAME["describe_cluster"]
    ADD_PARTITIONS_TO_TXN = _KEY_BY_NAME["add_partitions_to_txn"]
    ADD_OFFSETS_TO_TXN = _KEY_BY_NAME["add_offsets_to_txn"]
    END_TXN = _KEY_BY_NAME["end_txn"]
    WRITE_TXN_MARKERS = _KEY_BY_NAME["write_txn_markers"]
    DESCRIBE_TRANSACTIONS = _KEY_BY_NAME["describe_transactions"]
    LIST_TRANSACTIONS = _KEY_BY_NAME["list_transactions"]
    DESCRIBE_PRODUCERS = _KEY_BY_NAME["describe_producers"]
    TXN_OFFSET_COMMIT = _KEY_BY_NAME["txn_offset_commit"]
    ALTER_PARTITION_REASSIGNMENTS = _KEY_BY_NAME["alter_partition_reassignments"]
    LIST_PARTITION_REASSIGNMENTS = _KEY_BY_NAME["list_partition_reassignments"]
    ELECT_LEADERS = _KEY_BY_NAME["elect_leaders"]
    DELETE_RECORDS = _KEY_BY_NAME["delete_records"]
    ADD_RAFT_VOTER = _KEY_BY_NAME["add_raft_voter"]
    REMOVE_RAFT_VOTER = _KEY_BY_NAME["remove_raft_voter"]
    UPDATE_RAFT_VOTER = _KEY_BY_NAME["update_raft_voter"]
    UNREGISTER_BROKER = _KEY_BY_NAME["unregister_broker"]


# api key -> (min version, max version, handler). Why each range: docs/protocol.md.
VERSION_TABLE: dict[int, tuple[int, int, Handler]] = {
    # v3 (flexible) is what librdkafka asks for; v4 is left out until a client needs it.
    ApiKey.API_VERSIONS: (0, 3, handlers_core.handle_api_versions),
    # v3 is the first with record batch v2 (headers); librdkafka enables zstd only with
    # Produce 7 + Fetch 10; v10 carries KIP-951 current_leader/node_endpoints. v11 and v12
    # (KIP-890 part 2: the leader adds the partition to the transaction) and v13 (topics by
    # id, KIP-516; handle_produce serves it) mean transaction version 2, so they are
    # registered by handlers_txn.register_txn_apis with the coordinator that serves them.
    ApiKey.PRODUCE: (3, 10, handlers_core.handle_produce),
    # v13 names topics by id (KIP-516; unknown ids answer UNKNOWN_TOPIC_ID); v14 only adds
    # an error this node never sends (OFFSET_MOVED_TO_TIERED_STORAGE); v15 moves replica_id
    # into replica_state (KIP-903); v16 adds node_endpoints for moved leaders (KIP-951);
    # v17 a follower's directory id (KIP-853), ignored here. v18 (KIP-1166, a follower's
    # high watermark) is left out.
    ApiKey.FETCH: (4, 17, handlers_fetch.handle_fetch),
    # v7 adds MAX_TIMESTAMP (KIP-734); v8 EARLIEST_LOCAL (-4, KIP-405) and v9 LATEST_TIERED
    # (-5, KIP-1005), answered as Kafka does without tiered storage; v10's timeout_ms bounds
    # reads from remote storage, which this node has none of. v11 (EARLIEST_PENDING_UPLOAD,
    # KIP-1023) is left out.
    ApiKey.LIST_OFFSETS: (1, 10, handlers_fetch.handle_list_offsets),
    # v12 has topic ids and nullable topic names; v13 (KIP-1102 top-level error) left out.
    ApiKey.METADATA: (0, 12, handlers_core.handle_metadata),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (2, 4, handlers_fetch.handle_offset_for_leader_epoch),
    # v5+ return the created topic's configs and counts; v7 its topic id.
    ApiKey.CREATE_TOPICS: (2, 7, handlers_admin.handle_create_topics),
    ApiKey.DELETE_TOPICS: (1, 6, handlers_admin.handle_delete_topics),
    ApiKey.CREATE_PARTITIONS: (0, 3, handlers_admin.handle_create_partitions),
    # KIP-107; v2 is the flexible form.
    ApiKey.DELETE_RECORDS: (0, 2, handlers_records.handle_delete_records),
    ApiKey.DESCRIBE_CONFIGS: (1, 4, handlers_admin.handle_describe_configs),
    ApiKey.ALTER_CONFIGS: (0, 2, handlers_admin.handle_alter_configs),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1, handlers_admin.handle_incremental_alter_configs),
    # v1 adds endpoint_type (KIP-919), v2 include_fenced_brokers / is_fenced (KIP-1073).
    ApiKey.DESCRIBE_CLUSTER: (0, 2, handlers_cluster.handle_describe_cluster),
    # KIP-500's broker removal (`kafka-cluster.sh unregister`); kio models only v0.
    ApiKey.UNREGISTER_BROKER: (0, 0, handlers_cluster.handle_unregister_broker),
    # DescribeQuorum (0-2) and the KIP-853 voter APIs are registered by
    # handlers_quorum.register_quorum_apis with the quorum driver that answers them.
    ApiKey.DESCRIBE_CLIENT_QUOTAS: (0, 1, handlers_cluster.handle_describe_client_quotas),
    ApiKey.ALTER_CLIENT_QUOTAS: (0, 1, handlers_cluster.handle_alter_client_quotas),
    # v0-4: idempotent producer (librdkafka's IDEMPOTENT_PRODUCER feature needs v0);
    # v5+ (KIP-890/939 transactions) not implemented.
    ApiKey.INIT_PRODUCER_ID: (0, 4, handlers_core.handle_init_producer_id),
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: (
        0,
        0,
        handlers_topic_partitions.handle_describe_topic_partitions,
    ),
}

# Moving partitions and leaders (handlers_reassign.py): every version kio models. v1 of
# AlterPartitionReassignments adds allow_replication_factor_change; ElectLeaders v0 has no
# election type (preferred), v1 adds it, v2 is its flexible form.
REASSIGNMENT_APIS: dict[int, tuple[int, int, Handler]] = {
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: (
        0,
        1,
        handlers_reassign.handle_alter_partition_reassignments,
    ),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: (
        0,
        0,
        handlers_reassign.handle_list_partition_reassignments,
    ),
    ApiKey.ELECT_LEADERS: (0, 2, handlers_reassign.handle_elect_leaders),
}
VERSION_TABLE.update(REASSIGNMENT_APIS)
# DescribeLogDirs v1-4 (handlers_log_dirs.py): this broker's log directory and partition sizes.
VERSION_TABLE.update(handlers_log_dirs.LOG_DIR_APIS)


@dataclass(frozen=True)
class ApiSpec:
    api_key: int
    min_version: int
    max_version: int
    handler: Handler

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


class ApiRegistry:
    """api key -> ApiSpec. The server answers only what is registered here."""

    def __init__(self) -> None:
        self._specs: dict[int, ApiSpec] = {}

    def register(self, api_key: int, min_version: int, max_version: int, handler: Handler) -> None:
        """Add (or replace) an API. Every version in the range must be one kio models."""
        if api_key not in api_key_map:
            raise ValueError(f"api key {api_key} is unknown to kio")
        modelled = schema_name_map[api_key_map[api_key]]
        missing = [v for v in range(min_version, max_version + 1) if v not in modelled]
        if min_version > max_version or missing:
            raise ValueError(
                f"{api_key_map[api_key]} v{min_version}-{max_version}: kio lacks {missing}"
            )
        self._specs[api_key] = ApiSpec(int(api_key), min_version, max_version, handler)

    def copy(self) -> ApiRegistry:
        """A registry with the same APIs, to extend for one listener only."""
        registry = ApiRegistry()
        registry._specs = dict(self._specs)
        return registry

    def get(self, api_key: int) -> ApiSpec | None:
        return self._specs.get(api_key)

    def __iter__(self) -> Iterator[ApiSpec]:
        return iter(sorted(self._specs.values(), key=lambda s: s.api_key))

    def table(self) -> list[tuple[int, int, int]]:
        return [(s.api_key, s.min_version, s.max_version) for s in self]


def default_registry() -> ApiRegistry:
    registry = ApiRegistry()
    for api_key, (lo, hi, handler) in VERSION_TABLE.items():
        registry.register(api_key, lo, hi, handler)
    return registry
