"""The memory backend of tests/kafka with ACLs and SCRAM credentials kept in memory, served
by the real Kafka handlers (raftlog.net.kafka.handlers_security), so `raftlog acls` and
`raftlog users` are tested against real CreateAcls/DescribeAcls/... traffic."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

from raftlog.errors import ErrorCode
from raftlog.metadata.controller.messages import ScramCredentialDeletion, ScramCredentialUpsertion
from raftlog.net.kafka import handlers_security
from raftlog.net.kafka.apis import ApiRegistry, default_registry
from raftlog.net.kafka.backend import (
    AclCreateResult,
    AclDeleteResult,
    ScramAlterResult,
    ScramUserDescription,
)
from raftlog.security.acl import (
    AclBinding,
    AclBindingFilter,
    InvalidAclError,
    ScramCredential,
    ScramMechanism,
)
from raftlog.security.scram import credential_from_salted_password
from tests.kafka.memory_backend import MemoryBackend


class SecureMemoryBackend(MemoryBackend):
    def __init__(self, data_dir: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(data_dir, host, port)
        self.acls: dict[AclBinding, None] = {}
        self.credentials: dict[tuple[str, ScramMechanism], ScramCredential] = {}

    async def create_acls(self, creations: Sequence[AclBinding]) -> Sequence[AclCreateResult]:
        results = []
        for binding in creations:
            try:
                self.acls[binding.validate()] = None
                results.append(AclCreateResult())
            except InvalidAclError as exc:
                results.append(AclCreateResult(ErrorCode.invalid_request, str(exc)))
        return results

    async def describe_acls(self, acl_filter: AclBindingFilter) -> Sequence[AclBinding]:
        return [b for b in self.acls if acl_filter.matches(b)]

    async def delete_acls(self, filters: Sequence[AclBindingFilter]) -> Sequence[AclDeleteResult]:
        results = []
        for acl_filter in filters:
            matching = [b for b in self.acls if acl_filter.matches(b)]
            for binding in matching:
                del self.acls[binding]
            results.append(AclDeleteResult(matching=matching))
        return results

    async def describe_user_scram_credentials(
        self, users: Sequence[str] | None
    ) -> Sequence[ScramUserDescription]:
        names = sorted({u for u, _ in self.credentials}) if not users else list(users)
        out = []
        for name in names:
            found = [
                (m, c.iterations) for (u, m), c in sorted(self.credentials.items()) if u == name
            ]
            if not found:
                out.append(ScramUserDescription(name, ErrorCode.resource_not_found, None))
            else:
                out.append(ScramUserDescription(name, credentials=found))
        return out

    async def alter_user_scram_credentials(
        self,
        deletions: Sequence[ScramCredentialDeletion],
        upsertions: Sequence[ScramCredentialUpsertion],
    ) -> Sequence[ScramAlterResult]:
        results: dict[str, ScramAlterResult] = {}
        for d in deletions:
            key = (d.name, ScramMechanism(d.mechanism))
            if self.credentials.pop(key, None) is None:
                results[d.name] = ScramAlterResult(d.name, ErrorCode.resource_not_found, None)
            else:
                results.setdefault(d.name, ScramAlterResult(d.name))
        for u in upsertions:
            mechanism = ScramMechanism(u.mechanism)
            self.credentials[(u.name, mechanism)] = credential_from_salted_password(
                mechanism, salt=u.salt, salted_password=u.salted_password, iterations=u.iterations
            )
            results.setdefault(u.name, ScramAlterResult(u.name))
        return list(results.values())

    def scram_credential(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        return self.credentials.get((user, mechanism))

    def acl_bindings(self) -> Collection[AclBinding]:
        return tuple(self.acls)


def security_registry() -> ApiRegistry:
    registry = default_registry()
    handlers_security.register(registry)
    return registry
