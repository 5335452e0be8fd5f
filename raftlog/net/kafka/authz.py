"""Which ACL check each Kafka API makes, in one place, and the helpers handlers call.

Why one module: whether raftlog closes the doors a Kafka broker closes can then be read (and
tested) as a whole: `API_RULES` names, per API, every check its handler makes, in Kafka's
terms (operation, resource type, the error code a refusal answers with), as Kafka's KafkaApis
and ControllerApis make them. Handlers call `allows`, `allowed_names` and
`authorized_operations` with a `Rule` from here; none builds a check of its own.

With no authorizer configured (`authorizer_class_name` empty) `RequestContext.authorizer` is
None and every helper answers "allowed" after that one attribute check, so the produce and
fetch paths cost what they cost before.

The principal is the connection's ("User:ANONYMOUS" until SASL or a client certificate names
another) and the host is the peer's IP address. A refusal is logged on
`raftlog.kafka.authorizer` (Kafka's authorizer log), at most one line per (principal,
operation, resource) per interval; checks that only filter what a listing shows (all topics
in Metadata, ListGroups) or compute KIP-430 fields log nothing, as in Kafka.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from raftlog.errors import ErrorCode
from raftlog.net.kafka.codec import api_name
from raftlog.net.kafka.context import RequestContext
from raftlog.records import ATTRIBUTES_OFFSET, LOG_OVERHEAD_BYTES, TRANSACTIONAL_BIT
from raftlog.security.acl import (
    CLUSTER_RESOURCE_NAME,
    WILDCARD_HOST,
    WILDCARD_PRINCIPAL,
    WILDCARD_RESOURCE,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from raftlog.security.authorizer import (
    SUPPORTED_OPERATIONS,
    Authorizer,
    canonical_host,
    operations_bitfield,
)

log = logging.getLogger("raftlog.kafka.authorizer")

DENIAL_LOG_INTERVAL_S = 60.0
# The denial log remembers this many (principal, operation, resource) keys at most; a flood
# of distinct names cannot grow it without bound.
DENIAL_LOG_MAX_KEYS = 10_000

# KIP-430's field with no authorizer configured: every operation the resource type has.
_ALL_OPERATIONS_BITFIELD: Mapping[ResourceType, int] = MappingProxyType(
    {rt: operations_bitfield(ops) for rt, ops in SUPPORTED_OPERATIONS.items()}
)

_op = AclOperation
_rt = ResourceType
_err = ErrorCode


@dataclass(frozen=True, slots=True)
class Rule:
    """One check: `operation` on a resource of `resource_type`; a refusal answers `error`."""

    operation: AclOperation
    resource_type: ResourceType
    error: ErrorCode


# ------------------------------------------------------------------ the rules
WRITE_TOPIC = Rule(_op.WRITE, _rt.TOPIC, _err.topic_authorization_failed)
READ_TOPIC = Rule(_op.READ, _rt.TOPIC, _err.topic_authorization_failed)
DESCRIBE_TOPIC = Rule(_op.DESCRIBE, _rt.TOPIC, _err.topic_authorization_failed)
CREATE_TOPIC = Rule(_op.CREATE, _rt.TOPIC, _err.topic_authorization_failed)
DELETE_TOPIC = Rule(_op.DELETE, _rt.TOPIC, _err.topic_authorization_failed)
ALTER_TOPIC = Rule(_op.ALTER, _rt.TOPIC, _err.topic_authorization_failed)
DESCRIBE_CONFIGS_TOPIC = Rule(_op.DESCRIBE_CONFIGS, _rt.TOPIC, _err.topic_authorization_failed)
ALTER_CONFIGS_TOPIC = Rule(_op.ALTER_CONFIGS, _rt.TOPIC, _err.topic_authorization_failed)

READ_GROUP = Rule(_op.READ, _rt.GROUP, _err.group_authorization_failed)
DESCRIBE_GROUP = Rule(_op.DESCRIBE, _rt.GROUP, _err.group_authorization_failed)
DELETE_GROUP = Rule(_op.DELETE, _rt.GROUP, _err.group_authorization_failed)

WRITE_TRANSACTIONAL_ID = Rule(
    _op.WRITE, _rt.TRANSACTIONAL_ID, _err.transactional_id_authorization_failed
)
DESCRIBE_TRANSACTIONAL_ID = Rule(
    _op.DESCRIBE, _rt.TRANSACTIONAL_ID, _err.transactional_id_authorization_failed
)

CREATE_CLUSTER = Rule(_op.CREATE, _rt.CLUSTER, _err.cluster_authorization_failed)
ALTER_CLUSTER = Rule(_op.ALTER, _rt.CLUSTER, _err.cluster_authorization_failed)
DESCRIBE_CLUSTER = Rule(_op.DESCRIBE, _rt.CLUSTER, _err.cluster_authorization_failed)
DESCRIBE_CONFIGS_CLUSTER = Rule(
    _op.DESCRIBE_CONFIGS, _rt.CLUSTER, _err.cluster_authorization_failed
)
ALTER_CONFIGS_CLUSTER = Rule(_op.ALTER_CONFIGS, _rt.CLUSTER, _err.cluster_authorization_failed)
IDEMPOTENT_WRITE_CLUSTER = Rule(
    _op.IDEMPOTENT_WRITE, _rt.CLUSTER, _err.cluster_authorization_failed
)
# A fetch naming a replica id is replication: Kafka refuses every partition of it with
# TOPIC_AUTHORIZATION_FAILED when the caller lacks CLUSTER_ACTION.
CLUSTER_ACTION_FOR_REPLICA_FETCH = Rule(
    _op.CLUSTER_ACTION, _rt.CLUSTER, _err.topic_authorization_failed
)
# OffsetForLeaderEpoch: CLUSTER_ACTION (a follower) covers every topic; else DESCRIBE each.
CLUSTER_ACTION = Rule(_op.CLUSTER_ACTION, _rt.CLUSTER, _err.cluster_authorization_failed)


# API (kio's name) -> every check its handler makes, in the order it makes them. Where an
# API lists several rules the handler's docstring says how they combine (e.g. CreateTopics:
# CREATE on the cluster, else CREATE on each topic; configs shown only with DESCRIBE_CONFIGS).
API_RULES: Mapping[str, tuple[Rule, ...]] = MappingProxyType(
    {
        # Reachable before and without authentication; Kafka checks nothing.
        "api_versions": (),
        "sasl_handshake": (),
        "sasl_authenticate": (),
        # Data path.
        "produce": (WRITE_TRANSACTIONAL_ID, WRITE_TOPIC),
        "fetch": (CLUSTER_ACTION_FOR_REPLICA_FETCH, READ_TOPIC),
        "list_offsets": (DESCRIBE_TOPIC,),
        "offset_for_leader_epoch": (CLUSTER_ACTION, DESCRIBE_TOPIC),
        "init_producer_id": (WRITE_TRANSACTIONAL_ID, IDEMPOTENT_WRITE_CLUSTER, WRITE_TOPIC),
        # Cluster view. Metadata: DESCRIBE per topic (an unnamed listing leaves out the rest),
        # auto-creation needs CREATE on the cluster or the topic; KIP-430 fields on request.
        "metadata": (DESCRIBE_TOPIC, CREATE_CLUSTER, CREATE_TOPIC, DESCRIBE_CLUSTER),
        # Kafka's broker answers DescribeCluster to anyone; DESCRIBE on the cluster only
        # decides whether the KIP-430 field is filled (else 0).
        "describe_cluster": (DESCRIBE_CLUSTER,),
        "describe_quorum": (DESCRIBE_CLUSTER,),
        "describe_log_dirs": (DESCRIBE_CLUSTER,),
        # Groups.
        "find_coordinator": (DESCRIBE_GROUP, DESCRIBE_TRANSACTIONAL_ID),
        "join_group": (READ_GROUP,),
        "sync_group": (READ_GROUP,),
        "heartbeat": (READ_GROUP,),
        "leave_group": (READ_GROUP,),
        # KAFKA-18813: DESCRIBE on every topic named, and a regex matches only those.
        "consumer_group_heartbeat": (READ_GROUP, DESCRIBE_TOPIC),
        # DESCRIBE on every topic the group's members name or hold, else the group's error.
        "consumer_group_describe": (DESCRIBE_GROUP, DESCRIBE_TOPIC),
        "offset_commit": (READ_GROUP, READ_TOPIC),
        "offset_fetch": (DESCRIBE_GROUP, DESCRIBE_TOPIC),
        # KIP-848 groups: DESCRIBE on every topic their members name or hold, as
        # ConsumerGroupDescribe.
        "describe_groups": (DESCRIBE_GROUP, DESCRIBE_TOPIC),
        "list_groups": (DESCRIBE_CLUSTER, DESCRIBE_GROUP),
        "delete_groups": (DELETE_GROUP,),
        # Topics and configs.
        "create_topics": (CREATE_CLUSTER, CREATE_TOPIC, DESCRIBE_CONFIGS_TOPIC),
        "delete_topics": (DESCRIBE_TOPIC, DELETE_TOPIC),
        "create_partitions": (ALTER_TOPIC,),
        "describe_configs": (DESCRIBE_CONFIGS_TOPIC, DESCRIBE_CONFIGS_CLUSTER),
        "alter_configs": (ALTER_CONFIGS_TOPIC, ALTER_CONFIGS_CLUSTER),
        "incremental_alter_configs": (ALTER_CONFIGS_TOPIC, ALTER_CONFIGS_CLUSTER),
        "describe_client_quotas": (DESCRIBE_CONFIGS_CLUSTER,),
        "alter_client_quotas": (ALTER_CONFIGS_CLUSTER,),
        # Security administration.
        "create_acls": (ALTER_CLUSTER,),
        "delete_acls": (ALTER_CLUSTER,),
        "describe_acls": (DESCRIBE_CLUSTER,),
        "describe_user_scram_credentials": (DESCRIBE_CLUSTER,),
        "alter_user_scram_credentials": (ALTER_CLUSTER,),
        "alter_partition_reassignments": (ALTER_CLUSTER,),
        "list_partition_reassignments": (DESCRIBE_CLUSTER,),
        "elect_leaders": (ALTER_CLUSTER,),
        "unregister_broker": (ALTER_CLUSTER,),
        # KIP-853 (handlers_quorum.py).
        "add_raft_voter": (ALTER_CLUSTER,),
        "remove_raft_voter": (ALTER_CLUSTER,),
        "update_raft_voter": (CLUSTER_ACTION,),
        # Transactions (handlers_txn*.py); AddPartitionsToTxn v4+ is sent by brokers and
        # checked against CLUSTER_ACTION instead.
        "add_partitions_to_txn": (WRITE_TRANSACTIONAL_ID, WRITE_TOPIC, CLUSTER_ACTION),
        "add_offsets_to_txn": (WRITE_TRANSACTIONAL_ID, READ_GROUP),
        "end_txn": (WRITE_TRANSACTIONAL_ID,),
        "txn_offset_commit": (WRITE_TRANSACTIONAL_ID, READ_GROUP, READ_TOPIC),
        "write_txn_markers": (CLUSTER_ACTION,),
        "describe_transactions": (DESCRIBE_TRANSACTIONAL_ID, DESCRIBE_TOPIC),
        "list_transactions": (DESCRIBE_TRANSACTIONAL_ID,),
        "describe_producers": (READ_TOPIC,),
        "delete_records": (DELETE_TOPIC,),
        "offset_delete": (DELETE_GROUP, READ_TOPIC),
        # KIP-966: the topics the principal may DESCRIBE; the rest are left out of a listing.
        "describe_topic_partitions": (DESCRIBE_TOPIC,),
    }
)

# What DescribeConfigs/AlterConfigs resource types are checked against (Kafka's
# ConfigResource types: TOPIC = 2, BROKER = 4).
CONFIG_RULES: Mapping[int, tuple[Rule, Rule]] = MappingProxyType(
    {
        2: (DESCRIBE_CONFIGS_TOPIC, ALTER_CONFIGS_TOPIC),
        4: (DESCRIBE_CONFIGS_CLUSTER, ALTER_CONFIGS_CLUSTER),
    }
)


AUTHORIZATION_FAILED_MESSAGE = "Authorization failed."


def config_refusal(
    ctx: RequestContext, resource_type: int, resource_name: str, *, alter: bool
) -> ErrorCode | None:
    """DescribeConfigs (alter=False) and (Incremental)AlterConfigs (alter=True) on one
    resource: DESCRIBE_CONFIGS/ALTER_CONFIGS on the topic, or on the cluster for a broker.
    None: allowed (or a resource type the handler refuses on its own)."""
    if ctx.authorizer is None:
        return None
    rules = CONFIG_RULES.get(resource_type)
    if rules is None:
        return None
    rule = rules[1] if alter else rules[0]
    name = resource_name if rule.resource_type == ResourceType.TOPIC else CLUSTER_RESOURCE_NAME
    return None if allows(ctx, rule, name) else rule.error


def cluster_refusal(ctx: RequestContext, rule: Rule) -> ErrorCode | None:
    """For APIs with one check on the cluster: its error when refused, else None."""
    if ctx.authorizer is None or allows(ctx, rule):
        return None
    return rule.error


# ------------------------------------------------------------------ the denial log
class DenialLog:
    """Kafka's authorizer log, rate-limited: the first refusal of a (principal, operation,
    resource) is logged at once, later ones at most once per interval with a count."""

    def __init__(
        self,
        logger: logging.Logger = log,
        interval_s: float = DENIAL_LOG_INTERVAL_S,
        max_keys: int = DENIAL_LOG_MAX_KEYS,
    ) -> None:
        self._log = logger
        self._interval_s = interval_s
        self._max_keys = max_keys
        # key -> (monotonic time the next line may be written, refusals not logged since)
        self._state: dict[tuple[str, AclOperation, ResourceType, str], tuple[float, int]] = {}

    def denied(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
        api: str,
    ) -> None:
        now = time.monotonic()
        key = (principal, operation, resource_type, name)
        next_at, suppressed = self._state.get(key, (-float("inf"), 0))
        if now < next_at:
            self._state[key] = (next_at, suppressed + 1)
            return
        if len(self._state) >= self._max_keys and key not in self._state:
            self._state = {k: v for k, v in self._state.items() if v[0] > now}
            if len(self._state) >= self._max_keys:
                self._state.clear()
        self._state[key] = (now + self._interval_s, 0)
        more = f" ({suppressed} more since the last such line)" if suppressed else ""
        self._log.info(
            "Principal = %s is Denied Operation = %s from host = %s on resource = %s:%s "
            "for request = %s%s",
            principal,
            operation.name,
            host,
            resource_type.name,
            name,
            api,
            more,
        )


DENIALS = DenialLog()


# ------------------------------------------------------------------ checks
def _host(ctx: RequestContext) -> str:
    """The peer's IP address ("ip:port" and "[v6]:port" alike)."""
    host = ctx.connection.peer.rpartition(":")[0] or ctx.connection.peer
    return host.strip("[]")


