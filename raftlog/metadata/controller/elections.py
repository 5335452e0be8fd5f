"""Leader election and ISR rules, as pure functions over a MetadataImage.

Rules (KRaft's):
- A leader must be an ISR member that is eligible: registered, unfenced, not in controlled
  shutdown. Candidates are tried in replica order, so the preferred replica wins when it can.
- A broker that is fenced or shutting down is removed from every ISR it is in, unless it is the
  last member: an ISR is never empty, so the partition remembers who has all the data and
  comes back clean when that broker returns.
- A leader that is shutting down keeps leading while no eligible ISR member can take over;
  it loses the partition when it is fenced at the end of its shutdown.
- With no eligible ISR member the partition goes offline (leader -1), unless unclean leader
  election is enabled for the topic (topic config, else cluster config, else the node config);
  then the first eligible replica leads and the ISR shrinks to it (acknowledged data may be
  lost, which is why it is off by default).
- A leader change bumps leader_epoch (the image does that when it applies PartitionChange).
- A replica whose broker reports it unsafe (it lost records it may have acknowledged, or holds
  a damaged batch: KIP-966's unclean replica) leaves the ISR and is never elected leader of
  that partition, not even as the last ISR member: with no safe ISR member the partition goes
  offline rather than truncate intact copies to a damaged one. It rejoins the ISR the usual
  way, when the leader sees it caught up, and its broker stops reporting it once it holds
  everything committed.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping

from raftlog.constants import NO_LEADER
from raftlog.errors import ErrorCode, RemoteError
from raftlog.metadata import records as r
from raftlog.metadata.controller.messages import (
    ELECTION_PREFERRED,
    AlterPartition,
    AlterPartitionReply,
    ElectLeaders,
    ElectLeadersReply,
    PartitionResult,
)
from raftlog.metadata.image import MetadataImage, PartitionState

UNCLEAN_KEY = "unclean.leader.election.enable"

log = logging.getLogger("raftlog.metadata")

# broker id -> the partitions (topic id, index) its last heartbeat reported unsafe to lead.
UnsafeReplicas = Mapping[int, frozenset[tuple[uuid.UUID, int]]]
NO_UNSAFE_REPLICAS: UnsafeReplicas = {}


class Batch:
    """Records being built for one request, applied as they are added.

    Later checks in the same request see the effect of earlier records (a fenced broker is
    not elected a few lines later). The image offset is left alone: these records have no
    log offset until Raft appends them.
    """

    def __init__(self, image: MetadataImage) -> None:
        self.image = image
        self.records: list[r.Record] = []

    def add(self, *records: r.Record) -> None:
        if records:
            self.image, _ = self.image.apply(records, self.image.last_applied_offset)
            self.records.extend(records)


def unclean_allowed(image: MetadataImage, topic_name: str, default: bool) -> bool:
    value = image.configs.get(("topic", topic_name), {}).get(UNCLEAN_KEY)
    if value is None:
        value = image.cluster_config(UNCLEAN_KEY)
    return default if value is None else value.strip().lower() == "true"


def alive_fn(image: MetadataImage) -> Callable[[int], bool]:
    brokers = image.brokers

    def alive(broker_id: int) -> bool:
        reg = brokers.get(broker_id)
        return reg is not None and not reg.fenced

    return alive


def eligible_fn(image: MetadataImage) -> Callable[[int], bool]:
    brokers = image.brokers

    def eligible(broker_id: int) -> bool:
        reg = brokers.get(broker_id)
        return reg is not None and reg.eligible_leader

    return eligible


def safe_fn(
    check: Callable[[int], bool], unsafe: UnsafeReplicas, topic_id: uuid.UUID, index: int
) -> Callable[[int], bool]:
    """`check` narrowed to brokers that did not report this partition unsafe."""
    if not unsafe:
        return check
    key = (topic_id, index)
    return lambda broker_id: check(broker_id) and key not in unsafe.get(broker_id, ())


def elect(
    topic_id: uuid.UUID,
    index: int,
    state: PartitionState,
    eligible: Callable[[int], bool],
    unclean: bool,
    drop: int | None = None,
    alive: Callable[[int], bool] = lambda broker_id: False,
    last_resort: Callable[[int], bool] | None = None,
) -> r.PartitionChange | None:
    """The change that makes `state` obey the rules above, or None when it already does.

    `drop` is a broker leaving the ISR (being fenced or shutting down); `alive` says whether
    a broker is unfenced (it may be shutting down, so not eligible for a new election).
    `last_resort` widens an unclean election when no `eligible` replica is left: an operator
    who enabled it accepts losing what a replica unsafe to lead lacks, rather than no leader.
    """
    isr = state.isr
    if drop is not None and drop in isr:
        rest = tuple(b for b in isr if b != drop)
        isr = rest or isr  # never empty: the last member stays as the record of who has data
    leader = state.leader
    if leader == NO_LEADER or leader not in isr or not eligible(leader):
        candidates = [b for b in state.replicas if b in isr and eligible(b)]
        if candidates:
            leader = candidates[0]
        elif leader != NO_LEADER and leader in isr and alive(leader):
            pass  # a leader shutting down keeps leading until it stops if nobody can take over
        else:
            # A replica still joining in a reassignment was never in sync: it may hold
            # nothing at all, so not even an unclean election picks it.
            joined = [b for b in state.replicas if b not in state.adding_replicas]
            live = [b for b in joined if eligible(b)] if unclean else []
            if unclean and not live and last_resort is not None:
                live = [b for b in joined if last_resort(b)]
            leader = live[0] if live else NO_LEADER
            if live:
                isr = (leader,)
    if leader == state.leader and isr == state.isr:
        return None
    return r.PartitionChange(
        topic_id,
        index,
        leader=None if leader == state.leader else leader,
        isr=None if isr == state.isr else isr,
    )


def _changes(
    image: MetadataImage,
    default_unclean: bool,
    wanted: Callable[[PartitionState], bool],
    drop: int | None,
    unsafe: UnsafeReplicas,
) -> list[r.PartitionChange]:
    eligible = eligible_fn(image)
    alive = alive_fn(image)
    changes = []
    for topic, index, state in image.iter_partitions():
        if wanted(state):
            unclean = unclean_allowed(image, topic.name, default_unclean)
            change = elect(
                topic.topic_id,
                index,
                state,
                safe_fn(eligible, unsafe, topic.topic_id, index),
                unclean,
                drop,
                safe_fn(alive, unsafe, topic.topic_id, index),
                eligible,
            )
            if change is not None:
                changes.append(change)
    return changes


def leave_changes(
    image: MetadataImage,
    broker_id: int,
    default_unclean: bool,
    unsafe: UnsafeReplicas = NO_UNSAFE_REPLICAS,
) -> list[r.PartitionChange]:
    """After `broker_id` became fenced or began shutting down in `image`: move its leaderships
    and take it out of ISRs."""
    return _changes(
        image,
        default_unclean,
        lambda s: s.leader == broker_id or broker_id in s.isr,
        broker_id,
        unsafe,
    )


def offline_changes(
    image: MetadataImage,
    default_unclean: bool,
    broker_id: int | None = None,
    unsafe: UnsafeReplicas = NO_UNSAFE_REPLICAS,
) -> list[r.PartitionChange]:
    """Elect leaders for offline partitions (only those `broker_id` replicates, if given)."""
    return _changes(
        image,
        default_unclean,
        lambda s: s.leader == NO_LEADER and (broker_id is None or broker_id in s.replicas),
        None,
        unsafe,
    )


def unsafe_changes(
    image: MetadataImage, broker_id: int, default_unclean: bool, unsafe: UnsafeReplicas
) -> list[r.PartitionChange]:
    """`broker_id` reported its replicas of `unsafe[broker_id]` unsafe: take it out of their
    ISRs and move their leadership to a safe ISR member, or leave them offline (leader -1)
    when there is none."""
    changes = []
    eligible = eligible_fn(image)
    alive = alive_fn(image)
    for topic_id, index in sorted(unsafe.get(broker_id, ())):
        topic = image.topics_by_id.get(topic_id)
        state = None if topic is None else topic.partitions.get(index)
        if topic is None or state is None:
            continue
        if broker_id not in state.isr and state.leader != broker_id:
            continue
        change = elect(
            topic_id,
            index,
            state,
            safe_fn(eligible, unsafe, topic_id, index),
            unclean_allowed(image, topic.name, default_unclean),
            broker_id,
            safe_fn(alive, unsafe, topic_id, index),
            eligible,
        )
        if change is None:
            continue
        if change.leader == NO_LEADER:
            log.error(
                "%s-%d is offline: broker %d reported its replica unsafe to lead (it lost or "
                "holds damaged records) and no other in-sync replica can lead",
                topic.name,
                index,
                broker_id,
            )
        changes.append(change)
    return changes


def preferred_leader_changes(
    image: MetadataImage, unsafe: UnsafeReplicas = NO_UNSAFE_REPLICAS
) -> list[r.PartitionChange]:
    """Move leadership back to the first replica where it is in the ISR and eligible."""
    eligible = eligible_fn(image)
    changes = []
    for topic, index, state in image.iter_partitions():
        preferred = state.replicas[0]
        safe = safe_fn(eligible, unsafe, topic.topic_id, index)
        if state.leader != preferred and preferred in state.isr and safe(preferred):
            changes.append(r.PartitionChange(topic.topic_id, index, leader=preferred))
    return changes


def initial_state(replicas: Iterable[int], eligible: Callable[[int], bool]) -> PartitionState:
    """State of a new partition: ISR = eligible replicas, leader = first of them."""
    replicas = tuple(replicas)
    isr = tuple(b for b in replicas if eligible(b))
    return PartitionState(replicas, isr, isr[0] if isr else NO_LEADER)


def alter_partition(batch: Batch, req: AlterPartition) -> AlterPartitionReply:
    """A partition leader's ISR change, fenced by leader epoch and partition epoch."""
    image = batch.image

    def refuse(code: ErrorCode, message: str) -> AlterPartitionReply:
        return AlterPartitionReply(code, message)

    reg = image.brokers.get(req.broker_id)
    if reg is None:
        return refuse(ErrorCode.broker_id_not_registered, "the broker is not registered")
    if reg.epoch != req.broker_epoch:
        return refuse(ErrorCode.stale_broker_epoch, "the broker epoch is not the registered one")
    topic = image.topics_by_id.get(req.topic_id)
    if topic is None:
        return refuse(ErrorCode.unknown_topic_id, f"no topic with id {req.topic_id}")
    state = topic.partitions.get(req.partition)
    if state is None:
        return refuse(
            ErrorCode.unknown_topic_or_partition, f"{topic.name} has no partition {req.partition}"
        )
    if req.leader_epoch != state.leader_epoch:
        # Refusals never echo the current epochs (the peer may be a forger); the service
        # logs the detail.
        return refuse(ErrorCode.fenced_leader_epoch, "the leader epoch is not the current one")
    if req.broker_id != state.leader:
        return refuse(
            ErrorCode.invalid_request,
            f"broker {req.broker_id} is not the leader of {topic.name}-{req.partition}",
        )
    if req.partition_epoch != state.partition_epoch:
        return refuse(
            ErrorCode.invalid_update_version, "the partition epoch is not the current one"
        )
    new_isr = tuple(req.new_isr)
    if len(set(new_isr)) != len(new_isr) or not set(new_isr) <= set(state.replicas):
        return refuse(
            ErrorCode.invalid_request,
            f"ISR {list(new_isr)} must be distinct members of replicas {list(state.replicas)}",
        )
    if state.leader not in new_isr:
        return refuse(ErrorCode.invalid_request, f"ISR {list(new_isr)} must contain the leader")
    eligible = eligible_fn(image)
    ineligible = [b for b in new_isr if b != state.leader and not eligible(b)]
    if ineligible:
        return refuse(
            ErrorCode.ineligible_replica,
            f"replicas {ineligible} are fenced or shutting down and cannot join the ISR",
        )
    if new_isr != state.isr:
        batch.add(r.PartitionChange(req.topic_id, req.partition, isr=new_isr))
        state = batch.image.topics_by_id[req.topic_id].partitions[req.partition]
    return AlterPartitionReply(
        leader=state.leader,
        leader_epoch=state.leader_epoch,
        isr=state.isr,
        partition_epoch=state.partition_epoch,
    )


