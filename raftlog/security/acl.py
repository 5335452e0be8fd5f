"""The ACL vocabulary: Kafka's resource, pattern, operation and permission types with their
wire codes, and the binding an authorizer holds (a resource pattern plus an access control
entry). Shared by the metadata records, the authorizer and the Kafka handlers."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from raftlog.errors import RemoteError

WILDCARD_RESOURCE = "*"
WILDCARD_PRINCIPAL = "User:*"
WILDCARD_HOST = "*"
CLUSTER_RESOURCE_NAME = "kafka-cluster"


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


# Only these may be stored in a binding; ANY/MATCH/UNKNOWN are for filters.
CONCRETE_RESOURCE_TYPES = frozenset(
    {ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID}
)
CONCRETE_PATTERN_TYPES = frozenset({PatternType.LITERAL, PatternType.PREFIXED})
CONCRETE_OPERATIONS = frozenset(op for op in AclOperation if op > AclOperation.ANY)
CONCRETE_PERMISSIONS = frozenset({AclPermissionType.DENY, AclPermissionType.ALLOW})


class InvalidAclError(RemoteError, ValueError):
    """A binding that cannot be stored (Kafka answers INVALID_REQUEST)."""


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: `principal` from `host` is allowed/denied `operation` on resources matching
    (resource_type, resource_name, pattern_type). Principals are "User:<name>"."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType

    def validate(self) -> AclBinding:
        """Return self if it can be stored, else raise InvalidAclError saying why."""
        if self.resource_type not in CONCRETE_RESOURCE_TYPES:
            raise InvalidAclError(f"resource type {self.resource_type.name} cannot be stored")
        if self.pattern_type not in CONCRETE_PATTERN_TYPES:
            raise InvalidAclError(f"pattern type {self.pattern_type.name} cannot be stored")
        if self.operation not in CONCRETE_OPERATIONS:
            raise InvalidAclError(f"operation {self.operation.name} cannot be stored")
        if self.permission not in CONCRETE_PERMISSIONS:
            raise InvalidAclError(f"permission {self.permission.name} cannot be stored")
        if not self.resource_name:
            raise InvalidAclError("resource name is empty")
        if self.resource_type == ResourceType.CLUSTER and (
            self.resource_name != CLUSTER_RESOURCE_NAME or self.pattern_type != PatternType.LITERAL
        ):
            raise InvalidAclError(f"a CLUSTER ACL names the literal {CLUSTER_RESOURCE_NAME!r}")
        if self.pattern_type == PatternType.PREFIXED and self.resource_name == WILDCARD_RESOURCE:
            raise InvalidAclError("a PREFIXED ACL cannot use the wildcard name")
        kind, colon, name = self.principal.partition(":")
        if not colon or not kind or not name:
            raise InvalidAclError(f"principal {self.principal!r} is not TYPE:NAME")
        if not self.host:
            raise InvalidAclError("host is empty (use '*' for any host)")
        return self


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """What DescribeAcls and DeleteAcls select: None (or ANY) matches every value; pattern
    type MATCH selects every binding that would apply to the named resource (literal,
    wildcard and prefixed ones), as Kafka's filter does."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermissionType = AclPermissionType.ANY

    def matches(self, binding: AclBinding) -> bool:
        if self.resource_type not in (ResourceType.ANY, binding.resource_type):
            return False
        if self.operation not in (AclOperation.ANY, binding.operation):
            return False
        if self.permission not in (AclPermissionType.ANY, binding.permission):
            return False
        if self.principal is not None and self.principal != binding.principal:
            return False
        if self.host is not None and self.host != binding.host:
            return False
        return self._matches_pattern(binding)

    def _matches_pattern(self, binding: AclBinding) -> bool:
        if self.pattern_type == PatternType.MATCH:
            if self.resource_name is None:
                return True
            if binding.pattern_type == PatternType.LITERAL:
                return binding.resource_name in (self.resource_name, WILDCARD_RESOURCE)
            return self.resource_name.startswith(binding.resource_name)
        if self.pattern_type not in (PatternType.ANY, binding.pattern_type):
            return False
        return self.resource_name is None or self.resource_name == binding.resource_name


class ScramMechanism(enum.IntEnum):
    """KIP-554's mechanism codes; the SASL names are `sasl_name`."""

    UNKNOWN = 0
    SCRAM_SHA_256 = 1
    SCRAM_SHA_512 = 2

    @property
    def sasl_name(self) -> str:
        return self.name.replace("_", "-")

    @property
    def hash_name(self) -> str:
        return "sha256" if self is ScramMechanism.SCRAM_SHA_256 else "sha512"


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the server keeps of a SCRAM password (RFC 5802): never the password itself."""

    mechanism: ScramMechanism
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int
