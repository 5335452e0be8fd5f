"""Moving partitions and leaders: AlterPartitionReassignments, ListPartitionReassignments
(KIP-455), ElectLeaders (KIP-460), and reassignment plans in kafka-reassign-partitions.sh's
JSON format.

A plan is ``{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2],
"log_dirs": ["any", "any"]}, ...]}``; ``replicas`` null cancels (as in the API). `parse_plan`
checks it all and says which entry is wrong (PlanError, a ValueError). Generating a plan is
the CLI's (raftlog_cli.reassign), with the controller's own placement.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raftlog.client.cluster import Cluster, raise_for
from raftlog.client.connection import call_negotiated
from raftlog.client.protocol import error_of
from raftlog.codec import I32_MAX
from raftlog.errors import ErrorCode, KafkaError, LocalError

__all__ = [
    "MAX_PLAN_PARTITIONS",
    "ElectionType",
    "OngoingReassignment",
    "PartitionResult",
    "PlanError",
    "ReassignmentAdminMixin",
    "parse_plan",
    "parse_topics_to_move",
    "plan_json",
]

# api name -> (min, max) version this module speaks: every version kio models.
REASSIGNMENT_API_VERSIONS: dict[str, tuple[int, int]] = {
    "alter_partition_reassignments": (0, 1),
    "list_partition_reassignments": (0, 0),
    "elect_leaders": (0, 2),
}

TopicPartition = tuple[str, int]
Plan = dict[TopicPartition, tuple[int, ...] | None]

# What one plan may hold (the API's own bound per request) and Kafka's limits on a name.
MAX_PLAN_PARTITIONS = 100_000
MAX_PLAN_REPLICAS = 32
MAX_TOPIC_NAME_CHARS = 249
MAX_PARTITION_INDEX = I32_MAX
MAX_BROKER_ID = I32_MAX
PLAN_VERSION = 1


class ElectionType(enum.IntEnum):
    """Kafka's ElectionType."""

    PREFERRED = 0
    UNCLEAN = 1


class PlanError(LocalError, ValueError):
    """A reassignment plan (or a topics-to-move file) that is not valid, and why."""


@dataclass(frozen=True)
class PartitionResult:
    topic: str
    partition: int
    error: ErrorCode
    message: str | None = None


@dataclass(frozen=True)
class OngoingReassignment:
    topic: str
    partition: int
    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]

    @property
    def target_replicas(self) -> tuple[int, ...]:
        return tuple(b for b in self.replicas if b not in self.removing_replicas)


