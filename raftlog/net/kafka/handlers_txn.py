"""Transaction APIs (KIP-98, KIP-360, KIP-664): InitProducerId with a transactional id,
AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, DescribeTransactions and ListTransactions; and
the registration of WriteTxnMarkers and DescribeProducers, which partition leaders answer
(handlers_txn_partitions.py, with the range checks both modules share).

The handlers translate kio's requests into raftlog.txn.messages and ask the node's
TxnService; nothing here decides a transaction. What they own is what needs the cluster's
metadata or the connection, checked before the service is asked, as Kafka's KafkaApis does:
- range checks of every field (transactional ids, producer ids and epochs, counts: one request
  names at most MAX_PARTITIONS_PER_REQUEST partitions and MAX_IDS_PER_REQUEST ids);
- authorization (authz.API_RULES): WRITE on the transactional id, WRITE on each topic for
  AddPartitionsToTxn, READ on the group for AddOffsetsToTxn, CLUSTER_ACTION for what only
  brokers send (WriteTxnMarkers, AddPartitionsToTxn v4+), DESCRIBE to see a transaction;
- unknown topics and partitions (UNKNOWN_TOPIC_OR_PARTITION per partition) and the internal
  topics clients may not add to a transaction.
A request over a count limit is answered without per-item results (INVALID_REQUEST at the
top level where the version has one): echoing a million entries back would be the very work
the limit exists to refuse. Error answers carry codes only, never a message.

Error codes pass through txn.messages.for_version, so a client of an older version never
reads PRODUCER_FENCED.

`register_txn_apis(registry, service)` adds them (and an InitProducerId handler that sends
transactional ids to the service and the rest to handlers_core) to an ApiRegistry;
`TXN_VERSION_TABLE` is the advertised ranges.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from typing import Any

from raftlog.errors import ErrorCode
from raftlog.net.kafka import authz
from raftlog.net.kafka.apis import ApiKey, ApiRegistry
from raftlog.net.kafka.backend import (
    TopicPartitionKey,
)
from raftlog.net.kafka.context import Handler, RequestContext
from raftlog.net.kafka.handlers_core import CLIENT_READ_ONLY_TOPICS, handle_init_producer_id
from raftlog.net.kafka.handlers_txn_offsets import TXN_OFFSET_COMMIT_TV2_SINCE, with_implicit_add
from raftlog.net.kafka.handlers_txn_partitions import (
    MAX_PARTITIONS_PER_REQUEST,
    by_topic,
    handle_describe_producers,
    handle_write_txn_markers,
    partition_count,
    partition_exists,
    request_pairs,
    too_big,
    valid_producer,
    valid_transactional_id,
)
from raftlog.net.kafka.handlers_util import guarded, partition_counts, to_ms
from raftlog.net.limits import RateLimitedLog
from raftlog.txn.log_format import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
)
from raftlog.txn.messages import (
    END_TXN_TV2_SINCE,
    AddOffsetsToTxnRequest,
    AddPartitionsTxn,
    AddPartitionsTxnResult,
    DescribedTransaction,
    EndTxnRequest,
    EndTxnResult,
    InitProducerIdRequest,
    InitProducerIdResult,
    ListTransactionsResult,
    TxnApi,
    for_version,
)
from raftlog.txn.service import TxnService

log = logging.getLogger("raftlog.kafka")
_oversized = RateLimitedLog(log)
_bad_producers = RateLimitedLog(log)


# api key -> (min version, max version). Why each maximum:
# - InitProducerId v5 (TRANSACTION_ABORTABLE) and v6 (KIP-939 two-phase commit): not yet;
# - AddPartitionsToTxn v4 batches transactions and verifies (KIP-890 part 1, sent by brokers);
#   v5 is part 2's;
# - AddPartitionsToTxn v5 only tells the broker the client knows TRANSACTION_ABORTABLE
#   (a TV2 client sends no AddPartitionsToTxn for its data partitions: Produce v12 adds them);
# - AddOffsetsToTxn v4 and EndTxn v4 only tell the broker the client knows
#   TRANSACTION_ABORTABLE, which the coordinator never answers; EndTxn v5 is KIP-890 part 2
#   (an epoch bump per transaction, answered with the new producer id and epoch), offered
#   with the `transaction.version` feature finalized at 2 (handlers_core.feature_fields);
# - Produce v11 only tells the broker the client knows TRANSACTION_ABORTABLE, v12 is KIP-890
#   part 2 (a transactional batch adds its partition to the transaction); v13 addresses
#   topics by id (handlers_core.handle_produce), registered here with v11-12, which are the
#   transaction layer's;
# - WriteTxnMarkers v2 carries the transaction version of KIP-890 part 2 (only the
#   coordinator's own markers need it here, and they travel over the internal RPC);
# - ListTransactions v2 filters by a transactional id regular expression (KIP-1152): not yet.
TXN_VERSION_TABLE: dict[int, tuple[int, int]] = {
    ApiKey.INIT_PRODUCER_ID: (0, 4),
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 4),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 4),
    ApiKey.END_TXN: (0, 5),
    ApiKey.WRITE_TXN_MARKERS: (1, 1),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 1),
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
}

# Produce's range with KIP-890 part 2 (see above); the lower bound is the node's own.
PRODUCE_MAX_VERSION = 13

MAX_IDS_PER_REQUEST = 10_000
MAX_TRANSACTIONS_PER_REQUEST = 10_000
MAX_STATE_FILTERS = 100
# The AddPartitionsToTxn v4 batch a broker sends for verification (KIP-890) may name
# internal topics (the offsets partition of a transactional offset commit); clients' v0-3 may
# not, as in Kafka.
# What a non-flexible request version can carry (an int16 length); the offsets topic's keys
# hold no longer group id either.
MAX_GROUP_ID_CHARS = 2**15 - 1
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def register_txn_apis(registry: ApiRegistry, service: TxnService) -> None:
    """Add every transaction API, answered by `service` (and the node's backend for markers
    and producer state), to `registry`. Replaces InitProducerId with a handler that routes
    transactional ids to `service`. Call once per node."""
    handlers = TxnHandlers(service)
    table: dict[int, Handler] = {
        ApiKey.INIT_PRODUCER_ID: handlers.init_producer_id,
        ApiKey.ADD_PARTITIONS_TO_TXN: handlers.add_partitions_to_txn,
        ApiKey.ADD_OFFSETS_TO_TXN: handlers.add_offsets_to_txn,
        ApiKey.END_TXN: handlers.end_txn,
        ApiKey.WRITE_TXN_MARKERS: handle_write_txn_markers,
        ApiKey.DESCRIBE_TRANSACTIONS: handlers.describe_transactions,
        ApiKey.LIST_TRANSACTIONS: handlers.list_transactions,
        ApiKey.DESCRIBE_PRODUCERS: handle_describe_producers,
    }
    for api_key, (lo, hi) in TXN_VERSION_TABLE.items():
        registry.register(api_key, lo, hi, table[api_key])
    offsets = registry.get(ApiKey.TXN_OFFSET_COMMIT)
    if offsets is not None:
        # v5 (KIP-890 part 2) adds the offsets partition to the transaction itself.
        registry.register(
            ApiKey.TXN_OFFSET_COMMIT,
            offsets.min_version,
            max(offsets.max_version, TXN_OFFSET_COMMIT_TV2_SINCE),
            with_implicit_add(offsets.handler, service),
        )
    produce = registry.get(ApiKey.PRODUCE)
    if produce is not None:
        # Produce v11-12 mean something only where a coordinator answers the implicit add.
        registry.register(
            ApiKey.PRODUCE,
            produce.min_version,
            max(produce.max_version, PRODUCE_MAX_VERSION),
            produce.handler,
        )


class TxnHandlers:
    """The transaction API handlers, bound to one TxnService."""

    def __init__(self, service: TxnService) -> None:
        self.service = service

    # ------------------------------------------------------------------ InitProducerId
    async def init_producer_id(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        """Transactional ids go to the coordinator; the rest to handlers_core, unchanged."""
        transactional_id = request.transactional_id
        if transactional_id is None:
            return await handle_init_producer_id(ctx, request)
        version = ctx.api_version

        def answer(code: ErrorCode, producer_id: int = -1, epoch: int = -1) -> dict[str, Any]:
            return {
                "error_code": for_version(code, TxnApi.INIT_PRODUCER_ID, version),
                "producer_id": producer_id,
                "producer_epoch": epoch,
            }

        # Range checks first: an oversized id is refused before the authorizer's log (which
        # names the resource) could be asked to write it.
        if not valid_transactional_id(transactional_id):
            return answer(ErrorCode.invalid_request)
        refusal = authz.init_producer_id_refusal(ctx, transactional_id)
        if refusal is not None:
            return answer(refusal)
        timeout_ms = to_ms(request.transaction_timeout)
        if timeout_ms <= 0:
            return answer(ErrorCode.invalid_transaction_timeout)
        # KIP-360 (v3+): the id and epoch the producer holds, both or neither.
        producer_id = int(getattr(request, "producer_id", NO_PRODUCER_ID))
        producer_epoch = int(getattr(request, "producer_epoch", NO_PRODUCER_EPOCH))
        fresh = producer_id == NO_PRODUCER_ID and producer_epoch == NO_PRODUCER_EPOCH
        if not fresh and not valid_producer(producer_id, producer_epoch):
            return answer(ErrorCode.invalid_request)
        req = InitProducerIdRequest(
            transactional_id=transactional_id,
            transaction_timeout_ms=timeout_ms,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            api_version=version,
        )
        result = await guarded(
            "txn init_producer_id",
            lambda: self.service.init_producer_id(req),
            lambda code, _msg: InitProducerIdResult(code),
        )
        if result.error_code is not ErrorCode.none:
            return answer(result.error_code)
        return answer(ErrorCode.none, result.producer_id, result.producer_epoch)

    # ------------------------------------------------------------------ AddPartitionsToTxn
    async def add_partitions_to_txn(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        version = ctx.api_version
        if version >= 4:
            transactions = list(request.transactions)
            top_level = ErrorCode.none
            if not authz.allows(ctx, authz.CLUSTER_ACTION):
                top_level = authz.CLUSTER_ACTION.error
            elif too_big(
                ctx, "transactions", len(transactions), MAX_TRANSACTIONS_PER_REQUEST
            ) or too_big(
                ctx,
                "partitions",
                sum(partition_count(t.topics, "partitions") for t in transactions),
                MAX_PARTITIONS_PER_REQUEST,
            ):
                top_level = ErrorCode.invalid_request
            if top_level is not ErrorCode.none:
                return {"error_code": top_level, "results_by_transaction": []}
            entries = [
                (
                    t.transactional_id,
                    int(t.producer_id),
                    int(t.producer_epoch),
                    bool(t.verify_only),
                    request_pairs(t.topics, "partitions"),
                )
                for t in transactions
            ]
        else:
            topics = request.v3_and_below_topics
            if too_big(
                ctx,
                "partitions",
                partition_count(topics, "partitions"),
                MAX_PARTITIONS_PER_REQUEST,
            ):
                return {"results_by_topic_v3_and_below": []}
            entries = [
                (
                    request.v3_and_below_transactional_id,
                    int(request.v3_and_below_producer_id),
                    int(request.v3_and_below_producer_epoch),
                    False,
                    request_pairs(topics, "partitions"),
                )
            ]
        existing = partition_counts(ctx, (topic for *_, pairs in entries for topic, _ in pairs))
        answers: list[dict[TopicPartitionKey, ErrorCode] | None] = []
        asked: list[AddPartitionsTxn] = []
        asked_at: list[int] = []
        for transactional_id, producer_id, producer_epoch, verify_only, pairs in entries:
            refused = self._check_add(
                ctx, transactional_id, producer_id, producer_epoch, pairs, existing
            )
            if refused is not None:
                answers.append(refused)
                continue
            asked_at.append(len(answers))
            answers.append(None)
            asked.append(
                AddPartitionsTxn(
                    transactional_id=transactional_id,
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    partitions=tuple(pairs),
                    verify_only=verify_only,
                    api_version=version,
                )
            )
        if asked:
            results = await guarded(
                "txn add_partitions_to_txn",
                lambda: self.service.add_partitions_to_txn(asked),
                lambda code, _msg: [
                    AddPartitionsTxnResult(t.transactional_id, dict.fromkeys(t.partitions, code))
                    for t in asked
                ],
            )
            for index, txn, result in zip(asked_at, asked, results, strict=True):
                answers[index] = {
                    p: result.errors.get(p, ErrorCode.unknown_server_error) for p in txn.partitions
                }

        def topic_results(errors: dict[TopicPartitionKey, ErrorCode] | None) -> list[Any]:
            assert errors is not None
            return [
                {
                    "name": topic,
                    "results_by_partition": [
                        {
                            "partition_index": partition,
                            "partition_error_code": for_version(
                                code, TxnApi.ADD_PARTITIONS_TO_TXN, version
                            ),
                        }
                        for partition, code in partitions
                    ],
                }
                for topic, partitions in by_topic(errors.items()).items()
            ]

        if version >= 4:
            return {
                "error_code": ErrorCode.none,
                "results_by_transaction": [
                    {"transactional_id": entry[0], "topic_results": topic_results(errors)}
                    for entry, errors in zip(entries, answers, strict=True)
                ],
            }
        return {"results_by_topic_v3_and_below": topic_results(answers[0])}

    def _check_add(
        self,
        ctx: RequestContext,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        pairs: Sequence[TopicPartitionKey],
        existing: dict[str, int],
    ) -> dict[TopicPartitionKey, ErrorCode] | None:
        """The answer to one transaction of AddPartitionsToTxn when the handler refuses it,
        or None when the coordinator is to be asked."""

        def every(code: ErrorCode) -> dict[TopicPartitionKey, ErrorCode]:
            return dict.fromkeys(pairs, code)

        if not valid_transactional_id(transactional_id):
            return every(ErrorCode.invalid_request)
        if not authz.allows(ctx, authz.WRITE_TRANSACTIONAL_ID, transactional_id):
            return every(authz.WRITE_TRANSACTIONAL_ID.error)
        if not valid_producer(producer_id, producer_epoch) or not pairs:
            return every(ErrorCode.invalid_request)
        if ctx.api_version < 4:
            # Clients need WRITE on each topic; internal topics are never theirs to add.
            names = [t for t, _ in pairs if t not in CLIENT_READ_ONLY_TOPICS]
            writable = authz.allowed_names(ctx, authz.WRITE_TOPIC, names)
        else:
            writable = {t for t, _ in pairs}
        errors: dict[TopicPartitionKey, ErrorCode] = {}
        for key in pairs:
            if key[0] not in writable:
                errors[key] = authz.WRITE_TOPIC.error
            elif not partition_exists(existing, key):
                errors[key] = ErrorCode.unknown_topic_or_partition
        if not errors:
            return None
        # One bad partition fails the whole transaction's request (Kafka's rule): the others
        # were not added, and say so.
        return {key: errors.get(key, ErrorCode.operation_not_attempted) for key in pairs}

    # ------------------------------------------------------------------ AddOffsetsToTxn
    async def add_offsets_to_txn(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        version = ctx.api_version
        code = await self._add_offsets(ctx, request)
        return {"error_code": for_version(code, TxnApi.ADD_OFFSETS_TO_TXN, version)}

    async def _add_offsets(self, ctx: RequestContext, request: Any) -> ErrorCode:
        transactional_id = request.transactional_id
        if not valid_transactional_id(transactional_id):
            return ErrorCode.invalid_request
        if not authz.allows(ctx, authz.WRITE_TRANSACTIONAL_ID, transactional_id):
            return authz.WRITE_TRANSACTIONAL_ID.error
        if not request.group_id or len(request.group_id) > MAX_GROUP_ID_CHARS:
            return ErrorCode.invalid_group_id
        if not authz.allows(ctx, authz.READ_GROUP, request.group_id):
            return authz.READ_GROUP.error
        if not valid_producer(request.producer_id, request.producer_epoch):
            return ErrorCode.invalid_request
        req = AddOffsetsToTxnRequest(
            transactional_id=transactional_id,
            producer_id=int(request.producer_id),
            producer_epoch=int(request.producer_epoch),
            group_id=request.group_id,
            api_version=ctx.api_version,
        )
        return await guarded(
            "txn add_offsets_to_txn",
            lambda: self.service.add_offsets_to_txn(req),
            lambda code, _msg: code,
        )

    # ------------------------------------------------------------------ EndTxn
    async def end_txn(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        version = ctx.api_version
        result = await self._end_txn(ctx, request)
        response: dict[str, Any] = {
            "error_code": for_version(result.error_code, TxnApi.END_TXN, version)
        }
        if version >= END_TXN_TV2_SINCE:
            # The id and epoch of the producer's next transaction, only with success: an
            # error answer names no epoch (a forged EndTxn learns nothing from it).
            ok = result.error_code == ErrorCode.none
            response["producer_id"] = result.producer_id if ok else NO_PRODUCER_ID
            response["producer_epoch"] = result.producer_epoch if ok else NO_PRODUCER_EPOCH
        return response

    async def _end_txn(self, ctx: RequestContext, request: Any) -> EndTxnResult:
        transactional_id = request.transactional_id
        if not valid_transactional_id(transactional_id):
            return EndTxnResult(ErrorCode.invalid_request)
        if not authz.allows(ctx, authz.WRITE_TRANSACTIONAL_ID, transactional_id):
            return EndTxnResult(authz.WRITE_TRANSACTIONAL_ID.error)
        if not valid_producer(request.producer_id, request.producer_epoch):
            _bad_producers.warning(
                "EndTxn v%d from client %r refused: producer id or epoch out of range",
                ctx.api_version,
                ctx.client_id,
            )
            return EndTxnResult(ErrorCode.invalid_request)
        req = EndTxnRequest(
            transactional_id=transactional_id,
            producer_id=int(request.producer_id),
            producer_epoch=int(request.producer_epoch),
            committed=bool(request.committed),
            api_version=ctx.api_version,
        )
        result = await guarded(
            "txn end_txn",
            lambda: self.service.end_txn(req),
            lambda code, _msg: EndTxnResult(code),
        )
        return result

    # ------------------------------------------------------------------ admin
    async def describe_transactions(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        """DESCRIBE on each transactional id (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
        of a described transaction's topics, only those the principal may DESCRIBE."""
        ids = list(request.transactional_ids)
        if too_big(ctx, "transactional ids", len(ids), MAX_IDS_PER_REQUEST):
            return {"transaction_states": []}
        # A repeated id is answered once (as a repeated partition is): each copy would cost
        # a whole description, up to max_partitions_per_transaction partitions.
        ids = list(dict.fromkeys(ids))
        answers: list[DescribedTransaction | None] = []
        asked: list[str] = []
        for transactional_id in ids:
            if not valid_transactional_id(transactional_id):
                answers.append(DescribedTransaction(transactional_id, ErrorCode.invalid_request))
            elif not authz.allows(ctx, authz.DESCRIBE_TRANSACTIONAL_ID, transactional_id):
                answers.append(
                    DescribedTransaction(transactional_id, authz.DESCRIBE_TRANSACTIONAL_ID.error)
                )
            else:
                answers.append(None)
                asked.append(transactional_id)
        if asked:
            described = await guarded(
                "txn describe_transactions",
                lambda: self.service.describe_transactions(asked),
                lambda code, _msg: [DescribedTransaction(t, code) for t in asked],
            )
            # One answer per id asked, in order; anything else is a broken service.
            if [d.transactional_id for d in described] != asked:
                log.error("describe_transactions answered %d of %d ids", len(described), len(asked))
                described = [DescribedTransaction(t, ErrorCode.unknown_server_error) for t in asked]
            in_order = iter(described)
            answers = [a if a is not None else next(in_order) for a in answers]
        states = []
        for found in answers:
            assert found is not None
            topics = found.topics
            if ctx.authorizer is not None and topics:
                describable = authz.allowed_names(
                    ctx, authz.DESCRIBE_TOPIC, (t for t, _ in topics), log_denied=False
                )
                topics = tuple(t for t in topics if t[0] in describable)
            states.append(
                {
                    "error_code": found.error_code,
                    "transactional_id": found.transactional_id,
                    "transaction_state": found.state,
                    "transaction_timeout": found.transaction_timeout_ms,
                    "transaction_start_time": _wall_time(found.transaction_start_time_ms),
                    "producer_id": found.producer_id,
                    "producer_epoch": found.producer_epoch,
                    "topics": [{"topic": t, "partitions": list(ps)} for t, ps in topics],
                }
            )
        return {"transaction_states": states}

    async def list_transactions(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        """Every transaction of the partitions this broker coordinates, filtered as asked,
        then to those the principal may DESCRIBE (a filter: nothing is logged, as Kafka)."""
        states = list(request.state_filters)
        producer_ids = list(request.producer_id_filters)
        duration_ms = int(getattr(request, "duration_filter", -1))
        if (
            too_big(ctx, "state filters", len(states), MAX_STATE_FILTERS)
            or too_big(ctx, "producer id filters", len(producer_ids), MAX_IDS_PER_REQUEST)
            or duration_ms < -1
        ):
            return {
                "error_code": ErrorCode.invalid_request,
                "unknown_state_filters": [],
                "transaction_states": [],
            }
        result = await guarded(
            "txn list_transactions",
            lambda: self.service.list_transactions(states, producer_ids, duration_ms),
            lambda code, _msg: ListTransactionsResult(code),
        )
        listed = result.transactions
        if ctx.authorizer is not None:
            describable = authz.allowed_names(
                ctx,
                authz.DESCRIBE_TRANSACTIONAL_ID,
                (t.transactional_id for t in listed),
                log_denied=False,
            )
            listed = tuple(t for t in listed if t.transactional_id in describable)
        return {
            "error_code": result.error_code,
            "unknown_state_filters": list(result.unknown_state_filters),
            "transaction_states": [
                {
                    "transactional_id": t.transactional_id,
                    "producer_id": t.producer_id,
                    "transaction_state": t.state,
                }
                for t in listed
            ],
        }


def _wall_time(ms: int) -> datetime.datetime:
    """kio's datetime for an int64 ms field that is never null: -1 (no transaction open)
    must reach the wire as -1, not as a missing value."""
    return EPOCH + datetime.timedelta(milliseconds=ms)
