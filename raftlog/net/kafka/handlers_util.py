"""Small helpers shared by the handler modules."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from raftlog.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from raftlog.net.kafka.context import RequestContext

log = logging.getLogger("raftlog.kafka")

T = TypeVar("T")


def to_ms(value: datetime.timedelta | int | None, default_ms: int = 0) -> int:
    """kio models Kafka's *_ms int32 fields as timedeltas; handlers and the backend use ms."""
    if value is None:
        return default_ms
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    return int(value)


async def guarded(
    what: str,
    call: Callable[[], Awaitable[T]],
    on_error: Callable[[ErrorCode, str | None], T],
) -> T:
    """Run one backend call; turn KafkaError into its code and any other exception into
    UNKNOWN_SERVER_ERROR (logged with its traceback), so one failing partition or resource
    does not fail the whole request."""
    try:
        return await call()
    except KafkaError as exc:
        return on_error(exc.code, exc.message or None)
    except Exception:
        log.exception("backend call %s failed", what)
        return on_error(ErrorCode.unknown_server_error, None)


def leader_dict(leader: Any) -> dict[str, int]:
    if leader is None:
        return {"leader_id": -1, "leader_epoch": -1}
    return {"leader_id": leader.leader_id, "leader_epoch": leader.leader_epoch}


def partition_counts(ctx: RequestContext, names: Iterable[str]) -> dict[str, int]:
    """topic -> partition count for the named topics that exist, from the node's metadata
    image."""
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return {}
    return {t.name: len(t.partitions) for t in ctx.backend.topics(wanted)}
