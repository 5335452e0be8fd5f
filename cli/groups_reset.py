"""`raftlog groups reset-offsets`: the argument forms and the plan, as kafka-consumer-groups.sh.

The parsers here turn what a user typed (--to-datetime, --by-duration, --topic T:P,P) into
checked values, or a ValueError whose text names what was wrong; the click parameter types
wrap them so a bad argument is refused before anything connects. `plan_resets` is the pure
part of a reset: given what the cluster said (committed offsets, log start offsets, high
watermarks, offsets found by timestamp) it computes each partition's new offset, clamped to
[log start, high watermark] as Kafka's tool does. The command (groups.py) gathers the inputs
and commits the plan.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import click

from raftlog.errors import LocalError

# Kafka's limits on a topic name (Topic.validate: legal characters, at most 249 of them).
TOPIC_NAME_MAX_CHARS = 249
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
PARTITION_MAX = 2**31 - 1
OFFSET_MAX = 2**63 - 1
# Longer arguments are refused before any parsing: none of the valid forms comes close.
DATETIME_MAX_CHARS = 64
DURATION_MAX_CHARS = 64
PARTITION_LIST_MAX_CHARS = 16_384
# Each number of a duration: far more than any real duration, small enough to stay exact.
DURATION_FIELD_MAX_DIGITS = 12

_DATETIME = re.compile(
    r"(?P<year>\d{4})-(?P<month>\d{2})-(?P<day>\d{2})"
    r"T(?P<hour>\d{2}):(?P<minute>\d{2}):(?P<second>\d{2})"
    r"(?:\.(?P<millis>\d{1,3}))?"
    r"(?P<zone>Z|[+-]\d{2}:\d{2})?",
    re.ASCII,
)
# java.time.Duration's form without signs: days, then T and hours, minutes, seconds.
_DURATION = re.compile(
    r"P(?:(?P<days>\d+)D)?"
    r"(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+)(?:\.(?P<fraction>\d{1,9}))?S)?)?",
    re.ASCII | re.IGNORECASE,
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_datetime_ms(text: str) -> int:
    """Epoch milliseconds of YYYY-MM-DDTHH:mm:SS[.sss][Z|±HH:MM].

    Without a zone the time is local, as Kafka's tool reads it. A time before 1970 is refused:
    ListOffsets reads negative timestamps as its "earliest"/"latest" sentinels.
    """
    if len(text) > DATETIME_MAX_CHARS:
        raise ValueError(f"a datetime is at most {DATETIME_MAX_CHARS} characters")
    match = _DATETIME.fullmatch(text)
    if match is None:
        raise ValueError(f"expected YYYY-MM-DDTHH:mm:SS[.sss][Z|+HH:MM|-HH:MM], got {text!r}")
    millis = match["millis"] or "0"
    zone = match["zone"]
    tz: timezone | None = None
    if zone == "Z":
        tz = UTC
    elif zone is not None:
        hours, minutes = int(zone[1:3]), int(zone[4:6])
        if hours > 23 or minutes > 59:
            raise ValueError(f"time zone offset out of range in {text!r}")
        offset = timedelta(hours=hours, minutes=minutes)
        tz = timezone(-offset if zone[0] == "-" else offset)
    try:
        moment = datetime(
            int(match["year"]),
            int(match["month"]),
            int(match["day"]),
            int(match["hour"]),
            int(match["minute"]),
            int(match["second"]),
            # ".5" is half a second, as in ISO 8601.
            int(millis.ljust(3, "0")) * 1000,
            tzinfo=tz,
        )
    except ValueError as exc:
        raise ValueError(f"not a valid date and time: {text!r} ({exc})") from None
    if moment.tzinfo is None:
        try:
            moment = moment.astimezone()
        except (OverflowError, OSError, ValueError):
            raise ValueError(f"cannot place {text!r} in the local time zone") from None
    try:
        since_epoch = moment - _EPOCH
    except OverflowError:
        raise ValueError(f"{text!r} is out of range") from None
    if since_epoch < timedelta(0):
        raise ValueError(f"{text!r} is before 1970-01-01T00:00:00Z")
    return since_epoch // timedelta(milliseconds=1)


def parse_duration_ms(text: str) -> int:
    """Milliseconds of a PnDTnHnMnS duration (java.time.Duration's form, as Kafka's
    --by-duration takes it; no sign: the reset goes that far back from now)."""
    if len(text) > DURATION_MAX_CHARS:
        raise ValueError(f"a duration is at most {DURATION_MAX_CHARS} characters")
    match = _DURATION.fullmatch(text)
    fields = ("days", "hours", "minutes", "seconds")
    if match is None or all(match[f] is None for f in fields) or text.upper().endswith("T"):
        raise ValueError(f"expected a duration PnDTnHnMnS such as P1DT2H or PT30M, got {text!r}")
    for f in fields:
        if match[f] is not None and len(match[f]) > DURATION_FIELD_MAX_DIGITS:
            raise ValueError(f"{f} of {text!r} has more than {DURATION_FIELD_MAX_DIGITS} digits")
    days, hours, minutes, seconds = (int(match[f] or 0) for f in fields)
    fraction_ms = int((match["fraction"] or "0").ljust(9, "0")[:3])
    return (((days * 24 + hours) * 60 + minutes) * 60 + seconds) * 1000 + fraction_ms


def parse_topic_partitions(text: str) -> tuple[str, tuple[int, ...] | None]:
    """TOPIC or TOPIC:P,P,...: the topic and its partitions (None: every partition)."""
    if len(text) > PARTITION_LIST_MAX_CHARS:
        raise ValueError(f"a --topic value is at most {PARTITION_LIST_MAX_CHARS} characters")
    topic, sep, listed = text.partition(":")
    if not topic:
        raise ValueError(f"expected TOPIC or TOPIC:PARTITION,..., got {text!r}")
    if (
        len(topic) > TOPIC_NAME_MAX_CHARS
        or not _TOPIC_NAME.fullmatch(topic)
        or topic in {".", ".."}
    ):
        raise ValueError(f"{topic!r} is not a valid topic name")
    if not sep:
        return topic, None
    partitions: list[int] = []
    for item in listed.split(","):
        item = item.strip()
        if not item.isascii() or not item.isdigit():
            raise ValueError(
                f"partitions of {topic!r} must be numbers separated by commas, got {listed!r}"
            )
        partition = int(item)
        if partition > PARTITION_MAX:
            raise ValueError(f"partition {item} of {topic!r} is out of range")
        partitions.append(partition)
    return topic, tuple(sorted(set(partitions)))


class _Checked(click.ParamType):
    """A click type from one of the parsers: a ValueError becomes a usage error."""

    def parse(self, text: str) -> Any:
        raise NotImplementedError

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class DateTimeType(_Checked):
    name = "datetime"

    def parse(self, text: str) -> int:
        return parse_datetime_ms(text)


class DurationType(_Checked):
    name = "duration"

    def parse(self, text: str) -> int:
        return parse_duration_ms(text)


class TopicPartitionsType(_Checked):
    name = "topic"

    def parse(self, text: str) -> tuple[str, tuple[int, ...] | None]:
        return parse_topic_partitions(text)


class ResetKind(enum.Enum):
    """The reset specs, named by their flags."""

    EARLIEST = "--to-earliest"
    LATEST = "--to-latest"
    OFFSET = "--to-offset"
    DATETIME = "--to-datetime"
    DURATION = "--by-duration"
    SHIFT = "--shift-by"
    CURRENT = "--to-current"

    @property
    def by_timestamp(self) -> bool:
        return self in (ResetKind.DATETIME, ResetKind.DURATION)


@dataclass(frozen=True)
class ResetSpec:
    kind: ResetKind
    # The offset (--to-offset), the shift (--shift-by), the timestamp in ms (--to-datetime,
    # and --by-duration once now is known), else 0.
    value: int = 0


class ResetError(LocalError):
    """A reset that cannot be planned (a --shift-by without a committed offset)."""


@dataclass(frozen=True)
class PartitionInputs:
    """What the cluster said about one partition."""

    log_start_offset: int
    high_watermark: int
    committed: int | None = None
    # --to-datetime/--by-duration: the first offset at or after the time, None if none is.
    by_timestamp: int | None = None


@dataclass(frozen=True)
class PlannedOffset:
    topic: str
    partition: int
    previous_offset: int | None
    new_offset: int


def plan_resets(
    spec: ResetSpec, inputs: Mapping[tuple[str, int], PartitionInputs]
) -> list[PlannedOffset]:
    """Each partition's new offset, clamped to [log start, high watermark], in order."""
    planned = []
    for (topic, partition), p in sorted(inputs.items()):
        if not 0 <= p.log_start_offset <= p.high_watermark:
            raise ResetError(
                f"{topic}-{partition} has log start {p.log_start_offset} "
                f"and high watermark {p.high_watermark}"
            )
        target: int
        if spec.kind is ResetKind.EARLIEST:
            target = p.log_start_offset
        elif spec.kind is ResetKind.LATEST:
            target = p.high_watermark
        elif spec.kind is ResetKind.OFFSET:
            target = spec.value
        elif spec.kind.by_timestamp:
            # No record that recent: the end, as Kafka's tool does.
            target = p.high_watermark if p.by_timestamp is None else p.by_timestamp
        elif spec.kind is ResetKind.SHIFT:
            if p.committed is None:
                raise ResetError(
                    f"--shift-by needs a committed offset, and {topic}-{partition} has none "
                    "(reset it with --to-earliest, --to-latest or --to-offset first)"
                )
            target = p.committed + spec.value
        else:  # CURRENT: where the group is; the end where it has not committed (as Kafka).
            target = p.high_watermark if p.committed is None else p.committed
        new_offset = min(max(target, p.log_start_offset), p.high_watermark)
        planned.append(PlannedOffset(topic, partition, p.committed, new_offset))
    return planned


def scope_partitions(
    topics: Sequence[tuple[str, tuple[int, ...] | None]],
    partition_counts: Mapping[str, int],
) -> list[tuple[str, int]]:
    """The (topic, partition) pairs --topic names: every partition of a bare topic, the listed
    ones otherwise. ResetError for an unknown topic or a partition it does not have."""
    wanted: set[tuple[str, int]] = set()
    for topic, partitions in topics:
        count = partition_counts.get(topic)
        if count is None:
            raise ResetError(f"unknown topic {topic!r}")
        if partitions is None:
            wanted.update((topic, p) for p in range(count))
            continue
        for p in partitions:
            if p >= count:
                raise ResetError(f"topic {topic!r} has no partition {p} (it has {count})")
            wanted.add((topic, p))
    return sorted(wanted)


__all__ = [
    "DateTimeType",
    "DurationType",
    "PartitionInputs",
    "PlannedOffset",
    "ResetError",
    "ResetKind",
    "ResetSpec",
    "TopicPartitionsType",
    "parse_datetime_ms",
    "parse_duration_ms",
    "parse_topic_partitions",
    "plan_resets",
    "scope_partitions",
]
