"""CreateTopics, DeleteTopics, CreatePartitions: validation, placement, records.

Placement (placement.py) spreads each partition's replicas over racks when brokers registered
one (broker_rack), as Kafka does, and is round-robin over brokers otherwise."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence

from raftlog.config import NodeConfig
from raftlog.config_keys import TOPIC_CONFIGS, validate_configs
from raftlog.errors import ErrorCode, RemoteError
from raftlog.metadata import records as r
from raftlog.metadata.controller.elections import Batch, eligible_fn, initial_state
from raftlog.metadata.controller.messages import (
    CreatePartitions,
    CreatePartitionsReply,
    CreatePartitionsResult,
    CreateTopicResult,
    CreateTopics,
    CreateTopicsReply,
    DeleteTopicResult,
    DeleteTopics,
    DeleteTopicsReply,
)
from raftlog.metadata.controller.placement import place_replicas as place_replicas
from raftlog.metadata.controller.placement import placement

# Kafka's topic name rules: 1..249 characters from [a-zA-Z0-9._-], not "." or "..".
MAX_TOPIC_NAME_CHARS = 249
_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")
# Bounds on what one request can create (matches NodeConfig.num_partitions' upper bound).
MAX_PARTITIONS_PER_TOPIC = 100_000
MAX_REPLICATION_FACTOR = 32


class TopicError(RemoteError):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def check_topic_name(name: str) -> None:
    if not name or name in (".", ".."):
        raise TopicError(ErrorCode.invalid_topic_exception, f"topic name {name!r} is not allowed")
    if len(name) > MAX_TOPIC_NAME_CHARS:
        raise TopicError(
            ErrorCode.invalid_topic_exception,
            f"topic name is {len(name)} characters, the limit is {MAX_TOPIC_NAME_CHARS}",
        )
    if not _LEGAL_NAME.fullmatch(name):
        raise TopicError(
            ErrorCode.invalid_topic_exception,
            f"topic name {name!r} may only contain ASCII letters, digits, '.', '_' and '-'",
        )


def _collision_key(name: str) -> str:
    # Kafka metric names turn '.' into '_', so "a.b" and "a_b" would collide there.
    return name.replace(".", "_")


def _check_assignments(
    batch: Batch,
    assignments: Sequence[tuple[int, ...]],
    eligible: Callable[[int], bool],
) -> None:
    for index, replicas in enumerate(assignments):
        if not replicas or len(set(replicas)) != len(replicas):
            raise TopicError(
                ErrorCode.invalid_replica_assignment,
                f"partition {index}: replicas {list(replicas)} must be distinct and non-empty",
            )
        if len(replicas) > MAX_REPLICATION_FACTOR:
            raise TopicError(
                ErrorCode.invalid_replication_factor,
                f"partition {index}: more than {MAX_REPLICATION_FACTOR} replicas",
            )
        unknown = [b for b in replicas if b not in batch.image.brokers]
        if unknown:
            raise TopicError(
                ErrorCode.invalid_replica_assignment,
                f"partition {index}: brokers {unknown} are not registered",
            )
        if not any(eligible(b) for b in replicas):
            raise TopicError(
                ErrorCode.invalid_replica_assignment,
                f"partition {index}: every replica is fenced or shutting down",
            )


def _auto_assign(
    batch: Batch, count: int, replication_factor: int, start: int
) -> list[tuple[int, ...]]:
    live = [b for b in sorted(batch.image.brokers) if batch.image.brokers[b].eligible_leader]
    if replication_factor < 1 or replication_factor > MAX_REPLICATION_FACTOR:
        raise TopicError(
            ErrorCode.invalid_replication_factor,
            f"replication factor must be 1..{MAX_REPLICATION_FACTOR}, got {replication_factor}",
        )
    if replication_factor > len(live):
        raise TopicError(
            ErrorCode.invalid_replication_factor,
            f"replication factor {replication_factor} is larger than the {len(live)} "
            f"available brokers",
        )
    racks = {b: batch.image.brokers[b].rack for b in live}
    return placement(live, racks, count, replication_factor, start)


def _partition_records(
    topic_id: uuid.UUID,
    first_index: int,
    assignments: Sequence[tuple[int, ...]],
    eligible: Callable[[int], bool],
) -> list[r.Record]:
    out: list[r.Record] = []
    for offset, replicas in enumerate(assignments):
        state = initial_state(replicas, eligible)
        out.append(
            r.Partition(topic_id, first_index + offset, state.replicas, state.isr, state.leader)
        )
    return out


def create_topics(
    batch: Batch,
    req: CreateTopics,
    config: NodeConfig,
    new_topic_id: Callable[[], uuid.UUID],
    placement_start: int,
) -> tuple[CreateTopicsReply, int]:
    """Returns the reply and the next placement start (rotated once per created topic)."""
    names = [t.name for t in req.topics]
    results = []
    for topic in req.topics:
        try:
            if names.count(topic.name) > 1:
                raise TopicError(ErrorCode.invalid_request, "topic named twice in one request")
            check_topic_name(topic.name)
            if batch.image.topic(topic.name) is not None:
                raise TopicError(
                    ErrorCode.topic_already_exists, f"topic {topic.name!r} already exists"
                )
            key = _collision_key(topic.name)
            clash = [n for n in batch.image.topic_ids_by_name if _collision_key(n) == key]
            if clash:
                raise TopicError(
                    ErrorCode.invalid_topic_exception,
                    f"topic {topic.name!r} collides with existing topic {clash[0]!r} "
                    f"('.' and '_' are interchangeable in metric names)",
                )
            message = validate_configs(TOPIC_CONFIGS, topic.configs)
            if message is not None:
                raise TopicError(ErrorCode.invalid_config, message)
            eligible = eligible_fn(batch.image)
            if topic.assignments is not None:
                if topic.num_partitions != -1 or topic.replication_factor != -1:
                    raise TopicError(
                        ErrorCode.invalid_request,
                        "with explicit assignments, num_partitions and replication_factor "
                        "must be -1",
                    )
                indexes = sorted(topic.assignments)
                if indexes != list(range(len(indexes))) or not indexes:
                    raise TopicError(
                        ErrorCode.invalid_replica_assignment,
                        f"assigned partitions {indexes} must be 0..n-1",
                    )
                if len(indexes) > MAX_PARTITIONS_PER_TOPIC:
                    raise TopicError(
                        ErrorCode.invalid_partitions,
                        f"more than {MAX_PARTITIONS_PER_TOPIC} partitions",
                    )
                assignments = [tuple(topic.assignments[i]) for i in indexes]
                _check_assignments(batch, assignments, eligible)
            else:
                count = (
                    config.num_partitions if topic.num_partitions == -1 else topic.num_partitions
                )
                if not 1 <= count <= MAX_PARTITIONS_PER_TOPIC:
                    raise TopicError(
                        ErrorCode.invalid_partitions,
                        f"number of partitions must be 1..{MAX_PARTITIONS_PER_TOPIC}, got {count}",
                    )
                rf = (
                    config.default_replication_factor
                    if topic.replication_factor == -1
                    else topic.replication_factor
                )
                assignments = _auto_assign(batch, count, rf, placement_start)
        except TopicError as exc:
            results.append(CreateTopicResult(topic.name, exc.code, exc.message))
            continue
        topic_id = new_topic_id()
        if not req.validate_only:
            placement_start += 1
            config_records = [
                r.Config("topic", topic.name, k, v) for k, v in sorted(topic.configs.items())
            ]
            batch.add(
                r.Topic(topic.name, topic_id),
                *_partition_records(topic_id, 0, assignments, eligible),
                *config_records,
            )
        results.append(
            CreateTopicResult(
                topic.name,
                topic_id=None if req.validate_only else topic_id,
                num_partitions=len(assignments),
                replication_factor=len(assignments[0]),
            )
        )
    return CreateTopicsReply(tuple(results)), placement_start


def delete_topics(batch: Batch, req: DeleteTopics) -> DeleteTopicsReply:
    results = []
    for name in req.names:
        topic = batch.image.topic(name)
        if topic is None:
            results.append(
                DeleteTopicResult(
                    name, None, ErrorCode.unknown_topic_or_partition, f"no topic {name!r}"
                )
            )
            continue
        batch.add(r.RemoveTopic(topic.topic_id))
        results.append(DeleteTopicResult(name, topic.topic_id))
    for topic_id in req.topic_ids:
        topic = batch.image.topics_by_id.get(topic_id)
        if topic is None:
            results.append(
                DeleteTopicResult(
                    None, topic_id, ErrorCode.unknown_topic_id, f"no topic with id {topic_id}"
                )
            )
            continue
        batch.add(r.RemoveTopic(topic_id))
        results.append(DeleteTopicResult(topic.name, topic_id))
    return DeleteTopicsReply(tuple(results))


def create_partitions(
    batch: Batch, req: CreatePartitions, placement_start: int
) -> CreatePartitionsReply:
    names = [t.name for t in req.topics]
    results = []
    for item in req.topics:
        try:
            if names.count(item.name) > 1:
                raise TopicError(ErrorCode.invalid_request, "topic named twice in one request")
            topic = batch.image.topic(item.name)
            if topic is None:
                raise TopicError(ErrorCode.unknown_topic_or_partition, f"no topic {item.name!r}")
            current = len(topic.partitions)
            if item.count <= current:
                raise TopicError(
                    ErrorCode.invalid_partitions,
                    f"topic {item.name!r} has {current} partitions; the new count "
                    f"{item.count} must be larger",
                )
            if item.count > MAX_PARTITIONS_PER_TOPIC:
                raise TopicError(
                    ErrorCode.invalid_partitions,
                    f"more than {MAX_PARTITIONS_PER_TOPIC} partitions",
                )
            added = item.count - current
            eligible = eligible_fn(batch.image)
            if item.assignments is not None:
                if len(item.assignments) != added:
                    raise TopicError(
                        ErrorCode.invalid_replica_assignment,
                        f"{len(item.assignments)} assignments given for {added} new partitions",
                    )
                assignments = [tuple(a) for a in item.assignments]
                _check_assignments(batch, assignments, eligible)
            else:
                rf = len(topic.partitions[0].replicas)
                assignments = _auto_assign(batch, added, rf, placement_start + current)
        except TopicError as exc:
            results.append(CreatePartitionsResult(item.name, exc.code, exc.message))
            continue
        if not req.validate_only:
            batch.add(*_partition_records(topic.topic_id, current, assignments, eligible))
        results.append(CreatePartitionsResult(item.name))
    return CreatePartitionsReply(tuple(results))


def new_topic_id_factory(source: Callable[[], uuid.UUID]) -> Callable[[], uuid.UUID]:
    """Kafka reserves the all-zero UUID (and 1 for the metadata topic); never hand them out."""

    def make() -> uuid.UUID:
        while True:
            topic_id = source()
            if topic_id.int > 1:
                return topic_id

    return make
