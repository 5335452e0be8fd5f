"""ApiVersions, Metadata, Produce and InitProducerId."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from raftlog.concurrency import run_all
from raftlog.constants import METADATA_TOPIC, NO_AUTHORIZED_OPERATIONS
from raftlog.errors import ErrorCode
from raftlog.groups.settings import OFFSETS_TOPIC
from raftlog.metadata.controller.messages import NewTopic
from raftlog.net.kafka import authz
from raftlog.net.kafka.backend import (
    ProduceResult,
    ProducerIdResult,
    ProducerInfo,
    TopicInfo,
)
from raftlog.net.kafka.context import RequestContext
from raftlog.net.kafka.handlers_util import guarded, leader_dict, log, to_ms
from raftlog.net.limits import RateLimitedLog
from raftlog.security.acl import ResourceType

VALID_ACKS = (-1, 0, 1)
TRANSACTION_STATE_TOPIC = "__transaction_state"
# Topics only the node itself writes (Kafka's Topic.isInternal, and the metadata log). A
# client's record in __consumer_offsets that the coordinator cannot decode keeps that
# offsets partition from loading after every coordinator move, so Produce is refused there
# as Kafka refuses it. The group coordinator appends through the replication layer's produce
# path directly, never through this handler.
CLIENT_READ_ONLY_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, METADATA_TOPIC})
# One line per interval however fast a client repeats the attempt.
_internal_topic_refusals = RateLimitedLog(log)


# ------------------------------------------------------------------------------ ApiVersions
# Kafka's `transaction.version` feature (KIP-890 part 2, KIP-1022): levels 0..2 supported,
# finalized at 2. A client that reads the finalized level (Kafka's Java client from 4.0) may
# then end transactions with EndTxn v5 (an epoch bump per transaction) and let Produce v12
# add its partitions; clients that do not know the feature (librdkafka, kafka-python,
# aiokafka) ignore these tagged fields and keep the protocol they speak.
TRANSACTION_VERSION_FEATURE = "transaction.version"
TRANSACTION_VERSION_SUPPORTED = (0, 2)
TRANSACTION_VERSION_FINALIZED = 2
# The finalized levels never change at run time (no UpdateFeatures): one epoch for ever.
FINALIZED_FEATURES_EPOCH = 0
# ApiVersions v4 is the first whose clients accept a supported range starting at 0 (Kafka
# leaves such features out of v3 answers, KAFKA-17011).
_FEATURES_FROM_ZERO_SINCE = 4


def feature_fields(api_version: int) -> dict[str, Any]:
    """The ApiVersions v3+ tagged feature fields (empty below v3, which has none)."""
    if api_version < 3:
        return {}
    low, high = TRANSACTION_VERSION_SUPPORTED
    supported = (
        [{"name": TRANSACTION_VERSION_FEATURE, "min_version": low, "max_version": high}]
        if low > 0 or api_version >= _FEATURES_FROM_ZERO_SINCE
        else []
    )
    return {
        "supported_features": supported,
        "finalized_features_epoch": FINALIZED_FEATURES_EPOCH,
        "finalized_features": [
            {
                "name": TRANSACTION_VERSION_FEATURE,
                "max_version_level": TRANSACTION_VERSION_FINALIZED,
                "min_version_level": TRANSACTION_VERSION_FINALIZED,
            }
        ],
    }


async def handle_api_versions(ctx: RequestContext, request: Any) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none,
        "api_keys": [
            {"api_key": key, "min_version": lo, "max_version": hi} for key, lo, hi in ctx.api_table
        ],
        "throttle_time": 0,
        **feature_fields(ctx.api_version),
    }


# ------------------------------------------------------------------------------ Metadata
# Metadata v12 answers a null name for a topic asked by an id it cannot name (KIP-516).
METADATA_NULLABLE_NAMES_SINCE = 12


def partition_dict(p: Any) -> dict[str, Any]:
    """A partition as Metadata (and DescribeTopicPartitions) answer it."""
    error = p.error
    if error == ErrorCode.none and p.leader_id < 0:
        error = ErrorCode.leader_not_available
    return {
        "error_code": error,
        "partition_index": p.partition,
        "leader_id": p.leader_id,
        "leader_epoch": p.leader_epoch,
        "replica_nodes": list(p.replicas),
        "isr_nodes": list(p.isr),
        "offline_replicas": list(p.offline_replicas),
    }


def _topic_dict(t: TopicInfo) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none,
        "name": t.name,
        "topic_id": t.topic_id,
        "is_internal": t.is_internal,
        "partitions": [partition_dict(p) for p in t.partitions],
        "topic_authorized_operations": NO_AUTHORIZED_OPERATIONS,
    }


def _missing_topic(name: str | None, error: ErrorCode, topic_id: Any = None) -> dict[str, Any]:
    return {
        "error_code": error,
        "name": name,
        "topic_id": topic_id,
        "is_internal": False,
        "partitions": [],
        "topic_authorized_operations": NO_AUTHORIZED_OPERATIONS,
    }


async def handle_metadata(ctx: RequestContext, request: Any) -> dict[str, Any]:
    """Topics the principal may DESCRIBE (an unnamed listing leaves out the others, a named
    one answers TOPIC_AUTHORIZATION_FAILED whether it exists or not); auto-creation needs
    CREATE on the cluster or the topic. KIP-430 fields only when asked (authz.API_RULES)."""
    backend = ctx.backend
    requested = request.topics
    # v0 has no null array: an empty list there means "all topics", as in Kafka.
    all_topics = requested is None or (ctx.api_version == 0 and not requested)
    topics: list[dict[str, Any]] = []
    if all_topics:
        listed = backend.topics(None)
        if ctx.authorizer is not None:
            # Filtering a listing is not a refusal: Kafka logs nothing for it.
            describable = authz.allowed_names(
                ctx, authz.DESCRIBE_TOPIC, [t.name for t in listed], log_denied=False
            )
            listed = [t for t in listed if t.name in describable]
        topics = [_topic_dict(t) for t in listed]
    else:
        names: list[str] = []
        by_id: dict[str, Any] = {}  # names the client asked for by topic id
        for item in requested:
            name = getattr(item, "name", None)
            if name is None:
                # Named by id alone (v10+; Kafka itself answers ids from v12). kio reads the
                # all-zero id as None, and no topic has it: UNKNOWN_TOPIC_ID, as any unknown id.
                topic_id = getattr(item, "topic_id", None)
                name = None if topic_id is None else backend.topic_name(topic_id)
                if name is None:
                    topics.append(_missing_topic(None, ErrorCode.unknown_topic_id, topic_id))
                    continue
                by_id[name] = topic_id
            names.append(name)
        # Checked before existence, so an unauthorized name looks the same either way.
        describable = authz.allowed_names(ctx, authz.DESCRIBE_TOPIC, names)
        known = {t.name: t for t in backend.topics([n for n in names if n in describable])}
        missing = [n for n in dict.fromkeys(names) if n in describable and n not in known]
        allow = getattr(request, "allow_auto_topic_creation", True)
        created: dict[str, ErrorCode] = {}
        refused = {n for n in dict.fromkeys(names) if n not in describable}
        if missing and allow and backend.auto_create_topics():
            if not authz.allows(ctx, authz.CREATE_CLUSTER, log_denied=False):
                creatable = authz.allowed_names(ctx, authz.CREATE_TOPIC, missing)
                refused.update(n for n in missing if n not in creatable)
                missing = [n for n in missing if n in creatable]
            if missing:
                created = await _auto_create(ctx, missing)
                known.update({t.name: t for t in backend.topics(missing)})
        for name in dict.fromkeys(names):
            if name in refused:
                # Asked by id: the id comes back, the name stays hidden (as Kafka).
                hidden = name in by_id
                topics.append(
                    _missing_topic(
                        None if hidden else name,
                        ErrorCode.topic_authorization_failed,
                        by_id.get(name),
                    )
                )
            elif name in known:
                topics.append(_topic_dict(known[name]))
            elif name in created:
                topics.append(_missing_topic(name, created[name]))
            else:
                topics.append(_missing_topic(name, ErrorCode.unknown_topic_or_partition))
    if getattr(request, "include_topic_authorized_operations", False):
        # As Kafka: every topic the principal may DESCRIBE, whatever its error.
        for topic in topics:
            if topic["name"] is not None and (
                topic["error_code"] != ErrorCode.topic_authorization_failed
            ):
                topic["topic_authorized_operations"] = authz.authorized_operations(
                    ctx, ResourceType.TOPIC, topic["name"]
                )
    if ctx.api_version < METADATA_NULLABLE_NAMES_SINCE:
        # v10-11 take topic ids but answer a non-null name: an unknown or hidden id gets "".
        for topic in topics:
            if topic["name"] is None:
                topic["name"] = ""
    cluster_operations = NO_AUTHORIZED_OPERATIONS
    # v8-10 carry the cluster's operations; v11 moved them to DescribeCluster (KIP-700).
    asked = getattr(request, "include_cluster_authorized_operations", False)
    if asked and 8 <= ctx.api_version <= 10:
        cluster_operations = authz.cluster_operations_if_described(ctx)
    return {
        "throttle_time": 0,
        "brokers": [
            {"node_id": b.node_id, **_endpoint(ctx, b), "rack": b.rack} for b in backend.brokers()
        ],
        "cluster_id": backend.cluster_id,
        "controller_id": backend.controller_id(),
        "topics": topics,
        "cluster_authorized_operations": cluster_operations,
    }


def _endpoint(ctx: RequestContext, broker: Any) -> dict[str, Any]:
    """host and port of `broker` on the listener this request came in on."""
    host, port = ctx.advertised(broker.node_id, broker.host, broker.port)
    return {"host": host, "port": port}


def node_endpoints(ctx: RequestContext, node_ids: Collection[int]) -> list[dict[str, Any]]:
    """KIP-951's node_endpoints (Produce v10+, Fetch v16+): the listed brokers among
    `node_ids` (the leaders a response names), on this request's listener."""
    return [
        {"node_id": b.node_id, **_endpoint(ctx, b), "rack": b.rack}
        for b in ctx.backend.brokers()
        if b.node_id in node_ids
    ]


