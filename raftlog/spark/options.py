"""Options of the `raftlog` Spark source, parsed and checked once on the driver.

The names and JSON formats are those of Spark's built-in Kafka source, so a user who knows
`spark.read.format("kafka")` knows this one. Everything is validated here, before any I/O,
so a typo fails with a message naming the option instead of deep inside an executor.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raftlog.client.properties import (
    PLAINTEXT,
    ClientPropertiesError,
    ClientSecurity,
    parse_client_properties,
)
from raftlog.client.protocol import IsolationLevel
from raftlog.errors import LocalError

# ListOffsets sentinels, as in Spark's offset JSON: -2 earliest, -1 latest.
EARLIEST = -2
LATEST = -1

DEFAULT_FETCH_MAX_BYTES = 8 * 1024 * 1024
MIN_FETCH_MAX_BYTES = 1024
# One executor read() holds at most this many fetch responses of decoded columns at a time.
DEFAULT_FETCHES_PER_CHUNK = 4
DEFAULT_FETCH_MAX_WAIT_MS = 500
# A split whose reads make no progress for this long fails (the HW stalled below its end).
DEFAULT_READ_STALL_TIMEOUT_MS = 60_000
DEFAULT_MAX_RETRIES = 15
DEFAULT_REQUEST_TIMEOUT_MS = 30_000


class OptionError(LocalError, ValueError):
    """An option is missing, unknown in value, or contradicts another one."""


@dataclass(frozen=True)
class ReadOptions:
    """What a read asked for; plain data so Spark can ship it to executors."""

    bootstrap_servers: str
    # Exactly one of the three subscriptions is set.
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: tuple[tuple[str, int], ...] = ()
    # "earliest" / "latest" or {topic: {partition: offset}}; timestamps override them.
    starting_offsets: str | dict[str, dict[int, int]] = "earliest"
    ending_offsets: str | dict[str, dict[int, int]] = "latest"
    starting_timestamp_ms: int | None = None
    ending_timestamp_ms: int | None = None
    # "error" (Spark's default) or "latest": what a start timestamp past every record means.
    starting_timestamp_strategy: str = "error"
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    fetches_per_chunk: int = DEFAULT_FETCHES_PER_CHUNK
    fetch_max_wait_ms: int = DEFAULT_FETCH_MAX_WAIT_MS
    read_stall_timeout_ms: int = DEFAULT_READ_STALL_TIMEOUT_MS
    max_retries: int = DEFAULT_MAX_RETRIES
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    max_offsets_per_trigger: int | None = None
    # TLS and SASL from the kafka.security.protocol, kafka.sasl.* and kafka.ssl.* options.
    security: ClientSecurity = PLAINTEXT
    # kafka.isolation.level, as Spark's Kafka source passes it to its consumer: under
    # read_committed a read ends at the last stable offset and skips aborted transactions.
    isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED

    def matches(self, topic: str) -> bool:
        """Whether a topic is part of this subscription (internal topics never are)."""
        if topic.startswith("__"):
            return False
        if self.subscribe:
            return topic in self.subscribe
        if self.subscribe_pattern is not None:
            return re.fullmatch(self.subscribe_pattern, topic) is not None
        return any(topic == t for t, _ in self.assign)


def _get(options: Mapping[str, str], *names: str) -> str | None:
    # Spark hands options over case-insensitively; plain dicts in tests may not be.
    lowered = {str(k).lower(): v for k, v in options.items()}
    for name in names:
        value = lowered.get(name.lower())
        if value is not None:
            return str(value)
    return None


def _int(options: Mapping[str, str], name: str, *, lo: int, default: int | None) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {raw!r}") from None
    if value < lo:
        raise OptionError(f"option {name} must be >= {lo}, got {value}")
    return value


def _count(options: Mapping[str, str], name: str, *, lo: int, default: int) -> int:
    value = _int(options, name, lo=lo, default=default)
    return default if value is None else value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered not in ("true", "false"):
        raise OptionError(f"option {name} must be true or false, got {raw!r}")
    return lowered == "true"


def parse_offsets_json(raw: str, name: str) -> dict[str, dict[int, int]]:
    """Spark's per-partition offset JSON: {"topic": {"0": 23, "1": -2}}."""
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option {name} is neither earliest/latest nor JSON: {exc}") from None
    if not isinstance(value, dict):
        raise OptionError(f'option {name} JSON must look like {{"topic": {{"0": 42}}}}')
    out: dict[str, dict[int, int]] = {}
    for topic, partitions in value.items():
        if not isinstance(partitions, dict):
            raise OptionError(f"option {name}: topic {topic!r} must map partitions to offsets")
        parsed: dict[int, int] = {}
        for partition, offset in partitions.items():
            try:
                index = int(partition)
            except ValueError:
                raise OptionError(f"option {name}: {partition!r} is not a partition") from None
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
                raise OptionError(
                    f"option {name}: {topic}-{index} offset must be an integer >= -2, "
                    f"got {offset!r}"
                )
            parsed[index] = offset
        out[str(topic)] = parsed
    return out


