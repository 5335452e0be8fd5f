"""DeleteRecords (KIP-107): move partitions' log start offsets up, on their leaders.

Kafka's checks: DELETE on each topic (TOPIC_AUTHORIZATION_FAILED per partition without it),
UNKNOWN_TOPIC_OR_PARTITION for a partition the cluster does not have, OFFSET_OUT_OF_RANGE for
an offset above the high watermark or below -1 (the one negative offset the API has: "up to
the high watermark"), NOT_LEADER_OR_FOLLOWER on a broker that does not lead it. Partitions
are handled concurrently; a request names at most MAX_PARTITIONS_PER_REQUEST of them (more
are answered INVALID_REQUEST each, nothing deleted).
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from raftlog.errors import ErrorCode
from raftlog.net.kafka import authz
from raftlog.net.kafka.backend import DeleteRecordsResult
from raftlog.net.kafka.context import RequestContext
from raftlog.net.kafka.handlers_util import guarded, partition_counts
from raftlog.net.limits import RateLimitedLog

log = logging.getLogger("raftlog.kafka")
_refusals = RateLimitedLog(log)

MAX_PARTITIONS_PER_REQUEST = 10_000
TO_HIGH_WATERMARK = -1


async def handle_delete_records(ctx: RequestContext, request: Any) -> dict[str, Any]:
    pairs = [
        (t.name, int(p.partition_index), int(p.offset))
        for t in request.topics
        for p in t.partitions
    ]
    results: list[DeleteRecordsResult] = [DeleteRecordsResult()] * len(pairs)
    if len(pairs) > MAX_PARTITIONS_PER_REQUEST:
        _refusals.warning(
            "refused DeleteRecords of %d partitions from client %r (at most %d)",
            len(pairs),
            ctx.client_id,
            MAX_PARTITIONS_PER_REQUEST,
        )
        results = [DeleteRecordsResult(ErrorCode.invalid_request)] * len(pairs)
        return _response(pairs, results)
    names = {topic for topic, _, _ in pairs}
    deletable = authz.allowed_names(ctx, authz.DELETE_TOPIC, names)
    counts = partition_counts(ctx, (n for n in names if n in deletable))
    # The client's timeout is what Kafka waits in its purgatory for the replicas' low
    # watermark; it never cuts the leader's own move short (librdkafka sends 0 and expects
    # the records deleted). The leader's part, its new log start made durable, is bounded by
    # request_timeout_ms.
    timeout_s = ctx.config.request_timeout_ms / 1000

    async def one(i: int, topic: str, partition: int, offset: int) -> None:
        with trio.move_on_after(timeout_s) as waited:
            results[i] = await guarded(
                f"delete_records {topic}-{partition}",
                lambda: ctx.backend.delete_records(topic, partition, offset),
                lambda code, message: DeleteRecordsResult(code, error_message=message),
            )
        if waited.cancelled_caught:
            results[i] = DeleteRecordsResult(ErrorCode.request_timed_out)

    async with trio.open_nursery() as nursery:
        for i, (topic, partition, offset) in enumerate(pairs):
            if topic not in deletable:
                results[i] = DeleteRecordsResult(authz.DELETE_TOPIC.error)
            elif not 0 <= partition < counts.get(topic, 0):
                results[i] = DeleteRecordsResult(ErrorCode.unknown_topic_or_partition)
            elif offset < TO_HIGH_WATERMARK:
                results[i] = DeleteRecordsResult(ErrorCode.offset_out_of_range)
            else:
                nursery.start_soon(one, i, topic, partition, offset)
    return _response(pairs, results)


def _response(
    pairs: list[tuple[str, int, int]], results: list[DeleteRecordsResult]
) -> dict[str, Any]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition, _), result in zip(pairs, results, strict=True):
        by_topic.setdefault(topic, []).append(
            {
                "partition_index": partition,
                "low_watermark": result.low_watermark,
                "error_code": result.error,
            }
        )
    return {
        "throttle_time": 0,
        "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()],
    }
