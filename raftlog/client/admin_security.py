"""Admin operations on ACLs (KIP-140) and SCRAM users (KIP-554), mixed into Admin.

SCRAM passwords never travel: the client draws the salt and sends the salted password,
as Kafka's AdminClient does, so the broker only ever sees what it would store anyway.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from raftlog.client.cluster import Cluster, raise_for
from raftlog.client.protocol import error_of
from raftlog.errors import ErrorCode
from raftlog.security.acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    ScramMechanism,
)
from raftlog.security.scram import DEFAULT_SALT_BYTES, MAX_ITERATIONS, MIN_ITERATIONS
from raftlog.security.scram import salted_password as scram_salted_password

# The iteration counts Kafka's tools and Confluent's documentation use by default.
DEFAULT_ITERATIONS = {
    ScramMechanism.SCRAM_SHA_256: 4096,
    ScramMechanism.SCRAM_SHA_512: 8192,
}


@dataclass(frozen=True)
class AclResult:
    """The outcome of one ACL creation."""

    error: ErrorCode
    message: str | None = None


@dataclass(frozen=True)
class DeletedAcl:
    binding: AclBinding
    error: ErrorCode
    message: str | None = None


@dataclass(frozen=True)
class AclDeletion:
    """The outcome of one DeleteAcls filter: the bindings it removed (or failed to)."""

    error: ErrorCode
    message: str | None
    deleted: tuple[DeletedAcl, ...]


@dataclass(frozen=True)
class ScramUpsertion:
    """Set `user`'s password for `mechanism` (iterations: the mechanism's default if None)."""

    user: str
    mechanism: ScramMechanism
    password: str
    iterations: int | None = None


@dataclass(frozen=True)
class ScramDeletion:
    user: str
    mechanism: ScramMechanism


@dataclass(frozen=True)
class UserResult:
    error: ErrorCode
    message: str | None = None


@dataclass(frozen=True)
class UserScramCredentials:
    """What DescribeUserScramCredentials tells of a user: mechanisms and iterations only."""

    error: ErrorCode
    message: str | None
    credentials: tuple[tuple[ScramMechanism, int], ...]


def _enum(kind: type[Any], value: Any) -> Any:
    """A wire code as the enum; an unknown code as UNKNOWN (a newer broker may send one)."""
    try:
        return kind(int(value))
    except ValueError:
        return kind.UNKNOWN


def _filter_values(f: AclBindingFilter) -> dict[str, Any]:
    return {
        "resource_type_filter": int(f.resource_type),
        "resource_name_filter": f.resource_name,
        "pattern_type_filter": int(f.pattern_type),
        "principal_filter": f.principal,
        "host_filter": f.host,
        "operation": int(f.operation),
        "permission_type": int(f.permission),
    }


def _binding(item: Any, resource: Any) -> AclBinding:
    return AclBinding(
        resource_type=_enum(ResourceType, resource.resource_type),
        resource_name=str(resource.resource_name),
        pattern_type=_enum(PatternType, getattr(resource, "pattern_type", PatternType.LITERAL)),
        principal=str(item.principal),
        host=str(item.host),
        operation=_enum(AclOperation, item.operation),
        permission=_enum(AclPermissionType, item.permission_type),
    )


def check_iterations(mechanism: ScramMechanism, iterations: int | None) -> int:
    """The iteration count to use; raises ValueError outside Kafka's bounds."""
    chosen = DEFAULT_ITERATIONS[mechanism] if iterations is None else iterations
    if not MIN_ITERATIONS <= chosen <= MAX_ITERATIONS:
        raise ValueError(
            f"iterations must be in [{MIN_ITERATIONS}, {MAX_ITERATIONS}] for "
            f"{mechanism.sasl_name}, got {chosen}"
        )
    return chosen


