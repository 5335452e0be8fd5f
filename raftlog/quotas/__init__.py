"""Client quotas: entities and precedence, windowed rates, per-broker throttling (sans-IO).

Rules of this package (docs/quotas.md): entity, rate and manager are sans-IO and take the
time as an argument; broker_hook.py and usage_rpc.py connect them to the node. Quota keys
and precedence are Kafka's.
"""

from raftlog.quotas.entity import (
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    PRODUCER_BYTE_RATE,
    QUOTA_KEYS,
    REQUEST_PERCENTAGE,
    USER,
    QuotaConfig,
    QuotaEntity,
    QuotaValidationError,
    precedence,
    sensor_tags,
    validate_alteration,
    validate_entity,
    validate_quota_value,
)
from raftlog.quotas.manager import MutationOutcome, QuotaLimits, QuotaManager, QuotaUsage
from raftlog.quotas.rate import SampledRate, TokenBucket, pacing_throttle_ms, throttle_time_ms

__all__ = [
    "CLIENT_ID",
    "CONSUMER_BYTE_RATE",
    "CONTROLLER_MUTATION_RATE",
    "PRODUCER_BYTE_RATE",
    "QUOTA_KEYS",
    "REQUEST_PERCENTAGE",
    "USER",
    "MutationOutcome",
    "QuotaConfig",
    "QuotaEntity",
    "QuotaLimits",
    "QuotaManager",
    "QuotaUsage",
    "QuotaValidationError",
    "SampledRate",
    "TokenBucket",
    "pacing_throttle_ms",
    "precedence",
    "sensor_tags",
    "throttle_time_ms",
    "validate_alteration",
    "validate_entity",
    "validate_quota_value",
]
