"""The transaction APIs a partition's leader answers: WriteTxnMarkers (from transaction
coordinators, and from `kafka-transactions.sh abort`) and DescribeProducers; and the range
checks every transaction handler shares (handlers_txn.py has the coordinator's APIs).

Both are answered by the node's backend for the partitions this broker leads. A request over
a count limit is answered without per-item results (see handlers_txn.py); error answers carry
codes only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import trio
from kio.schema.index import api_key_map

from raftlog.codec import I64_MAX
from raftlog.errors import ErrorCode
from raftlog.net.kafka import authz
from raftlog.net.kafka.backend import (
    PartitionProducers,
    ProducerDescription,
    TopicPartitionKey,
    TxnMarkerWrite,
)
from raftlog.net.kafka.context import RequestContext
from raftlog.net.kafka.handlers_util import guarded, partition_counts
from raftlog.net.limits import RateLimitedLog
from raftlog.txn.log_format import (
    MAX_PRODUCER_EPOCH,
    MAX_TRANSACTIONAL_ID_BYTES,
    NO_MARKER_TOPICS,
)

log = logging.getLogger("raftlog.kafka")
_oversized = RateLimitedLog(log)
_truncated = RateLimitedLog(log)

# Bounds on one request's fan-out (Kafka has none; real clients name a transaction's
# partitions, a coordinator's markers for one broker, an operator's few ids). A transaction
# holds at most TxnConfig.max_partitions_per_transaction (10 000) partitions anyway.
MAX_PARTITIONS_PER_REQUEST = 10_000
# DescribeProducers answers up to ProducerStateConfig.max_producer_ids (10 000) producers
# per partition: this bounds the response (and the concurrent look-ups) instead.
MAX_DESCRIBED_PARTITIONS = 1_000
# ... and this bounds the producers of one response: 1 000 partitions of 10 000 producers
# would be 10 million entries. Past it, the partitions' lists are cut short (and logged).
MAX_DESCRIBED_PRODUCERS = 100_000
MAX_MARKERS_PER_REQUEST = 10_000


# ------------------------------------------------------------------ range checks
def valid_transactional_id(transactional_id: str) -> bool:
    """Non-empty and within what `__transaction_state` can store."""
    if not transactional_id or len(transactional_id) > MAX_TRANSACTIONAL_ID_BYTES:
        return False
    return len(transactional_id.encode("utf-8", "surrogatepass")) <= MAX_TRANSACTIONAL_ID_BYTES


def valid_producer(producer_id: int, producer_epoch: int) -> bool:
    return 0 <= producer_id <= I64_MAX and 0 <= producer_epoch <= MAX_PRODUCER_EPOCH


def request_pairs(topics: Iterable[Any], field: str) -> list[TopicPartitionKey]:
    """(topic, partition) of a request's topics, duplicates dropped, in request order."""
    return list(dict.fromkeys((t.name, int(p)) for t in topics for p in getattr(t, field)))


def partition_count(topics: Iterable[Any], field: str) -> int:
    return sum(len(getattr(t, field)) for t in topics)


def partition_exists(partitions: dict[str, int], key: TopicPartitionKey) -> bool:
    return 0 <= key[1] < partitions.get(key[0], 0)


def by_topic(
    results: Iterable[tuple[TopicPartitionKey, ErrorCode]],
) -> dict[str, list[tuple[int, ErrorCode]]]:
    out: dict[str, list[tuple[int, ErrorCode]]] = {}
    for (topic, partition), code in results:
        out.setdefault(topic, []).append((partition, code))
    return out


def too_big(ctx: RequestContext, what: str, count: int, limit: int) -> bool:
    if count <= limit:
        return False
    _oversized.warning(
        "refused %s from client %r (%s): %d %s, the limit is %d",
        api_key_map.get(ctx.api_key, ctx.api_key),
        ctx.client_id,
        ctx.connection.peer,
        count,
        what,
        limit,
    )
    return True


