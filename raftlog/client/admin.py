"""Admin operations on a Cluster: topics, configs, cluster and quorum, client quotas, offsets
(ACLs and SCRAM users: admin_security.py; reassignments, leader elections: admin_reassign.py).

Every method returns plain Python values (dicts, dataclasses) rather than kio entities, so
the CLI renders them without knowing the protocol. Per-item errors (one topic of several)
come back as ErrorCode values in the result; whole-request failures raise KafkaError.
Leadership errors are retried through Cluster.retrying.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raftlog.client.admin_reassign import ReassignmentAdminMixin
from raftlog.client.admin_security import SecurityAdminMixin
from raftlog.client.cluster import Cluster, PartitionInfo, TopicInfo, raise_for
from raftlog.client.connection import call_negotiated
from raftlog.client.protocol import IsolationLevel, error_of
from raftlog.constants import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from raftlog.errors import ErrorCode, KafkaError
from raftlog.metadata.controller.messages import NewTopic
from raftlog.quotas.entity import QuotaEntity, validate_alteration

DEFAULT_ADMIN_TIMEOUT_MS = 30_000
# api name -> (min, max) version spoken by methods that are not in CLIENT_API_VERSIONS.
UNREGISTER_BROKER_VERSIONS: dict[str, tuple[int, int]] = {"unregister_broker": (0, 0)}
# Kafka's ListOffsets sentinels.


class ResourceType(enum.IntEnum):
    TOPIC = 2
    BROKER = 4


class ConfigOp(enum.IntEnum):
    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


class QuotaMatch(enum.IntEnum):
    """DescribeClientQuotas component match types."""

    EXACT = 0
    DEFAULT = 1
    ANY = 2


@dataclass(frozen=True)
class TopicResult:
    error: ErrorCode
    message: str | None = None


@dataclass(frozen=True)
class ClusterDescription:
    cluster_id: str
    controller_id: int
    brokers: dict[int, tuple[str, int]]


@dataclass(frozen=True)
class ListedOffset:
    offset: int
    timestamp_ms: int
    leader_epoch: int


class Admin(SecurityAdminMixin, ReassignmentAdminMixin):
    """Admin client over a Cluster (see raftlog.client.open_cluster); the ACL and SCRAM
    methods are in raftlog.client.admin_security, reassignments and leader elections in
    raftlog.client.admin_reassign."""

    def __init__(self, cluster: Cluster, *, timeout_ms: int = DEFAULT_ADMIN_TIMEOUT_MS) -> None:
        self.cluster = cluster
        self.timeout_ms = timeout_ms

    async def _controller_call(self, api: str, values: dict[str, Any]) -> Any:
        async def attempt() -> Any:
            connection = await self.cluster.controller()
            response = await connection.call(api, values)
            top = getattr(response, "error_code", None)
            if top is not None and error_of(top) in (ErrorCode.not_controller,):
                raise KafkaError(ErrorCode.not_controller, api)
            return response

        return await self.cluster.retrying(attempt)

    # ------------------------------------------------------------------ topics
    async def create_topics(
        self, topics: Sequence[NewTopic], *, validate_only: bool = False
    ) -> dict[str, TopicResult]:
        values = {
            "topics": [
                {
                    "name": t.name,
                    "num_partitions": t.num_partitions,
                    "replication_factor": t.replication_factor,
                    "assignments": [
                        {"partition_index": p, "broker_ids": list(r)}
                        for p, r in (t.assignments or {}).items()
                    ],
                    "configs": [{"name": k, "value": v} for k, v in t.configs.items()],
                }
                for t in topics
            ],
            "timeout": self.timeout_ms,
            "validate_only": validate_only,
        }
        response = await self._controller_call("create_topics", values)
        return {
            t.name: TopicResult(error_of(t.error_code), getattr(t, "error_message", None))
            for t in response.topics
        }

    async def delete_topics(self, names: Sequence[str]) -> dict[str, TopicResult]:
        values = {
            "topics": [{"name": name, "topic_id": None} for name in names],
            "topic_names": list(names),
            "timeout": self.timeout_ms,
        }
        response = await self._controller_call("delete_topics", values)
        return {
            r.name: TopicResult(error_of(r.error_code), getattr(r, "error_message", None))
            for r in response.responses
        }

    async def create_partitions(
        self, counts: Mapping[str, int], *, validate_only: bool = False
    ) -> dict[str, TopicResult]:
        values = {
            "topics": [
                {"name": name, "count": count, "assignments": None}
                for name, count in counts.items()
            ],
            "timeout": self.timeout_ms,
            "validate_only": validate_only,
        }
        response = await self._controller_call("create_partitions", values)
        return {
            r.name: TopicResult(error_of(r.error_code), getattr(r, "error_message", None))
            for r in response.results
        }

    async def list_topics(self, *, include_internal: bool = False) -> list[str]:
        await self.cluster.refresh_metadata()
        return sorted(
            name
            for name, info in self.cluster.topics.items()
            if info.error == ErrorCode.none and (include_internal or not info.is_internal)
        )

    async def describe_topics(self, names: Sequence[str] | None = None) -> dict[str, TopicInfo]:
        await self.cluster.refresh_metadata(names)
        wanted = names if names is not None else list(self.cluster.topics)
        return {name: self.cluster.topics[name] for name in wanted if name in self.cluster.topics}

    # ------------------------------------------------------------------ configs
    async def describe_configs(
        self, resources: Sequence[tuple[ResourceType, str]]
    ) -> dict[tuple[ResourceType, str], dict[str, str | None]]:
        values = {
            "resources": [
                {"resource_type": int(kind), "resource_name": name, "configuration_keys": None}
                for kind, name in resources
            ],
        }
        connection = await self.cluster.any_broker()
        response = await connection.call("describe_configs", values)
        out: dict[tuple[ResourceType, str], dict[str, str | None]] = {}
        for result in response.results:
            raise_for(
                result.error_code,
                f"describe_configs {result.resource_name}",
                getattr(result, "error_message", None),
            )
            key = (ResourceType(int(result.resource_type)), result.resource_name)
            out[key] = {c.name: c.value for c in result.configs}
        return out

    async def alter_configs(
        self,
        resource: tuple[ResourceType, str],
        configs: Mapping[str, str | None],
        *,
        validate_only: bool = False,
    ) -> None:
        """Legacy AlterConfigs: replaces the resource's whole dynamic config."""
        kind, name = resource
        values = {
            "resources": [
                {
                    "resource_type": int(kind),
                    "resource_name": name,
                    "configs": [{"name": k, "value": v} for k, v in configs.items()],
                }
            ],
            "validate_only": validate_only,
        }
        response = await self._controller_call("alter_configs", values)
        for r in response.responses:
            raise_for(r.error_code, f"alter_configs {r.resource_name}", r.error_message)

    async def incremental_alter_configs(
        self,
        resource: tuple[ResourceType, str],
        ops: Sequence[tuple[str, ConfigOp, str | None]],
        *,
        validate_only: bool = False,
    ) -> None:
        kind, name = resource
        values = {
            "resources": [
                {
                    "resource_type": int(kind),
                    "resource_name": name,
                    "configs": [
                        {"name": key, "config_operation": int(op), "value": value}
                        for key, op, value in ops
                    ],
                }
            ],
            "validate_only": validate_only,
        }
        response = await self._controller_call("incremental_alter_configs", values)
        for r in response.responses:
            raise_for(r.error_code, f"incremental_alter_configs {r.resource_name}", r.error_message)

    # ------------------------------------------------------------------ cluster
    async def describe_cluster(self) -> ClusterDescription:
        connection = await self.cluster.any_broker()
        response = await connection.call("describe_cluster", {})
        raise_for(response.error_code, "describe_cluster", response.error_message)
        return ClusterDescription(
            cluster_id=response.cluster_id,
            controller_id=int(response.controller_id),
            brokers={int(b.broker_id): (b.host, int(b.port)) for b in response.brokers},
        )

    async def unregister_broker(self, broker_id: int) -> None:
        """Kafka's UnregisterBroker (`kafka-cluster.sh unregister`): the controller fences the
        broker and drops its registration; its partitions list it as an offline replica.
        Stop the broker first: one still running registers again on its next heartbeat.
        Raises KafkaError (BROKER_ID_NOT_REGISTERED for an id that is not registered)."""

        async def attempt() -> Any:
            connection = await self.cluster.controller()
            response = await call_negotiated(
                connection,
                "unregister_broker",
                {"broker_id": broker_id},
                UNREGISTER_BROKER_VERSIONS,
                timeout_ms=self.timeout_ms,
            )
            # Retriable answers (NOT_CONTROLLER, REQUEST_TIMED_OUT while the quorum elects a
            # leader) are retried by Cluster.retrying; anything else is the caller's.
            raise_for(response.error_code, f"unregister_broker {broker_id}", response.error_message)
            return response

        await self.cluster.retrying(attempt)

    async def describe_quorum(self) -> dict[str, Any]:
        """Leader, epoch, high watermark and voter/observer progress of the metadata log."""
        values = {
            "topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]
        }
        response = await self._controller_call("describe_quorum", values)
        raise_for(response.error_code, "describe_quorum")
        partition = response.topics[0].partitions[0]
        raise_for(partition.error_code, "describe_quorum __cluster_metadata-0")

        def replicas(states: Sequence[Any]) -> list[dict[str, int]]:
            return [
                {
                    "replica_id": int(s.replica_id),
                    "log_end_offset": int(s.log_end_offset),
                    "last_fetch_timestamp": int(getattr(s, "last_fetch_timestamp", -1)),
                    "last_caught_up_timestamp": int(getattr(s, "last_caught_up_timestamp", -1)),
                }
                for s in states
            ]

        return {
            "leader_id": int(partition.leader_id),
            "leader_epoch": int(partition.leader_epoch),
            "high_watermark": int(partition.high_watermark),
            "voters": replicas(partition.current_voters),
            "observers": replicas(partition.observers),
        }

    # ------------------------------------------------------------------ quotas
    async def describe_client_quotas(
        self,
        components: Sequence[tuple[str, QuotaMatch, str | None]] = (),
        *,
        strict: bool = False,
    ) -> dict[QuotaEntity, dict[str, float]]:
        """Quotas matching a filter of (entity type, match type, name) components."""
        values = {
            "components": [
                {"entity_type": kind, "match_type": int(match), "match": name}
                for kind, match, name in components
            ],
            "strict": strict,
        }
        connection = await self.cluster.any_broker()
        response = await connection.call("describe_client_quotas", values)
        raise_for(response.error_code, "describe_client_quotas", response.error_message)
        return {
            QuotaEntity.of((e.entity_type, e.entity_name) for e in entry.entity): {
                v.key: float(v.value) for v in entry.values
            }
            for entry in response.entries or ()
        }

    async def alter_client_quotas(
        self,
        alterations: Sequence[tuple[QuotaEntity, Mapping[str, object]]],
        *,
        validate_only: bool = False,
    ) -> dict[QuotaEntity, TopicResult]:
        """Set (value) or remove (None) quota keys per entity; validated here first.

        A bad value raises QuotaValidationError before anything is sent, with a message that
        names the key, so the CLI can print it as is.
        """
        entries = []
        for entity, changes in alterations:
            ops = [(key, value, value is None) for key, value in changes.items()]
            checked, delta = validate_alteration(entity.components, ops)
            entries.append(
                {
                    "entity": [
                        {"entity_type": kind, "entity_name": name}
                        for kind, name in checked.components
                    ],
                    "ops": [
                        {
                            "key": key,
                            "value": 0.0 if value is None else value,
                            "remove": value is None,
                        }
                        for key, value in delta.items()
                    ],
                }
            )
        response = await self._controller_call(
            "alter_client_quotas", {"entries": entries, "validate_only": validate_only}
        )
        return {
            QuotaEntity.of((e.entity_type, e.entity_name) for e in entry.entity): TopicResult(
                error_of(entry.error_code), entry.error_message
            )
            for entry in response.entries
        }

    # ------------------------------------------------------------------ offsets
    async def list_offsets(
        self,
        topic: str,
        partition: int,
        spec: str | int = "latest",
        isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> ListedOffset:
        """Offset at "earliest", "latest", or the first offset with timestamp >= spec (ms);
        see list_offset for the isolation level."""
        return await list_offset(self.cluster, topic, partition, spec, isolation_level)


__all__ = [
    "Admin",
    "ClusterDescription",
    "ConfigOp",
    "ListedOffset",
    "PartitionInfo",
    "QuotaMatch",
    "ResourceType",
    "TopicResult",
]


async def list_offset(
    cluster: Cluster,
    topic: str,
    partition: int,
    spec: str | int = "latest",
    isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
) -> ListedOffset:
    """ListOffsets at an isolation level: "latest" is the high watermark under
    read_uncommitted and the last stable offset under read_committed (as Kafka's consumer
    endOffsets); "earliest" is the log start offset; a timestamp in ms, the first offset
    whose timestamp is at or after it."""
    if spec == "latest":
        timestamp = LATEST_TIMESTAMP
    elif spec == "earliest":
        timestamp = EARLIEST_TIMESTAMP
    elif isinstance(spec, int) and spec >= 0:
        timestamp = spec
    else:
        raise ValueError(f"spec must be 'earliest', 'latest' or a timestamp in ms, got {spec!r}")

    async def attempt() -> ListedOffset:
        connection, info = await cluster.leader(topic, partition)
        values = {
            "replica_id": -1,
            "isolation_level": int(isolation_level),
            "topics": [
                {
                    "name": topic,
                    "partitions": [
                        {
                            "partition_index": partition,
                            "current_leader_epoch": info.leader_epoch,
                            "timestamp": timestamp,
                        }
                    ],
                }
            ],
        }
        response = await connection.call("list_offsets", values)
        result = response.topics[0].partitions[0]
        raise_for(result.error_code, f"list_offsets {topic}-{partition}")
        return ListedOffset(
            offset=int(result.offset),
            timestamp_ms=int(result.timestamp),
            leader_epoch=int(getattr(result, "leader_epoch", -1)),
        )

    return await cluster.retrying(attempt, refresh_topics=[topic])
