"""Options of the `raftlog` Spark sink, parsed and checked once on the driver.

The names are those of Spark's Kafka sink (`kafka.bootstrap.servers`, `topic`, `kafka.*`
producer settings), so a `df.write.format("kafka")` job carries over. Every write is
transactional (docs/spark.md): acks is all, idempotence is on, and a setting that would
weaken either is refused rather than ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from raftlog.client.properties import PLAINTEXT, ClientSecurity
from raftlog.codec import I32_MAX
from raftlog.records import Compression
from raftlog.spark.options import OptionError, _get, parse_security

# A task sends a partition's rows as one batch once they reach this many bytes (Kafka's
# batch.size is 16 KiB; a Spark task has its rows at hand, so bigger batches cost no latency
# and save round trips). Kept under the broker's default message.max.bytes (1 MiB).
DEFAULT_BATCH_SIZE_BYTES = 512 * 1024
MAX_BATCH_SIZE_BYTES = 64 * 1024 * 1024
# Long enough for a batch job's slowest task plus the driver's commit; at most the server's
# transaction_max_timeout_ms default (900 000).
DEFAULT_TRANSACTION_TIMEOUT_MS = 300_000
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
# Kafka's producer defaults: a batch's whole delivery, and a coordinator call, retries included.
DEFAULT_DELIVERY_TIMEOUT_MS = 120_000
DEFAULT_MAX_BLOCK_MS = 60_000
DEFAULT_TRANSACTIONAL_ID_PREFIX = "raftlog-spark"
MAX_TRANSACTIONAL_ID_PREFIX_CHARS = 100

COMPRESSION_NAMES = {
    "none": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}
# kafka.* producer settings the sink reads (security ones are parse_security's).
PRODUCER_OPTION_KEYS = (
    "bootstrap.servers",
    "acks",
    "compression.type",
    "linger.ms",
    "batch.size",
    "enable.idempotence",
    "transaction.timeout.ms",
    "request.timeout.ms",
    "delivery.timeout.ms",
    "max.block.ms",
    "client.id",
    "max.in.flight.requests.per.connection",
)


@dataclass(frozen=True)
class WriteOptions:
    """What a write asked for; plain data so Spark can ship it to executors."""

    bootstrap_servers: str
    # The `topic` option: where rows without a topic column go (it overrides the column,
    # as in Spark's Kafka sink).
    topic: str | None = None
    compression: Compression = Compression.NONE
    batch_size_bytes: int = DEFAULT_BATCH_SIZE_BYTES
    linger_ms: int = 0  # accepted for Kafka parity; a task flushes when its rows end
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    delivery_timeout_ms: int = DEFAULT_DELIVERY_TIMEOUT_MS
    max_block_ms: int = DEFAULT_MAX_BLOCK_MS
    transactional_id_prefix: str = DEFAULT_TRANSACTIONAL_ID_PREFIX
    # Streaming: the topic whose partition 0 keys each task's committed batch id, kept as a
    # consumer-group offset written in the task's transaction (defaults to `topic`).
    commit_topic: str | None = None
    security: ClientSecurity = PLAINTEXT


def _int_option(options: Mapping[str, str], name: str, lo: int, hi: int, default: int) -> int:
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {raw!r}") from None
    if not lo <= value <= hi:
        raise OptionError(f"option {name} must be in [{lo}, {hi}], got {value}")
    return value


def parse_write_options(options: Mapping[str, str], *, streaming: bool = False) -> WriteOptions:
    """Validate the sink's options; raises OptionError naming the bad option."""
    servers = _get(options, "kafka.bootstrap.servers", "bootstrap.servers")
    if not servers or not servers.strip():
        raise OptionError("option kafka.bootstrap.servers (or bootstrap.servers) is required")
    lowered = {str(k).lower() for k in options}
    unknown = sorted(
        name
        for name in lowered
        if name.startswith("kafka.")
        and not name.startswith(("kafka.ssl.", "kafka.sasl.", "kafka.security."))
        and name[len("kafka.") :] not in PRODUCER_OPTION_KEYS
    )
    if unknown:
        raise OptionError(f"option {unknown[0]} is not supported by the raftlog sink")
    acks = (_get(options, "kafka.acks") or "all").strip().lower()
    if acks not in ("all", "-1"):
        raise OptionError(
            f"option kafka.acks must be all (or -1): every raftlog sink write is "
            f"transactional, got {acks!r}"
        )
    idempotence = (_get(options, "kafka.enable.idempotence") or "true").strip().lower()
    if idempotence != "true":
        raise OptionError("option kafka.enable.idempotence must be true (writes are transactional)")
    compression_name = (_get(options, "kafka.compression.type") or "none").strip().lower()
    if compression_name not in COMPRESSION_NAMES:
        raise OptionError(
            f"option kafka.compression.type must be one of {', '.join(COMPRESSION_NAMES)}, "
            f"got {compression_name!r}"
        )
    topic = _get(options, "topic")
    if topic is not None and not topic.strip():
        raise OptionError("option topic is empty")
    prefix = (_get(options, "transactionalIdPrefix") or DEFAULT_TRANSACTIONAL_ID_PREFIX).strip()
    if not prefix or len(prefix) > MAX_TRANSACTIONAL_ID_PREFIX_CHARS:
        raise OptionError(
            f"option transactionalIdPrefix must be 1..{MAX_TRANSACTIONAL_ID_PREFIX_CHARS} chars"
        )
    commit_topic = _get(options, "commitTopic") or topic
    if streaming and not commit_topic:
        raise OptionError(
            "a streaming write without the topic option needs option commitTopic: the topic "
            "whose partition 0 keys each task's committed batch id (exactly-once replays)"
        )
    return WriteOptions(
        bootstrap_servers=servers.strip(),
        topic=topic.strip() if topic else None,
        compression=COMPRESSION_NAMES[compression_name],
        batch_size_bytes=_int_option(
            options, "kafka.batch.size", 1, MAX_BATCH_SIZE_BYTES, DEFAULT_BATCH_SIZE_BYTES
        ),
        linger_ms=_int_option(options, "kafka.linger.ms", 0, I32_MAX, 0),
        transaction_timeout_ms=_int_option(
            options,
            "kafka.transaction.timeout.ms",
            1_000,
            I32_MAX,
            DEFAULT_TRANSACTION_TIMEOUT_MS,
        ),
        request_timeout_ms=_int_option(
            options, "kafka.request.timeout.ms", 100, I32_MAX, DEFAULT_REQUEST_TIMEOUT_MS
        ),
        delivery_timeout_ms=_int_option(
            options, "kafka.delivery.timeout.ms", 1_000, I32_MAX, DEFAULT_DELIVERY_TIMEOUT_MS
        ),
        max_block_ms=_int_option(
            options, "kafka.max.block.ms", 1_000, I32_MAX, DEFAULT_MAX_BLOCK_MS
        ),
        transactional_id_prefix=prefix,
        commit_topic=commit_topic.strip() if commit_topic else None,
        security=parse_security(options),
    )
