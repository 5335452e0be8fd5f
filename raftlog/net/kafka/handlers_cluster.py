"""DescribeCluster, UnregisterBroker, DescribeClientQuotas and AlterClientQuotas.

DescribeQuorum is served by handlers_quorum, with the quorum driver it needs.
"""

from __future__ import annotations

from typing import Any

from raftlog.constants import NO_AUTHORIZED_OPERATIONS
from raftlog.errors import ErrorCode, KafkaError
from raftlog.metadata.controller import messages as cm
from raftlog.net.kafka import authz
from raftlog.net.kafka.backend import QuotaAlteration, QuotaAlterResult, QuotaFilter
from raftlog.net.kafka.context import RequestContext
from raftlog.net.kafka.handlers_reassign import controller_backend
from raftlog.net.kafka.handlers_util import log

# DescribeCluster endpoint types (KIP-919): a client listener describes brokers; controllers
# are described by a controller listener, which this node's client listener is not.
ENDPOINT_TYPE_BROKERS = 1
ENDPOINT_TYPE_CONTROLLERS = 2


async def handle_describe_cluster(ctx: RequestContext, request: Any) -> dict[str, Any]:
    # Kafka's broker answers anyone; DESCRIBE on the cluster only decides the KIP-430 field.
    backend = ctx.backend
    endpoint_type = int(getattr(request, "endpoint_type", ENDPOINT_TYPE_BROKERS))
    if endpoint_type != ENDPOINT_TYPE_BROKERS:
        # Kafka's broker: an unknown type is UNSUPPORTED_ENDPOINT_TYPE, the controllers'
        # type MISMATCHED_ENDPOINT_TYPE (v0 has no endpoint type, so never gets here).
        known = endpoint_type == ENDPOINT_TYPE_CONTROLLERS
        return {
            "throttle_time": 0,
            "error_code": (
                ErrorCode.mismatched_endpoint_type if known else ErrorCode.unsupported_endpoint_type
            ),
            "error_message": (
                "this listener describes brokers, not controllers"
                if known
                else "unknown endpoint type"
            ),
            "endpoint_type": ENDPOINT_TYPE_BROKERS,
            "cluster_id": backend.cluster_id,
            "controller_id": -1,
            "brokers": [],
            "cluster_authorized_operations": NO_AUTHORIZED_OPERATIONS,
        }
    cluster_operations = NO_AUTHORIZED_OPERATIONS
    if request.include_cluster_authorized_operations:
        cluster_operations = authz.cluster_operations_if_described(ctx)
    if getattr(request, "include_fenced_brokers", False):
        # KIP-1073 (v2): every registered broker, each with whether it is fenced.
        # A backend that keeps no registrations (the in-memory test one) has no fenced
        # brokers to add.
        registered = getattr(backend, "registered_brokers", backend.brokers)
        brokers = registered()
    else:
        brokers = backend.brokers()
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "error_message": None,
        "endpoint_type": ENDPOINT_TYPE_BROKERS,
        "cluster_id": backend.cluster_id,
        "controller_id": backend.controller_id(),
        "brokers": [_broker_dict(ctx, b) for b in brokers],
        "cluster_authorized_operations": cluster_operations,
    }


def _broker_dict(ctx: RequestContext, broker: Any) -> dict[str, Any]:
    # The endpoint on the listener this request came in on (Kafka answers per listener).
    host, port = ctx.advertised(broker.node_id, broker.host, broker.port)
    return {
        "broker_id": broker.node_id,
        "host": host,
        "port": port,
        "rack": broker.rack,
        "is_fenced": bool(getattr(broker, "fenced", False)),
    }


async def handle_unregister_broker(ctx: RequestContext, request: Any) -> dict[str, Any]:
    """Kafka's UnregisterBroker (v0, `kafka-cluster.sh unregister`): ALTER on the cluster,
    sent to the active controller; answered once the removal committed and this broker's
    image no longer lists the broker. A broker still running registers again on its next
    heartbeat: stop it first."""

    def answer(code: ErrorCode, message: str | None = None) -> dict[str, Any]:
        return {"throttle_time": 0, "error_code": code, "error_message": message}

    refusal = authz.cluster_refusal(ctx, authz.ALTER_CLUSTER)
    if refusal is not None:
        return answer(refusal, authz.AUTHORIZATION_FAILED_MESSAGE)
    broker_id = int(request.broker_id)
    if broker_id < 0:
        # Range-checked here: the controller's codec would refuse it as a malformed request.
        return answer(ErrorCode.broker_id_not_registered, f"broker {broker_id} is not registered")
    backend = controller_backend(ctx)
    if backend is None:
        return answer(ErrorCode.unknown_server_error, "this node does not reach a controller")
    timeout_ms = ctx.config.request_timeout_ms
    try:
        reply: cm.UnregisterBrokerReply = await backend.controller_call(
            cm.UnregisterBroker(broker_id), timeout_ms
        )
    except KafkaError as exc:
        return answer(exc.code, exc.message or None)
    except Exception:
        log.exception("unregister_broker failed")
        return answer(ErrorCode.unknown_server_error)
    if reply.error_code == ErrorCode.none:
        await backend.wait_for_image(lambda image: broker_id not in image.brokers, timeout_ms)
    return answer(reply.error_code, reply.error_message)


async def handle_describe_client_quotas(ctx: RequestContext, request: Any) -> dict[str, Any]:
    filters = [QuotaFilter(c.entity_type, c.match_type, c.match) for c in request.components]
    refusal = authz.cluster_refusal(ctx, authz.DESCRIBE_CONFIGS_CLUSTER)
    if refusal is not None:
        return {
            "throttle_time": 0,
            "error_code": refusal,
            "error_message": authz.AUTHORIZATION_FAILED_MESSAGE,
            "entries": None,
        }
    try:
        entries = await ctx.backend.describe_client_quotas(filters, bool(request.strict))
    except KafkaError as exc:
        return {
            "throttle_time": 0,
            "error_code": exc.code,
            "error_message": exc.message or None,
            "entries": None,
        }
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "error_message": None,
        "entries": [
            {
                "entity": [{"entity_type": t, "entity_name": n} for t, n in entity],
                "values": [{"key": k, "value": float(v)} for k, v in values.items()],
            }
            for entity, values in entries
        ],
    }


async def handle_alter_client_quotas(ctx: RequestContext, request: Any) -> dict[str, Any]:
    alterations = [
        QuotaAlteration(
            tuple((e.entity_type, e.entity_name) for e in entry.entity),
            [(op.key, float(op.value), bool(op.remove)) for op in entry.ops],
        )
        for entry in request.entries
    ]
    refusal = authz.cluster_refusal(ctx, authz.ALTER_CONFIGS_CLUSTER)
    if refusal is not None:
        results = [
            QuotaAlterResult(a.entity, refusal, authz.AUTHORIZATION_FAILED_MESSAGE)
            for a in alterations
        ]
        return _alter_quotas_response(results)
    try:
        results = list(
            await ctx.backend.alter_client_quotas(alterations, bool(request.validate_only))
        )
    except KafkaError as exc:
        results = [QuotaAlterResult(a.entity, exc.code, exc.message) for a in alterations]
    except Exception:
        log.exception("alter_client_quotas failed")
        results = [QuotaAlterResult(a.entity, ErrorCode.unknown_server_error) for a in alterations]
    return _alter_quotas_response(results)


def _alter_quotas_response(results: list[QuotaAlterResult]) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "entries": [
            {
                "error_code": r.error,
                "error_message": r.message,
                "entity": [{"entity_type": t, "entity_name": n} for t, n in r.entity],
            }
            for r in results
        ],
    }
