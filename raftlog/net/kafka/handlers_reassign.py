"""Moving partitions and their leadership: AlterPartitionReassignments and
ListPartitionReassignments (KIP-455), ElectLeaders (KIP-460).

Authorization as Kafka's KafkaApis checks it: ALTER on the cluster for AlterPartitionReassignments
and ElectLeaders, DESCRIBE on the cluster for ListPartitionReassignments; a refusal is
CLUSTER_AUTHORIZATION_FAILED at the top level (and on every partition, where the response
has them).

Changes go to the active controller (metadata/controller/reassignments.py, elections.py) and
are answered once committed and visible in this broker's image; listings are served from this
broker's committed image. The backend seam (`ReassignmentBackend`) is what a node offers;
a backend that does not declare it but holds a controller client and the metadata service (the
node's BrokerBackend) is adapted to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import trio

from raftlog.errors import ErrorCode, KafkaError
from raftlog.metadata.controller import messages as cm
from raftlog.metadata.controller.reassignments import ongoing_reassignments
from raftlog.metadata.image import MetadataImage
from raftlog.net.kafka import authz
from raftlog.net.kafka.context import RequestContext
from raftlog.net.kafka.handlers_util import log, to_ms

__all__ = [
    "ReassignmentBackend",
    "handle_alter_partition_reassignments",
    "handle_elect_leaders",
    "handle_list_partition_reassignments",
]

# Bounds a request before anything reaches the controller (the internal codec refuses more).
MAX_PARTITIONS_PER_REQUEST = cm.MAX_PARTITIONS_PER_REQUEST
MIN_WAIT_MS = 1000


@runtime_checkable
class ReassignmentBackend(Protocol):
    """What these handlers need from a node."""

    @property
    def image(self) -> MetadataImage:
        """This broker's committed metadata image."""
        ...

    async def controller_call(self, request: Any, timeout_ms: int) -> Any:
        """The active controller's reply (KafkaError REQUEST_TIMED_OUT when none answers)."""
        ...

    async def wait_for_image(
        self, predicate: Callable[[MetadataImage], bool], timeout_ms: int
    ) -> None:
        """Return once predicate(image) holds or timeout_ms passed."""
        ...


class _NodeAdapter:
    """ReassignmentBackend over a backend holding `controller` (a ControllerClient) and
    `metadata` (the MetadataService), as the node's BrokerBackend does."""

    def __init__(self, controller: Any, metadata: Any, max_timeout_ms: int) -> None:
        self._controller = controller
        self._metadata = metadata
        self._max_timeout_ms = max_timeout_ms

    @property
    def image(self) -> MetadataImage:
        image: MetadataImage = self._metadata.image
        return image

    async def controller_call(self, request: Any, timeout_ms: int) -> Any:
        timeout_ms = max(MIN_WAIT_MS, min(timeout_ms or self._max_timeout_ms, self._max_timeout_ms))
        return await self._controller.call(request, timeout_ms=timeout_ms)

    async def wait_for_image(
        self, predicate: Callable[[MetadataImage], bool], timeout_ms: int
    ) -> None:
        with trio.move_on_after(max(timeout_ms, MIN_WAIT_MS) / 1000):
            while not predicate(self.image):
                await self._metadata.wait_for_change()


def controller_backend(ctx: RequestContext) -> ReassignmentBackend | None:
    backend: Any = ctx.backend
    if isinstance(backend, ReassignmentBackend):
        return backend
    controller = getattr(backend, "controller", None)
    metadata = getattr(backend, "metadata", None)
    if controller is None or metadata is None:
        return None
    return _NodeAdapter(controller, metadata, ctx.config.request_timeout_ms)


_NO_BACKEND = "this node does not move partitions"