async def _auto_create(ctx: RequestContext, names: Sequence[str]) -> dict[str, ErrorCode]:
    """Create topics named in a Metadata request. Kafka answers LEADER_NOT_AVAILABLE for a
    topic it just created (clients retry); so do we until the backend reports a leader."""
    try:
        results = await ctx.backend.create_topics(
            [NewTopic(name) for name in names], ctx.config.request_timeout_ms, False
        )
    except Exception:
        log.exception("auto-creating topics %s failed", list(names))
        return {}
    out: dict[str, ErrorCode] = {}
    for r in results:
        if r.error in (ErrorCode.none, ErrorCode.topic_already_exists):
            out[r.name] = ErrorCode.leader_not_available
        elif r.error == ErrorCode.invalid_topic_exception:
            out[r.name] = ErrorCode.invalid_topic_exception
    return out


# ------------------------------------------------------------------------------ Produce
# KIP-890 part 2: a transactional Produce v12+ is from a client of transaction version 2,
# whose batches add their partitions to the transaction (replication/produce.py).
PRODUCE_TV2_SINCE = 12
# Produce v13 (Kafka 4.1, KIP-516) names topics by id in the request and the answer.
PRODUCE_TOPIC_IDS_SINCE = 13


@dataclass(frozen=True)
class TxnProducerInfo(ProducerInfo):
    """A Produce's sender, with the transaction version its request version speaks."""

    transaction_version: int = 0