async def handle_write_txn_markers(ctx: RequestContext, request: Any) -> dict[str, Any]:
    """Kafka's checks: CLUSTER_ACTION (only coordinators send markers; else every
    partition is CLUSTER_AUTHORIZATION_FAILED), then per partition: it exists, and is not
    a topic that never holds transactional data. The backend writes the rest on the
    partitions this broker leads."""
    markers = list(request.markers)
    if too_big(ctx, "markers", len(markers), MAX_MARKERS_PER_REQUEST) or too_big(
        ctx,
        "partitions",
        sum(partition_count(m.topics, "partition_indexes") for m in markers),
        MAX_PARTITIONS_PER_REQUEST,
    ):
        return {"markers": []}
    per_marker = [request_pairs(m.topics, "partition_indexes") for m in markers]
    answers: list[dict[TopicPartitionKey, ErrorCode]] = [{} for _ in markers]
    if not authz.allows(ctx, authz.CLUSTER_ACTION):
        for answer, pairs in zip(answers, per_marker, strict=True):
            answer.update(dict.fromkeys(pairs, authz.CLUSTER_ACTION.error))
        return _markers_response(markers, per_marker, answers)
    existing = partition_counts(ctx, (topic for pairs in per_marker for topic, _ in pairs))
    writes: list[TxnMarkerWrite] = []
    write_at: list[int] = []
    for index, (marker, pairs) in enumerate(zip(markers, per_marker, strict=True)):
        answer = answers[index]
        fields_valid = valid_producer(marker.producer_id, marker.producer_epoch) and (
            marker.coordinator_epoch >= 0
        )
        writable: list[TopicPartitionKey] = []
        for key in pairs:
            if not fields_valid:
                answer[key] = ErrorCode.invalid_request
            elif key[0] in NO_MARKER_TOPICS:
                answer[key] = ErrorCode.invalid_topic_exception
            elif not partition_exists(existing, key):
                answer[key] = ErrorCode.unknown_topic_or_partition
            else:
                writable.append(key)
        if writable:
            write_at.append(index)
            writes.append(
                TxnMarkerWrite(
                    producer_id=int(marker.producer_id),
                    producer_epoch=int(marker.producer_epoch),
                    coordinator_epoch=int(marker.coordinator_epoch),
                    commit=bool(marker.transaction_result),
                    partitions=tuple(writable),
                )
            )
    if writes:
        written = await guarded(
            "write_txn_markers",
            lambda: ctx.backend.write_txn_markers(writes),
            lambda code, _msg: [dict.fromkeys(w.partitions, code) for w in writes],
        )
        for index, write, result in zip(write_at, writes, written, strict=True):
            for key in write.partitions:
                # A partition the backend left out was not written: retriable for the
                # coordinator, never taken as done.
                answers[index][key] = result.get(key, ErrorCode.unknown_server_error)
    return _markers_response(markers, per_marker, answers)


async def handle_describe_producers(ctx: RequestContext, request: Any) -> dict[str, Any]:
    """READ on each topic (else TOPIC_AUTHORIZATION_FAILED, before any existence check);
    then each partition's producers from the backend, which answers only for partitions
    this broker leads."""
    topics = list(request.topics)
    if too_big(
        ctx,
        "partitions",
        partition_count(topics, "partition_indexes"),
        MAX_DESCRIBED_PARTITIONS,
    ):
        return {"topics": []}
    readable = authz.allowed_names(ctx, authz.READ_TOPIC, (t.name for t in topics))
    existing = partition_counts(ctx, (t.name for t in topics if t.name in readable))
    # A repeated partition is answered once, as every other transaction API answers it.
    jobs = request_pairs(topics, "partition_indexes")
    results: list[PartitionProducers] = [PartitionProducers()] * len(jobs)

    async def one(index: int, topic: str, partition: int) -> None:
        results[index] = await guarded(
            f"describe_producers {topic}-{partition}",
            lambda: ctx.backend.describe_producers(topic, partition),
            lambda code, _msg: PartitionProducers(code),
        )

    async with trio.open_nursery() as nursery:
        for index, key in enumerate(jobs):
            if key[0] not in readable:
                results[index] = PartitionProducers(authz.READ_TOPIC.error)
            elif not partition_exists(existing, key):
                results[index] = PartitionProducers(ErrorCode.unknown_topic_or_partition)
            else:
                nursery.start_soon(one, index, *key)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    budget = MAX_DESCRIBED_PRODUCERS
    left_out = 0
    for (topic, partition), result in zip(jobs, results, strict=True):
        producers = result.producers[:budget]
        left_out += len(result.producers) - len(producers)
        budget -= len(producers)
        by_topic.setdefault(topic, []).append(
            {
                "partition_index": partition,
                "error_code": result.error,
                "error_message": None,
                "active_producers": [_producer_dict(p) for p in producers],
            }
        )
    if left_out:
        _truncated.warning(
            "DescribeProducers from client %r (%s): %d producers left out, the limit is %d",
            ctx.client_id,
            ctx.connection.peer,
            left_out,
            MAX_DESCRIBED_PRODUCERS,
        )
    return {"topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}


def _producer_dict(p: ProducerDescription) -> dict[str, Any]:
    return {
        "producer_id": p.producer_id,
        "producer_epoch": p.producer_epoch,
        "last_sequence": p.last_sequence,
        "last_timestamp": p.last_timestamp_ms,
        "coordinator_epoch": p.coordinator_epoch,
        "current_txn_start_offset": p.current_txn_start_offset,
    }


def _markers_response(
    markers: Sequence[Any],
    per_marker: Sequence[Sequence[TopicPartitionKey]],
    answers: Sequence[dict[TopicPartitionKey, ErrorCode]],
) -> dict[str, Any]:
    return {
        "markers": [
            {
                "producer_id": marker.producer_id,
                "topics": [
                    {
                        "name": topic,
                        "partitions": [
                            {"partition_index": partition, "error_code": code}
                            for partition, code in partitions
                        ],
                    }
                    for topic, partitions in by_topic((k, answer[k]) for k in pairs).items()
                ],
            }
            for marker, pairs, answer in zip(markers, per_marker, answers, strict=True)
        ]
    }