def _api_name(ctx: RequestContext) -> str:
    """Kafka's name for the request in its authorizer log ("OffsetCommit")."""
    return "".join(part.capitalize() for part in api_name(ctx.api_key).split("_"))


def allows(
    ctx: RequestContext,
    rule: Rule,
    name: str = CLUSTER_RESOURCE_NAME,
    *,
    log_denied: bool = True,
) -> bool:
    """May this request's principal do `rule` on the resource `name` (the cluster when not
    given)? Always True when no authorizer is configured."""
    authorizer = ctx.authorizer
    if authorizer is None:
        return True
    principal = ctx.connection.principal
    host = _host(ctx)
    if authorizer.authorize(principal, host, rule.operation, rule.resource_type, name):
        return True
    if log_denied:
        DENIALS.denied(principal, host, rule.operation, rule.resource_type, name, _api_name(ctx))
    return False


def allowed_names(
    ctx: RequestContext, rule: Rule, names: Iterable[str], *, log_denied: bool = True
) -> set[str]:
    """The names among `names` that `rule` allows (each asked once)."""
    unique = dict.fromkeys(names)
    if ctx.authorizer is None:
        return set(unique)
    return {name for name in unique if allows(ctx, rule, name, log_denied=log_denied)}


def authorized_operations(ctx: RequestContext, resource_type: ResourceType, name: str) -> int:
    """KIP-430's bitfield of the operations the principal may do on the resource (bit i:
    the AclOperation whose code is i). Without an authorizer every operation of the
    resource type is allowed, so all of them are set, as Kafka answers (AuthHelper)."""
    authorizer = ctx.authorizer
    if authorizer is None:
        return _ALL_OPERATIONS_BITFIELD.get(resource_type, 0)
    return operations_bitfield(
        authorizer.authorized_operations(ctx.connection.principal, _host(ctx), resource_type, name)
    )


