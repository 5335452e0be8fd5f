"""Upkeep of hosted replicas: status views and retention/compaction through the cleaner."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from raftlog.constants import NO_LEADER
from raftlog.replication.hosted import HostedPartition
from raftlog.storage.cleaner import clean_log
from raftlog.storage.retention import retention_target

log = logging.getLogger("raftlog.replication")


@dataclass(frozen=True)
class PartitionStatus:
    """One hosted replica, for `topics describe` and status pages."""

    topic: str
    partition: int
    role: str  # "leader", "follower" or "none" (offline / not assigned a role yet)
    leader_id: int
    leader_epoch: int
    partition_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    # The LSO this replica computes from what it holds (-1 while its producer state loads).
    last_stable_offset: int = -1


def partition_status(hosted: HostedPartition) -> PartitionStatus:
    replica = hosted.replica
    state = replica.state
    leader = replica.leader
    role = "leader" if leader else "follower" if replica.follower else "none"
    # The leader applies AlterPartition answers before the metadata carrying them arrives:
    # its ISR and partition epoch are the newest this broker knows.
    isr = leader.isr if leader is not None else (state.isr if state else frozenset())
    partition_epoch = leader.partition_epoch if leader else (state.partition_epoch if state else -1)
    return PartitionStatus(
        topic=hosted.topic,
        partition=hosted.partition,
        role=role,
        leader_id=state.leader_id if state else NO_LEADER,
        leader_epoch=state.leader_epoch if state else -1,
        partition_epoch=partition_epoch,
        replicas=state.replicas if state else (),
        isr=tuple(sorted(isr)),
        high_watermark=replica.high_watermark,
        log_start_offset=hosted.log.log_start_offset,
        log_end_offset=hosted.log.log_end_offset,
        last_stable_offset=_last_stable_offset(hosted),
    )


def _last_stable_offset(hosted: HostedPartition) -> int:
    lso = hosted.producers.last_stable_offset(hosted.replica.high_watermark)
    return -1 if lso is None else lso


async def clean_partitions(partitions: list[HostedPartition], clock_ms: Callable[[], int]) -> None:
    """Retention never past a replica's HW and compaction never past its LSO: data a consumer
    may not have seen yet or a follower may still need to diverge from stays, and no
    undecided transaction is compacted. Retention does not wait for the LSO (Kafka's rule):
    a transaction that never ends must not keep the disk from being freed; the LSO then
    stays at the log start (idempotence.py)."""
    for hosted in partitions:
        partition_log = hosted.log
        if partition_log.closed or not hosted.producers.loaded:
            continue  # a loading producer state reads this log in a worker thread
        now_ms = clock_ms()
        high_watermark = hosted.replica.high_watermark
        target = min(retention_target(partition_log, now_ms), high_watermark)
        if target > partition_log.log_start_offset:
            deleted = partition_log.advance_log_start(target)
            log.info("%s: retention deleted %d segment(s)", partition_log.directory.name, deleted)
        stable = hosted.producers.last_stable_offset(high_watermark)
        if partition_log.config.compact and stable is not None:
            async with hosted.disk_lock:
                if not partition_log.closed:  # removed while we waited for the lock
                    await clean_log(partition_log, clean_below_offset=stable, now_ms=now_ms)
