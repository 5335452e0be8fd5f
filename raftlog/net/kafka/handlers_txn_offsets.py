"""TxnOffsetCommit (Kafka API 28; KIP-98, v3+ KIP-447): a transactional producer commits a
consumer group's offsets inside its transaction.

The group coordinator appends them to the group's `__consumer_offsets` partition as a
transactional batch of the producer and keeps them pending until the transaction's marker
lands there (raftlog.groups.txn_offsets); this handler owns what needs the connection and the
cluster's metadata, checked before the coordinator is asked, as Kafka's KafkaApis does:
- range checks of every field: the transactional id (non-empty, within what
  `__transaction_state` stores), the group id, producer id and epoch, at most
  MAX_PARTITIONS_PER_REQUEST partitions, offsets >= 0, leader epochs >= -1 (the metadata
  length bound is the coordinator's offset_metadata_max_bytes);
- authorization (authz.API_RULES): WRITE on the transactional id, then READ on the group
  (either refusal answers every partition), then READ on each topic;
- unknown topics and partitions: UNKNOWN_TOPIC_OR_PARTITION per partition.
The response has no top-level error: every refusal is per partition.

`register_txn_offset_commit(registry, service)` adds it; register_group_apis calls it when
the node runs a transaction coordinator.

KIP-890 part 2: a client of transaction version 2 sends no AddOffsetsToTxn; its TxnOffsetCommit
v5 has the broker add the group's offsets partition to the transaction (Kafka's verification
with the add operation). `with_implicit_add(handler, txn)` does that before the group
coordinator is asked, once the request passed the same checks; register_txn_apis wraps the
registered handler with it and raises the range to v5.
"""

from __future__ import annotations

import logging
from typing import Any

from raftlog.errors import ErrorCode
from raftlog.groups import messages as m
from raftlog.groups.service import GroupService
from raftlog.net.kafka import authz
from raftlog.net.kafka.apis import ApiKey, ApiRegistry
from raftlog.net.kafka.context import Handler, RequestContext
from raftlog.net.kafka.handlers_txn_partitions import valid_producer, valid_transactional_id
from raftlog.net.kafka.handlers_util import partition_counts
from raftlog.net.limits import RateLimitedLog
from raftlog.txn.messages import AddOffsetsToTxnRequest
from raftlog.txn.service import TxnService

log = logging.getLogger("raftlog.kafka")
_refusals = RateLimitedLog(log)

TXN_OFFSET_COMMIT = ApiKey.TXN_OFFSET_COMMIT
# Without a transaction coordinator to add the offsets partition (with_implicit_add), v5
# (KIP-890 part 2) is not offered.
TXN_OFFSET_COMMIT_VERSIONS = (0, 4)
TXN_OFFSET_COMMIT_TV2_SINCE = 5
# What an add's refusal becomes in a TxnOffsetCommit answer: the coordinator being out of
# reach, loading, or finishing the previous transaction is retried by every client as a
# group coordinator that is loading.
_ADD_ERRORS_FOR_COMMIT = {
    ErrorCode.not_coordinator: ErrorCode.coordinator_load_in_progress,
    ErrorCode.coordinator_not_available: ErrorCode.coordinator_load_in_progress,
    ErrorCode.concurrent_transactions: ErrorCode.coordinator_load_in_progress,
    ErrorCode.not_enough_replicas: ErrorCode.coordinator_load_in_progress,
    ErrorCode.request_timed_out: ErrorCode.coordinator_load_in_progress,
}
# A transaction holds at most TxnConfig.max_partitions_per_transaction (10 000) partitions;
# one request committing more is refused whole.
MAX_PARTITIONS_PER_REQUEST = 10_000
# What a non-flexible version carries (an int16 length); the offsets topic keys hold no more.
MAX_GROUP_ID_CHARS = 2**15 - 1
NO_LEADER_EPOCH = -1
# KIP-447 (v3) added the member fields, KIP-890 (v4) TRANSACTION_ABORTABLE.
PRODUCER_FENCED_SINCE_VERSION = 3
TRANSACTION_ABORTABLE_SINCE_VERSION = 4

TopicPartition = tuple[str, int]


def register_txn_offset_commit(registry: ApiRegistry, service: GroupService) -> None:
    """Add TxnOffsetCommit, answered by `service`'s group coordinator, to `registry`."""
    handlers = TxnOffsetHandlers(service)
    lo, hi = TXN_OFFSET_COMMIT_VERSIONS
    registry.register(TXN_OFFSET_COMMIT, lo, hi, handlers.txn_offset_commit)


def for_version(code: ErrorCode, api_version: int) -> ErrorCode:
    """`code` as a TxnOffsetCommit client of `api_version` understands it: older clients
    get INVALID_PRODUCER_EPOCH for a fenced producer, and INVALID_TXN_STATE (abortable, as
    TRANSACTION_ABORTABLE is) before KIP-890."""
    if code == ErrorCode.producer_fenced and api_version < PRODUCER_FENCED_SINCE_VERSION:
        return ErrorCode.invalid_producer_epoch
    if (
        code == ErrorCode.transaction_abortable
        and api_version < TRANSACTION_ABORTABLE_SINCE_VERSION
    ):
        return ErrorCode.invalid_txn_state
    return code


