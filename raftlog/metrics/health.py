"""The numbers operators alert on, computed from state the node already keeps.

One computation: the Prometheus collector (collectors.py) and status views read these
functions, so a dashboard and `raftlog cluster status` cannot disagree. Nothing here is
counted on a hot path; each call walks the hosted replicas or the metadata image once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from raftlog.constants import NO_LEADER
from raftlog.metadata.image import MetadataImage
from raftlog.metadata.raft.driver import QuorumDriver
from raftlog.replication.hosted import HostedPartition
from raftlog.replication.replicas import Replicas


@dataclass(frozen=True)
class ReplicaHealth:
    """kafka.server:type=ReplicaManager gauges of one broker."""

    partition_count: int = 0  # replicas hosted here
    leader_count: int = 0  # of which this broker leads
    # Led here with an ISR smaller than the replica set (Kafka's UnderReplicatedPartitions).
    under_replicated_partitions: int = 0
    # Led here with an ISR below min.insync.replicas: acks=all produces are refused.
    under_min_isr_partition_count: int = 0
    # Led here with an ISR exactly at min.insync.replicas: one more loss refuses acks=all.
    at_min_isr_partition_count: int = 0
    # Hosted here, compaction stopped on a batch it could not read (Kafka's LogCleanerManager
    # uncleanable-partitions-count).
    uncleanable_partitions_count: int = 0


def replica_health(
    partitions: Iterable[HostedPartition], min_insync_replicas: Callable[[str], int]
) -> ReplicaHealth:
    """Counts over the hosted replicas, judged as Kafka's Partition does: by the leader's
    ISR (which includes AlterPartition answers the metadata has not carried yet)."""
    hosted_count = leaders = under_replicated = under_min = at_min = uncleanable = 0
    min_isr_by_topic: dict[str, int] = {}
    for hosted in partitions:
        hosted_count += 1
        if hosted.log.uncleanable_reason is not None:
            uncleanable += 1
        leader = hosted.replica.leader
        if leader is None:
            continue
        leaders += 1
        isr_size = len(leader.isr)
        if isr_size < len(leader.state.replicas):
            under_replicated += 1
        min_isr = min_isr_by_topic.get(hosted.topic)
        if min_isr is None:
            min_isr = min_isr_by_topic[hosted.topic] = min_insync_replicas(hosted.topic)
        if isr_size < min_isr:
            under_min += 1
        elif isr_size == min_isr:
            at_min += 1
    return ReplicaHealth(hosted_count, leaders, under_replicated, under_min, at_min, uncleanable)


@dataclass(frozen=True)
class ControllerHealth:
    """kafka.controller:type=KafkaController gauges, as one node reports them: only the
    active controller reports the cluster-wide counts (Kafka's rule), others report 0, so
    sum() over nodes gives the cluster's figure."""

    active_controller_count: int = 0
    offline_partitions_count: int = 0
    global_topic_count: int = 0
    global_partition_count: int = 0
    fenced_broker_count: int = 0
    active_broker_count: int = 0


def controller_health(image: MetadataImage, *, active: bool) -> ControllerHealth:
    if not active:
        return ControllerHealth()
    offline = partitions = 0
    for _topic, _index, state in image.iter_partitions():
        partitions += 1
        if state.leader == NO_LEADER:
            offline += 1
    fenced = sum(1 for registration in image.brokers.values() if registration.fenced)
    return ControllerHealth(
        active_controller_count=1,
        offline_partitions_count=offline,
        global_topic_count=len(image.topics_by_id),
        global_partition_count=partitions,
        fenced_broker_count=fenced,
        active_broker_count=len(image.brokers) - fenced,
    )


@dataclass(frozen=True)
class QuorumHealth:
    """kafka.server:type=raft-metrics gauges of this node's view of the metadata quorum."""

    current_epoch: int
    current_leader: int  # -1: no leader known
    high_watermark: int
    log_end_offset: int
    role: str


@dataclass(frozen=True)
class NodeHealth:
    """Everything above for one node; `as_dict()` is what a status view shows."""

    node_id: int
    replicas: ReplicaHealth
    controller: ControllerHealth
    quorum: QuorumHealth
    produce_purgatory_size: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def quorum_health(quorum: QuorumDriver) -> QuorumHealth:
    core = quorum.core
    leader = core.leader_id
    return QuorumHealth(
        current_epoch=core.epoch,
        current_leader=-1 if leader is None else leader,
        high_watermark=core.high_watermark,
        log_end_offset=core.log_end,
        role=core.role.name,
    )


def node_health(
    node_id: int,
    quorum: QuorumDriver,
    image: MetadataImage,
    replicas: Replicas | None,
    *,
    is_controller: bool,
) -> NodeHealth:
    """This node's figures; `replicas` is None on a node without the broker role."""
    quorum_view = quorum_health(quorum)
    active = is_controller and quorum_view.role == "leader"
    return NodeHealth(
        node_id=node_id,
        replicas=(
            ReplicaHealth()
            if replicas is None
            else replica_health(replicas.partitions.values(), replicas.min_insync_replicas)
        ),
        controller=controller_health(image, active=active),
        quorum=quorum_view,
        produce_purgatory_size=0 if replicas is None else len(replicas.purgatory),
    )


@dataclass(frozen=True)
class GroupLag:
    """One committed offset of a group this node coordinates, against the partition's HW."""

    group: str
    topic: str
    partition: int
    committed_offset: int
    high_watermark: int

    @property
    def lag(self) -> int:
        return max(0, self.high_watermark - self.committed_offset)


def group_lag(
    committed: Mapping[tuple[str, str, int], int],
    high_watermark_of: Callable[[str, int], int | None],
    *,
    max_rows: int,
) -> list[GroupLag]:
    """Lag of every (group, topic, partition) committed here whose HW this node knows (it
    hosts a replica: a follower's HW trails the leader's by at most one fetch, so its lag
    may read a little low), largest first, at most `max_rows` of them."""
    rows = []
    for (group, topic, partition), offset in committed.items():
        high_watermark = high_watermark_of(topic, partition)
        if high_watermark is not None and offset >= 0:
            rows.append(GroupLag(group, topic, partition, offset, high_watermark))
    rows.sort(key=lambda row: (-row.lag, row.group, row.topic, row.partition))
    return rows[:max_rows]