def _parse_assign(raw: str) -> tuple[tuple[str, int], ...]:
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f'option assign must be JSON like {{"topic": [0, 1]}}: {exc}') from None
    if not isinstance(value, dict) or not value:
        raise OptionError('option assign must be JSON like {"topic": [0, 1]}')
    pairs: list[tuple[str, int]] = []
    for topic, partitions in value.items():
        if not isinstance(partitions, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
        ):
            raise OptionError(f"option assign: topic {topic!r} needs a list of partition numbers")
        pairs.extend((str(topic), p) for p in partitions)
    return tuple(sorted(set(pairs)))


def _offsets_option(
    options: Mapping[str, str], name: str, default: str, *, refused: str, streaming: bool
) -> str | dict[str, dict[int, int]]:
    raw = _get(options, name)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in ("earliest", "latest"):
        if word == refused and not streaming:
            raise OptionError(f"option {name}={word} is not valid for batch queries (as in Spark)")
        return word
    parsed = parse_offsets_json(raw, name)
    refused_sentinel = LATEST if refused == "latest" else EARLIEST
    if not streaming:
        for topic, partitions in parsed.items():
            for partition, offset in partitions.items():
                if offset == refused_sentinel:
                    raise OptionError(
                        f"option {name}: {topic}-{partition} uses {offset} ({refused}), "
                        f"which is not valid for batch queries"
                    )
    return parsed


# The security options Spark's Kafka source passes to its consumer (prefixed "kafka."),
# plus librdkafka's PEM names, which Java's consumer does not have.
SECURITY_OPTION_KEYS = (
    "security.protocol",
    "sasl.mechanism",
    "sasl.jaas.config",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "ssl.truststore.location",
    "ssl.truststore.type",
    "ssl.keystore.location",
    "ssl.keystore.type",
)
# Java keystore/truststore passwords guard JKS/PKCS12 files, which raftlog does not read; a
# PEM store needs none, so they are accepted and unused.
_IGNORED_SECURITY_OPTIONS = ("ssl.truststore.password", "ssl.keystore.password")


def parse_security(options: Mapping[str, str]) -> ClientSecurity:
    """kafka.security.protocol, kafka.sasl.* and kafka.ssl.* as a ClientSecurity (the same
    reading as a client properties file); files are not checked here: they must exist on
    the executors, not on the driver."""
    lowered = {str(k).lower(): v for k, v in options.items()}
    values = {
        key: str(lowered[f"kafka.{key}"])
        for key in SECURITY_OPTION_KEYS
        if lowered.get(f"kafka.{key}") is not None
    }
    unknown = sorted(
        name
        for name in lowered
        if name.startswith(("kafka.ssl.", "kafka.sasl."))
        and name[len("kafka.") :] not in SECURITY_OPTION_KEYS
        and name[len("kafka.") :] not in _IGNORED_SECURITY_OPTIONS
    )
    if unknown:
        # Refused, not ignored: a security setting the reader would drop silently could
        # leave a connection less protected than its author meant.
        raise OptionError(f"option {unknown[0]} is not supported by the raftlog source")
    try:
        return parse_client_properties(values, source="options").security
    except ClientPropertiesError as exc:
        raise OptionError(_with_prefix(str(exc))) from None


def _with_prefix(message: str) -> str:
    """Name the options as the user wrote them: kafka.sasl.mechanism, not sasl.mechanism."""
    for key in sorted(SECURITY_OPTION_KEYS, key=len, reverse=True):
        message = re.sub(rf"(?<![\w.]){re.escape(key)}(?![\w.])", f"kafka.{key}", message)
    return message


