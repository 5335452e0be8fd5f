"""Quota entities, the quota configuration store and Kafka's precedence rules (KIP-55).

A quota entity names who a quota applies to: a user, a client id, or a (user, client id) pair,
where either name may be the default (`<default>`, stored as None). Entities are kept in the
shape AlterClientQuotas and DescribeClientQuotas use on the wire: a tuple of
(entity type, name or None) components, so the Kafka handlers and the metadata records can
build one without translation.

Resolution follows Kafka's eight-level table, most specific first. Each key is resolved on its
own: a user may get producer_byte_rate from its own entity and consumer_byte_rate from the
client-id default. Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from raftlog.errors import ErrorCode, KafkaError

USER = "user"
CLIENT_ID = "client-id"
ENTITY_TYPES = (USER, CLIENT_ID)

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
QUOTA_KEYS = (
    PRODUCER_BYTE_RATE,
    CONSUMER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    CONTROLLER_MUTATION_RATE,
)
# Kafka types the byte rates as LONG and the others as DOUBLE; a fractional byte rate is a
# typo far more often than an intent, so it is refused like Kafka refuses it.
_INTEGER_KEYS = frozenset({PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE})

# Longest user or client-id name accepted in an entity; Kafka's strings are int16-sized.
MAX_ENTITY_NAME_BYTES = 32_767

Component = tuple[str, str | None]


class QuotaValidationError(KafkaError):
    """A quota alteration or entity was refused; the message says which part and why."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.invalid_request, message)


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """Who a quota applies to: ordered (entity type, name or None for <default>) components."""

    components: tuple[Component, ...]

    @classmethod
    def of(cls, components: Iterable[Component]) -> QuotaEntity:
        """Build from wire-shaped components in any order; validates types and duplicates."""
        return cls(validate_entity(components))

    @classmethod
    def user(cls, name: str | None) -> QuotaEntity:
        return cls(((USER, name),))

    @classmethod
    def client(cls, client_id: str | None) -> QuotaEntity:
        return cls(((CLIENT_ID, client_id),))

    @classmethod
    def user_client(cls, name: str | None, client_id: str | None) -> QuotaEntity:
        # Canonical order is ENTITY_TYPES order (user first), the same order `of` produces.
        return cls(((USER, name), (CLIENT_ID, client_id)))

    def get(self, entity_type: str) -> tuple[bool, str | None]:
        """(present, name) of one component; name None means <default>."""
        for kind, name in self.components:
            if kind == entity_type:
                return True, name
        return False, None

    @property
    def path(self) -> str:
        """The entity as Kafka's config path, e.g. /config/users/alice/clients/<default>."""
        parts = []
        for kind, name in self.components:
            shown = "<default>" if name is None else name
            parts.append(f"users/{shown}" if kind == USER else f"clients/{shown}")
        return "/config/" + "/".join(parts)

    def __str__(self) -> str:
        return self.path


def precedence(user: str, client_id: str) -> tuple[QuotaEntity, ...]:
    """Kafka's eight quota entities for a connection, most specific first."""
    return (
        QuotaEntity.user_client(user, client_id),
        QuotaEntity.user_client(user, None),
        QuotaEntity.user(user),
        QuotaEntity.user_client(None, client_id),
        QuotaEntity.user_client(None, None),
        QuotaEntity.user(None),
        QuotaEntity.client(client_id),
        QuotaEntity.client(None),
    )


def sensor_tags(matched: QuotaEntity, user: str, client_id: str) -> tuple[str, str]:
    """The (user, client-id) pair whose traffic shares one quota, as Kafka's metric tags.

    A default entity is a template, not a shared bucket: `/config/users/<default>` gives every
    user its own quota. Only the components the matched entity names are kept; the other is
    "" so, for example, all clients of a user with a user-level quota share one rate.
    """
    has_user, _ = matched.get(USER)
    has_client, _ = matched.get(CLIENT_ID)
    return (user if has_user else "", client_id if has_client else "")


# ---------------------------------------------------------------------------- validation
def validate_entity(components: Iterable[Component]) -> tuple[Component, ...]:
    """Check entity components from a request or the CLI; return them in canonical order."""
    seen: dict[str, str | None] = {}
    for item in components:
        if not isinstance(item, tuple) or len(item) != 2:
            raise QuotaValidationError(f"entity component must be (type, name), got {item!r}")
        kind, name = item
        if kind not in ENTITY_TYPES:
            raise QuotaValidationError(
                f"unknown quota entity type {kind!r}; expected one of {list(ENTITY_TYPES)}"
            )
        if kind in seen:
            raise QuotaValidationError(f"quota entity names {kind!r} twice")
        if name is not None:
            if not isinstance(name, str):
                raise QuotaValidationError(f"{kind} name must be a string, got {name!r}")
            if len(name.encode()) > MAX_ENTITY_NAME_BYTES:
                raise QuotaValidationError(
                    f"{kind} name is longer than {MAX_ENTITY_NAME_BYTES} bytes"
                )
        seen[kind] = name
    if not seen:
        raise QuotaValidationError("quota entity is empty; name a user, a client-id or both")
    return tuple((kind, seen[kind]) for kind in ENTITY_TYPES if kind in seen)


