"""Fetch, ListOffsets and OffsetForLeaderEpoch."""

from __future__ import annotations

import dataclasses
import uuid
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
    LeaderHint,
    ListOffsetsResult,
)
from raftlog.net.kafka.codec import RecordSet
from raftlog.net.kafka.context import RequestContext
from raftlog.net.kafka.handlers_core import node_endpoints
from raftlog.net.kafka.handlers_util import guarded, leader_dict, log, to_ms
from raftlog.net.limits import RateLimitedLog

# ------------------------------------------------------------------------------ Fetch
# Fetch v13 (KIP-516) names topics by id in the request and the answer.
FETCH_TOPIC_IDS_SINCE = 13
# KIP-227's session epochs: FINAL (-1) is a full fetch that opens no session, INITIAL (0) a
# full fetch that asks for one; anything above is an incremental fetch of an open session.
FINAL_SESSION_EPOCH = -1
INITIAL_SESSION_EPOCH = 0
# KIP-951: the errors whose partitions carry the current leader (and, from v16, its
# endpoint), so a client re-routes without asking for metadata first.
_LEADER_MOVED = (ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch)
# One line per interval however often a client repeats a malformed fetch.
_malformed_fetches = RateLimitedLog(log)


@dataclasses.dataclass(frozen=True, slots=True)
class _Wanted:
    """One partition of a fetch request, its topic resolved."""

    key: str | uuid.UUID | None  # the topic as the answer names it: name (v4-12), id (v13+)
    topic: str | None  # its name; None for a topic id this node does not know
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    leader_epoch: int


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


def _session_refusal(request: Any) -> ErrorCode | None:
    """Fetch sessions (KIP-227) are optional for a broker and raftlog opens none: every
    answer carries session id 0, so a client keeps sending full fetches. A full fetch
    (epoch FINAL or INITIAL) is served whatever session id it names (Kafka closes that
    session; there is none to close here); an incremental one cannot name a session that
    exists, and an epoch below FINAL is no epoch at all."""
    epoch = getattr(request, "session_epoch", FINAL_SESSION_EPOCH)
    if epoch < FINAL_SESSION_EPOCH:
        return ErrorCode.invalid_fetch_session_epoch
    if epoch > INITIAL_SESSION_EPOCH:
        return ErrorCode.fetch_session_id_not_found
    return None


def _malformed(request: Any) -> str | None:
    """Why the request's limits make no sense (None: they do). Kafka's clients never send
    a negative limit; answering INVALID_REQUEST says so instead of guessing a meaning."""
    for name in ("max_bytes", "min_bytes"):
        value = getattr(request, name, 0)
        if value < 0:
            return f"{name} {value} is negative"
    max_wait_ms = to_ms(request.max_wait)
    if max_wait_ms < 0:
        return f"max_wait_ms {max_wait_ms} is negative"
    isolation = getattr(request, "isolation_level", 0)
    if isolation not in (IsolationLevel.READ_UNCOMMITTED, IsolationLevel.READ_COMMITTED):
        return f"isolation_level {isolation} is neither 0 nor 1"
    for topic in request.topics:
        for p in topic.partitions:
            if p.partition_max_bytes < 0:
                return f"partition_max_bytes {p.partition_max_bytes} is negative"
    return None


def _fetch_error(ctx: RequestContext, request: Any, code: ErrorCode) -> dict[str, Any]:
    """A malformed fetch, refused as a whole as Kafka refuses one: the error at the top
    level (v7+) and, below v13, on every partition named too (v4-6 have no top-level
    error; v7-12 clients may read either)."""
    responses = []
    if ctx.api_version < FETCH_TOPIC_IDS_SINCE:
        responses = [
            {
                "topic": topic.topic,
                "partitions": [
                    {
                        "partition_index": p.partition,
                        "error_code": code,
                        "high_watermark": -1,
                        "aborted_transactions": [],
                        "records": None,
                    }
                    for p in topic.partitions
                ],
            }
            for topic in request.topics
        ]
    return {"throttle_time": 0, "error_code": code, "session_id": 0, "responses": responses}