def parse_isolation_level(options: Mapping[str, str]) -> IsolationLevel:
    raw = _get(options, "kafka.isolation.level")
    if raw is None:
        return IsolationLevel.READ_UNCOMMITTED
    try:
        return IsolationLevel.parse(raw)
    except ValueError:
        raise OptionError(
            f"option kafka.isolation.level must be read_uncommitted or read_committed, got {raw!r}"
        ) from None


def parse_options(options: Mapping[str, str], *, streaming: bool = False) -> ReadOptions:
    """Validate the user's options; raises OptionError naming the bad option."""
    servers = _get(options, "bootstrap.servers", "kafka.bootstrap.servers")
    if not servers or not servers.strip():
        raise OptionError("option bootstrap.servers (or kafka.bootstrap.servers) is required")
    subscribe_raw = _get(options, "subscribe")
    pattern = _get(options, "subscribePattern")
    assign_raw = _get(options, "assign")
    given = [n for n, v in (("subscribe", subscribe_raw), ("subscribePattern", pattern),
                            ("assign", assign_raw)) if v is not None]  # fmt: skip
    if len(given) != 1:
        raise OptionError(
            "exactly one of subscribe, subscribePattern, assign is required"
            + (f" (got {', '.join(given)})" if given else "")
        )
    subscribe: tuple[str, ...] = ()
    if subscribe_raw is not None:
        subscribe = tuple(t.strip() for t in subscribe_raw.split(",") if t.strip())
        if not subscribe:
            raise OptionError("option subscribe names no topic")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option subscribePattern is not a valid regex: {exc}") from None
    assign = _parse_assign(assign_raw) if assign_raw is not None else ()

    # Spark's Kafka source starts streams at latest and batches at earliest.
    starting = _offsets_option(
        options,
        "startingOffsets",
        "latest" if streaming else "earliest",
        refused="latest",
        streaming=streaming,
    )
    ending = _offsets_option(
        options, "endingOffsets", "latest", refused="earliest", streaming=streaming
    )
    if streaming and _get(options, "endingOffsets") is not None:
        raise OptionError("option endingOffsets is for batch queries only (as in Spark)")
    if streaming and (
        _get(options, "startingTimestamp") is not None
        or _get(options, "endingTimestamp") is not None
    ):
        # Refused rather than ignored: a stream would silently start somewhere else.
        raise OptionError(
            "options startingTimestamp/endingTimestamp are not supported for streaming reads "
            "yet; use startingOffsets"
        )
    strategy = (_get(options, "startingOffsetsByTimestampStrategy") or "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError(
            f"option startingOffsetsByTimestampStrategy must be error or latest, got {strategy!r}"
        )
    min_partitions = _int(options, "minPartitions", lo=1, default=None)
    max_records = _int(options, "maxRecordsPerPartition", lo=1, default=None)
    fetch_max_bytes = _int(options, "fetchMaxBytes", lo=MIN_FETCH_MAX_BYTES, default=None)
    if fetch_max_bytes is None:
        fetch_max_bytes = _int(
            options, "kafka.fetch.max.bytes", lo=MIN_FETCH_MAX_BYTES, default=None
        )
    return ReadOptions(
        bootstrap_servers=servers.strip(),
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        starting_offsets=starting,
        ending_offsets=ending,
        starting_timestamp_ms=_int(options, "startingTimestamp", lo=0, default=None),
        ending_timestamp_ms=_int(options, "endingTimestamp", lo=0, default=None),
        starting_timestamp_strategy=strategy,
        min_partitions=min_partitions,
        max_records_per_partition=max_records,
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        include_headers=_bool(options, "includeHeaders", False),
        fetch_max_bytes=fetch_max_bytes or DEFAULT_FETCH_MAX_BYTES,
        fetches_per_chunk=_count(
            options, "fetchesPerChunk", lo=1, default=DEFAULT_FETCHES_PER_CHUNK
        ),
        read_stall_timeout_ms=_count(
            options, "readStallTimeoutMs", lo=1, default=DEFAULT_READ_STALL_TIMEOUT_MS
        ),
        max_retries=_count(options, "fetchRetries", lo=0, default=DEFAULT_MAX_RETRIES),
        max_offsets_per_trigger=_int(options, "maxOffsetsPerTrigger", lo=1, default=None),
        security=parse_security(options),
        isolation_level=parse_isolation_level(options),
    )