class TxnOffsetHandlers:
    """The TxnOffsetCommit handler, bound to one GroupService."""

    def __init__(self, service: GroupService) -> None:
        self.service = service

    async def txn_offset_commit(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        topics = list(request.topics)
        count = sum(len(t.partitions) for t in topics)
        # Every requested partition, in request order (a repeated one answered once).
        requested = list(
            dict.fromkeys((t.name, int(p.partition_index)) for t in topics for p in t.partitions)
        )
        if count > MAX_PARTITIONS_PER_REQUEST:
            self._refuse(ctx, f"{count} partitions, the limit is {MAX_PARTITIONS_PER_REQUEST}")
            return _response(dict.fromkeys(requested, ErrorCode.invalid_request))
        code = self._check_request(ctx, request)
        if code is not ErrorCode.none:
            return _response(dict.fromkeys(requested, code))
        errors: dict[TopicPartition, ErrorCode] = dict.fromkeys(requested, ErrorCode.none)
        readable = authz.allowed_names(ctx, authz.READ_TOPIC, (t.name for t in topics))
        counts = partition_counts(ctx, readable)
        accepted: dict[str, list[m.OffsetCommitPartition]] = {}
        for topic in topics:
            for p in topic.partitions:
                key = (topic.name, int(p.partition_index))
                code = _check_partition(topic.name, p, readable, counts)
                if code is not ErrorCode.none:
                    errors[key] = code
                    continue
                accepted.setdefault(topic.name, []).append(
                    m.OffsetCommitPartition(
                        key[1],
                        int(p.committed_offset),
                        int(getattr(p, "committed_leader_epoch", NO_LEADER_EPOCH)),
                        p.committed_metadata,
                    )
                )
        if accepted:
            req = m.TxnOffsetCommitRequest(
                transactional_id=request.transactional_id,
                group_id=request.group_id,
                producer_id=int(request.producer_id),
                producer_epoch=int(request.producer_epoch),
                topics=tuple(m.OffsetCommitTopic(t, tuple(ps)) for t, ps in accepted.items()),
                generation_id=int(getattr(request, "generation_id", m.NO_GENERATION)),
                member_id=getattr(request, "member_id", m.UNKNOWN_MEMBER_ID),
                group_instance_id=getattr(request, "group_instance_id", None),
            )
            resp = await self.service.shell.txn_offset_commit(req)
            for topic_errors in resp.topics:
                for pe in topic_errors.partitions:
                    errors[(topic_errors.name, pe.partition)] = pe.error_code
        return _response({k: for_version(v, ctx.api_version) for k, v in errors.items()})

    def _check_request(self, ctx: RequestContext, request: Any) -> ErrorCode:
        return check_request(ctx, request)

    @staticmethod
    def _refuse(ctx: RequestContext, what: str) -> None:
        _refuse(ctx, what)


def with_implicit_add(handler: Handler, txn: TxnService) -> Handler:
    """`handler` (TxnOffsetCommit) that, for v5+, first adds the group's offsets partition to
    the producer's transaction at its coordinator (KIP-890 part 2), answered once the
    coordinator's record is replicated; a refusal answers every partition with its code."""

    async def handle(ctx: RequestContext, request: Any) -> dict[str, Any] | None:
        if ctx.api_version < TXN_OFFSET_COMMIT_TV2_SINCE:
            return await handler(ctx, request)
        topics = list(request.topics)
        count = sum(len(t.partitions) for t in topics)
        if count > MAX_PARTITIONS_PER_REQUEST or check_request(ctx, request) != ErrorCode.none:
            return await handler(ctx, request)  # refused there, with the same checks
        code = await txn.add_offsets_for_commit(
            AddOffsetsToTxnRequest(
                transactional_id=request.transactional_id,
                producer_id=int(request.producer_id),
                producer_epoch=int(request.producer_epoch),
                group_id=request.group_id,
            )
        )
        if code != ErrorCode.none:
            code = _ADD_ERRORS_FOR_COMMIT.get(code, code)
            requested = dict.fromkeys(
                (t.name, int(p.partition_index)) for t in topics for p in t.partitions
            )
            return _response(dict.fromkeys(requested, for_version(code, ctx.api_version)))
        return await handler(ctx, request)

    return handle


def check_request(ctx: RequestContext, request: Any) -> ErrorCode:
    """What refuses the whole request: malformed ids, then authorization."""
    transactional_id = request.transactional_id
    if not valid_transactional_id(transactional_id):
        _refuse(ctx, "an invalid transactional id")
        return ErrorCode.invalid_request
    if not valid_producer(request.producer_id, request.producer_epoch):
        _refuse(ctx, f"producer {request.producer_id} epoch {request.producer_epoch}")
        return ErrorCode.invalid_request
    if not authz.allows(ctx, authz.WRITE_TRANSACTIONAL_ID, transactional_id):
        return authz.WRITE_TRANSACTIONAL_ID.error
    group_id = request.group_id
    if not group_id or len(group_id) > MAX_GROUP_ID_CHARS:
        return ErrorCode.invalid_group_id
    if not authz.allows(ctx, authz.READ_GROUP, group_id):
        return authz.READ_GROUP.error
    return ErrorCode.none


def _refuse(ctx: RequestContext, what: str) -> None:
    _refusals.warning(
        "refused TxnOffsetCommit from client %r (%s): %s",
        ctx.client_id,
        ctx.connection.peer,
        what,
    )


def _check_partition(
    topic: str, p: Any, readable: set[str], partition_counts: dict[str, int]
) -> ErrorCode:
    if topic not in readable:
        return authz.READ_TOPIC.error
    if not 0 <= p.partition_index < partition_counts.get(topic, 0):
        return ErrorCode.unknown_topic_or_partition
    if p.committed_offset < 0:
        return ErrorCode.invalid_request
    if getattr(p, "committed_leader_epoch", NO_LEADER_EPOCH) < NO_LEADER_EPOCH:
        return ErrorCode.invalid_request
    return ErrorCode.none


def _response(errors: dict[TopicPartition, ErrorCode]) -> dict[str, Any]:
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), code in errors.items():
        topics.setdefault(topic, []).append({"partition_index": partition, "error_code": code})
    return {"topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}