async def handle_produce(ctx: RequestContext, request: Any) -> dict[str, Any] | None:
    acks = request.acks
    timeout_ms = to_ms(request.timeout)
    producer: ProducerInfo = ProducerInfo(
        client_id=ctx.client_id, transactional_id=request.transactional_id
    )
    if request.transactional_id is not None and ctx.api_version >= PRODUCE_TV2_SINCE:
        producer = TxnProducerInfo(
            client_id=ctx.client_id,
            transactional_id=request.transactional_id,
            transaction_version=2,
        )
    # The topic as the answer names it (its name; its id from v13) and, per partition, its
    # name, index and records. A topic id this node does not know names no topic ("").
    keys, jobs = _produce_jobs(ctx, request)
    results: list[ProduceResult] = [ProduceResult()] * len(jobs)
    produced_bytes = sum(len(r) for _, _, r in jobs if r is not None)
    # Partitions answered here and never appended: unknown topic ids (UNKNOWN_TOPIC_ID before
    # the topic's authorization, as Kafka), then what the authorizer refused (none when off).
    by_id = ctx.api_version >= PRODUCE_TOPIC_IDS_SINCE
    refused = {i for i, (topic, _, _) in enumerate(jobs) if by_id and not topic}
    for i in refused:
        results[i] = ProduceResult(ErrorCode.unknown_topic_id)
    if ctx.authorizer is not None:
        refused |= _refuse_unauthorized(ctx, request.transactional_id, jobs, results, refused)

    # Wait for the connection's earlier Produce requests to append (turns.py); this one's
    # turn ends once each of its partitions has appended or failed.
    turn = ctx.turn
    if turn is not None:
        await turn.wait()
    unappended = len(jobs) - len(refused)
    if unappended == 0 and turn is not None:
        turn.done()

    def appended_once() -> Callable[[], None]:
        called = False

        def appended() -> None:
            nonlocal called, unappended
            if not called:
                called = True
                unappended -= 1
                if unappended == 0 and turn is not None:
                    turn.done()

        return appended

    async def one(i: int, topic: str, partition: int, records: bytes | None) -> None:
        appended = appended_once()
        try:
            await produce_one(i, topic, partition, records, appended)
        finally:
            appended()

    async def produce_one(
        i: int, topic: str, partition: int, records: bytes | None, appended: Callable[[], None]
    ) -> None:
        if acks not in VALID_ACKS:
            results[i] = ProduceResult(ErrorCode.invalid_required_acks)
        elif partition < 0:
            results[i] = ProduceResult(ErrorCode.unknown_topic_or_partition)
        elif topic in CLIENT_READ_ONLY_TOPICS:
            _internal_topic_refusals.warning(
                "refused produce to internal topic %s from client %r", topic, ctx.client_id
            )
            results[i] = ProduceResult(
                ErrorCode.invalid_topic_exception,
                error_message=f"cannot append to internal topic {topic}",
            )
        elif not records:
            results[i] = ProduceResult(ErrorCode.corrupt_message, error_message="no records")
        else:
            results[i] = await guarded(
                f"produce {topic}-{partition}",
                lambda: ctx.backend.produce(
                    topic,
                    partition,
                    bytes(records),
                    acks,
                    timeout_ms,
                    dataclasses.replace(producer, appended=appended),
                ),
                lambda code, msg: ProduceResult(code, error_message=msg),
            )

    # Partitions are independent (acks=all waits per partition): run them concurrently.
    await run_all(one, [(i, *job) for i, job in enumerate(jobs) if i not in refused])

    ctx.throttle(ctx.quotas.record_produce(ctx.client_id, ctx.connection.user, produced_bytes))
    if acks == 0:
        return None  # Kafka never answers acks=0

    leaders = {r.current_leader.leader_id for r in results if r.current_leader is not None}
    by_topic: dict[str | uuid.UUID | None, list[dict[str, Any]]] = {}
    for key, (_, partition, _), r in zip(keys, jobs, results, strict=True):
        entry: dict[str, Any] = {
            "index": partition,
            "error_code": r.error,
            "base_offset": r.base_offset,
            "log_append_time": r.log_append_time_ms,
            "log_start_offset": r.log_start_offset,
            "record_errors": [
                {"batch_index": index, "batch_index_error_message": why}
                for index, why in r.record_errors
            ],
            "error_message": r.error_message,
        }
        if r.current_leader is not None:
            entry["current_leader"] = leader_dict(r.current_leader)
        by_topic.setdefault(key, []).append(entry)
    response: dict[str, Any] = {
        # codec.build keeps the one of name / topic_id that the version has.
        "responses": [
            {"name": k, "topic_id": k, "partition_responses": ps} for k, ps in by_topic.items()
        ],
        "throttle_time": 0,
    }
    if leaders:
        # KIP-951: endpoints of the new leaders, so the client need not refresh metadata.
        response["node_endpoints"] = node_endpoints(ctx, leaders)
    return response


