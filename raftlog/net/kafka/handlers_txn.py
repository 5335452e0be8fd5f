"""Transaction APIs (KIP-98, KIP-360, KIP-664): InitProducerId with a transactional id,
AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, WriteTxnMarkers, DescribeTransactions,
ListTransactions and DescribeProducers.

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
from collections.abc import Iterable, Sequence
from typing import Any

import trio
from kio.schema.index import api_key_map

from raftlog.errors import ErrorCode
from raftlog.net.kafka import authz
from raftlog.net.kafka.apis import ApiKey, ApiRegistry
from raftlog.net.kafka.backend import (
    PartitionProducers,
    ProducerDescription,
    TopicPartitionKey,
    TxnMarkerWrite,
)
from raftlog.net.kafka.context import Handler, RequestContext
from raftlog.net.kafka.handlers_cluster import METADATA_TOPIC
from raftlog.net.kafka.handlers_core import CLIENT_READ_ONLY_TOPICS, handle_init_producer_id
from raftlog.net.kafka.handlers_util import guarded, to_ms
from raftlog.net.limits import RateLimitedLog
from raftlog.txn.log_format import (
    MAX_PRODUCER_EPOCH,
    MAX_TRANSACTIONAL_ID_BYTES,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TRANSACTION_STATE_TOPIC,
)
from raftlog.txn.messages import (
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

_KEY_BY_NAME = {name: key for key, name in api_key_map.items()}
ADD_PARTITIONS_TO_TXN = _KEY_BY_NAME["add_partitions_to_txn"]
ADD_OFFSETS_TO_TXN = _KEY_BY_NAME["add_offsets_to_txn"]
END_TXN = _KEY_BY_NAME["end_txn"]
WRITE_TXN_MARKERS = _KEY_BY_NAME["write_txn_markers"]
DESCRIBE_TRANSACTIONS = _KEY_BY_NAME["describe_transactions"]
LIST_TRANSACTIONS = _KEY_BY_NAME["list_transactions"]
DESCRIBE_PRODUCERS = _KEY_BY_NAME["describe_producers"]

# api key -> (min version, max version). Why each maximum:
# - InitProducerId v5 (TRANSACTION_ABORTABLE) and v6 (KIP-939 two-phase commit): not yet;
# - AddPartitionsToTxn v4 batches transactions and verifies (KIP-890 part 1, sent by brokers);
#   v5 is part 2's;
# - AddOffsetsToTxn v4 and EndTxn v4 only tell the broker the client knows
#   TRANSACTION_ABORTABLE, which the coordinator never answers; EndTxn v5 is KIP-890 part 2
#   (an epoch bump per transaction, answered with the new epoch), which the coordinator does
#   not do;
# - WriteTxnMarkers v2 carries the transaction version of KIP-890 part 2;
# - ListTransactions v2 filters by a transactional id regular expression (KIP-1152): not yet.
TXN_VERSION_TABLE: dict[int, tuple[int, int]] = {
    ApiKey.INIT_PRODUCER_ID: (0, 4),
    ADD_PARTITIONS_TO_TXN: (0, 4),
    ADD_OFFSETS_TO_TXN: (0, 4),
    END_TXN: (0, 4),
    WRITE_TXN_MARKERS: (1, 1),
    DESCRIBE_TRANSACTIONS: (0, 0),
    LIST_TRANSACTIONS: (0, 1),
    DESCRIBE_PRODUCERS: (0, 0),
}

# Bounds on one request's fan-out (Kafka has none; real clients name a transaction's
# partitions, a coordinator's markers for one broker, an operator's few ids). A transaction
# holds at most TxnConfig.max_partitions_per_transaction (10 000) partitions anyway.
MAX_PARTITIONS_PER_REQUEST = 10_000
# DescribeProducers answers up to ProducerStateConfig.max_producer_ids (10 000) producers
# per partition: this bounds the response (and the concurrent look-ups) instead.
MAX_DESCRIBED_PARTITIONS = 1_000
MAX_IDS_PER_REQUEST = 10_000
MAX_TRANSACTIONS_PER_REQUEST = 10_000
MAX_MARKERS_PER_REQUEST = 10_000
MAX_STATE_FILTERS = 100
# The AddPartitionsToTxn v4 batch a broker sends for verification (KIP-890) may name
# internal topics (the offsets partition of a transactional offset commit); clients' v0-3 may
# not, as in Kafka. Markers may go to the offsets topic, never to these two.
NO_MARKER_TOPICS = frozenset({TRANSACTION_STATE_TOPIC, METADATA_TOPIC})
MAX_INT64 = 2**63 - 1
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
        ADD_PARTITIONS_TO_TXN: handlers.add_partitions_to_txn,
        ADD_OFFSETS_TO_TXN: handlers.add_offsets_to_txn,
        END_TXN: handlers.end_txn,
        WRITE_TXN_MARKERS: handlers.write_txn_markers,
        DESCRIBE_TRANSACTIONS: handlers.describe_transactions,
        LIST_TRANSACTIONS: handlers.list_transactions,
        DESCRIBE_PRODUCERS: handlers.describe_producers,
    }
    for api_key, (lo, hi) in TXN_VERSION_TABLE.items():
        registry.register(api_key, lo, hi, table[api_key])


# ------------------------------------------------------------------ range checks
def valid_transactional_id(transactional_id: str) -> bool:
    """Non-empty and within what `__transaction_state` can store."""
    if not transactional_id or len(transactional_id) > MAX_TRANSACTIONAL_ID_BYTES:
        return False
    return len(transactional_id.encode("utf-8", "surrogatepass")) <= MAX_TRANSACTIONAL_ID_BYTES


def valid_producer(producer_id: int, producer_epoch: int) -> bool:
    return 0 <= producer_id <= MAX_INT64 and 0 <= producer_epoch <= MAX_PRODUCER_EPOCH


def _pairs(topics: Iterable[Any], field: str) -> list[TopicPartitionKey]:
    """(topic, partition) of a request's topics, duplicates dropped, in request order."""
    return list(dict.fromkeys((t.name, int(p)) for t in topics for p in getattr(t, field)))


