"""OffsetDelete (API 47, KIP-496): delete a group's committed offsets of some partitions.

Kafka's checks, in its order: DELETE on the group (else the whole answer is
GROUP_AUTHORIZATION_FAILED), then READ on each topic (else its partitions are
TOPIC_AUTHORIZATION_FAILED: a refused topic is not told whether it exists), then the topic
must exist (UNKNOWN_TOPIC_OR_PARTITION). What is left goes to the group coordinator
(raftlog.groups.offset_delete), which decides per group and per partition and answers once
the offsets' tombstones are replicated in `__consumer_offsets`.
"""

from __future__ import annotations

import logging
from typing import Any

from raftlog.errors import ErrorCode
from raftlog.groups import messages as m
from raftlog.groups.service import GroupService
from raftlog.net.kafka import authz
from raftlog.net.kafka.context import RequestContext
from raftlog.net.kafka.handlers_util import partition_counts

_refusals = logging.getLogger("raftlog.kafka.refused")

# Bounds on one request (Kafka has none; a client names one group's handful of partitions).
MAX_PARTITIONS_PER_REQUEST = 10_000
MAX_GROUP_ID_CHARS = 2**15 - 1


class OffsetDeleteHandler:
    """The OffsetDelete handler, bound to one GroupService."""

    def __init__(self, service: GroupService) -> None:
        self.service = service

    async def offset_delete(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        group_id = request.group_id
        topics = list(request.topics)
        count = sum(len(t.partitions) for t in topics)
        if count > MAX_PARTITIONS_PER_REQUEST:
            _refusals.warning(
                "refused OffsetDelete from client %r (%s): %d partitions, the limit is %d",
                ctx.client_id,
                ctx.connection.peer,
                count,
                MAX_PARTITIONS_PER_REQUEST,
            )
            return _response(ErrorCode.invalid_request, {})
        if not group_id or len(group_id) > MAX_GROUP_ID_CHARS:
            return _response(ErrorCode.invalid_group_id, {})
        if not authz.allows(ctx, authz.DELETE_GROUP, group_id):
            return _response(authz.DELETE_GROUP.error, {})
        readable = authz.allowed_names(ctx, authz.READ_TOPIC, (t.name for t in topics))
        counts = partition_counts(ctx, readable)
        # Every requested partition, in request order (a repeated one answered once).
        errors: dict[tuple[str, int], ErrorCode] = {}
        wanted: dict[str, list[int]] = {}
        for topic in topics:
            for p in topic.partitions:
                key = (topic.name, int(p.partition_index))
                if key in errors:
                    continue
                if topic.name not in readable:
                    errors[key] = authz.READ_TOPIC.error
                elif not 0 <= key[1] < counts.get(topic.name, 0):
                    errors[key] = ErrorCode.unknown_topic_or_partition
                else:
                    errors[key] = ErrorCode.none
                    wanted.setdefault(topic.name, []).append(key[1])
        # The coordinator is asked even with nothing left to delete, as Kafka does: an
        # unknown group is reported all the same.
        req = m.OffsetDeleteRequest(
            group_id, tuple(m.OffsetFetchTopic(t, tuple(ps)) for t, ps in wanted.items())
        )
        resp = await self.service.shell.offset_delete(req)
        if resp.error_code is not ErrorCode.none:
            # The group's error; the partitions refused before the coordinator keep theirs.
            refused: dict[tuple[str, int], ErrorCode] = {
                k: v for k, v in errors.items() if v is not ErrorCode.none
            }
            return _response(resp.error_code, refused)
        for topic_errors in resp.topics:
            for pe in topic_errors.partitions:
                errors[(topic_errors.name, pe.partition)] = pe.error_code
        return _response(ErrorCode.none, errors)


def _response(code: ErrorCode, errors: dict[tuple[str, int], ErrorCode]) -> dict[str, Any]:
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), partition_code in errors.items():
        topics.setdefault(topic, []).append(
            {"partition_index": partition, "error_code": partition_code}
        )
    return {
        "error_code": code,
        "throttle_time": 0,
        "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
    }