def _wanted_partitions(ctx: RequestContext, request: Any) -> list[_Wanted]:
    """The request's partitions in order, topics resolved (by id from v13). A partition named
    twice is fetched once, with the values it was given last, as Kafka keeps the fetch data
    in a map."""
    by_id = ctx.api_version >= FETCH_TOPIC_IDS_SINCE
    names: dict[uuid.UUID, str | None] = {}
    wanted: dict[tuple[str | uuid.UUID | None, int], _Wanted] = {}
    for topic in request.topics:
        key: str | uuid.UUID | None
        name: str | None
        if by_id:
            # kio reads the all-zero id as None: no topic has it.
            topic_id: uuid.UUID | None = topic.topic_id
            key = topic_id
            if topic_id is None:
                name = None
            elif topic_id in names:
                name = names[topic_id]
            else:
                name = names[topic_id] = ctx.backend.topic_name(topic_id)
        else:
            key = name = topic.topic
        for p in topic.partitions:
            wanted[key, p.partition] = _Wanted(
                key,
                name,
                p.partition,
                p.fetch_offset,
                p.partition_max_bytes,
                getattr(p, "current_leader_epoch", -1),
            )
    return list(wanted.values())


async def _read_all(
    ctx: RequestContext,
    wanted: list[_Wanted],
    max_bytes: int,
    isolation: IsolationLevel,
) -> tuple[list[FetchResult], int]:
    """One pass over the requested partitions. The response limit max_bytes is soft in the
    Kafka sense: the first non-empty partition always returns at least one batch, so a
    consumer can make progress past a batch larger than its limits."""
    results: list[FetchResult] = []
    remaining_bytes = max_bytes
    total_bytes = 0
    for w in wanted:
        assert w.topic is not None, w  # unknown topic ids are answered without a read
        # The first partition is held to the response limit too (a consumer quota may have
        # lowered it); the backend still returns at least one batch, so progress is kept.
        limit = min(w.partition_max_bytes, remaining_bytes)
        result = await guarded(
            f"fetch {w.topic}-{w.partition}",
            partial(
                ctx.backend.fetch,
                w.topic,
                w.partition,
                w.fetch_offset,
                max(1, limit),
                w.leader_epoch,
                isolation,
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
    session_error = _session_refusal(request)
    if session_error is not None:
        # As Kafka answers a session error: the code at the top level, no partitions.
        return {"throttle_time": 0, "error_code": session_error, "session_id": 0, "responses": []}
    why = _malformed(request)
    if why is not None:
        _malformed_fetches.warning(
            "refused a fetch from client %r at %s: %s", ctx.client_id, ctx.connection.peer, why
        )
        return _fetch_error(ctx, request, ErrorCode.invalid_request)
    isolation = IsolationLevel(getattr(request, "isolation_level", 0))
    max_bytes = min(
        getattr(request, "max_bytes", ctx.config.fetch_max_bytes), ctx.config.fetch_max_bytes
    )
    # Under a consumer quota one response carries at most one quota window's bytes (Kafka's
    # getMaxValueInQuotaWindow): the bytes arrive evenly instead of as a burst and a mute.
    # Replication is never throttled, but raftlog's followers fetch over the internal
    # listener: a fetch here that names a replica (replica_id, or replica_state from v15) is
    # exempt only when the authorizer grants it CLUSTER_ACTION (as a broker's principal has
    # in Kafka). Without an authorizer anyone could name one, so it is a consumer like any.
    replica_state = getattr(request, "replica_state", None)
    replica_id = getattr(replica_state, "replica_id", getattr(request, "replica_id", -1))
    is_replica = replica_id is not None and replica_id >= 0
    trusted_replica = (
        is_replica
        and ctx.authorizer is not None
        and authz.allows(ctx, authz.CLUSTER_ACTION_FOR_REPLICA_FETCH, log_denied=False)
    )
    quota_max_bytes = (
        None if trusted_replica else ctx.quotas.fetch_max_bytes(ctx.client_id, ctx.connection.user)
    )
    if quota_max_bytes is not None:
        max_bytes = min(max_bytes, quota_max_bytes)
    max_wait_ms = min(to_ms(request.max_wait), ctx.config.request_timeout_ms)
    min_bytes = request.min_bytes
    requested = _wanted_partitions(ctx, request)
    # Partitions answered without a read (and never waited on): an unknown topic id (not
    # authorized or not, as Kafka: ids are not guessable), a negative partition index, a
    # topic the authorizer refused.
    answered: dict[int, FetchResult] = {}
    for i, w in enumerate(requested):
        if w.topic is None:
            answered[i] = FetchResult(ErrorCode.unknown_topic_id)
        elif w.partition < 0:
            answered[i] = FetchResult(ErrorCode.unknown_topic_or_partition)
    if ctx.authorizer is not None:
        answered.update(_refused(ctx, requested, answered, is_replica))
    to_read = [i for i in range(len(requested)) if i not in answered]
    wanted = [requested[i] for i in to_read]
    deadline = trio.current_time() + max_wait_ms / 1000
    while True:
        # Take the events before reading so an append between read and wait wakes us.
        events = [ctx.backend.data_event(w.topic, w.partition) for w in wanted if w.topic]
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

    if not trusted_replica:
        # Zero-copy regions count at their length: the bytes the socket will carry.
        ctx.throttle(ctx.quotas.record_fetch(ctx.client_id, ctx.connection.user, total_bytes))
    answered.update(zip(to_read, results, strict=True))
    leaders: set[int] = set()
    leaders_now: dict[str, dict[int, LeaderHint]] = {}
    by_topic: dict[str | uuid.UUID | None, list[dict[str, Any]]] = {}
    for i, w in enumerate(requested):
        r = answered[i]
        if r.error in _LEADER_MOVED and r.current_leader is None and w.topic is not None:
            if w.topic not in leaders_now:
                leaders_now[w.topic] = _leaders_now(ctx, w.topic)
            r = dataclasses.replace(r, current_leader=leaders_now[w.topic].get(w.partition))
        entry: dict[str, Any] = {
            "partition_index": w.partition,
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
            if r.error in _LEADER_MOVED and r.current_leader.leader_id >= 0:
                leaders.add(r.current_leader.leader_id)
        by_topic.setdefault(w.key, []).append(entry)
    response: dict[str, Any] = {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "session_id": 0,
        # codec.build keeps the one of topic / topic_id that the version has.
        "responses": [{"topic": k, "topic_id": k, "partitions": ps} for k, ps in by_topic.items()],
    }
    if leaders:
        # v16 (KIP-951): where those leaders are, on this listener.
        response["node_endpoints"] = node_endpoints(ctx, leaders)
    return response


def _leaders_now(ctx: RequestContext, topic: str) -> dict[int, LeaderHint]:
    """partition -> leader and epoch as this node's metadata has them (partitions with no
    leader left out), for partitions the backend refused without saying who leads them."""
    return {
        p.partition: LeaderHint(p.leader_id, p.leader_epoch)
        for info in ctx.backend.topics([topic])
        for p in info.partitions
        if p.leader_id >= 0
    }


def _refused(
    ctx: RequestContext,
    requested: list[_Wanted],
    answered: dict[int, FetchResult],
    is_replica: bool,
) -> dict[int, FetchResult]:
    """The partitions the authorizer refuses, by index: a consumer needs READ on each topic;
    a fetch naming a replica needs CLUSTER_ACTION on the cluster for all of them (as
    Kafka)."""
    pending = {i: w.topic for i, w in enumerate(requested) if i not in answered and w.topic}
    refusal = FetchResult(ErrorCode.topic_authorization_failed)
    if is_replica:
        if authz.allows(ctx, authz.CLUSTER_ACTION_FOR_REPLICA_FETCH):
            return {}
        return dict.fromkeys(pending, refusal)
    readable = authz.allowed_names(ctx, authz.READ_TOPIC, pending.values())
    return {i: refusal for i, name in pending.items() if name not in readable}


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