def _partition_count(topics: Iterable[Any], field: str) -> int:
    return sum(len(getattr(t, field)) for t in topics)


def _existing(ctx: RequestContext, names: Iterable[str]) -> dict[str, int]:
    """topic -> partition count, for the named topics that exist."""
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return {}
    return {t.name: len(t.partitions) for t in ctx.backend.topics(wanted)}


def _exists(partitions: dict[str, int], key: TopicPartitionKey) -> bool:
    return 0 <= key[1] < partitions.get(key[0], 0)


def _by_topic(
    results: Iterable[tuple[TopicPartitionKey, ErrorCode]],
) -> dict[str, list[tuple[int, ErrorCode]]]:
    out: dict[str, list[tuple[int, ErrorCode]]] = {}
    for (topic, partition), code in results:
        out.setdefault(topic, []).append((partition, code))
    return out


def _too_big(ctx: RequestContext, what: str, count: int, limit: int) -> bool:
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
            elif _too_big(
                ctx, "transactions", len(transactions), MAX_TRANSACTIONS_PER_REQUEST
            ) or _too_big(
                ctx,
                "partitions",
                sum(_partition_count(t.topics, "partitions") for t in transactions),
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
                    _pairs(t.topics, "partitions"),
                )
                for t in transactions
            ]
        else:
            topics = request.v3_and_below_topics
            if _too_big(
                ctx,
                "partitions",
                _partition_count(topics, "partitions"),
                MAX_PARTITIONS_PER_REQUEST,
            ):
                return {"results_by_topic_v3_and_below": []}
            entries = [
                (
                    request.v3_and_below_transactional_id,
                    int(request.v3_and_below_producer_id),
                    int(request.v3_and_below_producer_epoch),
                    False,
                    _pairs(topics, "partitions"),
                )
            ]
        existing = _existing(ctx, (topic for *_, pairs in entries for topic, _ in pairs))
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
                for topic, partitions in _by_topic(errors.items()).items()
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
            elif not _exists(existing, key):
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
        code = await self._end_txn(ctx, request)
        return {"error_code": for_version(code, TxnApi.END_TXN, version)}

    async def _end_txn(self, ctx: RequestContext, request: Any) -> ErrorCode:
        transactional_id = request.transactional_id
        if not valid_transactional_id(transactional_id):
            return ErrorCode.invalid_request
        if not authz.allows(ctx, authz.WRITE_TRANSACTIONAL_ID, transactional_id):
            return authz.WRITE_TRANSACTIONAL_ID.error
        if not valid_producer(request.producer_id, request.producer_epoch):
            return ErrorCode.invalid_request
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
        return result.error_code

    # ------------------------------------------------------------------ WriteTxnMarkers
    async def write_txn_markers(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        """Kafka's checks: CLUSTER_ACTION (only coordinators send markers; else every
        partition is CLUSTER_AUTHORIZATION_FAILED), then per partition: it exists, and is not
        a topic that never holds transactional data. The backend writes the rest on the
        partitions this broker leads."""
        markers = list(request.markers)
        if _too_big(ctx, "markers", len(markers), MAX_MARKERS_PER_REQUEST) or _too_big(
            ctx,
            "partitions",
            sum(_partition_count(m.topics, "partition_indexes") for m in markers),
            MAX_PARTITIONS_PER_REQUEST,
        ):
            return {"markers": []}
        per_marker = [_pairs(m.topics, "partition_indexes") for m in markers]
        answers: list[dict[TopicPartitionKey, ErrorCode]] = [{} for _ in markers]
        if not authz.allows(ctx, authz.CLUSTER_ACTION):
            for answer, pairs in zip(answers, per_marker, strict=True):
                answer.update(dict.fromkeys(pairs, authz.CLUSTER_ACTION.error))
            return _markers_response(markers, per_marker, answers)
        existing = _existing(ctx, (topic for pairs in per_marker for topic, _ in pairs))
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
                elif not _exists(existing, key):
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

    # ------------------------------------------------------------------ admin
    async def describe_transactions(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        """DESCRIBE on each transactional id (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
        of a described transaction's topics, only those the principal may DESCRIBE."""
        ids = list(request.transactional_ids)
        if _too_big(ctx, "transactional ids", len(ids), MAX_IDS_PER_REQUEST):
            return {"transaction_states": []}
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
            _too_big(ctx, "state filters", len(states), MAX_STATE_FILTERS)
            or _too_big(ctx, "producer id filters", len(producer_ids), MAX_IDS_PER_REQUEST)
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

    async def describe_producers(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        """READ on each topic (else TOPIC_AUTHORIZATION_FAILED, before any existence check);
        then each partition's producers from the backend, which answers only for partitions
        this broker leads."""
        topics = list(request.topics)
        if _too_big(
            ctx,
            "partitions",
            _partition_count(topics, "partition_indexes"),
            MAX_DESCRIBED_PARTITIONS,
        ):
            return {"topics": []}
        readable = authz.allowed_names(ctx, authz.READ_TOPIC, (t.name for t in topics))
        existing = _existing(ctx, (t.name for t in topics if t.name in readable))
        jobs = [(t.name, int(p)) for t in topics for p in t.partition_indexes]
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
                elif not _exists(existing, key):
                    results[index] = PartitionProducers(ErrorCode.unknown_topic_or_partition)
                else:
                    nursery.start_soon(one, index, *key)
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), result in zip(jobs, results, strict=True):
            by_topic.setdefault(topic, []).append(
                {
                    "partition_index": partition,
                    "error_code": result.error,
                    "error_message": None,
                    "active_producers": [_producer_dict(p) for p in result.producers],
                }
            )
        return {"topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}


def _wall_time(ms: int) -> datetime.datetime:
    """kio's datetime for an int64 ms field that is never null: -1 (no transaction open)
    must reach the wire as -1, not as a missing value."""
    return EPOCH + datetime.timedelta(milliseconds=ms)


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
                    for topic, partitions in _by_topic((k, answer[k]) for k in pairs).items()
                ],
            }
            for marker, pairs, answer in zip(markers, per_marker, answers, strict=True)
        ]
    }
