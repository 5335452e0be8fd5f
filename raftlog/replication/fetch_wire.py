"""The replica.fetch RPC body: one request per follower broker, all its partitions of a leader.

Bodies are plain msgpack values (dicts, lists, ints, bytes), decoded and checked here so a
malformed request from a peer becomes a ValueError (the RPC layer answers with an error) and
never a half-applied fetch. Records travel as the leader's on-disk RecordBatch v2 bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from raftlog.errors import ErrorCode
from raftlog.replication.core.types import DivergingEpoch

REPLICA_FETCH_METHOD = "replica.fetch"
# A follower hosts at most this many partitions of one leader in a single fetch; more is a
# malformed (or hostile) request, refused before any work is done.
MAX_PARTITIONS_PER_REPLICA_FETCH = 100_000


@dataclass(frozen=True)
class ReplicaFetchPartition:
    topic: str
    partition: int
    fetch_offset: int
    last_fetched_epoch: int
    leader_epoch: int
    # The HW the follower knows (-1: unknown). A leader whose HW is ahead answers at once
    # instead of parking, so followers learn HW advances without waiting for new data.
    high_watermark: int = -1


@dataclass(frozen=True)
class ReplicaFetchRequest:
    replica_id: int
    max_wait_ms: int
    min_bytes: int
    partitions: tuple[ReplicaFetchPartition, ...]


@dataclass(frozen=True)
class ReplicaFetchAnswer:
    topic: str
    partition: int
    error: ErrorCode
    high_watermark: int
    log_start_offset: int
    diverging_epoch: DivergingEpoch | None = None
    records: bytes = b""


def encode_request(request: ReplicaFetchRequest) -> dict[str, Any]:
    return {
        "replica_id": request.replica_id,
        "max_wait_ms": request.max_wait_ms,
        "min_bytes": request.min_bytes,
        "partitions": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "fetch_offset": p.fetch_offset,
                "last_fetched_epoch": p.last_fetched_epoch,
                "leader_epoch": p.leader_epoch,
                "high_watermark": p.high_watermark,
            }
            for p in request.partitions
        ],
    }


def _int(body: dict[str, Any], key: str) -> int:
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"replica fetch: {key!r} must be an integer, got {value!r}")
    return value


def _str(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise ValueError(f"replica fetch: {key!r} must be a string, got {value!r}")
    return value


def _list(body: dict[str, Any], key: str) -> list[Any]:
    value = body.get(key)
    if not isinstance(value, list):
        raise ValueError(f"replica fetch: {key!r} must be a list")
    if len(value) > MAX_PARTITIONS_PER_REPLICA_FETCH:
        raise ValueError(
            f"replica fetch names {len(value)} partitions, above "
            f"MAX_PARTITIONS_PER_REPLICA_FETCH {MAX_PARTITIONS_PER_REPLICA_FETCH}"
        )
    return value


def decode_request(body: Any) -> ReplicaFetchRequest:
    if not isinstance(body, dict):
        raise ValueError("replica fetch: body is not a map")
    partitions = []
    for item in _list(body, "partitions"):
        if not isinstance(item, dict):
            raise ValueError("replica fetch: a partition entry is not a map")
        partitions.append(
            ReplicaFetchPartition(
                _str(item, "topic"),
                _int(item, "partition"),
                _int(item, "fetch_offset"),
                _int(item, "last_fetched_epoch"),
                _int(item, "leader_epoch"),
                _int(item, "high_watermark") if "high_watermark" in item else -1,
            )
        )
    return ReplicaFetchRequest(
        _int(body, "replica_id"),
        _int(body, "max_wait_ms"),
        _int(body, "min_bytes"),
        tuple(partitions),
    )


def encode_response(answers: Sequence[ReplicaFetchAnswer]) -> dict[str, Any]:
    return {
        "partitions": [
            {
                "topic": a.topic,
                "partition": a.partition,
                "error": int(a.error),
                "high_watermark": a.high_watermark,
                "log_start_offset": a.log_start_offset,
                "diverging_epoch": None
                if a.diverging_epoch is None
                else [a.diverging_epoch.epoch, a.diverging_epoch.end_offset],
                "records": a.records,
            }
            for a in answers
        ]
    }


def decode_response(body: Any) -> list[ReplicaFetchAnswer]:
    if not isinstance(body, dict):
        raise ValueError("replica fetch response: body is not a map")
    answers = []
    for item in _list(body, "partitions"):
        if not isinstance(item, dict):
            raise ValueError("replica fetch response: a partition entry is not a map")
        diverging = item.get("diverging_epoch")
        if diverging is not None:
            if not (
                isinstance(diverging, list)
                and len(diverging) == 2
                and all(isinstance(v, int) for v in diverging)
            ):
                raise ValueError(f"replica fetch response: bad diverging_epoch {diverging!r}")
            diverging = DivergingEpoch(diverging[0], diverging[1])
        records = item.get("records", b"")
        if not isinstance(records, bytes):
            raise ValueError("replica fetch response: records must be bytes")
        try:
            error = ErrorCode(_int(item, "error"))
        except ValueError:
            error = ErrorCode.unknown_server_error
        answers.append(
            ReplicaFetchAnswer(
                _str(item, "topic"),
                _int(item, "partition"),
                error,
                _int(item, "high_watermark"),
                _int(item, "log_start_offset"),
                diverging,
                records,
            )
        )
    return answers