def cluster_operations_if_described(ctx: RequestContext) -> int:
    """The cluster's KIP-430 field as Kafka fills it: the operations when the principal may
    DESCRIBE the cluster, else 0."""
    if not allows(ctx, DESCRIBE_CLUSTER):
        return 0
    return authorized_operations(ctx, ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME)


def may_init_idempotent_producer(ctx: RequestContext) -> bool:
    """KIP-679: an idempotent (non-transactional) producer needs IDEMPOTENT_WRITE on the
    cluster, or WRITE on at least one topic (Kafka's authorizeByResourceType)."""
    if ctx.authorizer is None or allows(ctx, IDEMPOTENT_WRITE_CLUSTER, log_denied=False):
        return True
    bindings = getattr(ctx.backend, "acl_bindings", lambda: ())()
    allowed = may_do_on_some_resource(
        ctx.authorizer,
        bindings,
        ctx.connection.principal,
        _host(ctx),
        AclOperation.WRITE,
        ResourceType.TOPIC,
    )
    if not allowed:
        DENIALS.denied(
            ctx.connection.principal,
            _host(ctx),
            AclOperation.IDEMPOTENT_WRITE,
            ResourceType.CLUSTER,
            CLUSTER_RESOURCE_NAME,
            _api_name(ctx),
        )
    return allowed


