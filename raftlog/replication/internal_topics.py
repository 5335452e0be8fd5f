"""What the coordinators living where an internal topic's partitions lead share
(`__consumer_offsets` for groups, `__transaction_state` for transactions): creating the topic
on first use, naming the broker that leads a key's partition, and reading a partition back
when this node becomes its leader.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import trio

from raftlog.constants import NO_LEADER
from raftlog.errors import ErrorCode, KafkaError
from raftlog.groups.service import CoordinatorLocation
from raftlog.metadata.controller import messages as cm
from raftlog.metadata.image import MetadataImage
from raftlog.records import BatchHeader, iter_batches
from raftlog.replication.hosted import HostedPartition

log = logging.getLogger("raftlog.replication")

T = TypeVar("T")
# Bytes read per step (on the event loop) when a new coordinator replays its partition:
# small enough that one step stays a few milliseconds of loop time.
LOAD_READ_BYTES = 256 * 1024

ControllerCall = Callable[[cm.CreateTopics], Awaitable[Any]]


async def create_internal_topic(
    call: ControllerCall,
    image: MetadataImage,
    name: str,
    num_partitions: int,
    replication_factor: int,
    min_insync_replicas: int | None = None,
) -> None:
    """Ask the controller for the compacted internal topic `name`; the replication factor
    (and min.insync.replicas with it) is capped by the live brokers. A failure is a log line:
    the next FindCoordinator asks again."""
    try:
        live = len(image.unfenced_brokers())
        factor = max(1, min(replication_factor, live))
        configs = {"cleanup.policy": "compact"}
        if min_insync_replicas is not None:
            configs["min.insync.replicas"] = str(min(min_insync_replicas, factor))
        request = cm.CreateTopics((cm.NewTopic(name, num_partitions, factor, configs=configs),))
        reply = await call(request)
        result = reply.results[0]
        if result.error_code not in (ErrorCode.none, ErrorCode.topic_already_exists):
            log.warning(
                "cannot create %s: %s %s", name, result.error_code.name, result.error_message
            )
    except KafkaError as exc:
        log.warning("cannot create %s: %s", name, exc)


def coordinator_location(
    image: MetadataImage, topic_name: str, partition_of: Callable[[int], int]
) -> CoordinatorLocation | None:
    """The broker leading partition partition_of(partition count) of `topic_name`, as
    FindCoordinator answers it; None when the topic does not exist (the caller creates it),
    COORDINATOR_NOT_AVAILABLE while the partition has no live leader."""
    topic = image.topic(topic_name)
    if topic is None:
        return None
    state = topic.partitions.get(partition_of(len(topic.partitions)))
    if state is None or state.leader == NO_LEADER:
        return CoordinatorLocation(ErrorCode.coordinator_not_available)
    broker = image.brokers.get(state.leader)
    if broker is None or broker.fenced:
        return CoordinatorLocation(ErrorCode.coordinator_not_available)
    host, port = broker.client_endpoint
    return CoordinatorLocation(ErrorCode.none, state.leader, host, port)


async def wait_committed(hosted: HostedPartition | None) -> None:
    """Return once this leader's high watermark covers its log end as of the call.

    A record past the HW may still be cut away: if this leader fails before its followers
    have it, a replica without it leads next. A coordinator that replayed such a record and
    acted on it (writing the markers of a PrepareAbort, say) would have decided what the next
    coordinator never learns. Raises NOT_LEADER_OR_FOLLOWER once the replica stops leading."""
    if hosted is None:
        return
    end_offset = hosted.log.log_end_offset
    while True:
        leader = hosted.replica.leader
        if leader is None:
            raise KafkaError(ErrorCode.not_leader_or_follower, f"{hosted.key} lost its leadership")
        if leader.high_watermark >= end_offset:
            return
        # Woken when the HW advances and when the role changes (Replicas.handle_effects,
        # role_changed, unhost).
        wakeup = trio.Event()
        hosted.waiters.add(wakeup)
        try:
            await wakeup.wait()
        finally:
            hosted.waiters.discard(wakeup)


async def read_partition(
    hosted: HostedPartition | None, entries: Callable[[bytes, int, BatchHeader], Iterable[T]]
) -> list[T]:
    """entries(data, pos, header) of every batch of the partition, in log order.

    Read on the event loop, one bounded chunk at a time with a checkpoint between chunks:
    the log's segment list and files change under appends, retention and compaction, all of
    which run on the event loop, so a read there never sees a segment closed halfway through,
    as a read in a worker thread could. A follower truncation cuts the log in a worker
    thread; each chunk waits until no cut is under way.
    """
    if hosted is None:
        return []
    partition_log = hosted.log
    out: list[T] = []
    await hosted.wait_for_log_cut()
    offset = partition_log.log_start_offset
    end = partition_log.log_end_offset
    while offset < end:
        await hosted.wait_for_log_cut()
        data = partition_log.read(offset, LOAD_READ_BYTES, max_offset=end).read_bytes()
        if not data:
            break
        for pos, header in iter_batches(data):
            out.extend(entries(data, pos, header))
            offset = header.next_offset
        await trio.lowlevel.checkpoint()
    return out
