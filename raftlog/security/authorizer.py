"""The ACL authorizer, with the semantics of Kafka's StandardAuthorizer (KRaft).

Why this module: the Kafka handlers ask one question per resource per request ("may this
principal, from this host, do this operation on this resource?") and the answer must be the
one a Kafka broker gives for the same ACLs, or ACLs carried over from Kafka would open or
close the wrong doors. The rules: super users may do anything; any applicable DENY wins;
otherwise an applicable ALLOW (or one that implies the operation: READ/WRITE/DELETE/ALTER
imply DESCRIBE, ALTER_CONFIGS implies DESCRIBE_CONFIGS, ALL implies everything) allows;
otherwise, if no ACL at all names the resource, `allow.everyone.if.no.acl.found` decides,
and if some do, the answer is no. An Authorizer is immutable and built from the metadata
image's bindings: a new image builds a new one. Bindings are indexed by resource so a call
costs a few dict lookups however many ACLs there are. Hosts are compared as Kafka compares
them, as IP addresses: "::ffff:10.0.0.1" (a dual-stack socket's spelling) is 10.0.0.1 and
"0:0:0:0:0:0:0:1" is "::1" (see canonical_host).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable, Mapping
from functools import lru_cache
from types import MappingProxyType

from raftlog.security.acl import (
    WILDCARD_HOST,
    WILDCARD_PRINCIPAL,
    WILDCARD_RESOURCE,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)

_op = AclOperation

# Only for ALLOW bindings: a DENY on READ does not deny DESCRIBE (as in Kafka).
IMPLIES_DESCRIBE = frozenset({_op.DESCRIBE, _op.READ, _op.WRITE, _op.DELETE, _op.ALTER})
IMPLIES_DESCRIBE_CONFIGS = frozenset({_op.DESCRIBE_CONFIGS, _op.ALTER_CONFIGS})

# The operations each resource type has (Kafka's AclEntry.supportedOperations): what
# KIP-430's authorized operations are computed over.
SUPPORTED_OPERATIONS: Mapping[ResourceType, frozenset[AclOperation]] = MappingProxyType(
    {
        ResourceType.TOPIC: frozenset(
            {
                _op.READ,
                _op.WRITE,
                _op.CREATE,
                _op.DESCRIBE,
                _op.DELETE,
                _op.ALTER,
                _op.DESCRIBE_CONFIGS,
                _op.ALTER_CONFIGS,
            }
        ),
        ResourceType.GROUP: frozenset({_op.READ, _op.DESCRIBE, _op.DELETE}),
        ResourceType.CLUSTER: frozenset(
            {
                _op.CREATE,
                _op.CLUSTER_ACTION,
                _op.DESCRIBE_CONFIGS,
                _op.ALTER_CONFIGS,
                _op.IDEMPOTENT_WRITE,
                _op.ALTER,
                _op.DESCRIBE,
            }
        ),
        ResourceType.TRANSACTIONAL_ID: frozenset({_op.DESCRIBE, _op.WRITE}),
        ResourceType.DELEGATION_TOKEN: frozenset({_op.DESCRIBE}),
        ResourceType.USER: frozenset({_op.CREATE_TOKENS, _op.DESCRIBE_TOKENS}),
    }
)

# What a check needs of one binding: (canonical host, operation, permission).
_Entry = tuple[str, AclOperation, AclPermissionType]
# The ACLs of one resource pattern, by principal. Its presence alone means "some ACL names
# this resource", which turns off allow.everyone.if.no.acl.found.
_PrincipalIndex = Mapping[str, tuple[_Entry, ...]]


@lru_cache(maxsize=4096)
def canonical_host(host: str) -> str:
    """`host` as Kafka's authorizer sees it: an IP address in its canonical text form, with an
    IPv4-mapped IPv6 address as the IPv4 address (Java's InetAddress.getHostAddress()), so an
    ACL for 10.0.0.1 applies to a client a dual-stack socket reports as ::ffff:10.0.0.1.
    Anything that is not an IP address ("*", a host name) is returned unchanged."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def _allow_covers(granted: AclOperation, wanted: AclOperation) -> bool:
    if granted == _op.ALL or granted == wanted:
        return True
    if wanted == _op.DESCRIBE:
        return granted in IMPLIES_DESCRIBE
    if wanted == _op.DESCRIBE_CONFIGS:
        return granted in IMPLIES_DESCRIBE_CONFIGS
    return False


def _freeze(index: dict[str, list[_Entry]]) -> _PrincipalIndex:
    return {principal: tuple(bindings) for principal, bindings in index.items()}


class Authorizer:
    """Answers authorize() from a fixed set of bindings. Immutable."""

    __slots__ = (
        "_allow_everyone",
        "_binding_count",
        "_literal",
        "_prefix_lengths",
        "_prefixed",
        "_super_users",
        "_wildcard",
    )

    def __init__(
        self,
        bindings: Iterable[AclBinding],
        *,
        super_users: Collection[str] = (),
        allow_everyone_if_no_acl_found: bool = False,
    ) -> None:
        """`super_users` are principals ("User:admin"), as in Kafka's `super.users`.
        Bindings with a pattern type other than LITERAL or PREFIXED match nothing and are
        left out (the metadata side refuses to store them)."""
        literal: dict[tuple[ResourceType, str], dict[str, list[_Entry]]] = {}
        wildcard: dict[ResourceType, dict[str, list[_Entry]]] = {}
        prefixed: dict[tuple[ResourceType, str], dict[str, list[_Entry]]] = {}
        prefix_lengths: dict[ResourceType, set[int]] = {}
        count = 0
        for binding in bindings:
            name = binding.resource_name
            if binding.pattern_type == PatternType.LITERAL:
                if name == WILDCARD_RESOURCE:
                    by_principal = wildcard.setdefault(binding.resource_type, {})
                else:
                    by_principal = literal.setdefault((binding.resource_type, name), {})
            elif binding.pattern_type == PatternType.PREFIXED and name:
                by_principal = prefixed.setdefault((binding.resource_type, name), {})
                prefix_lengths.setdefault(binding.resource_type, set()).add(len(name))
            else:
                continue
            entry = (canonical_host(binding.host), binding.operation, binding.permission)
            by_principal.setdefault(binding.principal, []).append(entry)
            count += 1
        self._literal = {key: _freeze(value) for key, value in literal.items()}
        self._wildcard = {key: _freeze(value) for key, value in wildcard.items()}
        self._prefixed = {key: _freeze(value) for key, value in prefixed.items()}
        self._prefix_lengths = {
            key: tuple(sorted(lengths)) for key, lengths in prefix_lengths.items()
        }
        self._super_users = frozenset(super_users)
        self._allow_everyone = bool(allow_everyone_if_no_acl_found)
        self._binding_count = count

    def __len__(self) -> int:
        return self._binding_count

    @property
    def super_users(self) -> frozenset[str]:
        return self._super_users

    @property
    def allow_everyone_if_no_acl_found(self) -> bool:
        return self._allow_everyone

    def authorize(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        resource_name: str,
    ) -> bool:
        """May `principal` ("User:alice"), connected from `host` (the peer's IP address as
        text), perform `operation` on the resource? UNKNOWN and ANY are never authorized."""
        if operation == _op.UNKNOWN or operation == _op.ANY:
            return False
        if principal in self._super_users:
            return True
        principals = (principal, WILDCARD_PRINCIPAL)
        host = canonical_host(host)
        found_resource_acls = False
        allowed = False
        for by_principal in self._resource_acls(resource_type, resource_name):
            found_resource_acls = True
            for who in principals:
                for acl_host, acl_operation, permission in by_principal.get(who, ()):
                    if acl_host != WILDCARD_HOST and acl_host != host:
                        continue
                    if permission == AclPermissionType.DENY:
                        if acl_operation == _op.ALL or acl_operation == operation:
                            return False
                    elif (
                        not allowed
                        and permission == AclPermissionType.ALLOW
                        and _allow_covers(acl_operation, operation)
                    ):
                        allowed = True
        if allowed:
            return True
        return not found_resource_acls and self._allow_everyone

    def authorized_operations(
        self, principal: str, host: str, resource_type: ResourceType, resource_name: str
    ) -> frozenset[AclOperation]:
        """KIP-430: the operations of the resource type that `principal` may perform."""
        return frozenset(
            operation
            for operation in SUPPORTED_OPERATIONS.get(resource_type, frozenset())
            if self.authorize(principal, host, operation, resource_type, resource_name)
        )

    def _resource_acls(
        self, resource_type: ResourceType, resource_name: str
    ) -> Iterable[_PrincipalIndex]:
        """Every per-resource index whose pattern matches the name: the literal name, the
        literal wildcard, and each PREFIXED pattern that is a prefix of the name (one dict
        lookup per distinct prefix length, never a scan of the bindings)."""
        found: list[_PrincipalIndex] = []
        exact = self._literal.get((resource_type, resource_name))
        if exact is not None:
            found.append(exact)
        any_name = self._wildcard.get(resource_type)
        if any_name is not None:
            found.append(any_name)
        lengths = self._prefix_lengths.get(resource_type)
        if lengths:
            name_length = len(resource_name)
            for length in lengths:
                if length > name_length:
                    break
                prefixed = self._prefixed.get((resource_type, resource_name[:length]))
                if prefixed is not None:
                    found.append(prefixed)
        return found


def operations_bitfield(operations: Iterable[AclOperation]) -> int:
    """KIP-430's authorized-operations field: bit i set for the operation whose code is i."""
    field = 0
    for operation in operations:
        code = int(operation)
        if not 0 <= code < 32:
            raise ValueError(f"operation code {code} does not fit a 32-bit field")
        field |= 1 << code
    return field
