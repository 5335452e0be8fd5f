"""CreateAcls and DeleteAcls on the controller (Kafka's AclControlManager), sans-IO.

An ACL is stored as an AccessControlEntry record under an id the controller picks; deleting
writes RemoveAccessControlEntry for that id. Every node rebuilds the same id -> binding map
from the log, so ACLs survive failover and restart and are identical everywhere.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from raftlog.errors import ErrorCode
from raftlog.metadata import records as r
from raftlog.metadata.controller.elections import Batch
from raftlog.metadata.controller.messages import (
    AclCreationResult,
    CreateAcls,
    CreateAclsReply,
    DeleteAcls,
    DeleteAclsFilterResult,
    DeleteAclsReply,
)
from raftlog.security.acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    InvalidAclError,
    PatternType,
    ResourceType,
)

__all__ = ["MAX_ACL_BINDINGS", "check_binding", "check_filter", "create_acls", "delete_acls"]

# The most ACLs the cluster holds: every node keeps them all in memory and every snapshot
# carries them. Kafka has no such limit; ten times what large deployments use is generous.
MAX_ACL_BINDINGS = 100_000

AclIdSource = Callable[[], uuid.UUID]


def check_binding(binding: AclBinding) -> str | None:
    """Why `binding` cannot be stored (INVALID_REQUEST), or None. The length limits are the
    records' own: a binding past them would write a record no node could decode."""
    try:
        binding.validate()
    except InvalidAclError as exc:
        return str(exc)
    limits = (
        ("resource name", binding.resource_name, r.MAX_ACL_RESOURCE_NAME_CHARS),
        ("principal", binding.principal, r.MAX_ACL_PRINCIPAL_CHARS),
        ("host", binding.host, r.MAX_ACL_HOST_CHARS),
    )
    for what, value, limit in limits:
        if len(value) > limit:
            return f"the {what} is {len(value)} characters, over {limit}"
    return None


def check_filter(acl_filter: AclBindingFilter) -> str | None:
    """Why a DescribeAcls/DeleteAcls filter is refused (INVALID_REQUEST), or None: Kafka
    refuses a filter with an UNKNOWN field (a code this version does not know)."""
    unknown = [
        name
        for name, value, unknown_value in (
            ("resource type", acl_filter.resource_type, ResourceType.UNKNOWN),
            ("pattern type", acl_filter.pattern_type, PatternType.UNKNOWN),
            ("operation", acl_filter.operation, AclOperation.UNKNOWN),
            ("permission type", acl_filter.permission, AclPermissionType.UNKNOWN),
        )
        if value is unknown_value
    ]
    if unknown:
        return f"the filter has an unknown {', '.join(unknown)}"
    return None


def create_acls(batch: Batch, req: CreateAcls, new_id: AclIdSource) -> CreateAclsReply:
    """One result per creation, in order. A binding already stored (or created earlier in
    the same request) succeeds without a record, as in Kafka."""
    stored = set(batch.image.acls.values())
    new_ids: set[uuid.UUID] = set()
    records: list[r.Record] = []
    results: list[AclCreationResult] = []
    for binding in req.creations:
        message = check_binding(binding)
        if message is not None:
            results.append(AclCreationResult(ErrorCode.invalid_request, message))
            continue
        if binding in stored:
            results.append(AclCreationResult())
            continue
        if len(stored) >= MAX_ACL_BINDINGS:
            results.append(
                AclCreationResult(
                    ErrorCode.invalid_request,
                    f"the cluster already holds the most ACLs allowed ({MAX_ACL_BINDINGS})",
                )
            )
            continue
        acl_id = new_id()
        while acl_id in batch.image.acls or acl_id in new_ids:  # only a test source repeats
            acl_id = new_id()
        new_ids.add(acl_id)
        records.append(r.AccessControlEntry.of(acl_id, binding))
        stored.add(binding)
        results.append(AclCreationResult())
    batch.add(*records)  # at once: each add copies the ACL map
    return CreateAclsReply(tuple(results))


def delete_acls(batch: Batch, req: DeleteAcls) -> DeleteAclsReply:
    """Each filter is matched against the ACLs as they were before the request, so an ACL
    two filters match is reported by both and removed once (Kafka does the same)."""
    before = sorted(batch.image.acls.items(), key=lambda kv: kv[0].int)
    removed: set[uuid.UUID] = set()
    records: list[r.Record] = []
    results: list[DeleteAclsFilterResult] = []
    for acl_filter in req.filters:
        message = check_filter(acl_filter)
        if message is not None:
            results.append(DeleteAclsFilterResult(ErrorCode.invalid_request, message))
            continue
        matching = []
        for acl_id, binding in before:
            if acl_filter.matches(binding):
                matching.append(binding)
                if acl_id not in removed:
                    removed.add(acl_id)
                    records.append(r.RemoveAccessControlEntry(acl_id))
        results.append(DeleteAclsFilterResult(matching=tuple(matching)))
    batch.add(*records)
    return DeleteAclsReply(tuple(results))