def validate_quota_value(key: str, value: object) -> float:
    """Check one quota key and value (number or numeric string); return it as a float."""
    if key not in QUOTA_KEYS:
        raise QuotaValidationError(f"unknown quota key {key!r}; expected one of {list(QUOTA_KEYS)}")
    if isinstance(value, bool):
        raise QuotaValidationError(f"{key} must be a number, got {value!r}")
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise QuotaValidationError(f"{key} must be a number, got {value!r}") from None
    elif isinstance(value, int | float):
        number = float(value)
    else:
        raise QuotaValidationError(f"{key} must be a number, got {value!r}")
    if math.isnan(number) or math.isinf(number):
        raise QuotaValidationError(f"{key} must be a finite number, got {value!r}")
    if number < 0:
        raise QuotaValidationError(f"{key} must not be negative, got {value!r}")
    if number == 0:
        # A zero quota would make every byte an infinite violation; removing the key is the
        # way to lift a quota, and a tiny positive value is the way to nearly block a client.
        raise QuotaValidationError(f"{key} must be positive (remove the key to lift the quota)")
    if key in _INTEGER_KEYS and not number.is_integer():
        raise QuotaValidationError(f"{key} must be a whole number of bytes/s, got {value!r}")
    return number


def validate_alteration(
    components: Iterable[Component], ops: Iterable[tuple[str, object, bool]]
) -> tuple[QuotaEntity, dict[str, float | None]]:
    """Validate one AlterClientQuotas entry: ops are (key, value, remove).

    Returns the entity and a delta (key -> value, None to remove) for QuotaConfig.apply_delta.
    """
    entity = QuotaEntity.of(components)
    delta: dict[str, float | None] = {}
    for key, value, remove in ops:
        if key in delta:
            raise QuotaValidationError(f"{key} appears twice for {entity}")
        if remove:
            if key not in QUOTA_KEYS:
                raise QuotaValidationError(
                    f"unknown quota key {key!r}; expected one of {list(QUOTA_KEYS)}"
                )
            delta[key] = None
        else:
            delta[key] = validate_quota_value(key, value)
    return entity, delta


# ---------------------------------------------------------------------------- the store
class QuotaConfig:
    """Quota values by entity, fed from the metadata image (ClientQuotaRecord deltas)."""

    def __init__(self, quotas: Mapping[QuotaEntity, Mapping[str, float]] | None = None) -> None:
        self._quotas: dict[QuotaEntity, dict[str, float]] = {}
        # Bumped on every change so a cache keyed on it can never serve a stale quota.
        self.version = 0
        if quotas:
            self.replace(quotas)

    def replace(self, quotas: Mapping[QuotaEntity, Mapping[str, float]]) -> None:
        """Swap in a whole new table (a metadata snapshot was loaded)."""
        table: dict[QuotaEntity, dict[str, float]] = {}
        for entity, values in quotas.items():
            checked = {key: validate_quota_value(key, value) for key, value in values.items()}
            if checked:
                table[entity] = checked
        self._quotas = table
        self.version += 1

    def apply_delta(self, delta: Mapping[QuotaEntity, Mapping[str, float | None]]) -> None:
        """Apply changed keys; a value of None removes that key from the entity."""
        checked: dict[QuotaEntity, dict[str, float | None]] = {}
        for entity, values in delta.items():
            checked[entity] = {
                key: None if value is None else validate_quota_value(key, value)
                for key, value in values.items()
            }
        # Validate everything before changing anything, so a bad delta leaves no half update.
        for entity, values in checked.items():
            current = self._quotas.setdefault(entity, {})
            for key, value in values.items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = value
            if not current:
                del self._quotas[entity]
        self.version += 1

    def entities(self) -> dict[QuotaEntity, dict[str, float]]:
        """A copy of the whole table (for DescribeClientQuotas and snapshots)."""
        return {entity: dict(values) for entity, values in self._quotas.items()}

    def get(self, entity: QuotaEntity) -> dict[str, float]:
        return dict(self._quotas.get(entity, {}))

    def quota_for(
        self, user: str, client_id: str, key: str
    ) -> tuple[float | None, QuotaEntity | None]:
        """The quota that applies to (user, client_id) for key, and the entity it came from."""
        if not self._quotas:
            return None, None
        for entity in precedence(user, client_id):
            values = self._quotas.get(entity)
            if values is not None and key in values:
                return values[key], entity
        return None, None

    def __len__(self) -> int:
        return len(self._quotas)
