"""DescribeTopicPartitions (API 75, v0, KIP-966): topics with their partitions, paged.

Kafka's semantics, which librdkafka and Kafka's admin client rely on to walk big clusters:
- no topics named: every topic the principal may DESCRIBE (the others are left out
  silently); named topics: those, a refused one answered TOPIC_AUTHORIZATION_FAILED with no
  topic id (its existence stays hidden), an unknown one UNKNOWN_TOPIC_OR_PARTITION and a
  malformed name INVALID_TOPIC_EXCEPTION;
- topics in name order, starting at the cursor (topic, first partition); the cursor's topic
  must be among the named ones and its partition non-negative, else every named topic gets
  INVALID_REQUEST;
- at most `response_partition_limit` partitions an answer (clamped to
  1..MAX_RESPONSE_PARTITIONS, Kafka's max.request.partition.size.limit default); when more
  remain, `next_cursor` names where the next request starts.
There are no eligible leader replicas (KIP-966 ELR) here: those fields are null.
"""

from __future__ import annotations

from typing import Any

from raftlog.errors import ErrorCode
from raftlog.metadata.controller.topics import TopicError, check_topic_name
from raftlog.net.kafka import authz
from raftlog.net.kafka.backend import PartitionInfo, TopicInfo
from raftlog.net.kafka.context import RequestContext
from raftlog.net.kafka.handlers_core import partition_dict
from raftlog.security.acl import ResourceType

# Kafka's max.request.partition.size.limit default: the most partitions one answer holds.
MAX_RESPONSE_PARTITIONS = 2000
# The most topics one request may name (Kafka has no such bound).
MAX_TOPICS_PER_REQUEST = 10_000


async def handle_describe_topic_partitions(ctx: RequestContext, request: Any) -> dict[str, Any]:
    named = [t.name for t in request.topics]
    cursor = request.cursor
    cursor_topic = cursor.topic_name if cursor is not None else ""
    if len(named) > MAX_TOPICS_PER_REQUEST:
        return _refused(named, ErrorCode.invalid_request)
    fetch_all = not named
    if fetch_all:
        candidates = {t.name for t in ctx.backend.topics(None) if t.name >= cursor_topic}
    else:
        candidates = {name for name in named if name >= cursor_topic}
        if cursor is not None and cursor_topic not in candidates:
            return _refused(named, ErrorCode.invalid_request)
    if cursor is not None and cursor.partition_index < 0:
        return _refused(named, ErrorCode.invalid_request)
    ordered = sorted(candidates)
    allowed = authz.allowed_names(ctx, authz.DESCRIBE_TOPIC, ordered, log_denied=not fetch_all)
    # A listing leaves refused topics out; named ones are answered, without a topic id.
    refused = (
        []
        if fetch_all
        else [_topic_error(n, authz.DESCRIBE_TOPIC.error) for n in ordered if n not in allowed]
    )
    described = [n for n in ordered if n in allowed]
    infos = {t.name: t for t in ctx.backend.topics(described)} if described else {}
    limit = max(min(MAX_RESPONSE_PARTITIONS, int(request.response_partition_limit)), 1)
    topics: list[dict[str, Any]] = []
    next_cursor: dict[str, Any] | None = None
    for name in described:
        info = infos.get(name)
        if limit == 0:
            # Every earlier topic was answered whole: the next page starts at this one.
            next_cursor = {"topic_name": name, "partition_index": 0}
            break
        if info is None:
            if not fetch_all:  # a listing skips a topic deleted meanwhile
                topics.append(_topic_error(name, _missing_topic_error(name)))
            continue
        first = cursor.partition_index if cursor is not None and name == cursor_topic else 0
        partitions = sorted(info.partitions, key=lambda p: p.partition)[first:]
        page = partitions[:limit]
        topics.append(_topic_dict(ctx, info, page))
        if len(partitions) > len(page):
            next_cursor = {"topic_name": name, "partition_index": page[-1].partition + 1}
            break
        limit -= len(page)
    return {"throttle_time": 0, "topics": topics + refused, "next_cursor": next_cursor}


def _missing_topic_error(name: str) -> ErrorCode:
    try:
        check_topic_name(name)
    except TopicError:
        return ErrorCode.invalid_topic_exception
    return ErrorCode.unknown_topic_or_partition


def _topic_error(name: str, code: ErrorCode) -> dict[str, Any]:
    # No topic id with an error: a refused topic must not be told apart from a missing one.
    return {
        "error_code": code,
        "name": name,
        "topic_id": None,
        "is_internal": False,
        "partitions": [],
    }


def _refused(named: list[str], code: ErrorCode) -> dict[str, Any]:
    # Kafka's answer to a request it rejects: each named topic with the error, nothing else.
    return {
        "throttle_time": 0,
        "topics": [_topic_error(name, code) for name in dict.fromkeys(named)],
        "next_cursor": None,
    }


def _topic_dict(ctx: RequestContext, info: TopicInfo, page: list[PartitionInfo]) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none,
        "name": info.name,
        "topic_id": info.topic_id,
        "is_internal": info.is_internal,
        "partitions": [_partition_dict(p) for p in page],
        "topic_authorized_operations": authz.authorized_operations(
            ctx, ResourceType.TOPIC, info.name
        ),
    }


def _partition_dict(p: PartitionInfo) -> dict[str, Any]:
    # Metadata's partition, with KIP-966's eligible leader replicas (none kept: null).
    return {**partition_dict(p), "eligible_leader_replicas": None, "last_known_elr": None}