# ------------------------------------------------------------------ AlterPartitionReassignments
def _alter_response(
    topics: Sequence[tuple[str, Sequence[tuple[int, ErrorCode, str | None]]]],
    error: ErrorCode = ErrorCode.none,
    message: str | None = None,
) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "error_code": error,
        "error_message": message,
        "allow_replication_factor_change": True,
        "responses": [
            {
                "name": name,
                "partitions": [
                    {"partition_index": index, "error_code": code, "error_message": text}
                    for index, code, text in partitions
                ],
            }
            for name, partitions in topics
        ],
    }


def _landed(image: MetadataImage, item: cm.PartitionReassignment) -> bool:
    """The image shows the change `item` asked for (started, completed or cancelled)."""
    topic = image.topic(item.topic)
    state = None if topic is None else topic.partitions.get(item.partition)
    if state is None:
        return True  # deleted meanwhile: nothing more to wait for
    if item.replicas is None:
        return not state.reassigning
    return state.target_replicas == tuple(item.replicas)


async def handle_alter_partition_reassignments(ctx: RequestContext, request: Any) -> dict[str, Any]:
    """ALTER on the cluster; one result per partition named, in the request's order."""
    items = [
        cm.PartitionReassignment(
            t.name,
            p.partition_index,
            None if p.replicas is None else tuple(int(b) for b in p.replicas),
        )
        for t in request.topics
        for p in t.partitions
    ]

    def every(code: ErrorCode, message: str | None) -> dict[str, Any]:
        named = [
            (t.name, [(p.partition_index, code, message) for p in t.partitions])
            for t in request.topics
        ]
        return _alter_response(named, code, message)

    refusal = authz.cluster_refusal(ctx, authz.ALTER_CLUSTER)
    if refusal is not None:
        return every(refusal, authz.AUTHORIZATION_FAILED_MESSAGE)
    if len(items) > MAX_PARTITIONS_PER_REQUEST:
        return every(
            ErrorCode.invalid_request,
            f"{len(items)} partitions in one request; at most {MAX_PARTITIONS_PER_REQUEST}",
        )
    backend = controller_backend(ctx)
    if backend is None:
        return every(ErrorCode.unknown_server_error, _NO_BACKEND)
    timeout_ms = to_ms(request.timeout, ctx.config.request_timeout_ms)
    allow_rf_change = bool(getattr(request, "allow_replication_factor_change", True))
    try:
        reply: cm.AlterPartitionReassignmentsReply = await backend.controller_call(
            cm.AlterPartitionReassignments(tuple(items), allow_rf_change), timeout_ms
        )
    except KafkaError as exc:
        return every(exc.code, exc.message or None)
    except Exception:
        log.exception("alter_partition_reassignments failed")
        return every(ErrorCode.unknown_server_error, None)
    accepted = [
        item
        for item, result in zip(items, reply.results, strict=False)
        if result.error_code == ErrorCode.none
    ]
    if accepted:
        await backend.wait_for_image(
            lambda image: all(_landed(image, item) for item in accepted), timeout_ms
        )
    by_topic: dict[str, list[tuple[int, ErrorCode, str | None]]] = {}
    for result in reply.results:
        by_topic.setdefault(result.topic, []).append(
            (result.partition, result.error_code, result.error_message)
        )
    return _alter_response(list(by_topic.items()), reply.error_code, reply.error_message)


