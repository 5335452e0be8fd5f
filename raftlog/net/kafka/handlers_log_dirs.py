"""DescribeLogDirs (API key 35): this broker's log directory and the partition logs in it.

A raftlog broker keeps every partition log in one directory (`<data_dir>/logs`), so the answer
holds one result: its absolute path, the volume's total and usable bytes (os.statvfs; v4+),
and per partition log the bytes of its segments and its offset lag. The lag is Kafka's
"how far this log's end is behind the partition's high watermark": 0 on the leader; on a
follower the leader's high watermark from its last fetch answer minus this log's end (0 when
no answer came yet). `is_future_key` is always false: raftlog has no second directory to move
a replica to (AlterReplicaLogDirs).

Authorization as Kafka's KafkaApis: DESCRIBE on the cluster. Refused, v3+ answers
CLUSTER_AUTHORIZATION_FAILED at the top level; v1-2 have no such field and answer no
directories, as Kafka does.

A null `topics` asks for every partition log; a topic named with no partitions asks for none
of its partitions (Kafka's reading). Partitions this broker does not host are left out.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import trio
from kio.schema.index import api_key_map

from raftlog.errors import ErrorCode
from raftlog.net.kafka import authz
from raftlog.net.kafka.context import Handler, RequestContext
from raftlog.net.kafka.handlers_util import log

__all__ = [
    "DESCRIBE_LOG_DIRS_KEY",
    "LOG_DIR_APIS",
    "LogDirsBackend",
    "PartitionLogInfo",
    "describe_partition_logs",
    "handle_describe_log_dirs",
]

# From kio's table of the protocol (not apis.ApiKey: apis imports the handler modules).
DESCRIBE_LOG_DIRS_KEY = next(k for k, name in api_key_map.items() if name == "describe_log_dirs")
# A request naming more partitions than this is refused whole (INVALID_REQUEST, v3+); the
# frame limit bounds it already, this bounds the set built from it.
MAX_NAMED_PARTITIONS = 1_000_000


@dataclass(frozen=True, slots=True)
class PartitionLogInfo:
    topic: str
    partition: int
    size_bytes: int
    offset_lag: int


@runtime_checkable
class LogDirsBackend(Protocol):
    """What the handler needs from a node."""

    def log_dir(self) -> str:
        """The directory holding the partition logs (absolute)."""
        ...

    def partition_logs(self) -> Sequence[PartitionLogInfo]:
        """Every partition log in it."""
        ...


def describe_partition_logs(logs: Any, partitions: Any) -> list[PartitionLogInfo]:
    """PartitionLogInfo of each log in `logs` ((topic, partition) -> PartitionLog, as
    LogManager.all_logs gives them), its lag from the hosted replica in `partitions`
    ((topic, partition) -> HostedPartition) when there is one."""
    out = []
    for key, plog in sorted(logs.items()):
        topic, partition = key
        hosted = partitions.get(key)
        lag = 0
        follower = None if hosted is None else hosted.replica.follower
        if follower is not None:
            lag = max(0, follower.leader_high_watermark - plog.log_end_offset)
        out.append(PartitionLogInfo(topic, partition, plog.size_bytes, lag))
    return out


class _ReplicaManagerAdapter:
    """LogDirsBackend over a ReplicaManager (its LogManager and hosted replicas)."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager

    def log_dir(self) -> str:
        return os.path.abspath(self._manager.log_manager.data_dir)

    def partition_logs(self) -> Sequence[PartitionLogInfo]:
        return describe_partition_logs(
            self._manager.log_manager.all_logs(), self._manager.replicas.partitions
        )


def _backend(ctx: RequestContext) -> LogDirsBackend | None:
    backend: Any = ctx.backend
    if isinstance(backend, LogDirsBackend):
        return backend
    # The node's BrokerBackend holds the ReplicaManager under this name.
    manager = getattr(backend, "replica_manager", None) or getattr(
        backend, "_replica_manager", None
    )
    if manager is None or not hasattr(manager, "log_manager"):
        return None
    return _ReplicaManagerAdapter(manager)


def _response(
    error: ErrorCode, results: Iterable[dict[str, Any]] = (), throttle_ms: int = 0
) -> dict[str, Any]:
    return {"throttle_time": throttle_ms, "error_code": error, "results": list(results)}


def _wanted(request: Any) -> set[tuple[str, int]] | None:
    if request.topics is None:
        return None
    wanted: set[tuple[str, int]] = set()
    for topic in request.topics:
        wanted.update((topic.topic, int(p)) for p in topic.partitions)
        if len(wanted) > MAX_NAMED_PARTITIONS:
            raise ValueError(f"more than {MAX_NAMED_PARTITIONS} partitions named")
    return wanted


def _volume_bytes(path: str) -> tuple[int, int]:
    """(total, usable) bytes of the volume holding `path` (blocking)."""
    stats = os.statvfs(path)
    return stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize


async def handle_describe_log_dirs(ctx: RequestContext, request: Any) -> dict[str, Any]:
    """DESCRIBE on the cluster; this broker's one log directory and its partition logs."""
    refusal = authz.cluster_refusal(ctx, authz.DESCRIBE_CLUSTER)
    if refusal is not None:
        return _response(refusal)
    try:
        wanted = _wanted(request)
    except ValueError:
        return _response(ErrorCode.invalid_request)
    backend = _backend(ctx)
    if backend is None:
        return _response(ErrorCode.none)  # not a broker: no log directories
    path = backend.log_dir()
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for info in backend.partition_logs():
        if wanted is not None and (info.topic, info.partition) not in wanted:
            continue
        by_topic.setdefault(info.topic, []).append(
            {
                "partition_index": info.partition,
                "partition_size": info.size_bytes,
                "offset_lag": info.offset_lag,
                "is_future_key": False,
            }
        )
    try:
        total_bytes, usable_bytes = await trio.to_thread.run_sync(_volume_bytes, path)
    except OSError as exc:
        # Kafka answers an unusable directory with KAFKA_STORAGE_ERROR and no topics.
        log.warning("describe_log_dirs: cannot stat %s: %s", path, exc)
        result = {"error_code": ErrorCode.kafka_storage_error, "log_dir": path, "topics": []}
        return _response(ErrorCode.none, [result])
    result = {
        "error_code": ErrorCode.none,
        "log_dir": path,
        "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()],
        "total_bytes": total_bytes,
        "usable_bytes": usable_bytes,
    }
    return _response(ErrorCode.none, [result])


# DescribeLogDirs v1-4: kio models no v0; v3 is the flexible form with a top-level error code
# (KIP-784), v4 adds the volume's total and usable bytes (KIP-827); v5 (KIP-1066's cordoned
# directories) is left out.
LOG_DIR_APIS: dict[int, tuple[int, int, Handler]] = {
    DESCRIBE_LOG_DIRS_KEY: (1, 4, handle_describe_log_dirs),
}