# ------------------------------------------------------------------ plans
def _load(text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(f"{what} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PlanError(f"{what} must be a JSON object")
    version = data.get("version", PLAN_VERSION)
    if version != PLAN_VERSION:
        raise PlanError(f"{what} has version {version!r}; only version {PLAN_VERSION} is read")
    return data


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _topic_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_TOPIC_NAME_CHARS:
        raise PlanError(
            f'{where}: "topic" must be a topic name of 1..{MAX_TOPIC_NAME_CHARS} characters'
        )
    return value


def parse_plan(text: str) -> Plan:
    """The plan in `text`: {(topic, partition): replicas, or None to cancel}."""
    data = _load(text, "the reassignment plan")
    entries = data.get("partitions")
    if not isinstance(entries, list) or not entries:
        raise PlanError('the reassignment plan needs a non-empty "partitions" list')
    if len(entries) > MAX_PLAN_PARTITIONS:
        raise PlanError(f"the plan names {len(entries)} partitions; at most {MAX_PLAN_PARTITIONS}")
    plan: Plan = {}
    for number, entry in enumerate(entries):
        where = f"partitions[{number}]"
        if not isinstance(entry, dict):
            raise PlanError(f"{where} must be an object")
        topic = _topic_name(entry.get("topic"), where)
        partition: Any = entry.get("partition")
        if not _is_int(partition) or not 0 <= partition <= MAX_PARTITION_INDEX:
            raise PlanError(f'{where}: "partition" must be an integer 0..{MAX_PARTITION_INDEX}')
        where = f"{where} ({topic}-{partition})"
        if "replicas" not in entry:
            raise PlanError(f'{where}: "replicas" is missing (null cancels a reassignment)')
        replicas = entry["replicas"]
        if replicas is not None:
            if not isinstance(replicas, list) or not replicas:
                raise PlanError(f'{where}: "replicas" must be a non-empty list of broker ids')
            if len(replicas) > MAX_PLAN_REPLICAS:
                raise PlanError(f"{where}: {len(replicas)} replicas; at most {MAX_PLAN_REPLICAS}")
            if not all(_is_int(b) and 0 <= b <= MAX_BROKER_ID for b in replicas):
                raise PlanError(f'{where}: "replicas" must be broker ids 0..{MAX_BROKER_ID}')
            if len(set(replicas)) != len(replicas):
                raise PlanError(f"{where}: a broker is named twice in {replicas}")
            log_dirs = entry.get("log_dirs")
            if log_dirs is not None and (
                not isinstance(log_dirs, list)
                or len(log_dirs) != len(replicas)
                or any(d != "any" for d in log_dirs)
            ):
                raise PlanError(
                    f'{where}: "log_dirs" must be "any" for each replica (raftlog places '
                    f"a replica in its broker's one log directory)"
                )
        if (topic, partition) in plan:
            raise PlanError(f"{where}: the partition is named twice")
        plan[(topic, partition)] = None if replicas is None else tuple(replicas)
    return plan


def parse_topics_to_move(text: str) -> list[str]:
    """kafka-reassign-partitions.sh's --topics-to-move-json-file:
    {"version": 1, "topics": [{"topic": "a"}, ...]}."""
    data = _load(text, "the topics-to-move file")
    entries = data.get("topics")
    if not isinstance(entries, list) or not entries:
        raise PlanError('the topics-to-move file needs a non-empty "topics" list')
    names = []
    for number, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise PlanError(f"topics[{number}] must be an object")
        names.append(_topic_name(entry.get("topic"), f"topics[{number}]"))
    return list(dict.fromkeys(names))


def plan_json(plan: Mapping[TopicPartition, Sequence[int] | None]) -> str:
    """A plan as kafka-reassign-partitions.sh writes it (sorted by topic and partition)."""
    partitions = []
    for (topic, partition), replicas in sorted(plan.items()):
        entry: dict[str, Any] = {"topic": topic, "partition": partition}
        entry["replicas"] = None if replicas is None else list(replicas)
        if replicas is not None:
            entry["log_dirs"] = ["any"] * len(replicas)
        partitions.append(entry)
    return json.dumps({"version": PLAN_VERSION, "partitions": partitions})


# ------------------------------------------------------------------ the API
def _results(items: Iterable[Any], topic_of: str, index_of: str) -> list[PartitionResult]:
    out = []
    for item in items:
        for p in item.partitions if hasattr(item, "partitions") else item.partition_result:
            out.append(
                PartitionResult(
                    getattr(item, topic_of),
                    int(getattr(p, index_of)),
                    error_of(p.error_code),
                    getattr(p, "error_message", None),
                )
            )
    return out


class ReassignmentAdminMixin:
    """Reassignment and election methods of Admin (raftlog.client.admin)."""

    cluster: Cluster
    timeout_ms: int

    async def _reassign_call(self, api: str, values: dict[str, Any]) -> Any:
        """`api` at the controller (any broker forwards), retried as Admin's calls are."""

        async def attempt() -> Any:
            connection = await self.cluster.controller()
            response = await call_negotiated(connection, api, values, REASSIGNMENT_API_VERSIONS)
            if error_of(getattr(response, "error_code", 0)) == ErrorCode.not_controller:
                raise KafkaError(ErrorCode.not_controller, api)
            return response

        return await self.cluster.retrying(attempt)

    async def alter_partition_reassignments(
        self,
        plan: Mapping[TopicPartition, Sequence[int] | None],
        *,
        allow_replication_factor_change: bool = True,
    ) -> list[PartitionResult]:
        """Start (replicas), replace or cancel (None) reassignments; one result each. A
        whole-request failure (authorization, no controller) raises KafkaError."""
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), replicas in plan.items():
            by_topic.setdefault(topic, []).append(
                {
                    "partition_index": partition,
                    "replicas": None if replicas is None else list(replicas),
                }
            )
        values = {
            "timeout": self.timeout_ms,
            "allow_replication_factor_change": allow_replication_factor_change,
            "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()],
        }
        response = await self._reassign_call("alter_partition_reassignments", values)
        raise_for(response.error_code, "alter_partition_reassignments", response.error_message)
        return _results(response.responses, "name", "partition_index")

    async def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OngoingReassignment]:
        """Reassignments in progress (of the named partitions, else all)."""
        topics: list[dict[str, Any]] | None = None
        if partitions is not None:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in partitions:
                by_topic.setdefault(topic, []).append(partition)
            topics = [{"name": t, "partition_indexes": ps} for t, ps in by_topic.items()]
        values = {"timeout": self.timeout_ms, "topics": topics}
        response = await self._reassign_call("list_partition_reassignments", values)
        raise_for(response.error_code, "list_partition_reassignments", response.error_message)
        out = {}
        for topic in response.topics:
            for p in topic.partitions:
                key = (topic.name, int(p.partition_index))
                out[key] = OngoingReassignment(
                    topic.name,
                    int(p.partition_index),
                    tuple(int(b) for b in p.replicas),
                    tuple(int(b) for b in p.adding_replicas),
                    tuple(int(b) for b in p.removing_replicas),
                )
        return out

    async def elect_leaders(
        self,
        election_type: ElectionType,
        partitions: Iterable[TopicPartition] | None = None,
    ) -> list[PartitionResult]:
        """Elect leaders of the named partitions (None: every partition; the result then
        names only those where an election was needed)."""
        topic_partitions: list[dict[str, Any]] | None = None
        if partitions is not None:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in partitions:
                by_topic.setdefault(topic, []).append(partition)
            topic_partitions = [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]
        values = {
            "election_type": int(election_type),
            "topic_partitions": topic_partitions,
            "timeout": self.timeout_ms,
        }
        response = await self._reassign_call("elect_leaders", values)
        raise_for(getattr(response, "error_code", ErrorCode.none), "elect_leaders")
        return _results(response.replica_election_results, "topic", "partition_id")

    async def broker_racks(self) -> dict[int, str | None]:
        """Every live broker's rack (None: registered without one), from Metadata."""

        async def attempt() -> Any:
            connection = await self.cluster.any_broker()
            return await connection.call(
                "metadata", {"topics": [], "allow_auto_topic_creation": False}
            )

        response = await self.cluster.retrying(attempt)
        return {int(b.node_id): getattr(b, "rack", None) for b in response.brokers}
