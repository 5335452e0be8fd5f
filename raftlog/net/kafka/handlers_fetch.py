"""Fetch, ListOffsets and OffsetForLeaderEpoch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import trio

from raftlog.constants import EARLIEST_TIMESTAMP
from raftlog.errors import ErrorCode
from raftlog.net.kafka import authz
from raftlog.net.kafka.backend import (
    EpochEndOffset,
    FetchResult,
    IsolationLevel,
    ListOffsetsResult,
)
from raftlog.net.kafka.codec import RecordSet
from raftlog.net.kafka.context import RequestContext
from raftlog.net.kafka.handlers_util import guarded, leader_dict, to_ms

# ------------------------------------------------------------------------------ Fetch


async def _wait_any(events: list[trio.Event]) -> None:
    """Return when any of the events is set."""
    if any(e.is_set() for e in events):
        return
    async with trio.open_nursery() as nursery:

        async def waiter(event: trio.Event) -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        for event in events:
            nursery.start_soon(waiter, event)


async def _read_all(
    ctx: RequestContext,
    wanted: list[tuple[str, int, int, int, int]],
    max_bytes: int,
    isolation: IsolationLevel,
) -> tuple[list[FetchResult], int]:
    """One pass over the requested partitions. The response limit max_bytes is soft in the
    Kafka sense: the first non-empty partition always returns at least one batch, so a
    consumer can make progress past a batch larger than its limits."""
    results: list[FetchResult] = []
    remaining_bytes = max_bytes
    total_bytes = 0
    for topic, partition, offset, partition_max_bytes, leader_epoch in wanted:
        # The first partition is held to the response limit too (a consumer quota may have
        # lowered it); the backend still returns at least one batch, so progress is kept.
        limit = min(partition_max_bytes, remaining_bytes)
        result = await guarded(
            f"fetch {topic}-{partition}",
            partial(
                ctx.backend.fetch, topic, partition, offset, max(1, limit), leader_epoch, isolation
            ),
            lambda code, msg: FetchResult(code),
        )
        size = result.records_bytes
        if total_bytes and size > remaining_bytes:
            # Over the response limit: keep the partition's offsets, drop its records.
            result = dataclasses.replace(result, records=(), aborted_transactions=())
            size = 0
        total_bytes += size
        remaining_bytes -= size
        results.append(result)
    return results, total_bytes


async def handle_fetch(ctx: RequestContext, request: Any) -> dict[str, Any]:
    # Fetch sessions (KIP-227) are optional for a broker: we never create one (session id
    # 0 in every answer), so a client only ever sends full fetches. A client that names a
    # session anyway gets FETCH_SESSION_ID_NOT_FOUND and falls back to a full fetch.
    if getattr(request, "session_id", 0) != 0:
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.fetch_session_id_not_found,
            "session_id": 0,
            "responses": [],
        }
    isolation = IsolationLevel(getattr(request, "isolation_level", 0))
    max_bytes = min(
        getattr(request, "max_bytes", ctx.config.fetch_max_bytes), ctx.config.fetch_max_bytes
    )
    # Under a consumer quota one response carries at most one quota window's bytes (Kafka's
    # getMaxValueInQuotaWindow): the bytes arrive evenly instead of as a burst and a mute.
    # Replication is never throttled. raftlog's followers fetch over the internal listener,
    # but a fetch that names a replica (replica_id, or replica_state from v15) is exempt too.
    replica_state = getattr(request, "replica_state", None)
    replica_id = getattr(replica_state, "replica_id", getattr(request, "replica_id", -1))
    is_replica = replica_id is not None and replica_id >= 0
    quota_max_bytes = (
        None if is_replica else ctx.quotas.fetch_max_bytes(ctx.client_id, ctx.connection.user)
    )
    if quota_max_bytes is not None:
        max_bytes = min(max_bytes, quota_max_bytes)
    max_wait_ms = min(to_ms(request.max_wait), ctx.config.request_timeout_ms)
    min_bytes = request.min_bytes
    wanted = [
        (
            topic.topic,
            p.partition,
            p.fetch_offset,
            p.partition_max_bytes,
            getattr(p, "current_leader_epoch", -1),
        )
        for topic in request.topics
        for p in topic.partitions
    ]
    # Partitions the authorizer refused: answered with the error, never read or waited on.
    refused: list[tuple[str, int, int, int, int]] = []
    if ctx.authorizer is not None:
        wanted, refused = _split_authorized(ctx, wanted, is_replica)
    deadline = trio.current_time() + max_wait_ms / 1000
    while True:
        # Take the events before reading so an append between read and wait wakes us.
        events = [ctx.backend.data_event(t, p) for t, p, _, _, _ in wanted]
        results, total_bytes = await _read_all(ctx, wanted, max_bytes, isolation)
        done = (
            total_bytes >= min_bytes
            or not wanted
            or any(r.error != ErrorCode.none for r in results)
            or trio.current_time() >= deadline
        )
        if done:
            break
        with trio.move_on_at(deadline):
            await _wait_any(events)

    if not is_replica:
        # Zero-copy regions count at their length: the bytes the socket will carry.
        ctx.throttle(ctx.quotas.record_fetch(ctx.client_id, ctx.connection.user, total_bytes))
    by_topic: dict[str, list[dict[str, Any]]] = {}
    if refused:
        wanted = wanted + refused
        results = results + [FetchResult(ErrorCode.topic_authorization_failed)] * len(refused)
    for (topic, partition, _, _, _), r in zip(wanted, results, strict=True):
        entry: dict[str, Any] = {
            "partition_index": partition,
            "error_code": r.error,
            "high_watermark": r.high_watermark,
            "last_stable_offset": r.last_stable_offset,
            "log_start_offset": r.log_start_offset,
            # Always empty under read_uncommitted (its result carries none).
            "aborted_transactions": [
                {"producer_id": pid, "first_offset": first} for pid, first in r.aborted_transactions
            ],
            "preferred_read_replica": r.preferred_read_replica,
            "records": RecordSet(r.records),
        }
        if r.diverging_epoch is not None:
            entry["diverging_epoch"] = {
                "epoch": r.diverging_epoch[0],
                "end_offset": r.diverging_epoch[1],
            }
        if r.current_leader is not None:
            entry["current_leader"] = leader_dict(r.current_leader)
        by_topic.setdefault(topic, []).append(entry)
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "session_id": 0,
        "responses": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
    }


def _split_authorized(
    ctx: RequestContext, wanted: list[tuple[str, int, int, int, int]], is_replica: bool
) -> tuple[list[tuple[str, int, int, int, int]], list[tuple[str, int, int, int, int]]]:
    """(allowed, refused) partitions: a consumer needs READ on each topic; a fetch naming a
    replica needs CLUSTER_ACTION on the cluster for all of them (as Kafka)."""
    if is_replica:
        if authz.allows(ctx, authz.CLUSTER_ACTION_FOR_REPLICA_FETCH):
            return wanted, []
        return [], wanted
    readable = authz.allowed_names(ctx, authz.READ_TOPIC, (w[0] for w in wanted))
    return [w for w in wanted if w[0] in readable], [w for w in wanted if w[0] not in readable]


def _describable(
    ctx: RequestContext,
    topics: Iterable[Any],
    name_of: Callable[[Any], str],
    *,
    cluster_action_covers: bool = False,
) -> set[str] | None:
    """ListOffsets and OffsetForLeaderEpoch: the topics the principal may DESCRIBE (None:
    all of them: no authorizer, or, for OffsetForLeaderEpoch, a follower's CLUSTER_ACTION)."""
    if ctx.authorizer is None:
        return None
    if cluster_action_covers and authz.allows(ctx, authz.CLUSTER_ACTION, log_denied=False):
        return None
    return authz.allowed_names(ctx, authz.DESCRIBE_TOPIC, (name_of(t) for t in topics))


# ------------------------------------------------------------------------------ ListOffsets
# KIP-405/KIP-1005 tiered-storage specs (ListOffsets v8 and v9). Without tiered storage the
# local log is the whole log: EARLIEST_LOCAL is the log start, and LATEST_TIERED (the highest
# offset uploaded) is offset -1 with leader epoch -1, as Kafka answers when remote storage
# is off.
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5


async def _list_offset(
    ctx: RequestContext,
    topic: str,
    partition: int,
    timestamp_ms: int,
    leader_epoch: int,
    isolation: IsolationLevel,
) -> ListOffsetsResult:
    # The tiered specs are asked as EARLIEST: the backend still checks the partition, its
    # leadership and the client's epoch, and their errors come first, as in Kafka.
    tiered = timestamp_ms in (EARLIEST_LOCAL_TIMESTAMP, LATEST_TIERED_TIMESTAMP)
    result = await guarded(
        f"list_offset {topic}-{partition}",
        partial(
            ctx.backend.list_offset,
            topic,
            partition,
            EARLIEST_TIMESTAMP if tiered else timestamp_ms,
            leader_epoch,
            isolation,
        ),
        lambda code, msg: ListOffsetsResult(code),
    )
    if timestamp_ms == LATEST_TIERED_TIMESTAMP and result.error == ErrorCode.none:
        return ListOffsetsResult()  # nothing is tiered: offset -1, leader epoch -1
    return result


async def handle_list_offsets(ctx: RequestContext, request: Any) -> dict[str, Any]:
    isolation = IsolationLevel(getattr(request, "isolation_level", 0))
    describable = _describable(ctx, request.topics, lambda t: t.name)
    topics = []
    for topic in request.topics:
        partitions = []
        if describable is not None and topic.name not in describable:
            partitions = [
                {
                    "partition_index": p.partition_index,
                    "error_code": ErrorCode.topic_authorization_failed,
                    "timestamp": -1,
                    "offset": -1,
                    "leader_epoch": -1,
                }
                for p in topic.partitions
            ]
            topics.append({"name": topic.name, "partitions": partitions})
            continue
        for p in topic.partitions:
            leader_epoch = getattr(p, "current_leader_epoch", -1)
            result = await _list_offset(
                ctx, topic.name, p.partition_index, p.timestamp, leader_epoch, isolation
            )
            partitions.append(
                {
                    "partition_index": p.partition_index,
                    "error_code": result.error,
                    "timestamp": result.timestamp_ms,
                    "offset": result.offset,
                    "leader_epoch": result.leader_epoch,
                }
            )
        topics.append({"name": topic.name, "partitions": partitions})
    return {"throttle_time": 0, "topics": topics}


# ------------------------------------------------------------------- OffsetForLeaderEpoch
async def handle_offset_for_leader_epoch(ctx: RequestContext, request: Any) -> dict[str, Any]:
    describable = _describable(ctx, request.topics, lambda t: t.topic, cluster_action_covers=True)
    topics = []
    for topic in request.topics:
        partitions = []
        if describable is not None and topic.topic not in describable:
            partitions = [
                {
                    "error_code": ErrorCode.topic_authorization_failed,
                    "partition": p.partition,
                    "leader_epoch": -1,
                    "end_offset": -1,
                }
                for p in topic.partitions
            ]
            topics.append({"topic": topic.topic, "partitions": partitions})
            continue
        for p in topic.partitions:
            result = await guarded(
                f"offset_for_leader_epoch {topic.topic}-{p.partition}",
                partial(
                    ctx.backend.offset_for_leader_epoch,
                    topic.topic,
                    p.partition,
                    getattr(p, "current_leader_epoch", -1),
                    p.leader_epoch,
                ),
                lambda code, msg: EpochEndOffset(code),
            )
            partitions.append(
                {
                    "error_code": result.error,
                    "partition": p.partition,
                    "leader_epoch": result.leader_epoch,
                    "end_offset": result.end_offset,
                }
            )
        topics.append({"topic": topic.topic, "partitions": partitions})
    return {"throttle_time": 0, "topics": topics}