def _produce_jobs(
    ctx: RequestContext, request: Any
) -> tuple[list[str | uuid.UUID | None], list[tuple[str, int, bytes | None]]]:
    """(topic keys, jobs), one of each per partition of the request: the key names the topic
    in the answer (its name; from v13 its id, KIP-516), a job is (topic name, partition
    index, records), with "" as the name of a topic id this node does not know."""
    keys: list[str | uuid.UUID | None] = []
    jobs: list[tuple[str, int, bytes | None]] = []
    names: dict[uuid.UUID, str] = {}
    by_id = ctx.api_version >= PRODUCE_TOPIC_IDS_SINCE
    for topic in request.topic_data:
        key: str | uuid.UUID | None
        if by_id:
            # kio reads the all-zero id as None: no topic has it.
            topic_id: uuid.UUID | None = topic.topic_id
            key = topic_id
            if topic_id is None:
                name = ""
            elif topic_id in names:
                name = names[topic_id]
            else:
                name = names[topic_id] = ctx.backend.topic_name(topic_id) or ""
        else:
            key = name = topic.name
        for p in topic.partition_data:
            keys.append(key)
            jobs.append((name, p.index, p.records))
    return keys, jobs


def _refuse_unauthorized(
    ctx: RequestContext,
    transactional_id: str | None,
    jobs: Sequence[tuple[str, int, bytes | None]],
    results: list[ProduceResult],
    answered: Collection[int],
) -> set[int]:
    """Kafka's checks for a produce: transactional batches need WRITE on the request's
    transactional id (else every partition is refused with TRANSACTIONAL_ID_AUTHORIZATION_
    FAILED); then WRITE on each topic (else that topic's partitions get TOPIC_AUTHORIZATION_
    FAILED, before any existence check, and the others are appended). Past the first
    check, jobs in `answered` (unknown topic ids) keep their answer. Fills `results` for
    the refused jobs and returns their indexes."""
    transactional = any(r is not None and authz.has_transactional_batch(r) for _, _, r in jobs)
    if transactional and (
        transactional_id is None
        or not authz.allows(ctx, authz.WRITE_TRANSACTIONAL_ID, transactional_id)
    ):
        for i in range(len(jobs)):
            results[i] = ProduceResult(ErrorCode.transactional_id_authorization_failed)
        return set(range(len(jobs)))
    pending = [i for i in range(len(jobs)) if i not in answered]
    writable = authz.allowed_names(ctx, authz.WRITE_TOPIC, (jobs[i][0] for i in pending))
    refused = {i for i in pending if jobs[i][0] not in writable}
    for i in refused:
        results[i] = ProduceResult(ErrorCode.topic_authorization_failed)
    return refused