def init_producer_id_refusal(ctx: RequestContext, transactional_id: str | None) -> ErrorCode | None:
    """InitProducerId: WRITE on the transactional id when there is one, else what
    `may_init_idempotent_producer` asks. None: allowed."""
    if ctx.authorizer is None:
        return None
    if transactional_id is not None:
        if allows(ctx, WRITE_TRANSACTIONAL_ID, transactional_id):
            return None
        return WRITE_TRANSACTIONAL_ID.error
    if may_init_idempotent_producer(ctx):
        return None
    return IDEMPOTENT_WRITE_CLUSTER.error


# A name no ACL is expected to name: asking for it answers "super user, or nothing names
# resources of this type and allow.everyone.if.no.acl.found" (Kafka asks the same way).
_PROBE_NAME = "hardcode"


def may_do_on_some_resource(
    authorizer: Authorizer,
    bindings: Iterable[AclBinding],
    principal: str,
    host: str,
    operation: AclOperation,
    resource_type: ResourceType,
) -> bool:
    """Kafka's Authorizer.authorizeByResourceType: is there some resource of the type the
    principal may do `operation` on? An ALLOW for the principal (or User:*) from this host
    (or *) on a literal name counts unless a DENY names that literal or a prefix of it; on a
    prefix, unless a DENY prefix is a prefix of it; a DENY on the literal '*' refuses all.
    The scan over the bindings is fine: only InitProducerId asks, once per producer."""
    if authorizer.authorize(principal, host, operation, resource_type, _PROBE_NAME):
        return True
    host = canonical_host(host)
    principals = (principal, WILDCARD_PRINCIPAL)
    allow_literal: set[str] = set()
    allow_prefix: set[str] = set()
    deny_literal: set[str] = set()
    deny_prefix: set[str] = set()
    for binding in bindings:
        if binding.resource_type != resource_type or binding.principal not in principals:
            continue
        if binding.operation not in (operation, AclOperation.ALL):
            continue
        if binding.host != WILDCARD_HOST and canonical_host(binding.host) != host:
            continue
        deny = binding.permission == AclPermissionType.DENY
        if binding.pattern_type == PatternType.LITERAL:
            (deny_literal if deny else allow_literal).add(binding.resource_name)
        elif binding.pattern_type == PatternType.PREFIXED:
            (deny_prefix if deny else allow_prefix).add(binding.resource_name)
    if WILDCARD_RESOURCE in deny_literal:
        return False

    def denied_by_prefix(name: str) -> bool:
        return any(name.startswith(prefix) for prefix in deny_prefix)

    if any(not denied_by_prefix(prefix) for prefix in allow_prefix):
        return True
    return any(name not in deny_literal and not denied_by_prefix(name) for name in allow_literal)


# ------------------------------------------------------------------ record batches
def has_transactional_batch(records: bytes | bytearray | memoryview) -> bool:
    """Whether any RecordBatch in a produce payload is transactional (Kafka checks WRITE on
    the request's transactional id for these). Reads only batch lengths and attributes; a
    malformed payload answers False here and is refused by batch validation later."""
    view = memoryview(records)
    pos = 0
    end = len(view)
    while pos + ATTRIBUTES_OFFSET + 2 <= end:
        if view[pos + ATTRIBUTES_OFFSET + 1] & TRANSACTIONAL_BIT:
            return True
        batch_length = int.from_bytes(view[pos + 8 : pos + 12], "big", signed=True)
        if batch_length <= 0:
            return False
        pos += LOG_OVERHEAD_BYTES + batch_length
    return False