class SecurityAdminMixin:
    """ACL and SCRAM methods of Admin (raftlog.client.admin)."""

    cluster: Cluster

    async def _controller_call(self, api: str, values: dict[str, Any]) -> Any:
        raise NotImplementedError  # Admin's, with its retries

    # ------------------------------------------------------------------ ACLs
    async def create_acls(self, bindings: Sequence[AclBinding]) -> list[AclResult]:
        """Create ACLs; one result per binding, in order. Bindings are checked here first
        (InvalidAclError, a ValueError, says which field is wrong)."""
        for binding in bindings:
            binding.validate()
        values = {
            "creations": [
                {
                    "resource_type": int(b.resource_type),
                    "resource_name": b.resource_name,
                    "resource_pattern_type": int(b.pattern_type),
                    "principal": b.principal,
                    "host": b.host,
                    "operation": int(b.operation),
                    "permission_type": int(b.permission),
                }
                for b in bindings
            ]
        }
        response = await self._controller_call("create_acls", values)
        results = [
            AclResult(error_of(r.error_code), getattr(r, "error_message", None))
            for r in response.results
        ]
        if len(results) != len(bindings):
            raise ValueError(
                f"CreateAcls answered {len(results)} results for {len(bindings)} bindings"
            )
        return results

    async def describe_acls(self, acl_filter: AclBindingFilter | None = None) -> list[AclBinding]:
        """Every ACL the filter selects (default: all)."""
        acl_filter = acl_filter or AclBindingFilter()
        connection = await self.cluster.any_broker()
        response = await connection.call("describe_acls", _filter_values(acl_filter))
        raise_for(response.error_code, "describe_acls", response.error_message)
        return [
            _binding(item, resource) for resource in response.resources for item in resource.acls
        ]

    async def delete_acls(self, filters: Sequence[AclBindingFilter]) -> list[AclDeletion]:
        """Delete the ACLs each filter selects; one AclDeletion per filter, in order."""
        values = {"filters": [_filter_values(f) for f in filters]}
        response = await self._controller_call("delete_acls", values)
        outcome = []
        for result in response.filter_results:
            deleted = tuple(
                DeletedAcl(
                    _binding(match, match),
                    error_of(match.error_code),
                    match.error_message,
                )
                for match in result.matching_acls
            )
            outcome.append(AclDeletion(error_of(result.error_code), result.error_message, deleted))
        if len(outcome) != len(filters):
            raise ValueError(
                f"DeleteAcls answered {len(outcome)} results for {len(filters)} filters"
            )
        return outcome

    # ------------------------------------------------------------------ SCRAM users
    async def alter_user_scram_credentials(
        self,
        upsertions: Sequence[ScramUpsertion] = (),
        deletions: Sequence[ScramDeletion] = (),
    ) -> dict[str, UserResult]:
        """Set or remove SCRAM credentials; one result per user named.

        Salting happens here (PBKDF2, the chosen iterations); a bad iteration count or
        password raises ValueError before anything is sent.
        """
        upserts = []
        for upsertion in upsertions:
            iterations = check_iterations(upsertion.mechanism, upsertion.iterations)
            if not upsertion.user:
                raise ValueError("user name is empty")
            if not upsertion.password:
                raise ValueError(f"the password of {upsertion.user!r} is empty")
            salt = secrets.token_bytes(DEFAULT_SALT_BYTES)
            upserts.append(
                {
                    "name": upsertion.user,
                    "mechanism": int(upsertion.mechanism),
                    "iterations": iterations,
                    "salt": salt,
                    "salted_password": scram_salted_password(
                        upsertion.mechanism, upsertion.password, salt, iterations
                    ),
                }
            )
        values = {
            "deletions": [{"name": d.user, "mechanism": int(d.mechanism)} for d in deletions],
            "upsertions": upserts,
        }
        response = await self._controller_call("alter_user_scram_credentials", values)
        return {
            str(r.user): UserResult(error_of(r.error_code), r.error_message)
            for r in response.results
        }

    async def describe_user_scram_credentials(
        self, users: Sequence[str] | None = None
    ) -> dict[str, UserScramCredentials]:
        """Mechanisms and iteration counts per user (None: every user with a credential)."""
        values = {"users": None if users is None else [{"name": u} for u in users]}
        connection = await self.cluster.any_broker()
        response = await connection.call("describe_user_scram_credentials", values)
        raise_for(response.error_code, "describe_user_scram_credentials", response.error_message)
        return {
            str(r.user): UserScramCredentials(
                error_of(r.error_code),
                r.error_message,
                tuple(
                    (_enum(ScramMechanism, c.mechanism), int(c.iterations))
                    for c in r.credential_infos
                ),
            )
            for r in response.results
        }