# ---------------------------------------------------------------- ElectLeaders
class _ElectionRefused(RemoteError):
    """An ElectLeaders request that cannot be carried out for one partition (its code goes
    back to the client)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _preferred_change(
    topic_id: uuid.UUID,
    index: int,
    state: PartitionState,
    eligible: Callable[[int], bool],
) -> r.PartitionChange:
    preferred = state.replicas[0]
    if state.leader == preferred:
        raise _ElectionRefused(
            ErrorCode.election_not_needed, f"the preferred replica {preferred} leads already"
        )
    if preferred not in state.isr or not eligible(preferred):
        raise _ElectionRefused(
            ErrorCode.preferred_leader_not_available,
            f"the preferred replica {preferred} is not in the ISR, fenced, shutting down or "
            f"unsafe to lead",
        )
    return r.PartitionChange(topic_id, index, leader=preferred)


def _unclean_change(
    topic_id: uuid.UUID,
    index: int,
    state: PartitionState,
    eligible: Callable[[int], bool],
    alive: Callable[[int], bool],
) -> r.PartitionChange:
    if state.leader != NO_LEADER and eligible(state.leader):
        raise _ElectionRefused(
            ErrorCode.election_not_needed, f"replica {state.leader} leads already"
        )
    in_sync = [b for b in state.replicas if b in state.isr and eligible(b)]
    if in_sync:
        # An in-sync replica can lead: that is a clean election, and loses nothing.
        return r.PartitionChange(topic_id, index, leader=in_sync[0])
    waiting = [b for b in state.isr if alive(b)]
    if waiting:
        raise _ElectionRefused(
            ErrorCode.eligible_leaders_not_available,
            f"in-sync replicas {waiting} are alive (shutting down): no unclean election",
        )
    # Joining replicas never were in sync, and unsafe ones reported lost or damaged
    # records (`eligible` already refuses those): neither is a candidate.
    candidates = [b for b in state.replicas if b not in state.adding_replicas and eligible(b)]
    if not candidates:
        raise _ElectionRefused(
            ErrorCode.eligible_leaders_not_available,
            "no live replica that is safe to lead",
        )
    leader = candidates[0]
    log.warning(
        "unclean election of replica %d (ISR was %s): records only the ISR held are lost",
        leader,
        list(state.isr),
    )
    return r.PartitionChange(topic_id, index, leader=leader, isr=(leader,))


def elect_leaders(batch: Batch, req: ElectLeaders, unsafe: UnsafeReplicas) -> ElectLeadersReply:
    """Kafka's ElectLeaders: PREFERRED moves leadership to the first replica when it is in
    the ISR and eligible; UNCLEAN elects a replica outside the ISR only when no ISR member is
    alive. Replicas their broker reports unsafe are never elected (elections rules above).
    With no partitions named every partition is tried and the reply leaves out those that
    needed no election."""
    image = batch.image
    every = req.partitions is None
    wanted: list[tuple[str, int]]
    if req.partitions is None:
        wanted = sorted((t.name, i) for t, i, _ in image.iter_partitions())
    else:
        wanted = list(dict.fromkeys(req.partitions))  # once each, in the request's order
    results = []
    for name, index in wanted:
        try:
            topic = batch.image.topic(name)
            state = None if topic is None or index < 0 else topic.partitions.get(index)
            if topic is None or state is None:
                raise _ElectionRefused(
                    ErrorCode.unknown_topic_or_partition, f"no partition {name}-{index}"
                )
            eligible = safe_fn(eligible_fn(batch.image), unsafe, topic.topic_id, index)
            if req.election_type == ELECTION_PREFERRED:
                change = _preferred_change(topic.topic_id, index, state, eligible)
            else:
                alive = safe_fn(alive_fn(batch.image), unsafe, topic.topic_id, index)
                change = _unclean_change(topic.topic_id, index, state, eligible, alive)
        except _ElectionRefused as exc:
            if not (every and exc.code == ErrorCode.election_not_needed):
                results.append(PartitionResult(name, index, exc.code, exc.message))
            continue
        batch.add(change)
        results.append(PartitionResult(name, index))
    return ElectLeadersReply(tuple(results))