# ------------------------------------------------------------------ ListPartitionReassignments
async def handle_list_partition_reassignments(ctx: RequestContext, request: Any) -> dict[str, Any]:
    """DESCRIBE on the cluster; every reassignment in progress (topics None) or those of the
    named partitions, from this broker's committed image."""
    refusal = authz.cluster_refusal(ctx, authz.DESCRIBE_CLUSTER)
    backend = controller_backend(ctx)
    if refusal is not None or backend is None:
        return {
            "throttle_time": 0,
            "error_code": refusal or ErrorCode.unknown_server_error,
            "error_message": authz.AUTHORIZATION_FAILED_MESSAGE if refusal else _NO_BACKEND,
            "topics": [],
        }
    wanted: dict[str, tuple[int, ...] | None] | None = None
    if request.topics is not None:
        wanted = {}
        for t in request.topics:
            # A topic named with no partitions lists none of them (Kafka's reading).
            wanted[t.name] = tuple(t.partition_indexes) or (-1,)
    topics: dict[str, list[dict[str, Any]]] = {}
    for name, index, state in ongoing_reassignments(backend.image, wanted):
        topics.setdefault(name, []).append(
            {
                "partition_index": index,
                "replicas": list(state.replicas),
                "adding_replicas": list(state.adding_replicas),
                "removing_replicas": list(state.removing_replicas),
            }
        )
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "error_message": None,
        "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()],
    }


# ------------------------------------------------------------------ ElectLeaders
def _elect_response(
    results: Sequence[tuple[str, int, ErrorCode, str | None]], error: ErrorCode = ErrorCode.none
) -> dict[str, Any]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for topic, index, code, message in results:
        by_topic.setdefault(topic, []).append(
            {"partition_id": index, "error_code": code, "error_message": message}
        )
    return {
        "throttle_time": 0,
        "error_code": error,
        "replica_election_results": [
            {"topic": topic, "partition_result": parts} for topic, parts in by_topic.items()
        ],
    }


async def handle_elect_leaders(ctx: RequestContext, request: Any) -> dict[str, Any]:
    """ALTER on the cluster. v0 has no election type: it is a preferred election."""
    election_type = int(getattr(request, "election_type", cm.ELECTION_PREFERRED))
    named: tuple[tuple[str, int], ...] | None = None
    if request.topic_partitions is not None:
        named = tuple((t.topic, int(p)) for t in request.topic_partitions for p in t.partitions)

    def every(code: ErrorCode, message: str | None) -> dict[str, Any]:
        return _elect_response([(t, p, code, message) for t, p in named or ()], code)

    refusal = authz.cluster_refusal(ctx, authz.ALTER_CLUSTER)
    if refusal is not None:
        return every(refusal, authz.AUTHORIZATION_FAILED_MESSAGE)
    if election_type not in (cm.ELECTION_PREFERRED, cm.ELECTION_UNCLEAN):
        return every(ErrorCode.invalid_request, f"unknown election type {election_type}")
    if named is not None and len(named) > MAX_PARTITIONS_PER_REQUEST:
        return every(
            ErrorCode.invalid_request,
            f"{len(named)} partitions in one request; at most {MAX_PARTITIONS_PER_REQUEST}",
        )
    backend = controller_backend(ctx)
    if backend is None:
        return every(ErrorCode.unknown_server_error, _NO_BACKEND)
    timeout_ms = to_ms(request.timeout, ctx.config.request_timeout_ms)
    before = backend.image
    try:
        reply: cm.ElectLeadersReply = await backend.controller_call(
            cm.ElectLeaders(election_type, named), timeout_ms
        )
    except KafkaError as exc:
        return every(exc.code, exc.message or None)
    except Exception:
        log.exception("elect_leaders failed")
        return every(ErrorCode.unknown_server_error, None)
    elected = [
        (res.topic, res.partition) for res in reply.results if res.error_code == ErrorCode.none
    ]

    def leader_epoch(image: MetadataImage, topic: str, index: int) -> int:
        info = image.topic(topic)
        state = None if info is None else info.partitions.get(index)
        return -1 if state is None else state.leader_epoch

    if elected:
        # The election committed; wait until this broker's image shows the new leaders.
        await backend.wait_for_image(
            lambda image: all(
                leader_epoch(image, t, p) > leader_epoch(before, t, p) or image.topic(t) is None
                for t, p in elected
            ),
            timeout_ms,
        )
    return _elect_response(
        [(res.topic, res.partition, res.error_code, res.error_message) for res in reply.results],
        reply.error_code,
    )