# ------------------------------------------------------------------------------ InitProducerId
async def handle_init_producer_id(ctx: RequestContext, request: Any) -> dict[str, Any]:
    """InitProducerId for idempotent producers. One with a transactional id is the
    transaction coordinator's: register_txn_apis (handlers_txn.py) puts a handler in front of
    this one that routes it there; without one, the answer is COORDINATOR_NOT_AVAILABLE, as
    FindCoordinator answers for a transactional id then."""
    refusal = authz.init_producer_id_refusal(ctx, request.transactional_id)
    if refusal is not None:
        return {"throttle_time": 0, "error_code": refusal, "producer_id": -1, "producer_epoch": -1}
    if request.transactional_id is not None:
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.coordinator_not_available,
            "producer_id": -1,
            "producer_epoch": -1,
        }
    result = await guarded(
        "init_producer_id",
        lambda: ctx.backend.init_producer_id(
            request.transactional_id,
            to_ms(request.transaction_timeout),
            getattr(request, "producer_id", -1),
            getattr(request, "producer_epoch", -1),
        ),
        lambda code, msg: ProducerIdResult(code),
    )
    return {
        "throttle_time": 0,
        "error_code": result.error,
        "producer_id": result.producer_id,
        "producer_epoch": result.producer_epoch,
    }
